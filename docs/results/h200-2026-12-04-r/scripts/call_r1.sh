#!/usr/bin/env bash
# run r, call 1: the engine's wire, ZMQ (main, 8e0c1eb, in .variants/r/main) against the Unix socket pair
# (this tree), alternating, with --busy-poll (twice each) and without (once each). Each server: a raw-socket
# client one at a time (60, fresh prompts), bench-serve one at a time (40), Poisson 20 / 50 req/s of the
# mixed workload. All at once through the new wire. Offline beside (two processes).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/r1; mkdir -p $R
M=random:qwen2.5-0.5b
git log -1 --format=%h > $R/commit.txt 2>/dev/null
PYTHONPATH=src:/tmp/site timeout 170 python3 -m slipstream bench --model $M --mode pipelined --workload ttft,mixed \
  --request-rate inf,20,50 --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
PYTHONPATH=src:/tmp/site timeout 60 python3 -m slipstream bench --model $M --mode pipelined --workload ttft \
  --ttft-lengths 128 --out $R/offline.ttft2.json > $R/offline.ttft2.txt 2>>$R/offline.err
grep -h "^ttft\|^mixed" $R/offline*.txt
seed=100
for v in zbp ubp zbp2 ubp2 z u; do
  T=$R/$v; mkdir -p $T
  flag=; [[ $v == *bp* ]] && flag=--busy-poll
  src=src; [[ $v == z* ]] && src=.variants/r/main/src
  export PYTHONPATH=$src:/tmp/site
  python3 -m slipstream serve --model $M --port 8100 $flag > $T/serve.log 2>&1 &
  S=$!
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  seed=$((seed + 1)); timeout 60 python3 .variants/r/raw_ttft.py 8100 60 $seed > $T/raw.txt 2>&1
  timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 40 \
    --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $v --out $T/light.json > $T/light.txt 2>/dev/null
  seed=$((seed + 1)); timeout 60 python3 .variants/r/raw_ttft.py 8100 60 $seed > $T/raw2.txt 2>&1
  timeout 120 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --request-rate 20,50 \
    --label $v --out $T/poisson.json > $T/poisson.txt 2>/dev/null
  if [ $v == ubp ]; then
    timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --label $v \
      --out $T/saturated.json > $T/saturated.txt 2>/dev/null
  fi
  kill -TERM $S; sleep 4; kill -KILL $S 2>/dev/null; pkill -KILL -f "multiprocessing.spawn" 2>/dev/null; sleep 1
  echo "== $v"; cat $T/raw.txt $T/raw2.txt; tail -n 8 $T/light.txt | cut -c1-160; tail -n 6 $T/poisson.txt | cut -c1-160
done
tar czf $OUT/r1.tgz -C $OUT r1
