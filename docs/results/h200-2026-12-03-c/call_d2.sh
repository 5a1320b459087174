#!/usr/bin/env bash
# call d2 (291 s of device time left): nl5 = branch lora-norms (normlora4 rebased on main) + the norm's LoRA work spread over (row, 16 rank columns)
# programs, A loaded before the wait (d1's profile: the LoRA norms 396.8 µs a step against 75). The GPU tests d1 did
# not reach (the engine's LoRA rows against peft, base rows beside adapted ones, no sync) and the norm kernels'
# fp32 cases; then the A/B.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/d2; mkdir -p $R
echo "== GPU tests of nl5 $(date +%T)"
(cd .variants/nl5 && PYTHONPATH=src timeout 100 python3 -m pytest -q -p no:cacheprovider -rf tests/test_kernels.py \
  tests/test_gpu.py -k "test_a_norm_adds or swiglu_gemm_starts or test_cuda_lora_rows or test_cuda_base_rows or never_synchronizes" \
  2>&1 | tail -6) | tee $R/gpu_tests.txt
echo "== A/B $(date +%T)"
OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 nl5 2>&1 \
  | tee $R/ab.txt | grep -E "^==|lora8 |lora-none|decode |pipelined lora8"
date +%T
