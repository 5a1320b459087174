#!/usr/bin/env bash
# issue 18 (second call): the same, every bench-serve run with prompts of its own (e2cXXXX)
# against 2fb8b50's server (.variants/base_s), offline before and after, one call.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/f1; mkdir -p $R
PORT=8100
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }
offline() {
  echo "== offline $1 $(date +%T)"
  PYTHONPATH=src:/tmp/site timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --mode pipelined \
    --workload mixed,ttft --ttft-lengths 128 --out $R/offline.$1.json 2>$R/offline.$1.err | tee $R/offline.$1.txt
}
served() {  # served NAME SRC
  echo "== serve $1 $(date +%T)"
  PYTHONPATH=$2:/tmp/site python3 -m slipstream serve --model random:qwen2.5-0.5b --mode pipelined --port $PORT \
    >$R/serve.$1.log 2>&1 &
  local server=$!
  for _ in $(seq 150); do curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
  local B="env PYTHONPATH=src:/tmp/site timeout 120 python3 -m slipstream bench-serve --url http://127.0.0.1:$PORT --workload mixed --label $1"
  for run in warm cold warm2 cold2; do
    local c0=$(cpu $server)
    $B --request-rate inf $([[ $run == cold* ]] && echo --cold-connections) --out $R/$1.$run.json 2>>$R/bs.$1.err \
      | grep -E "^mixed|rate inf:" | tee -a $R/$1.txt
    echo "  ($run: API process CPU $(( $(cpu $server) - c0 )) ticks)" | tee -a $R/$1.txt
  done
  if [[ $1 == head ]]; then
    $B --request-rate 25%,50%,90% --out $R/$1.rates.json 2>>$R/bs.$1.err | tee -a $R/$1.txt
  fi
  $B --requests 20 --prompt-range 128,128 --output-range 16,16 --max-concurrency 1 --out $R/$1.light.json \
    2>>$R/bs.$1.err | tee -a $R/$1.txt
  kill -TERM $server; for _ in $(seq 30); do kill -0 $server 2>/dev/null || break; sleep 1; done
  pkill -KILL -P $server; kill -KILL $server 2>/dev/null
}
offline 1
served head src
served base .variants/base_s/src
offline 2
date +%T
