#!/usr/bin/env bash
# run g, call 3 (issue 19): the LoRA decode step by adapter rank (4, 8, 16; max_lora_rank = the rank):
# the pipelined bench twice each, alternating, then the kernels by name without PDL (ranks 4 and 16).
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src
R=$OUT/g3; mkdir -p $R
trap 'tar czf $OUT/g3.tgz -C $OUT g3' EXIT
for rep in 1 2; do
  for r in 4 16 8; do
    echo "== rank $r round $rep $(date +%T)"
    timeout 110 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --mode pipelined --prompt-tokens 64 \
      --max-tokens 128 --profile --lora 8 --lora-rank $r --out $R/bench.r$r.$rep.json 2>/dev/null | grep -A4 "ms/step" | head -4
  done
done 2>&1 | tee $R/bench.txt
echo "== kernels $(date +%T)"
SLIPSTREAM_PDL=0 RANKS=4,16 OUT=$R timeout 200 python3 .variants/lora_rank_profile.py 2>$R/profile.err | tee $R/profile.txt | head -45
date +%T
