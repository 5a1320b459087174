#!/usr/bin/env bash
# run j, call 3: GPU tests of the working tree (matcher process); then both shapes, both modes, unprofiled.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/j3; mkdir -p $R
trap 'tar czf $OUT/j3.tgz -C $OUT j3' EXIT
echo "== gpu tests $(date +%T)"
PYTHONPATH=src:tests:/tmp/site timeout 260 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -8 | tee $R/gpu_tests.txt
for m in qwen2.5-0.5b phi-1.5; do
  echo "== $m both modes, unprofiled $(date +%T)"
  PYTHONPATH=src:/tmp/site timeout 200 python3 -m slipstream bench --model random:$m --streams 32,64 \
    --max-tokens 1024 --constrained 0,0.5,1 --out $R/modes.$m.json 2>&1 | grep -A14 "ms/step" > $R/modes.$m.txt
  cat $R/modes.$m.txt
done
date +%T
