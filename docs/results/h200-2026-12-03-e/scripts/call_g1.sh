#!/usr/bin/env bash
# run e, call 1 (diagnostic): do deep CPU idle states cost the constrained tick (issue 16) and the light-load
# TTFT (issue 18)? wake.py (thread and process wake-ups), the constrained bench at 64 rows and the server one
# request at a time, each without and with /dev/cpu_dma_latency held at 0, alternating.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site
R=$OUT/g1; mkdir -p $R
nproc; lscpu | grep -i "model name\|MHz\|NUMA node"
hold() { python3 .variants/wake/hold_latency.py & H=$!; sleep 0.5; }
unhold() { kill $H; wait $H 2>/dev/null; }
echo "== wake $(date +%T)"
python3 .variants/wake/wake.py 300 | tee $R/wake.off.txt
hold; python3 .variants/wake/wake.py 300 | tee $R/wake.on.txt; unhold
B="--model random:qwen2.5-0.5b --streams 64 --max-tokens 1024 --constrained 0,1 --mode pipelined --profile"
for i in 1 2; do
  for st in off on; do
    echo "== con $st $i $(date +%T)"
    [ $st == on ] && hold
    timeout 120 python3 -m slipstream bench $B --out $R/con.$st.$i.json 2>/dev/null | grep -v "^wrote" | head -12
    [ $st == on ] && unhold
  done
done
echo "== serve $(date +%T)"
python3 -m slipstream serve --model random:qwen2.5-0.5b --port 8100 >$R/serve.log 2>&1 &
S=$!
for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
for i in 1 2 3; do
  for st in off on; do
    echo "== light $st $i $(date +%T)"
    [ $st == on ] && hold
    timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 --workload mixed --requests 40 \
      --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --label $st --out $R/light.$st.$i.json 2>>$R/bs.err | tail -8
    [ $st == on ] && unhold
  done
done
kill -TERM $S; sleep 5
echo "== offline ttft $(date +%T)"
timeout 90 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined --workload ttft --ttft-lengths 128 \
  --out $R/offline.off.json 2>/dev/null | tail -4
hold; timeout 90 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined --workload ttft --ttft-lengths 128 \
  --out $R/offline.on.json 2>/dev/null | tail -4; unhold
tar czf $OUT/g1.tgz -C $OUT g1
date +%T
