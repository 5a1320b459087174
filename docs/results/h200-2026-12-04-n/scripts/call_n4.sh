#!/usr/bin/env bash
# run n, call 4 (issue 19): the tree of the change (the one product before the GEMM's main loop): every GPU
# test, then the LoRA step's bench once more.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/n4; mkdir -p $R
trap 'tar czf $OUT/n4.tgz -C $OUT n4' EXIT
echo "== gpu tests $(date +%T)"
PYTHONPATH=src:tests timeout 300 python3 -m pytest -q tests/test_gpu.py -m gpu -rs 2>&1 | tail -15 | tee $R/gpu_tests.txt
echo "== bench $(date +%T)"
PYTHONPATH=src timeout 140 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
  --max-tokens 512 --mode pipelined --out $R/lora.json > $R/lora.txt 2>$R/lora.err
grep -A4 "workload" $R/lora.txt || tail -5 $R/lora.err
date +%T
