#!/usr/bin/env bash
# next session, call 1: the LoRA shrink inside the skinny GEMM's own grid (.variants/ticket = main at 36a00d0 +
# .variants/lora_ticket.patch; the shrink programs take the first tickets, the tiles' epilogues wait on them)
# beside main: its GPU tests first (a spin-wait: bounded by timeouts), then the kernels alone, then the step.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/b1; mkdir -p $R
echo "== GPU tests of the variant $(date +%T)"
(cd .variants/ticket && PYTHONPATH=src timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  tests/test_gpu.py -k "lora or skinny or adapter or deferred or never_synchronizes or base_rows" 2>&1 | tail -4) \
  | tee $R/gpu_tests.txt
PYTHONPATH=src timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k rotary_in_place 2>&1 | tail -1 \
  | tee -a $R/gpu_tests.txt  # (main's image-prefix rotary on the GPU: run a's call 4 cut it off)
echo "== lora micro, variant $(date +%T)"
PYTHONPATH=.variants/ticket/src OUT=$R timeout 90 python3 .variants/lora_micro2.py 2>&1 | tail -18 | tee $R/micro.txt
echo "== decode step with adapters $(date +%T)"
OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 ticket head ticket 2>&1 | tee $R/ab.txt
if (( SECONDS < 330 )); then  # issue 17 on main (the image prefix's rotary in two kernels, b0a46bc): not measured since run o
  echo "== md2-query $(date +%T)"
  PYTHONPATH=src timeout $((560 - SECONDS)) python3 -m slipstream bench --model random:moondream2 --workload md2-query \
    --streams 1,64 --max-num-seqs 64 --mode pipelined --profile --out $R/md2-query.json 2>$R/md2-query.err | tee $R/md2-query.txt
fi
date +%T
