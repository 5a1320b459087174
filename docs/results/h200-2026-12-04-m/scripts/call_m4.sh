#!/usr/bin/env bash
# run m, call 4: every GPU test on this tree (ab054c0 + docs), then the LoRA step at ranks 4 and 64.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/m4; mkdir -p $R
trap 'tar czf $OUT/m4.tgz -C $OUT m4' EXIT
git log --oneline -1 | tee $R/commit.txt
PYTHONPATH=src:tests timeout 400 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -15 | tee $R/gpu_tests.txt
PYTHONPATH=src:tests timeout 150 python3 -m pytest -q tests/test_kernels.py -k "lora or adapter or shrink or norm or skinny" 2>&1 | tail -8 | tee $R/kernel_tests.txt
for r in 4 64; do
  timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank $r \
    --max-tokens 512 --mode pipelined --out $R/lora.r$r.json 2>$R/lora.r$r.err | grep -A4 "workload" | tee $R/lora.r$r.txt
done
date +%T
