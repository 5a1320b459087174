#!/usr/bin/env bash
# run k, call 1: the vision encoder's time by kind (enc_probe.py); Phi-1.5 both modes, unprofiled, twice.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/k1; mkdir -p $R; export R
trap 'tar czf $OUT/k1.tgz -C $OUT k1' EXIT
git log --oneline -1 > $R/commit.txt 2>/dev/null
echo "== enc_probe $(date +%T)"
PYTHONPATH=src:/tmp/site timeout 150 python3 .variants/enc_probe.py 2>&1 | tee $R/enc_probe.txt | grep -v "^attention" 
grep "^attention" $R/enc_probe.txt | grep -v nan | sort -t: -k2 -n | head -12
for i in 1 2; do
  echo "== phi both modes, unprofiled, run $i $(date +%T)"
  PYTHONPATH=src:/tmp/site timeout 200 python3 -m slipstream bench --model random:phi-1.5 --streams 32,64 \
    --max-tokens 1024 --constrained 0,0.5,1 --out $R/modes.phi.$i.json 2>&1 | grep -A14 "ms/step" > $R/modes.phi.$i.txt
  cat $R/modes.phi.$i.txt
done
date +%T
