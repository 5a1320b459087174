#!/usr/bin/env bash
# run z, call 1: GPU tests on this tree (test_gpu + Moondream's), then the constrained bench (issue 16),
# this tree (new: the next step launched beside the mask fill) and base = 56b44ec, alternating, Qwen shape
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/z1; mkdir -p $R
echo "== tests $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_moondream.py -m gpu 2>&1 | tail -4 | tee $R/tests.txt
B="--streams 32,64 --max-tokens 1024 --constrained 0,0.5,1 --profile"
con() {  # name src shape
  echo "== $1 $3 $(date +%T)"
  PYTHONPATH=$2:/tmp/site timeout 170 python3 -m slipstream bench --model random:$3 $B --out $R/$1.$3.json 2>/dev/null \
    | grep -v "^wrote" | head -14
}
con new src qwen2.5-0.5b
[ $SECONDS -lt 380 ] && con base .variants/base_z/src qwen2.5-0.5b
[ $SECONDS -lt 440 ] && con new src phi-1.5
date +%T
