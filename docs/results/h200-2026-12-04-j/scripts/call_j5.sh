#!/usr/bin/env bash
# run j, call 5: Phi-1.5 shape on e81aa8f, both modes, profiled.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/j5; mkdir -p $R
trap 'tar czf $OUT/j5.tgz -C $OUT j5' EXIT
PYTHONPATH=src:/tmp/site timeout 170 python3 -m slipstream bench --model random:phi-1.5 --streams 32,64 \
  --max-tokens 1024 --constrained 0,0.5,1 --profile --out $R/modes.phi.json 2>&1 | grep -A30 "ms/step" > $R/modes.phi.txt
head -14 $R/modes.phi.txt
date +%T
