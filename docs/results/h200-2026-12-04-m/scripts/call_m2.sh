#!/usr/bin/env bash
# run m, call 2 (issue 19): the LoRA kernels' loads before the wait and 16 bytes wide, the norm's delta of the
# GEMM before computed before its wait (that GEMM triggering it early). kbench (single kernels and
# GEMM->norm pairs) main (.variants/m/base/src) against this tree; the LoRA step's bench, both; the GPU tests.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/m2; mkdir -p $R
trap 'tar czf $OUT/m2.tgz -C $OUT m2' EXIT
for t in base new base2 new2; do
  case $t in base*) P=.variants/m/base/src ;; *) P=src ;; esac
  echo "== kbench $t"; PYTHONPATH=$P OUT=$R CASES=32x16 timeout 200 python3 .variants/m/kbench.py > $R/kbench.$t.txt 2>&1
  mv $R/kbench.json $R/kbench.$t.json 2>/dev/null; tail -32 $R/kbench.$t.txt
done
for t in base new new2 base2; do
  case $t in base*) P=.variants/m/base/src ;; *) P=src ;; esac
  echo "== bench $t $(date +%T)"
  PYTHONPATH=$P timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$t.json 2>$R/lora.$t.err | grep -A4 "workload" | tee $R/lora.$t.txt
done
echo "== gpu tests $(date +%T)"
PYTHONPATH=src:tests timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu -k "lora or norm or skinny or sync_free" 2>&1 | tail -15 | tee $R/gpu_tests.txt
date +%T
