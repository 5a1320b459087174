#!/usr/bin/env bash
# run l, call 3 (issue 19): the LoRA decode step with the RMSNorm's warps a program at 8 (main), 16 and 4 —
# the norms carry LoRA's shrink and delta (295 µs a step against 78 plain, run g) — alternating.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/l3; mkdir -p $R
trap 'tar czf $OUT/l3.tgz -C $OUT l3' EXIT
cp src/slipstream/kernels/norm.py /tmp/norm.py.orig
for v in w8 w16 w4 w8b w16b; do
  cp /tmp/norm.py.orig src/slipstream/kernels/norm.py
  case $v in
    w16*) sed -i 's/\* (2 if rms else 1), \*\*pdl_args/* (4 if rms else 1), **pdl_args/' src/slipstream/kernels/norm.py ;;
    w4) sed -i 's/\* (2 if rms else 1), \*\*pdl_args/* (1 if rms else 1), **pdl_args/' src/slipstream/kernels/norm.py ;;
  esac
  grep -c "(2 if rms else 1), \*\*pdl" src/slipstream/kernels/norm.py
  echo "== $v $(date +%T)"
  timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$v.json 2>$R/lora.$v.err | grep -A4 "workload" | tee $R/lora.$v.txt
done
cp /tmp/norm.py.orig src/slipstream/kernels/norm.py
date +%T
