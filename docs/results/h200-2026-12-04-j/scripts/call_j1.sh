#!/usr/bin/env bash
# run j, call 1 (issue 16): new = the working tree (XGrammar's matchers in a process of their own,
# reading landed tokens and writing bitmasks in shared pinned memory), base = main's engine (63efbb8 = 42ac60f's src).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/j1; mkdir -p $R
trap 'tar czf $OUT/j1.tgz -C $OUT j1' EXIT
pathof() { case $1 in new) echo src;; base) echo .variants/base_h/src;; esac; }
nproc; python3 -c "import os; print(os.cpu_count())"
for rep in 1 2; do
  for t in new base; do
    echo "== $t round $rep $(date +%T)"
    PYTHONPATH=$(pathof $t):/tmp/site timeout 120 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile --out $R/bench.$t.$rep.json 2>&1 | grep -B2 -A9 "ms/step"
  done
done 2>&1 > $R/bench.txt
grep "==\|json1\|decode\|Error\|error" $R/bench.txt | head -60
echo "== new both modes, unprofiled $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 200 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
  --max-tokens 1024 --constrained 0,0.5,1 --out $R/modes.new.json 2>&1 | tee $R/modes.txt | grep -A14 "ms/step"
echo "== gpu tests $(date +%T)"
PYTHONPATH=src:tests:/tmp/site timeout 240 python3 -m pytest -q -x tests/test_gpu.py -m gpu 2>&1 | tail -15 | tee $R/gpu_tests.txt
date +%T
