#!/usr/bin/env bash
# run a, call 2: the LoRA expand inside the skinny GEMM's epilogue (working tree) beside fa97f7a's kernels
# (.variants/base_z = 56b44ec's src, the same engine code): kernels one at a time, the decode step with
# 8 adapters, the GPU tests of LoRA and the kernels
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src
R=$OUT/a2; mkdir -p $R
echo "== lora micro (new) $(date +%T)"
OUT=$R timeout 120 python3 .variants/lora_micro2.py 2>&1 | tail -6 | tee $R/lora_micro2.txt
echo "== GPU tests $(date +%T)"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_gpu.py \
  -k "lora or skinny or deferred or never_synchronizes" 2>&1 | tail -5 | tee $R/gpu_tests.txt
echo "== decode step with adapters $(date +%T)"
OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 head base_z head base_z \
  2>&1 | tee $R/ab.txt
date +%T
