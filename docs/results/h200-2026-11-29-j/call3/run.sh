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
b base.2 .variants/base/src X=1
b side32.2 .variants/side/src PF_PROGRAMS=32
P=.variants/probe2/src
for a in head embed rope layers layers,head; do b abl.$a $P ABLATE=$a; done
b nosplit $P ATTN_NOSPLIT=1
b none $P X=1
(cd .variants/ropefull && PYTHONPATH=src timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py tests/test_kernels.py tests/test_models.py 2>&1 | tail -4)
tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
