#!/usr/bin/env bash
# run l, call 5 (issue 19): the skinny GEMM with LoRA's loads (rows' slots and v, B, the next shrink's A) after
# the main loop instead of before it (call 4: the expand costs 0.2 ms a step), against main, alternating.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/l5; mkdir -p $R
G=src/slipstream/kernels/skinny_gemm.py
for v in after base after2; do
  cp .variants/l/skinny_gemm.${v%2}.py $G
  echo "== $v $(date +%T)"
  timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$v.json 2>$R/lora.$v.err | grep -A4 "workload" | tee $R/lora.$v.txt
done
date +%T
