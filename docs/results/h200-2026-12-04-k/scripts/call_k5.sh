#!/usr/bin/env bash
# run k, call 5: GPU tests of main (the engine of 6109fb6); Qwen2.5-0.5B both modes, profiled (issue 16).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/k5; mkdir -p $R
trap 'tar czf $OUT/k5.tgz -C $OUT k5' EXIT
git log --oneline -1 > $R/commit.txt 2>/dev/null
echo "== gpu tests $(date +%T)"
PYTHONPATH=src:tests:/tmp/site timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -6 | tee $R/gpu_tests.txt
echo "== qwen both modes, profiled $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 220 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
  --max-tokens 1024 --constrained 0,0.5,1 --profile --out $R/modes.qwen.json 2>&1 | grep -A30 "ms/step" > $R/modes.qwen.txt
head -14 $R/modes.qwen.txt
date +%T
