#!/usr/bin/env bash
# run o, call 2 (issue 19), from main's checkout: the LoRA step's bench on main and on the expand's product as the
# GEMM's last K blocks, pipelined with its main loop (.variants/o/kext/src), alternating; then the GPU tests on it.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/x2; mkdir -p $R
trap 'tar czf $OUT/x2.tgz -C $OUT x2' EXIT
for t in main kext main2 kext2; do
  case $t in main*) P=src ;; *) P=.variants/o/${t%2}/src ;; esac
  echo "== $t $(date +%T)"
  PYTHONPATH=$P timeout 140 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$t.json > $R/lora.$t.txt 2>$R/lora.$t.err
  grep -A4 "workload" $R/lora.$t.txt || tail -5 $R/lora.$t.err
done
echo "== gpu tests (kext) $(date +%T)"
PYTHONPATH=.variants/o/kext/src:tests timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -4 | tee $R/gpu_tests.txt
date +%T
