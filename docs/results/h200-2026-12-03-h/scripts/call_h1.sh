#!/usr/bin/env bash
# run h, call 1 (issue 16): new = the working tree (a constrained step's masks made on the commit worker
# from its plan on: wait, batched accept, fill, beside the launch and the commit's rest), sw = the same
# with the interpreter's switch interval at 0.2 ms, base = main (42ac60f). Constrained bench alternating,
# two rounds; then Phi-1.5 on base, both modes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/h1; mkdir -p $R
trap 'tar czf $OUT/h1.tgz -C $OUT h1' EXIT
pathof() { case $1 in new) echo src;; sw) echo .variants/switch:src;; base) echo .variants/base_h/src;; esac; }
for rep in 1 2; do
  for t in new base sw; do
    echo "== $t round $rep $(date +%T)"
    PYTHONPATH=$(pathof $t):/tmp/site timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile --out $R/bench.$t.$rep.json 2>&1 | grep -A7 "ms/step"
  done
done 2>&1 > $R/bench.txt
grep "==\|json1\|decode" $R/bench.txt
echo "== phi base both modes $(date +%T)"
PYTHONPATH=.variants/base_h/src:/tmp/site timeout 200 python3 -m slipstream bench --model random:phi-1.5 --streams 32,64 \
  --max-tokens 1024 --constrained 0,0.5,1 --profile --out $R/phi.base.json 2>&1 | tee $R/phi.txt | grep -A12 "ms/step"
date +%T
