#!/usr/bin/env bash
# run f, call 3 (issue 18, light-load TTFT): granian against uvicorn for the API process. A stand-in engine
# (first token after 2 ms), then the real engine (random:qwen2.5-0.5b), one request at a time, alternating.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site
R=$OUT/f3; mkdir -p $R
trap 'tar czf $OUT/f3.tgz -C $OUT f3' EXIT
BS="--workload mixed --requests 40 --prompt-range 128,128 --output-range 16,16 --max-concurrency 1"
echo "== stand-in $(date +%T)"
for rep in 1 2; do
  for s in serve_light serve_light_gr; do
    FIRST_S=0.002 python3 .variants/light/$s.py 8141 > $R/standin.$s.log 2>&1 &
    S=$!
    for _ in $(seq 100); do curl -sf -m 2 http://127.0.0.1:8141/health >/dev/null && break; sleep 0.2; done
    echo "== $s"
    timeout 40 python3 -m slipstream bench-serve --url http://127.0.0.1:8141 $BS --label $s 2>/dev/null \
      | grep -A2 "TTFT p50\|TTFT path" | grep -v "^--" | sed -n '2p;4p'
    kill $S; sleep 2; pkill -f "$s.py"; sleep 1
  done
done 2>&1 | tee $R/standin.txt
echo "== real servers $(date +%T)"
python3 -m slipstream serve --model random:qwen2.5-0.5b --port 8100 >$R/serve.uv.log 2>&1 &
P=$!
python3 .variants/light/serve_real_gr.py random:qwen2.5-0.5b 8101 >$R/serve.gr.log 2>&1 &
Q=$!
for port in 8100 8101; do for _ in $(seq 150); do curl -sf -m 5 http://127.0.0.1:$port/health >/dev/null && break; sleep 1; done; done
for rep in 1 2 3; do
  for port in 8100 8101; do
    echo "== port $port (8101: granian)"
    timeout 50 python3 -m slipstream bench-serve --url http://127.0.0.1:$port $BS --label p$port --out $R/light.$port.$rep.json 2>>$R/bs.err \
      | grep -A2 "TTFT p50\|TTFT path" | grep -v "^--" | sed -n '2p;4p'
  done
done 2>&1 | tee $R/real.txt
echo "== saturation $(date +%T)"
for port in 8100 8101; do
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:$port --workload mixed --requests 400 --label sat$port \
    --out $R/sat.$port.json 2>>$R/bs.err | grep -A1 "TTFT p50" | tail -1
done 2>&1 | tee $R/sat.txt
kill -TERM $P $Q; sleep 5; pkill -f serve_real_gr
date +%T
