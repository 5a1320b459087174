#!/usr/bin/env bash
# next session, call 1 (issue 19): pf = branch lora-prefetch (the GEMM's LoRA slots and B read before the PDL wait, v after
# the main loop: before, Triton copied v into shared memory ahead of the loop, which then waited for v's load). GPU tests,
# the A/B beside main (head), the step's kernels without PDL (pf).
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/e1; mkdir -p $R
echo "== GPU tests of pf $(date +%T)"
(cd .variants/pf && PYTHONPATH=src timeout 200 python3 -m pytest -q -p no:cacheprovider -rf tests/test_kernels.py \
  tests/test_gpu.py -k "adapter or lora or test_a_norm_adds or swiglu_gemm_starts or base_rows or never_synchronizes" \
  2>&1 | tail -6) | tee $R/gpu_tests.txt
OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 pf head pf 2>&1 \
  | tee $R/ab.txt | grep -E "^==|lora8 |lora-none|decode |pipelined lora8"
if (( SECONDS < 480 )); then
  SLIPSTREAM_PDL=0 PYTHONPATH=.variants/pf/src OUT=/tmp timeout 110 python3 .variants/lora_step_profile.py 2>/dev/null \
    | tee $R/profile.txt | tail -16
fi
date +%T
