#!/usr/bin/env bash
# run a, call 4: the image prefix's rotary in place (three launches a layer, not twelve): Moondream's GPU
# tests (the full-size preset against the reference in bf16), the rotary kernel compiled, and where an
# image step's GPU time goes now
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src
R=$OUT/a4; mkdir -p $R
echo "== GPU tests $(date +%T)"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_moondream.py -m gpu 2>&1 | tail -3 | tee $R/gpu_tests.txt
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "rotary" 2>&1 | tail -1 | tee -a $R/gpu_tests.txt
if (( SECONDS < 130 )); then
  echo "== md profile $(date +%T)"
  OUT=$R timeout $((265 - SECONDS)) python3 .variants/md_profile.py 2>$R/md_profile.err | tee $R/md_profile.txt | head -40
fi
date +%T
