#!/usr/bin/env bash
# run j, call 2 (issue 16): new = the working tree (matcher process; the loop's wait for a fill lets go of the
# interpreter lock between looks), spin = the same waiting without letting go, base = main's engine.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/j2; mkdir -p $R
trap 'tar czf $OUT/j2.tgz -C $OUT j2' EXIT
pathof() { case $1 in new) echo src;; spin) echo .variants/j_spin/src;; base) echo .variants/base_h/src;; esac; }
for rep in 1 2; do
  for t in new spin base; do
    echo "== $t round $rep $(date +%T)"
    PYTHONPATH=$(pathof $t):/tmp/site timeout 120 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile --out $R/bench.$t.$rep.json 2>&1 | grep -A9 "ms/step"
  done
done 2>&1 > $R/bench.txt
grep "==\|json\|decode\|Error\|error" $R/bench.txt | head -80
for t in new spin; do
  echo "== $t both modes, unprofiled $(date +%T)"
  PYTHONPATH=$(pathof $t):/tmp/site timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
    --max-tokens 1024 --constrained 0,0.5,1 --out $R/modes.$t.json 2>&1 | grep -A14 "ms/step" > $R/modes.$t.txt
  cat $R/modes.$t.txt
done
date +%T
