#!/usr/bin/env bash
# call d1: normlora4 (RMSNorm warps no longer depend on its LoRA work) GPU tests; the LoRA step's kernels
# by name without PDL (normlora4 and head); md2-query on main (aa3c8a6's host preparation); the A/B again if time is left.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/d1; mkdir -p $R
echo "== GPU tests of normlora4 $(date +%T)"
(cd .variants/normlora4 && PYTHONPATH=src timeout 200 python3 -m pytest -q -p no:cacheprovider -rf tests/test_kernels.py \
  tests/test_gpu.py -k "norm or swiglu_gemm_starts or lora or deferred or base_rows or never_synchronizes" 2>&1 | tail -6) \
  | tee $R/gpu_tests.txt
for t in normlora4 head; do
  echo "== step profile $t $(date +%T)"
  src=src; [ $t != head ] && src=.variants/$t/src
  mkdir -p $R/$t
  SLIPSTREAM_PDL=0 PYTHONPATH=$src OUT=$R/$t timeout 150 python3 .variants/lora_step_profile.py 2>$R/$t/err.txt | tee $R/$t/profile.txt | tail -40
done
echo "== md2-query $(date +%T)"
PYTHONPATH=src timeout 120 python3 -m slipstream bench --model random:moondream2 --workload md2-query \
  --streams 1,64 --max-num-seqs 64 --mode pipelined --profile --out $R/md2-query.json 2>$R/md2-query.err | tee $R/md2-query.txt
if (( SECONDS < 480 )); then
  OUT=$R BENCH_ARGS="--lora 8 --lora-rank 16" bash scripts/ab_bench.sh qwen2.5-0.5b 32 normlora4 2>&1 \
    | tee $R/ab.txt | grep -E "^==|lora8 |lora-none|decode |pipelined lora8"
fi
date +%T
