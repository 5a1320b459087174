#!/usr/bin/env bash
# run n, call 2 (issue 19): timing variants of the adapted skinny GEMM's expand (.variants/n/<v>/src): bmask
# (B loaded only at each column's part's 16 rank columns: qkv's q/k/v rows, gate_up's parity; exact for
# this bench's rank-16 adapters), first (the delta product before the main loop, the loop accumulating
# onto it), both; main before and after.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/n2; mkdir -p $R
trap 'tar czf $OUT/n2.tgz -C $OUT n2' EXIT
for t in main bmask first both main2; do
  case $t in main*) P=src ;; *) P=.variants/n/$t/src ;; esac
  echo "== $t $(date +%T)"
  PYTHONPATH=$P timeout 140 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$t.json > $R/lora.$t.txt 2>$R/lora.$t.err
  grep -A4 "workload" $R/lora.$t.txt || tail -5 $R/lora.$t.err
done
date +%T
