#!/usr/bin/env bash
# run n, call 3 (issue 19): variants of the adapted skinny GEMM's expand (.variants/n/<v>/src): first (the
# delta product before the main loop, the loop accumulating onto it); qpart (first, and qkv's product over
# each slot's 16 rank columns of the tile's part: 128 columns, not 512); qgpart (qpart, and gate_up's as
# two products, gate's and up's columns, 128 rank columns each, not one of 256). qpart and qgpart are exact
# for this bench's adapters (rank 16 on every part) only.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/n3; mkdir -p $R
trap 'tar czf $OUT/n3.tgz -C $OUT n3' EXIT
for t in main first qpart qgpart main2 first2 qgpart2; do
  case $t in main*) P=src ;; *) P=.variants/n/${t%2}/src ;; esac
  echo "== $t $(date +%T)"
  PYTHONPATH=$P timeout 140 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$t.json > $R/lora.$t.txt 2>$R/lora.$t.err
  grep -A4 "workload" $R/lora.$t.txt || tail -5 $R/lora.$t.err
done
date +%T
