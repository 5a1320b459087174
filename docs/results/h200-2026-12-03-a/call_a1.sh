#!/usr/bin/env bash
# run a (2026-12-03, session 13), call 1: the LoRA kernels one at a time; where an image step's GPU time
# goes; a constrained tick's functions on the H200's host (fa97f7a)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site
R=$OUT/a1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $R/gpu.txt
echo "== lora micro $(date +%T)"
OUT=$R timeout 120 python3 .variants/lora_micro.py 2>&1 | tail -8 | tee $R/lora_micro.txt
echo "== md profile $(date +%T)"
OUT=$R timeout 300 python3 .variants/md_profile.py 2>$R/md_profile.err | tee $R/md_profile.txt
tail -3 $R/md_profile.err
if (( SECONDS < 420 )); then
  echo "== tick parts, 64 rows JSON $(date +%T)"
  ROWS=64 FRAC=1 REPS=1 TOKENS=512 timeout 100 python3 .variants/tickparts.py 2>/dev/null | tee $R/tick_json1.txt
fi
date +%T
