#!/usr/bin/env bash
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
mkdir -p $OUT/r
b() { local m=$1 tag=$2 src=$3; shift 3
  env "$@" PYTHONPATH=$src timeout 100 python3 -m slipstream bench --model random:$m --streams 1,32 --mode pipelined \
    --prompt-tokens 64 --max-tokens 128 --out $OUT/r/$m.$tag.json >$OUT/r/$m.$tag.log 2>&1
  python3 -c "import json;d=json.load(open('$OUT/r/$m.$tag.json'));print('$m $tag',[(r['streams'],round(r['ms_per_step'],4)) for r in d['results']])" || { echo "$tag FAILED"; tail -5 $OUT/r/$m.$tag.log; }; }
for i in 1 2; do
b qwen2.5-0.5b base.$i .variants/base/src X=1
b qwen2.5-0.5b early1.$i .variants/early/src EARLY_WAVES=1
b qwen2.5-0.5b early3.$i .variants/early/src EARLY_WAVES=3
done
b phi-1.5 base .variants/base/src X=1
b phi-1.5 early1 .variants/early/src EARLY_WAVES=1
tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
