#!/usr/bin/env bash
# run e, call 2 (issue 16): XGrammar's accepts and fills of 64 rows on this host, serial (as main) against
# split over Python threads (xgr_par.py); then the constrained bench, this tree (the mask pass: accepts and
# fills split over mask threads, the rest on the loop thread beside) against base = ddaf7c8, alternating,
# both modes, Qwen2.5-0.5B shape; Phi-1.5 on this tree.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/g2; mkdir -p $R
echo "== xgr_par $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 100 python3 .variants/wake/xgr_par.py 64 100 2>&1 | grep -v Warning | tee $R/xgr_par.txt
B="--streams 32,64 --max-tokens 1024 --constrained 0,0.5,1 --profile"
con() {  # name src shape
  echo "== $1 $3 $(date +%T)"
  PYTHONPATH=$2:/tmp/site timeout 170 python3 -m slipstream bench --model random:$3 $B --out $R/$1.$3.json 2>$R/$1.$3.err \
    | grep -v "^wrote" | tee $R/$1.$3.txt | head -30
}
con new src qwen2.5-0.5b
[ $SECONDS -lt 330 ] && con base .variants/base_e/src qwen2.5-0.5b
[ $SECONDS -lt 420 ] && con new2 src qwen2.5-0.5b
[ $SECONDS -lt 420 ] && con new src phi-1.5
tar czf $OUT/g2.tgz -C $OUT g2
date +%T
