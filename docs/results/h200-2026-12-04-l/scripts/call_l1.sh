#!/usr/bin/env bash
# run l, call 1: the vision LayerNorm by warps (ln_probe.py); md2-encoder with md2-query's floors, md2-query at
# 1 and 64 clients, md2-reuse with the prefix cache (issues 17, 19).
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/l1; mkdir -p $R
trap 'tar czf $OUT/l1.tgz -C $OUT l1' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $R/gpu.txt
echo "== ln probe $(date +%T)"
R=$R PYTHONPATH=src timeout 120 python3 .variants/l/ln_probe.py 2>&1 | tee $R/ln_probe.txt
echo "== md2 $(date +%T)"
PYTHONPATH=src timeout 400 python3 -m slipstream bench --model random:moondream2 \
  --workload md2-encoder,md2-query,md2-reuse --streams 1,64 --max-num-seqs 64 --mode pipelined \
  --out $R/md2.json 2>&1 | grep -v "Warn\|capturing\|legend" > $R/md2.txt
grep -v "^ " $R/md2.txt | tail -30
date +%T
