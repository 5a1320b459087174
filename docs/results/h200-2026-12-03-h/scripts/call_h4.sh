#!/usr/bin/env bash
# run h, call 4 (issue 16): main (42ac60f) with Python's switch interval at 5 ms (its default, "base")
# against 0.2 ms ("sw") and 0.05 ms ("sw05"), each a sitecustomize.py on PYTHONPATH: the constrained bench alternating, three rounds.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/h4; mkdir -p $R
trap 'tar czf $OUT/h4.tgz -C $OUT h4' EXIT
pathof() { case $1 in sw) echo .variants/switch:src;; sw05) echo .variants/switch05:src;; base) echo src;; esac; }
for t in sw05 base sw; do PYTHONPATH=$(pathof $t) python3 -c "import sys; print('$t', sys.getswitchinterval())"; done
for rep in 1 2 3; do
  for t in sw05 base sw; do
    echo "== $t round $rep $(date +%T)"
    PYTHONPATH=$(pathof $t):/tmp/site timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32,64 \
      --max-tokens 1024 --constrained 0,0.5,1 --mode pipelined --profile --out $R/bench.$t.$rep.json 2>&1 | grep -A7 "ms/step"
  done
done 2>&1 > $R/bench.txt
grep "==\|json\|decode" $R/bench.txt
date +%T
