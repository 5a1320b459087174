#!/usr/bin/env bash
# run k, call 4: md2-query at 8 and 64 clients by the step's prompt budget (--max-prefill-chunk: how many
# new images a step may carry beside decode rows), pipelined, profiled.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/k4; mkdir -p $R
trap 'tar czf $OUT/k4.tgz -C $OUT k4' EXIT
for chunk in 320 1000 3000 320; do
  echo "== max_prefill_chunk $chunk $(date +%T)"
  PYTHONPATH=src timeout 150 python3 -m slipstream bench --model random:moondream2 --workload md2-query \
    --streams 8,64 --max-num-seqs 64 --mode pipelined --max-prefill-chunk $chunk --profile \
    --out $R/md2.chunk$chunk.$(date +%H%M%S).json 2>&1 | grep -v "Warn\|capturing\|legend" > $R/md2.chunk$chunk.txt
  grep -A4 "^workload" $R/md2.chunk$chunk.txt
  grep -E "x64|x8" $R/md2.chunk$chunk.txt | cut -c1-250
done
date +%T
