#!/usr/bin/env bash
# run y, call 3: issue 15's targets on the final tree: anchor; traffic per shape, both modes; --short; decode headline; interference repeats; GPU tests
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
echo "== anchor $(date +%T)"
timeout 90 python3 .anchors/prefill_floor.py 2>/dev/null
for m in qwen2.5-0.5b phi-1.5; do
  RATES=inf; [ $m = qwen2.5-0.5b ] && RATES=inf,50%,90%
  echo "== traffic $m $(date +%T)"
  timeout 200 python3 -m slipstream bench --model random:$m --workload mixed,prefill,ttft,interference --request-rate $RATES \
    --decoding 32 --arrival-tokens 1024 --ttft-lengths 128,1024 --out /tmp/traffic.$m.json 2>/dev/null | grep -v "^wrote"
  echo "== short $m $(date +%T)"
  timeout 60 python3 -m slipstream bench --model random:$m --streams 1,8,32 --prompt-tokens 64 --short 2>/dev/null | tail -8
  echo "== decode $m $(date +%T)"
  timeout 60 python3 -m slipstream bench --model random:$m --streams 1,32,64 --mode pipelined --prompt-tokens 64 --max-tokens 128 2>/dev/null | tail -4
done
for i in 1 2; do
  echo "== interference again $i $(date +%T)"
  timeout 60 python3 -m slipstream bench --model random:qwen2.5-0.5b --workload interference --mode pipelined --decoding 32 --arrival-tokens 1024 2>/dev/null | grep -E "^(interference|decode)"
done
echo "== tests $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 200 python3 -m pytest -q -x tests/test_gpu.py 2>&1 | tail -3
tar czf $OUT/traffic.tgz -C /tmp $(cd /tmp && ls traffic.*.json)
date +%T
