#!/usr/bin/env bash
# next session, call 2 (issue 17; run c measured aa3c8a6 on the H200: 1 client p50 30.0 ms, image step 18.6 ms):
# an image request's host parts at 1 client (md_launch.py: the image step's launch read 3.5 ms at its p99 in run b),
# then md2-query at 1 and 64 clients, pipelined, with the profiler's split.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/e2; mkdir -p $R
echo "== md_launch $(date +%T)"
PYTHONPATH=src OUT=$R timeout 200 python3 .variants/md_launch.py 2>$R/md_launch.err | tee $R/md_launch.txt
echo "== md2-query $(date +%T)"
PYTHONPATH=src timeout $((570 - SECONDS)) python3 -m slipstream bench --model random:moondream2 --workload md2-query \
  --streams 1,64 --max-num-seqs 64 --mode pipelined --profile --out $R/md2-query.json 2>$R/md2-query.err | tee $R/md2-query.txt
date +%T
