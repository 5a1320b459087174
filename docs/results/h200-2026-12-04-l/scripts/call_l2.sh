#!/usr/bin/env bash
# run l, call 2 (issue 18): the server's TTFT and ITL against the offline engine's at low load under Poisson
# arrivals (20 and 50 req/s of the mixed workload, ~10% and ~25% of capacity), beside one request at a time.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/l2; mkdir -p $R
trap 'tar czf $OUT/l2.tgz -C $OUT l2' EXIT
PORT=8100
git log -1 --format=%h > $R/commit.txt 2>/dev/null
for round in 1 2; do
  echo "== offline round $round $(date +%T)"
  timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined --workload mixed,ttft \
    --request-rate 20,50 --ttft-lengths 128 --out $R/offline.$round.json 2>$R/offline.$round.err | tee $R/offline.$round.txt
  echo "== served round $round $(date +%T)"
  python3 -m slipstream serve --model random:qwen2.5-0.5b --mode pipelined --port $PORT >$R/serve.$round.log 2>&1 &
  server=$!
  for _ in $(seq 120); do curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
  timeout 120 python3 -m slipstream bench-serve --url http://127.0.0.1:$PORT --workload mixed --request-rate 20,50 \
    --label pipelined --out $R/served.$round.json 2>$R/served.$round.err | tee $R/served.$round.txt
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:$PORT --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label pipelined --out $R/light.$round.json \
    2>>$R/served.$round.err | tee $R/light.$round.txt
  kill -TERM $server; wait $server
done
date +%T
