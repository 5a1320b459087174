#!/usr/bin/env bash
# probe call 1: firsttile A/B, ablations, GEMM configs (Qwen, 32 streams)
set -uo pipefail
export SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
mkdir -p $OUT/p
b() { # name src model streams
  local t0=$(date +%s.%N)
  PYTHONPATH=$2 timeout 100 python3 -m slipstream bench --model random:$3 --streams $4 --mode pipelined \
    --prompt-tokens 64 --max-tokens 128 --out $OUT/p/$1.json >/dev/null 2>$OUT/p/$1.err
  python3 - $OUT/p/$1.json $1 $t0 <<'PY'
import json,sys,time
try:
  d=json.load(open(sys.argv[1]))
  print(sys.argv[2], " ".join(f"{r['streams']}:{r['ms_per_step']:.4f}" for r in d['results']), f"({time.time()-float(sys.argv[3]):.0f}s)", flush=True)
except Exception as e: print(sys.argv[2], "FAILED", e, flush=True)
PY
}
for r in 1 2; do
  b q.head.$r src qwen2.5-0.5b 1,32
  b q.first.$r .variants/firsttile/src qwen2.5-0.5b 1,32
done
b p.head src phi-1.5 1,32
b p.first .variants/firsttile/src phi-1.5 1,32
for a in none norm attn qkv o gateup down; do ABLATE=$a b q.abl.$a .variants/probe/src qwen2.5-0.5b 32; done
for c in "9728x896=32,128,4,4,1" "9728x896=128,64,4,4,1" "9728x896=64,64,4,6,1" \
         "896x4864=32,128,4,4,8" "896x4864=16,128,4,4,4" "896x4864=64,128,4,4,8" \
         "1152x896=16,128,4,4,2" "1152x896=16,64,2,4,1" "896x896=16,128,4,4,2" "896x896=16,64,2,4,1"; do
  GEMM_CFG=$c b "q.cfg.${c//[=,]/_}" .variants/probe/src qwen2.5-0.5b 32
done
b q.head.3 src qwen2.5-0.5b 1,32
tar czf $OUT/p.tgz -C $OUT p && rm -rf $OUT/p
