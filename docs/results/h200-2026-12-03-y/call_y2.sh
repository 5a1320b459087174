#!/usr/bin/env bash
# run y, call 2: GC census + host split, ITL probe, CLI interference on the tree with deferred registration
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src
echo "== hostsplit $(date +%T)"
REPS=2 timeout 150 python3 .variants/hostsplit.py 2>&1 | grep -v -i "warn\|capturing" | cut -c1-1500
echo "== probe $(date +%T)"
CHUNKS=320,320,320 timeout 120 python3 .variants/itl_probe.py $OUT/itl.json 2>&1 | grep -E "^chunk"
echo "== CLI $(date +%T)"
timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --workload interference --mode pipelined --decoding 32 --arrival-tokens 1024 2>&1 | grep -E "^(workload|interference|decode)"
date +%T
