#!/usr/bin/env bash
# client-and-HTTP share of TTFT against a stand-in engine (light_engine.py): its first token after FIRST_S,
# the API process's loop and the client's loop sleeping or spinning (spin.py)
PORT=${PORT:-8141}
PY=${PY:-python3}
BS="--workload mixed --requests 40 --prompt-range 128,128 --output-range 16,16 --max-concurrency 1"
for rep in 1 2; do
for cfg in "0 0 0" "0.002 0 0" "0.002 1 0" "0.002 0 1" "0.002 1 1"; do
  set -- $cfg
  FIRST_S=$1 API_SPIN=$2 $PY .variants/light/serve_light.py $PORT > /tmp/light.srv.log 2>&1 &
  S=$!
  for _ in $(seq 100); do curl -sf -m 2 http://127.0.0.1:$PORT/health >/dev/null && break; sleep 0.2; done
  if [ $3 == 1 ]; then C="$PY .variants/light/spin.py client"; else C="$PY -m slipstream"; fi
  echo "== first $1 s, API spin $2, client spin $3"
  $C bench-serve --url http://127.0.0.1:$PORT $BS --label f$1a$2c$3 2>/dev/null | grep -A2 "TTFT p50\|TTFT path" \
    | grep -v "^--" | sed -n '2p;4p'
  kill $S; wait $S 2>/dev/null
done
done
