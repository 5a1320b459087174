#!/usr/bin/env bash
# run r, call 2: the committed tree (424c1fd, the Unix socket pair). First `serve` plain and with --busy-poll:
# the raw client one at a time (2 x 60, fresh prompts), Poisson 20 / 50 req/s of the mixed workload; offline
# beside in a second process (ttft and Poisson 20 / 50). Then scripts/h200_serve.sh (pipelined and blocking:
# all at once, 25/50/90% of capacity, cold connections, one at a time), its GPU tests skipped.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site
R=$OUT/r2; mkdir -p $R
M=random:qwen2.5-0.5b
git log -1 --format=%h > $R/commit.txt 2>/dev/null
timeout 120 python3 -m slipstream bench --model $M --mode pipelined --workload ttft,mixed --request-rate 20,50 \
  --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
grep -h "^ttft\|^mixed" $R/offline.txt
seed=200
for v in u ubp; do
  T=$R/$v; mkdir -p $T
  flag=; [[ $v == ubp ]] && flag=--busy-poll
  python3 -m slipstream serve --model $M --port 8100 $flag > $T/serve.log 2>&1 &
  S=$!
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  for k in 1 2; do seed=$((seed + 1)); timeout 60 python3 .variants/r/raw_ttft.py 8100 60 $seed > $T/raw$k.txt 2>&1; done
  timeout 100 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --request-rate 20,50 \
    --label $v --out $T/poisson.json > $T/poisson.txt 2>/dev/null
  kill -TERM $S; sleep 4; kill -KILL $S 2>/dev/null; pkill -KILL -f "multiprocessing.spawn" 2>/dev/null; sleep 1
  echo "== $v"; cat $T/raw*.txt; tail -n 6 $T/poisson.txt | cut -c1-160
done
tar czf $OUT/r2.tgz -C $OUT r2 && rm -rf $OUT/r2
OUT=$OUT TESTS=0 bash scripts/h200_serve.sh > $OUT/h200_serve.txt 2>&1
grep -h "^mixed\|^ttft\|rate \|^  " $OUT/h200_serve.txt | cut -c1-200
rm -rf $OUT/s
