#!/usr/bin/env bash
# run y, call 1: GPU tests on 73aa95c; interference ITL probe head (73aa95c) vs base (e705952) alternating; host split; CLI interference; decode headline
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
echo "== tests $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 200 python3 -m pytest -q -x tests/test_gpu.py 2>&1 | tail -4
for i in 1 2; do for T in head base; do
  SRC=src; [ $T = base ] && SRC=.variants/base_y/src
  echo "== probe $T $(date +%T)"
  CHUNKS=320,320 PYTHONPATH=$SRC timeout 120 python3 .variants/itl_probe.py $OUT/itl_$T$i.json 2>&1 | grep -E "^chunk"
done; done
echo "== hostsplit head $(date +%T)"
REPS=1 PYTHONPATH=src timeout 100 python3 .variants/hostsplit.py 2>&1 | grep -v -i "warn\|capturing" | grep -v "slow tick" | cut -c1-300
echo "== CLI $(date +%T)"
PYTHONPATH=src timeout 120 python3 -m slipstream bench --model random:qwen2.5-0.5b --workload interference,mixed --request-rate inf --mode pipelined --decoding 32 --arrival-tokens 1024 --out $OUT/traffic.json 2>&1 | grep -E "^(workload|interference|mixed|decode)"
PYTHONPATH=src timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 1,32,64 --mode pipelined --prompt-tokens 64 --max-tokens 128 2>&1 | grep -v -i "warn\|capturing" | tail -8
date +%T
