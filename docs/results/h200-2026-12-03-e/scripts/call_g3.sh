#!/usr/bin/env bash
# run e, call 3 (issue 18, light-load TTFT): where does "client and HTTP" grow on this host? A stand-in
# engine (first token after 0 or 2 ms), the API's and the client's loops sleeping or spinning (run_light.sh);
# then the real engine, one request at a time, against a plain server and one whose API loop spins.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site
R=$OUT/g3; mkdir -p $R
echo "== stand-in $(date +%T)"
timeout 150 bash .variants/light/run_light.sh 2>&1 | tee $R/standin.txt
echo "== real servers $(date +%T)"
python3 -m slipstream serve --model random:qwen2.5-0.5b --port 8100 >$R/serve.plain.log 2>&1 &
P=$!
python3 .variants/light/spin.py api serve --model random:qwen2.5-0.5b --port 8101 >$R/serve.spin.log 2>&1 &
Q=$!
for port in 8100 8101; do for _ in $(seq 150); do curl -sf -m 5 http://127.0.0.1:$port/health >/dev/null && break; sleep 1; done; done
BS="--workload mixed --requests 40 --prompt-range 128,128 --output-range 16,16 --max-concurrency 1"
for rep in 1 2 3; do
  for cfg in "8100 0" "8101 0" "8101 1" "8100 1"; do
    set -- $cfg
    if [ $2 == 1 ]; then C="python3 .variants/light/spin.py client"; else C="python3 -m slipstream"; fi
    echo "== port $1 (8101: API spins), client spin $2"
    timeout 60 $C bench-serve --url http://127.0.0.1:$1 $BS --label p$1c$2 --out $R/light.$1.$2.$rep.json 2>>$R/bs.err \
      | grep -A2 "TTFT p50\|TTFT path" | grep -v "^--" | sed -n '2p;4p'
  done
done
kill -TERM $P $Q; sleep 8
echo "== offline $(date +%T)"
timeout 90 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined --workload ttft --ttft-lengths 128 \
  --out $R/offline.json 2>/dev/null | tail -3
tar czf $OUT/g3.tgz -C $OUT g3
date +%T
