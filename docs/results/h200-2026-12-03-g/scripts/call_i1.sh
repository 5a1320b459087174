#!/usr/bin/env bash
# run g, call 1 (issue 16): the tick's copies and events through the CUDA driver ("new" = working tree)
# against main ("base" = .variants/base_i/src): GPU tests of the new tree, the copies' host cost by tree,
# then the constrained bench alternating, two rounds.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/i1; mkdir -p $R
trap 'tar czf $OUT/i1.tgz -C $OUT i1' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
for t in new base; do
  src=src; [ $t = base ] && src=.variants/base_i/src
  echo "== $t"; PYTHONPATH=$src:/tmp/site python3 .variants/copy_cost.py
done 2>&1 | tee $R/copy_cost.txt
PYTHONPATH=src:tests:/tmp/site timeout 300 python3 -m pytest -q -x tests/test_device.py tests/test_gpu.py -m gpu 2>&1 | tail -15 | tee $R/tests.txt
for rep in 1 2; do
  for t in new base; do
    src=src; [ $t = base ] && src=.variants/base_i/src
    echo "== $t round $rep $(date +%T)"
    PYTHONPATH=$src:/tmp/site timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile --out $R/bench.$t.$rep.json 2>&1 | grep -v "^WARN" | tail -30
  done
done 2>&1 | tee $R/bench.txt
date +%T
