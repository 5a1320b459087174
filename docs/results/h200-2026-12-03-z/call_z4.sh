#!/usr/bin/env bash
# run z, call 4: where a constrained tick's host time goes on the H200's host, by function (56b44ec + docs)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1 PYTHONPATH=src:/tmp/site
R=$OUT/z4; mkdir -p $R
echo "== 64 rows, 100% JSON $(date +%T)"
ROWS=64 FRAC=1 REPS=1 timeout 110 python3 .variants/tickparts.py 2>/dev/null | tee $R/json1.txt
echo "== 64 rows, free $(date +%T)"
ROWS=64 FRAC=0 REPS=1 timeout 80 python3 .variants/tickparts.py 2>/dev/null | tee $R/json0.txt
date +%T
