#!/usr/bin/env bash
# run y, call 7: issue 15's targets on the final tree, in priority order (later parts skipped when time runs short):
# Qwen traffic (both modes, Poisson), the prefill anchor, Qwen --short, Qwen decode, Phi traffic, Phi --short, interference again, GPU tests
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src
LIMIT=${LIMIT:-380}
left() { [ $SECONDS -lt $((LIMIT - $1)) ]; }
traffic() {
  echo "== traffic $1 $(date +%T)"
  timeout 200 python3 -m slipstream bench --model random:$1 --workload mixed,prefill,ttft,interference --request-rate $2 \
    --decoding 32 --arrival-tokens 1024 --ttft-lengths 128,1024 --out /tmp/traffic.$1.json 2>/dev/null | grep -v "^wrote"
}
short() {
  echo "== short $1 $(date +%T)"
  timeout 60 python3 -m slipstream bench --model random:$1 --streams 1,8,32 --prompt-tokens 64 --short 2>/dev/null | tail -8
}
traffic qwen2.5-0.5b inf,50%,90%
echo "== anchor $(date +%T)"; timeout 60 python3 .anchors/prefill_floor.py 2>/dev/null
short qwen2.5-0.5b
echo "== decode qwen $(date +%T)"
timeout 60 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 1,32,64 --mode pipelined --prompt-tokens 64 --max-tokens 128 2>/dev/null | tail -4
left 100 && traffic phi-1.5 inf
left 40 && short phi-1.5
left 40 && { echo "== interference again $(date +%T)"; timeout 40 python3 -m slipstream bench --model random:qwen2.5-0.5b --workload interference --mode pipelined --decoding 32 --arrival-tokens 1024 2>/dev/null | grep -E "^(interference|decode)"; }
if left 90; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
  echo "== tests $(date +%T)"; PYTHONPATH=src:/tmp/site timeout 85 python3 -m pytest -q -x tests/test_gpu.py 2>&1 | tail -3
fi
tar czf $OUT/traffic.tgz -C /tmp $(cd /tmp && ls traffic.*.json)
echo "done at $SECONDS s, $(date +%T)"
