#!/usr/bin/env bash
# run m, call 1 (issue 19, diagnostic): each LoRA decode kernel alone in a chain of its own launches
# (kbench.py), by rows and rank, with adapters and with every row in slot 0; then the LoRA step's bench.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/m1; mkdir -p $R
trap 'tar czf $OUT/m1.tgz -C $OUT m1' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $R/gpu.txt
OUT=$R timeout 300 python3 .variants/m/kbench.py > $R/kbench.txt 2>&1
tail -80 $R/kbench.txt
timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.json 2>$R/lora.err | grep -A4 "workload" | tee $R/lora.txt
