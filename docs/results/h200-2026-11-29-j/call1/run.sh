#!/usr/bin/env bash
# session 6, call 1: L2 weight prefetch windows (head), line prefetch, rope lookup, against main
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
mkdir -p $OUT/r
b() { local tag=$1 src=$2; shift 2
  env "$@" PYTHONPATH=$src timeout 100 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 1,32 --mode pipelined \
    --prompt-tokens 64 --max-tokens 128 --out $OUT/r/$tag.json >$OUT/r/$tag.log 2>&1
  python3 -c "import json;d=json.load(open('$OUT/r/$tag.json'));print('$tag',[(r['streams'],round(r['ms_per_step'],4)) for r in d['results']])" || { echo "$tag FAILED"; tail -5 $OUT/r/$tag.log; }; }
b base .variants/base/src X=1
b head src X=1
b off src SLIPSTREAM_L2_PREFETCH=0
b w16 src SLIPSTREAM_L2_AHEAD_MB=16
b w36 src SLIPSTREAM_L2_AHEAD_MB=36
b line .variants/line/src X=1
b rope .variants/rope/src X=1
b head.2 src X=1
b base.2 .variants/base/src X=1
python3 -c "import torch;print(torch.cuda.get_device_properties(0).L2_cache_size)"
PYTHONPATH=src timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py tests/test_models.py 2>&1 | tail -4
tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r
