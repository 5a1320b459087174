#!/usr/bin/env bash
# run h, call 2 (issues 16, 18): main (42ac60f, with 8730a80's batch shipped beside the fill) offline and
# served, pipelined: the mixed workload all at once and TTFT one request at a time, offline against served.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/h2; mkdir -p $R
trap 'tar czf $OUT/h2.tgz -C $OUT h2' EXIT
PORT=8100
echo "== offline $(date +%T)"
timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined --workload mixed,ttft \
  --ttft-lengths 128 --out $R/offline.json 2>$R/offline.err | tee $R/offline.txt
echo "== serve $(date +%T)"
python3 -m slipstream serve --model random:qwen2.5-0.5b --mode pipelined --port $PORT >$R/serve.log 2>&1 &
server=$!
for _ in $(seq 120); do curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
timeout 100 python3 -m slipstream bench-serve --url "http://127.0.0.1:$PORT" --workload mixed --request-rate inf \
  --label sat --out $R/sat.json 2>$R/bench-serve.err | tee $R/sat.txt
for i in 1 2; do
  timeout 60 python3 -m slipstream bench-serve --url "http://127.0.0.1:$PORT" --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label light$i --out $R/light$i.json \
    2>>$R/bench-serve.err | tee $R/light$i.txt
done
curl -s -m 10 "http://127.0.0.1:$PORT/metrics" | grep -v "^#" | grep -i "kv\|finish" > $R/metrics.txt
kill -TERM $server; wait $server
echo "== offline again $(date +%T)"
timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined --workload ttft \
  --ttft-lengths 128 --out $R/offline2.json 2>>$R/offline.err | tee $R/offline2.txt
date +%T
