#!/usr/bin/env bash
# run q, call 3: main's server (b) and variants (.variants/q/B, env flags): the queued reply encoded
# before the enqueue (c1), the API loop and the engine's idle intake polling (se), both (sec1).
# Each: a raw-socket client one at a time (60), bench-serve one at a time (40, aiohttp), Poisson 20 / 50
# req/s (the mixed workload's 384 requests, as offline). Offline beside: ttft in two processes, mixed at 20/50.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/q3; mkdir -p $R
M=random:qwen2.5-0.5b
export PYTHONPATH=.variants/q/B/src:/tmp/site
timeout 150 python3 -m slipstream bench --model $M --mode pipelined --workload ttft,mixed --request-rate 20,50 \
  --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
timeout 60 python3 -m slipstream bench --model $M --mode pipelined --workload ttft --ttft-lengths 128 \
  --out $R/offline.ttft2.json > $R/offline.ttft2.txt 2>>$R/offline.err
grep -h "^ttft\|^mixed" $R/offline*.txt
for v in ${VARIANTS:-b c1 se sec1}; do
  T=$R/$v; mkdir -p $T
  unset SPIN_API SPIN_ENGINE EARLY_REPLY
  case $v in c1) export EARLY_REPLY=1;; se) export SPIN_API=1 SPIN_ENGINE=1;; sec1) export SPIN_API=1 SPIN_ENGINE=1 EARLY_REPLY=1;; esac
  python3 -m slipstream serve --model $M --port 8100 > $T/serve.log 2>&1 &
  S=$!
  unset SPIN_API SPIN_ENGINE EARLY_REPLY
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  timeout 60 python3 .variants/q/raw_ttft.py 8100 60 > $T/raw.txt 2>&1
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $v --out $T/light.json > $T/light.txt 2>/dev/null
  timeout 60 python3 .variants/q/raw_ttft.py 8100 60 > $T/raw2.txt 2>&1
  timeout 120 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --request-rate 20,50 \
    --label $v --out $T/poisson.json > $T/poisson.txt 2>/dev/null
  kill -TERM $S; sleep 4; kill -KILL $S 2>/dev/null; pkill -KILL -f "multiprocessing.spawn" 2>/dev/null; sleep 1
  echo "== $v"; cat $T/raw.txt $T/raw2.txt; grep -h "^mixed |" $T/*.txt | cut -c1-130; grep -h "rate [0-9i].*:" $T/*.txt
done
tar czf $OUT/q3.tgz -C $OUT q3
