#!/usr/bin/env bash
# run g, call 4 (issue 16): "new" = the working tree (the consumer's batch shipped as each commit's rest
# ends, so its thread takes the interpreter lock inside the next mask fill) against main ("base").
# GPU tests of new, then the constrained bench alternating, two rounds.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/g4; mkdir -p $R
trap 'tar czf $OUT/g4.tgz -C $OUT g4' EXIT
srcof() { case $1 in new) echo src;; base) echo .variants/base_i/src;; esac; }
PYTHONPATH=src:tests:/tmp/site timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -4 > $R/tests.txt
tail -2 $R/tests.txt
for rep in 1 2; do
  for t in new base; do
    echo "== $t round $rep $(date +%T)"
    PYTHONPATH=$(srcof $t):/tmp/site timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile --out $R/bench.$t.$rep.json 2>&1 | grep -A7 "ms/step"
  done
done 2>&1 > $R/bench.txt
grep "==\|json1\|decode" $R/bench.txt
date +%T
