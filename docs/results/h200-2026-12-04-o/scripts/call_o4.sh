#!/usr/bin/env bash
# run o, call 4 (issue 19), from branch lora-shrink-in-grid's checkout (o's and down's shrinks in their GEMMs' grids,
# cleaned up): the LoRA step on it and on main before it (.variants/o/prev/src = d86b3c3), alternating, the second
# run of the branch with --profile (the step's GPU idle); then the GPU tests on the branch.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/x4; mkdir -p $R
trap 'tar czf $OUT/x4.tgz -C $OUT x4' EXIT
for t in new prev new2; do
  case $t in new*) P=src ;; *) P=.variants/o/prev/src ;; esac
  case $t in new2) X=--profile ;; *) X= ;; esac
  echo "== $t $(date +%T)"
  PYTHONPATH=$P timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined $X --out $R/lora.$t.json > $R/lora.$t.txt 2>$R/lora.$t.err
  cut -c1-200 $R/lora.$t.txt | grep -A4 "workload" || tail -5 $R/lora.$t.err
  grep -E "^\s+pipelined" $R/lora.$t.txt | awk '{print $1, $2, "gpu_idle", $(NF-4), "step", $(NF-3)}'
done
echo "== gpu tests (branch) $(date +%T)"
PYTHONPATH=src:tests timeout 200 python3 -m pytest -q tests/test_gpu.py -m gpu 2>&1 | tail -4 | tee $R/gpu_tests.txt
date +%T
