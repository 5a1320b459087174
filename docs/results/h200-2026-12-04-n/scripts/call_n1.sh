#!/usr/bin/env bash
# run n, call 1 (issue 19): the LoRA step's bench on main, on branch lora-expand-apart (the delta in programs of
# its own), and on main with only qkv's (nq) or only gate_up's (ng) expand taken out (timing only, tokens wrong);
# alternating; the second main and branch runs with --profile (the step's GPU idle).
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/n1; mkdir -p $R
trap 'tar czf $OUT/n1.tgz -C $OUT n1' EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $R/gpu.txt
for t in main branch nq ng branch2 main2; do
  case $t in main*) P=src ;; branch*) P=.variants/n/branch/src ;; *) P=.variants/n/$t/src ;; esac
  case $t in *2) X=--profile ;; *) X= ;; esac
  echo "== $t $(date +%T)"
  PYTHONPATH=$P timeout 140 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined $X --out $R/lora.$t.json > $R/lora.$t.txt 2>$R/lora.$t.err
  grep -A4 "workload" $R/lora.$t.txt; grep -A12 -i "idle" $R/lora.$t.txt | head -14
done
date +%T
