#!/usr/bin/env bash
# run p, call 3: the change (B, traced) plain, with the API loop spinning (SPIN_API), with the API
# process on one CPU and the engine's main and ZMQ I/O threads on another (PIN_*), and both; then
# B again. Each: a lone request's path, bench-serve one at a time and at Poisson 20 / 50 req/s.
# The offline engine beside (mixed all at once, 20, 50; ttft in three processes); bench-serve
# all at once against the plain server.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/p3; mkdir -p $R
M=random:qwen2.5-0.5b
export PYTHONPATH=.variants/p/B/src:/tmp/site
timeout 150 python3 -m slipstream bench --model $M --mode pipelined --workload mixed,ttft --request-rate inf,20,50 \
  --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
for i in 1 2; do
  timeout 60 python3 -m slipstream bench --model $M --mode pipelined --workload ttft --ttft-lengths 128 \
    --out $R/offline.ttft$i.json > $R/offline.ttft$i.txt 2>>$R/offline.err
done
grep "|" $R/offline*.txt
for v in b s p sp b2; do
  T=$R/$v; mkdir -p $T
  unset SPIN_API PIN_API PIN_ENGINE
  case $v in s) export SPIN_API=1;; p) export PIN_API=2 PIN_ENGINE=6;; sp) export SPIN_API=1 PIN_API=2 PIN_ENGINE=6;; esac
  TRACE_DIR=$T python3 -m slipstream serve --model $M --port 8100 > $T/serve.log 2>&1 &
  S=$!
  unset SPIN_API PIN_API PIN_ENGINE
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  TRACE_DIR=$T timeout 60 python3 .variants/p/trace_client.py http://127.0.0.1:8100 60
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $v --out $T/light.json > $T/light.txt 2>/dev/null
  timeout 90 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --request-rate 20,50 \
    --label $v --out $T/poisson.json > $T/poisson.txt 2>/dev/null
  if [ $v == b ]; then
    timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --label $v \
      --out $T/saturated.json > $T/saturated.txt 2>/dev/null
  fi
  kill -TERM $S; sleep 5; kill -KILL $S 2>/dev/null
  echo "== $v"; grep -h "^mixed |\|rate [0-9i].*:" $T/*.txt | cut -c1-200
done
python3 .variants/p/spans.py $R/b $R/s $R/p $R/sp $R/b2 > $R/spans.txt
tar czf $OUT/p3.tgz -C $OUT p3
