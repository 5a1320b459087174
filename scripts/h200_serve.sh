#!/usr/bin/env bash
# The server run on the H200 (issue 18, docs/benchmarks.md): the carried wheels installed (.whl:
# fastapi, starlette, pydantic, uvicorn with uvloop and httptools, pyzmq, msgspec, orjson,
# prometheus-client, httpx, aiohttp, xgrammar and what they need), the GPU tests of the step clock,
# then per mode, in one call: the offline engine's mixed and one-at-a-time (ttft) workloads, a `slipstream
# serve` of that mode on the same shape, and bench-serve through it: the mixed workload all at once
# and at 25/50/90% of its capacity, and one request at a time (128-token prompts, 16 output tokens,
# as the offline ttft run) for what the HTTP path adds to TTFT and ITL. MODES and MODEL pick a subset.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=src:/tmp/site SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=${OUT:-results}/s
mkdir -p "$R"
MODEL=${MODEL:-qwen2.5-0.5b}
PORT=8100
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$R/gpu.txt"
git log -1 --format=%h 2>/dev/null | tee "$R/commit.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "step_clock or never_synchronizes" \
  2>&1 | tail -3 | tee "$R/gpu_tests.txt"
for mode in ${MODES:-pipelined blocking}; do
  echo "== offline $mode"
  timeout 240 python3 -m slipstream bench --model "random:$MODEL" --mode "$mode" --workload mixed,ttft \
    --ttft-lengths 128 --out "$R/offline.$mode.json" 2>"$R/offline.$mode.err" | tee "$R/offline.$mode.txt"
  echo "== serve $mode"
  python3 -m slipstream serve --model "random:$MODEL" --mode "$mode" --port $PORT >"$R/serve.$mode.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
  timeout 240 python3 -m slipstream bench-serve --url "http://127.0.0.1:$PORT" --workload mixed \
    --request-rate inf,25%,50%,90% --label "$mode" --out "$R/serve.$mode.json" 2>/dev/null | tee "$R/serve.$mode.txt"
  timeout 120 python3 -m slipstream bench-serve --url "http://127.0.0.1:$PORT" --workload mixed --requests 20 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label "$mode" --out "$R/light.$mode.json" \
    2>/dev/null | tee "$R/light.$mode.txt"
  curl -s "http://127.0.0.1:$PORT/metrics" >"$R/metrics.$mode.txt"
  kill -TERM $server
  wait $server
done
tar czf "${OUT:-results}/serve.tgz" -C "$(dirname "$R")" s
