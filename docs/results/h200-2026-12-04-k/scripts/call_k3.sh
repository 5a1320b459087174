#!/usr/bin/env bash
# run k, call 3: Phi-1.5 both modes, profiled (issue 16's targets side by side); md2-encoder (issue 17).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/k3; mkdir -p $R
trap 'tar czf $OUT/k3.tgz -C $OUT k3' EXIT
echo "== phi both modes, profiled $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 220 python3 -m slipstream bench --model random:phi-1.5 --streams 32,64 \
  --max-tokens 1024 --constrained 0,0.5,1 --profile --out $R/modes.phi.json 2>&1 | grep -A30 "ms/step" > $R/modes.phi.txt
head -14 $R/modes.phi.txt
echo "== md2-encoder $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 240 python3 -m slipstream bench --model random:moondream2 --workload md2-encoder \
  --mode pipelined --out $R/md2-encoder.json 2>&1 | grep -v Warn | tail -8 | tee $R/md2-encoder.txt
date +%T
