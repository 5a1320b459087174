#!/usr/bin/env bash
# call 1 (issue 17): branch md-resample (the crops in five launches, kernels.resample) on the GPU:
# Moondream's GPU tests (the full-size preset against the reference in bf16, captured = eager), the resample
# kernel's crops bit for bit, then md_launch.py and md2-query at 1 client, md-resample against main alternating.
# Run from a checkout of md-resample with main's src in .variants/base_h/src (git archive main src).
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/h1; mkdir -p $R
trap 'tar czf $OUT/h1.tgz -C $OUT h1' EXIT
PYTHONPATH=src timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_moondream.py tests/test_moondream_parts.py -m gpu \
  2>&1 | tail -3 | tee $R/tests.txt
PYTHONPATH=src timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_moondream_parts.py -k resample 2>&1 | tail -3 | tee -a $R/tests.txt
PYTHONPATH=src OUT=$R timeout 90 python3 .variants/md_launch.py 2>$R/md_launch.err | tee $R/md_launch.txt
for rep in 1 2; do
  for t in new base; do
    src=src; [ $t == base ] && src=.variants/base_h/src
    PYTHONPATH=$src timeout 60 python3 -m slipstream bench --model random:moondream2 --workload md2-query --streams 1 \
      --max-num-seqs 64 --mode pipelined --out $R/$t.$rep.json 2>$R/$t.$rep.err | grep "md2-query |" | sed "s/^/$t /" | tee -a $R/md2.txt
  done
done
