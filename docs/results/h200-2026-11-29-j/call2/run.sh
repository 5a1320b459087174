#!/usr/bin/env bash
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
mkdir -p $OUT/r
b() { local tag=$1 src=$2; shift 2
  env "$@" PYTHONPATH=$src timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 1,32 --mode pipelined \
    --prompt-tokens 64 --max-tokens 128 --out $OUT/r/$tag.json >$OUT/r/$tag.log 2>&1
  python3 -c "import json;d=json.load(open('$OUT/r/$tag.json'));print('$tag',[(r['streams'],round(r['ms_per_step'],4)) for r in d['results']])" || { echo "$tag FAILED"; tail -5 $OUT/r/$tag.log; }; }
b base .variants/base/src X=1
b side32 .variants/side/src PF_PROGRAMS=32
b side8 .variants/side/src PF_PROGRAMS=8
b side132 .variants/side/src PF_PROGRAMS=132
b side32w36 .variants/side/src PF_PROGRAMS=32 SLIPSTREAM_L2_AHEAD_MB=36
b base.2 .variants/base/src X=1
b side32.2 .variants/side/src PF_PROGRAMS=32
for v in "off src SLIPSTREAM_L2_PREFETCH=0" "norm src X=1" "side .variants/side/src PF_PROGRAMS=32"; do set -- $v
  env $3 PYTHONPATH=$2 timeout 120 python3 .variants/prof.py $1 2>&1 | grep -v "^\s*$" | grep -v "it/s\|graph/s\|Warning\|warn" | tail -28; done
tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
