#!/usr/bin/env bash
# run q, call 4: the tree as it is, `slipstream serve` without and with --busy-poll (twice). Each: a
# raw-socket client one at a time (60), bench-serve one at a time (40, aiohttp), Poisson 20 / 50 req/s
# (the mixed workload's 384 requests, as offline); all at once with --busy-poll. Offline beside: ttft in
# two processes, mixed all at once and at 20/50.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/q4; mkdir -p $R
M=random:qwen2.5-0.5b
export PYTHONPATH=src:/tmp/site
git log -1 --format=%h > $R/commit.txt 2>/dev/null
timeout 170 python3 -m slipstream bench --model $M --mode pipelined --workload ttft,mixed --request-rate inf,20,50 \
  --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
timeout 60 python3 -m slipstream bench --model $M --mode pipelined --workload ttft --ttft-lengths 128 \
  --out $R/offline.ttft2.json > $R/offline.ttft2.txt 2>>$R/offline.err
grep -h "^ttft\|^mixed" $R/offline*.txt
seed=1
for v in b bp bp2; do
  T=$R/$v; mkdir -p $T
  flag=; [ $v != b ] && flag=--busy-poll
  python3 -m slipstream serve --model $M --port 8100 $flag > $T/serve.log 2>&1 &
  S=$!
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  seed=$((seed + 1)); timeout 60 python3 .variants/q/raw_ttft.py 8100 60 $seed > $T/raw.txt 2>&1
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $v --out $T/light.json > $T/light.txt 2>/dev/null
  seed=$((seed + 1)); timeout 60 python3 .variants/q/raw_ttft.py 8100 60 $seed > $T/raw2.txt 2>&1
  timeout 120 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --request-rate 20,50 \
    --label $v --out $T/poisson.json > $T/poisson.txt 2>/dev/null
  if [ $v == bp ]; then
    timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --label $v \
      --out $T/saturated.json > $T/saturated.txt 2>/dev/null
  fi
  top -b -n 1 | head -14 > $T/top.txt
  kill -TERM $S; sleep 4; kill -KILL $S 2>/dev/null; pkill -KILL -f "multiprocessing.spawn" 2>/dev/null; sleep 1
  echo "== $v"; cat $T/raw.txt $T/raw2.txt; grep -h "^mixed |" $T/*.txt | cut -c1-130; grep -h "rate [0-9i].*:" $T/*.txt
done
tar czf $OUT/q4.tgz -C $OUT q4
