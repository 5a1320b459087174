#!/usr/bin/env bash
# run j, call 4: GPU tests of the working tree (matcher process, Step fields fixed); Qwen both modes, profiled.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/j4; mkdir -p $R
trap 'tar czf $OUT/j4.tgz -C $OUT j4' EXIT
echo "== gpu tests $(date +%T)"
PYTHONPATH=src:tests:/tmp/site timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tee $R/gpu_tests_full.txt | tail -6
grep -B5 "^E " $R/gpu_tests_full.txt | head -40
echo "== qwen both modes, profiled $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 200 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
  --max-tokens 1024 --constrained 0,0.5,1 --profile --out $R/modes.qwen.json 2>&1 | grep -A30 "ms/step" > $R/modes.qwen.txt
cat $R/modes.qwen.txt | head -16
date +%T
