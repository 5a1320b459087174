#!/usr/bin/env bash
# run z, call 2: the constrained bench at 64 streams, pipelined, base (56b44ec) and new alternating twice
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/z2; mkdir -p $R
B="--model random:qwen2.5-0.5b --streams 64 --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile"
for i in 1 2; do
  for t in base new; do
    [ $SECONDS -lt 480 ] || break
    src=src; [ $t = base ] && src=.variants/base_z/src
    echo "== $t $i $(date +%T)"
    PYTHONPATH=$src:/tmp/site timeout 90 python3 -m slipstream bench $B --out $R/con.$t.$i.json 2>/dev/null | grep -E "^ +(decode|json)"
  done
done
date +%T
