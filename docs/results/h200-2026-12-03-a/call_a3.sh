#!/usr/bin/env bash
# run a, call 3: the LoRA rows and v loaded before the GEMM's main loop; decode graphs without the LoRA
# kernels for steps without adapter rows; the shrink's split tried at 8/4/2/1 (working tree) beside
# fa97f7a's kernels (.variants/base_z)
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src
R=$OUT/a3; mkdir -p $R
echo "== lora micro $(date +%T)"
OUT=$R timeout 150 python3 .variants/lora_micro2.py 2>&1 | tail -18 | tee $R/lora_micro2.txt
echo "== GPU tests $(date +%T)"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_gpu.py \
  -k "lora or skinny or deferred or never_synchronizes or base_rows" 2>&1 | tail -5 | tee $R/gpu_tests.txt
echo "== decode step with adapters $(date +%T)"
OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 head base_z head \
  2>&1 | tee $R/ab.txt
date +%T
