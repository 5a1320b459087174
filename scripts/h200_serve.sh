#!/usr/bin/env bash
# The server run on the H200 (issue 18, docs/benchmarks.md): the carried wheels installed (.whl:
# fastapi, starlette, pydantic, uvicorn with uvloop and httptools, msgspec, orjson,
# prometheus-client, httpx, aiohttp, xgrammar and what they need), the GPU tests of the step clock,
# then per mode, in one call: the offline engine's mixed and one-at-a-time (ttft) workloads, a `slipstream
# serve` of that mode on the same shape, and bench-serve through it: the mixed workload all at once
# and at 25/50/90% of its capacity (connections opened before each burst's clock, then once more
# with cold ones), and one request at a time (128-token prompts, 16 output tokens,
# as the offline ttft run) for what the HTTP path adds to TTFT and ITL, with the TTFT split by hop.
# MODES, OFFLINE_MODES and MODEL pick a subset, TESTS=0 skips the tests. Each step has a time limit; a
# bench-serve that fails or runs out of time has both server processes print their threads' stacks into
# the server's log (SIGUSR1).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=src:/tmp/site SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
python3 -c "import fastapi, uvicorn, msgspec, orjson, prometheus_client, aiohttp" || exit 1
R=${OUT:-results}/s
mkdir -p "$R"
MODEL=${MODEL:-qwen2.5-0.5b}
PORT=8100
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$R/gpu.txt"
git log -1 --format=%h 2>/dev/null | tee "$R/commit.txt"
if [[ ${TESTS:-1} == 1 ]]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "step_clock or never_synchronizes" \
    2>&1 | tail -3 | tee "$R/gpu_tests.txt"
fi
stop() {  # stop PID: SIGTERM (the server drains), SIGKILL after 40 s
  kill -TERM "$1"
  for _ in $(seq 40); do kill -0 "$1" 2>/dev/null || return 0; sleep 1; done
  pkill -KILL -P "$1"; kill -KILL "$1"
}
for mode in ${MODES:-pipelined blocking}; do
  if [[ " ${OFFLINE_MODES:-pipelined blocking} " == *" $mode "* ]]; then
    echo "== offline $mode"
    timeout 150 python3 -m slipstream bench --model "random:$MODEL" --mode "$mode" --workload mixed,ttft \
      --ttft-lengths 128 --out "$R/offline.$mode.json" 2>"$R/offline.$mode.err" | tee "$R/offline.$mode.txt"
  fi
  echo "== serve $mode"
  python3 -m slipstream serve --model "random:$MODEL" --mode "$mode" --port $PORT >"$R/serve.$mode.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
  timeout 150 python3 -m slipstream bench-serve --url "http://127.0.0.1:$PORT" --workload mixed \
    --request-rate inf,25%,50%,90% --label "$mode" --out "$R/serve.$mode.json" 2>"$R/bench-serve.$mode.err" \
    | tee "$R/serve.$mode.txt"
  saturated=${PIPESTATUS[0]}
  timeout 60 python3 -m slipstream bench-serve --url "http://127.0.0.1:$PORT" --workload mixed --cold-connections \
    --label "$mode" --out "$R/cold.$mode.json" 2>>"$R/bench-serve.$mode.err" | tee "$R/cold.$mode.txt"
  timeout 60 python3 -m slipstream bench-serve --url "http://127.0.0.1:$PORT" --workload mixed --requests 20 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label "$mode" --out "$R/light.$mode.json" \
    2>>"$R/bench-serve.$mode.err" | tee "$R/light.$mode.txt"
  light=${PIPESTATUS[0]}
  curl -s -m 10 "http://127.0.0.1:$PORT/metrics" >"$R/metrics.$mode.txt"
  if [[ $saturated != 0 || $light != 0 ]]; then  # every thread's stack, both processes, into the server's log
    echo "bench-serve exited $saturated / $light: stacks in serve.$mode.log"
    pkill -USR1 -P $server; kill -USR1 $server; sleep 3
  fi
  stop $server
  tar czf "${OUT:-results}/serve.tgz" -C "$(dirname "$R")" s
done
