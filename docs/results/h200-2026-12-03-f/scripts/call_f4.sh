#!/usr/bin/env bash
# run f, call 4 (issue 17): the vision encoder's attention by SDPA backend (attn_backends.py), then the fastest
# backend other than the default through the Moondream GPU test against the reference, and md2-query at 1 client
# with the default against it (SLIP_ATTN in .variants/v_attn, an experiment-only switch).
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/f4; mkdir -p $R
trap 'tar czf $OUT/f4.tgz -C $OUT f4' EXIT
V=.variants/v_attn
PYTHONPATH=$V/src OUT=$R timeout 120 python3 .variants/attn_backends.py 2>&1 | grep -v -i warn | tee $R/attn.txt
BEST=$(python3 -c "
import json; r=json.load(open('$R/attn_backends.json'))
ok={k:v['encoder_graph_ms'] for k,v in r.items() if 'encoder_graph_ms' in v}
b=min(ok,key=ok.get); print({'cudnn':'CUDNN_ATTENTION','flash':'FLASH_ATTENTION','efficient':'EFFICIENT_ATTENTION'}[b])")
echo "fastest: $BEST" | tee -a $R/attn.txt
SLIP_ATTN=$BEST PYTHONPATH=$V/src timeout 200 python3 -m pytest -q -p no:cacheprovider $V/tests/test_moondream.py -m gpu \
  2>&1 | tail -3 | tee $R/tests.txt
for rep in 1 2; do
  for a in default $BEST; do
    env $( [ $a != default ] && echo SLIP_ATTN=$a ) PYTHONPATH=$V/src timeout 60 python3 -m slipstream bench --model random:moondream2 \
      --workload md2-query --streams 1 --max-num-seqs 64 --mode pipelined --profile --out $R/$a.$rep.json > $R/$a.$rep.txt 2>$R/$a.$rep.err
    grep "md2-query |\|md2-query x1" $R/$a.$rep.txt | sed "s/^/$a /" | tee -a $R/md2.txt
  done
done
