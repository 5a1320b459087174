#!/usr/bin/env bash
# run k, call 6: the helper's accepts and fill in two halves at once (new = the working tree) against main
# (base = .variants/base_k, 6109fb6's src): Qwen2.5-0.5B, 32/64 rows free and 100% JSON, pipelined,
# profiled, alternating twice; then new both modes profiled; then the GPU tests of new.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/k6; mkdir -p $R
trap 'tar czf $OUT/k6.tgz -C $OUT k6' EXIT
for round in 1 2; do
  for tree in new base; do
    src=src; [ $tree = base ] && src=.variants/base_k/src
    echo "== $tree round $round $(date +%T)"
    PYTHONPATH=$src:/tmp/site timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,1 --mode pipelined --profile --out $R/ab.$tree.$round.json 2>&1 \
      | grep -A8 "ms/step" | grep -v "^ *mode" | cut -c1-120 | tee $R/ab.$tree.$round.txt
  done
done
echo "== new both modes profiled $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 130 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
  --max-tokens 1024 --constrained 0,0.5,1 --profile --out $R/modes.qwen.json 2>&1 | grep -A30 "ms/step" > $R/modes.qwen.txt
head -14 $R/modes.qwen.txt
echo "== gpu tests $(date +%T)"
PYTHONPATH=src:tests:/tmp/site timeout 150 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -3 | tee $R/gpu_tests.txt
date +%T
