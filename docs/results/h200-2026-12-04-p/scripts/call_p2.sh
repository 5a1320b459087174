#!/usr/bin/env bash
# run p, call 2: main (A) against the change (B), both with trace stamps, alternating: a lone
# request's path (trace_client), bench-serve one at a time and at Poisson 20 / 50 req/s; the
# offline engine of each tree beside.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/p2; mkdir -p $R
M=random:qwen2.5-0.5b
for t in A B; do
  PYTHONPATH=.variants/p/$t/src:/tmp/site timeout 150 python3 -m slipstream bench --model $M --mode pipelined \
    --workload mixed,ttft --request-rate 20,50 --ttft-lengths 128 --out $R/offline.$t.json > $R/offline.$t.txt 2>$R/offline.$t.err
  echo "== offline $t"; grep -v "^$" $R/offline.$t.txt | tail -4
done
for round in 1 2; do
for t in A B; do
  T=$R/$t.$round; mkdir -p $T
  TRACE_DIR=$T PYTHONPATH=.variants/p/$t/src:/tmp/site python3 -m slipstream serve --model $M --port 8100 > $T/serve.log 2>&1 &
  S=$!
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  TRACE_DIR=$T PYTHONPATH=/tmp/site timeout 60 python3 .variants/p/trace_client.py http://127.0.0.1:8100 60
  PYTHONPATH=.variants/p/$t/src:/tmp/site timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 \
    --workload mixed --requests 40 --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $t$round \
    --out $T/light.json > $T/light.txt 2>&1
  PYTHONPATH=.variants/p/$t/src:/tmp/site timeout 90 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 \
    --workload mixed --request-rate 20,50 --label $t$round --out $T/poisson.json > $T/poisson.txt 2>&1
  kill -TERM $S; sleep 5; kill -KILL $S 2>/dev/null
  echo "== $t $round"; grep "|" $T/light.txt | tail -1; grep "|" $T/poisson.txt | tail -2; grep "rate" $T/light.txt $T/poisson.txt | grep ":" | tail -3
done
done
python3 .variants/p/spans.py $R/A.1 $R/B.1 $R/A.2 $R/B.2 | tee $R/spans.txt
tar czf $OUT/p2.tgz -C $OUT p2
