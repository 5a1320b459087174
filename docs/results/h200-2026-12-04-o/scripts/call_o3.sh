#!/usr/bin/env bash
# run o, call 3 (issue 19), from main's checkout: the LoRA step on main and with the deferred GEMMs' shrinks in column
# tiles of their own grids (g1: o's; g2: o's and down's, gate_up's shares gone), alternating; the GPU tests on g2.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/x3; mkdir -p $R
trap 'tar czf $OUT/x3.tgz -C $OUT x3' EXIT
for t in main g2 g1 main2 g2b; do
  case $t in main*) P=src ;; *) P=.variants/o/${t%b}/src ;; esac
  echo "== $t $(date +%T)"
  PYTHONPATH=$P timeout 140 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$t.json > $R/lora.$t.txt 2>$R/lora.$t.err
  grep -A4 "workload" $R/lora.$t.txt || tail -5 $R/lora.$t.err
done
echo "== gpu tests (g2) $(date +%T)"
PYTHONPATH=.variants/o/g2/src:tests timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -4 | tee $R/gpu_tests.txt
date +%T
