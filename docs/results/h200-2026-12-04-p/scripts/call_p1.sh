#!/usr/bin/env bash
# run p, call 1: where a lone request's TTFT goes through the server on the H200's host (stamps in
# every process: trsrc = main + trace.patch), unpinned against API and engine each pinned to a CPU;
# wake2.py (cross-CPU and same-CPU wakes); the offline ttft bench beside.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/p1; mkdir -p $R
nproc > $R/host.txt; cat /sys/devices/system/cpu/cpuidle/current_driver >> $R/host.txt 2>&1
PYTHONPATH=src:/tmp/site timeout 120 python3 .variants/p/wake2.py 200 > $R/wake2.txt 2>&1
PYTHONPATH=src:/tmp/site timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined \
  --workload ttft --ttft-lengths 128 --out $R/offline.json > $R/offline.txt 2>$R/offline.err
BS="--workload mixed --requests 40 --prompt-range 128,128 --output-range 16,16 --max-concurrency 1"
for round in 1 2; do
for pin in none split; do
  T=$R/trace.$pin.$round; mkdir -p $T
  if [ $pin == split ]; then export PIN_API=4 PIN_ENGINE=10; else unset PIN_API PIN_ENGINE; fi
  TRACE_DIR=$T PYTHONPATH=.variants/p/trsrc:/tmp/site python3 -m slipstream serve --model random:qwen2.5-0.5b \
    --port 8100 > $T/serve.log 2>&1 &
  S=$!
  for _ in $(seq 120); do curl -sf -m 5 http://127.0.0.1:8100/health >/dev/null && break; sleep 1; done
  TRACE_DIR=$T PYTHONPATH=/tmp/site timeout 60 python3 .variants/p/trace_client.py http://127.0.0.1:8100 60
  PYTHONPATH=src:/tmp/site timeout 60 python3 -m slipstream bench-serve --url http://127.0.0.1:8100 $BS \
    --label $pin$round --out $T/light.json > $T/light.txt 2>&1
  kill -TERM $S; sleep 6; kill -KILL $S 2>/dev/null
  echo "== $pin $round"; grep -A1 "TTFT p50" $T/light.txt | tail -1; grep -A1 "TTFT path" $T/light.txt | tail -1
  python3 .variants/p/analyze.py $T | tee $T/analysis.txt
done
done
unset PIN_API PIN_ENGINE
cat $R/wake2.txt; grep -i "ttft" $R/offline.txt | head -5
tar czf $OUT/p1.tgz -C $OUT p1
