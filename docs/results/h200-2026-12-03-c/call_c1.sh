#!/usr/bin/env bash
# next session, call 1 (issue 19), three unmerged branches beside main (head):
#   lora_load = branch lora-load: each row's v read straight into its slot's columns (197 -> 143 registers in qkv's GEMM,
#               212 -> 128 in gate_up's, for sm_90: their grids one wave, not two)
#   normlora3 = normlora~1 (on lora-load): the RMSNorm before qkv and gate_up computes their shrink, the one after o adds
#               o's delta
#   normlora4 = normlora: + gate_up's tiles start down's shrink, the norm after down adds its delta (no LoRA launch)
# the GPU tests of normlora4 (which holds the other two), then the decode step with 8 adapters.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/c1; mkdir -p $R
echo "== GPU tests of normlora4 $(date +%T)"
(cd .variants/normlora4 && PYTHONPATH=src timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  tests/test_gpu.py -k "lora or skinny or adapter or deferred or never_synchronizes or base_rows or norm" 2>&1 | tail -4) \
  | tee $R/gpu_tests.txt
echo "== decode step with adapters $(date +%T)"
OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 normlora4 head lora_load 2>&1 \
  | tee $R/ab.txt | grep -E "^==|lora8 |lora-none|decode |pipelined lora8"
if (( SECONDS < 470 )); then
  OUT=$R AB_TAG=2 BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 normlora3 2>&1 \
    | tee -a $R/ab.txt | grep -E "^==|lora8 |lora-none|decode |pipelined lora8"
fi
date +%T
