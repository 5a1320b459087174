#!/usr/bin/env bash
# the expand as one product over every slot's B tile, loaded before the GEMM's main loop (working tree)
# beside main (9752096 = .variants/main_a): kernel tests on the GPU, the kernels alone, the step.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/b2; mkdir -p $R
echo "== GPU kernel tests $(date +%T)"
PYTHONPATH=src timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "lora or skinny" 2>&1 | tail -3 | tee $R/gpu_tests.txt
echo "== lora micro, head $(date +%T)"
PYTHONPATH=src OUT=$R timeout 90 python3 .variants/lora_micro2.py 2>&1 | tail -18 | tee $R/micro.txt
echo "== decode step with adapters $(date +%T)"
OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 head main_a head 2>&1 | tee $R/ab.txt | grep -E "^==|lora8 |lora-none|decode "
date +%T
