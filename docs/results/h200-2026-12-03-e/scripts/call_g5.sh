#!/usr/bin/env bash
# run e, call 5 (issue 17): md2-query at 1 client, this tree (an image's pixels hashed in chunks on threads beside
# their copy) against base = ddaf7c8, alternating
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/g5; mkdir -p $R
for rep in 1 2; do
  for t in new base; do
    src=src; [ $t == base ] && src=.variants/base_e2/src
    echo "== $t $rep $(date +%T)"
    PYTHONPATH=$src timeout 80 python3 -m slipstream bench --model random:moondream2 --workload md2-query --streams 1 \
      --max-num-seqs 64 --mode pipelined --out $R/$t.$rep.json 2>$R/$t.$rep.err | grep "md2-query |" | tee -a $R/md2.txt
  done
done
date +%T
