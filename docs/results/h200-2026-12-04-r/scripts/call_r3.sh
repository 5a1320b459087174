#!/usr/bin/env bash
# run r, call 3: the committed tree again (424c1fd), for the spread between server processes: `serve
# --busy-poll` three times and plain `serve` once, each one at a time (the raw client 2 x 60, bench-serve 40)
# and at Poisson 20 req/s; offline beside in two processes (ttft; one also at Poisson 20).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site
R=$OUT/r3; mkdir -p $R
M=random:qwen2.5-0.5b
timeout 100 python3 -m slipstream bench --model $M --mode pipelined --workload ttft,mixed --request-rate 20 \
  --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
timeout 60 python3 -m slipstream bench --model $M --mode pipelined --workload ttft --ttft-lengths 128 \
  --out $R/offline2.json > $R/offline2.txt 2>>$R/offline.err
grep -h "^ttft\|^mixed" $R/offline*.txt
seed=300
for v in ubp1 u ubp2 ubp3; do
  T=$R/$v; mkdir -p $T
  flag=; [[ $v == ubp* ]] && flag=--busy-poll
  python3 -m slipstream serve --model $M --port 8100 $flag > $T/serve.log 2>&1 &
  S=$!
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  for k in 1 2; do seed=$((seed + 1)); timeout 60 python3 .variants/r/raw_ttft.py 8100 60 $seed > $T/raw$k.txt 2>&1; done
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $v --out $T/light.json > $T/light.txt 2>/dev/null
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --request-rate 20 \
    --label $v --out $T/poisson.json > $T/poisson.txt 2>/dev/null
  kill -TERM $S; sleep 4; kill -KILL $S 2>/dev/null; pkill -KILL -f "multiprocessing.spawn" 2>/dev/null; sleep 1
  echo "== $v"; cat $T/raw*.txt; grep -h "^mixed" $T/light.txt $T/poisson.txt | cut -c1-120; grep -h "rate " $T/light.txt $T/poisson.txt
done
tar czf $OUT/r3.tgz -C $OUT r3 && rm -rf $OUT/r3
