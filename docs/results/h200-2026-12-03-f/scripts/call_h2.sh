#!/usr/bin/env bash
# call 2 (issue 17): md-resample's GPU tests (its tree: .variants/v_res), then md2-query at 1 client with the
# profiler: main (.variants/base_h), md-resample (v_res), md-captured-skills (v_skl), alternating.
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/h2; mkdir -p $R
trap 'tar czf $OUT/h2.tgz -C $OUT h2' EXIT
V=.variants/v_res
PYTHONPATH=$V/src timeout 200 python3 -m pytest -q -p no:cacheprovider $V/tests/test_moondream.py $V/tests/test_moondream_parts.py -m gpu \
  2>&1 | tail -3 | tee $R/tests.txt
PYTHONPATH=$V/src timeout 60 python3 -m pytest -q -p no:cacheprovider $V/tests/test_moondream_parts.py -k resample 2>&1 | tail -3 | tee -a $R/tests.txt
for rep in 1 2; do
  for t in base_h v_res v_skl; do
    PYTHONPATH=.variants/$t/src timeout 75 python3 -m slipstream bench --model random:moondream2 --workload md2-query,md2-caption --streams 1,32 --max-tokens 64 \
      --max-num-seqs 64 --mode pipelined --profile --out $R/$t.$rep.json > $R/$t.$rep.txt 2>$R/$t.$rep.err
    grep "md2-" $R/$t.$rep.txt | sed "s/^/$t /" | tee -a $R/md2.txt
  done
done
