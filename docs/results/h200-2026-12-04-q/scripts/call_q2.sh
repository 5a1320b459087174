#!/usr/bin/env bash
# run q, call 2: main's server (b) against research variants (.variants/q/B, env flags): the API
# loop spinning and pinned with the engine's intake thread pinned elsewhere (sp), that plus the
# engine's intake polling while the engine is idle (spe), and both spinning unpinned (se). Each: bench-serve one
# at a time (40 x 128-token prompts, 16 outputs) and Poisson 20 / 50 req/s (100 requests);
# all at once for spe; offline ttft in two processes and mixed at 20/50 beside.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/q2; mkdir -p $R
M=random:qwen2.5-0.5b
export PYTHONPATH=.variants/q/B/src:/tmp/site
timeout 150 python3 -m slipstream bench --model $M --mode pipelined --workload mixed,ttft --request-rate inf,20,50 \
  --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
timeout 60 python3 -m slipstream bench --model $M --mode pipelined --workload ttft --ttft-lengths 128 \
  --out $R/offline.ttft2.json > $R/offline.ttft2.txt 2>>$R/offline.err
grep "|" $R/offline*.txt
for v in ${VARIANTS:-b sp spe se b2}; do
  T=$R/$v; mkdir -p $T
  unset SPIN_API PIN_API PIN_ENGINE SPIN_ENGINE
  case $v in sp) export SPIN_API=1 PIN_API=2 PIN_ENGINE=6;; spe) export SPIN_API=1 PIN_API=2 PIN_ENGINE=6 SPIN_ENGINE=1;;
    se) export SPIN_API=1 SPIN_ENGINE=1;; esac
  python3 -m slipstream serve --model $M --port 8100 > $T/serve.log 2>&1 &
  S=$!
  unset SPIN_API PIN_API PIN_ENGINE SPIN_ENGINE
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $v --out $T/light.json > $T/light.txt 2>/dev/null
  timeout 90 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 100 --request-rate 20,50 \
    --label $v --out $T/poisson.json > $T/poisson.txt 2>/dev/null
  if [ $v == spe ] || [ $v == b ]; then
    timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --label $v \
      --out $T/saturated.json > $T/saturated.txt 2>/dev/null
  fi
  top -b -n 1 -H -p $(pgrep -d, -f "slipstream serve") 2>/dev/null | head -20 > $T/top.txt
  kill -TERM $S; sleep 4; kill -KILL $S 2>/dev/null; pkill -KILL -f "multiprocessing.spawn" 2>/dev/null; sleep 1
  echo "== $v"; grep -h "^mixed |" $T/*.txt | cut -c1-220
done
tar czf $OUT/q2.tgz -C $OUT q2
