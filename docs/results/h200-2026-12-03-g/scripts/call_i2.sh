#!/usr/bin/env bash
# run g, call 2 (issue 16): "new" = working tree (driver copies + the next step staged beside the fill),
# "drv" = driver copies alone (2e9b0ba), "base" = main (2e82bb2). GPU tests of the new tree, copies' host
# cost by tree, then the constrained bench (Qwen shape, pipelined) alternating, two rounds.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/i2; mkdir -p $R
trap 'tar czf $OUT/i2.tgz -C $OUT i2' EXIT
srcof() { case $1 in new) echo src;; drv) echo .variants/v_drv/src;; base) echo .variants/base_i/src;; esac; }
for t in new base; do
  echo "== $t"; PYTHONPATH=$(srcof $t):/tmp/site python3 .variants/copy_cost.py
done 2>&1 | tee $R/copy_cost.txt
PYTHONPATH=src:tests:/tmp/site timeout 330 python3 -m pytest -q tests/test_device.py tests/test_gpu.py -m gpu 2>&1 | tail -15 > $R/tests.txt
tail -3 $R/tests.txt
for rep in 1 2; do
  for t in new base drv; do
    echo "== $t round $rep $(date +%T)"
    PYTHONPATH=$(srcof $t):/tmp/site timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile --out $R/bench.$t.$rep.json 2>&1 | grep -A7 "ms/step"
  done
done 2>&1 > $R/bench.txt
grep -A7 "==" $R/bench.txt | grep "==\|json1\|decode" | head -40
date +%T
