#!/usr/bin/env bash
# next call (issue 19), from main's checkout: the LoRA step's bench on main, on branch lora-shares-one-product
# (.variants/n/shares/src: gate_up's shares of down's shrink as one product), and on that with the expand's
# product taken as columns by rows (.variants/n/sharesT/src: 148 -> 64 registers in qkv's GEMM for sm_90),
# alternating; then the GPU tests on the branch's tree.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/x1; mkdir -p $R
trap 'tar czf $OUT/x1.tgz -C $OUT x1' EXIT
for t in main shares sharesT main2 shares2; do
  case $t in main*) P=src ;; *) P=.variants/n/${t%2}/src ;; esac
  echo "== $t $(date +%T)"
  PYTHONPATH=$P timeout 140 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$t.json > $R/lora.$t.txt 2>$R/lora.$t.err
  grep -A4 "workload" $R/lora.$t.txt || tail -5 $R/lora.$t.err
done
echo "== gpu tests (branch) $(date +%T)"
PYTHONPATH=.variants/n/shares/src:tests timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -4 | tee $R/gpu_tests.txt
date +%T
