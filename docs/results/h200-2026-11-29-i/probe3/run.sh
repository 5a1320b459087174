#!/usr/bin/env bash
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
V=.variants/overlap/src
b q.head.1 src qwen2.5-0.5b 1,32
TRIGGER=start b q.trig $V qwen2.5-0.5b 32
ONESHOT=1 b q.one1 $V qwen2.5-0.5b 32
ONESHOT=1 TRIGGER=start b q.one1.trig $V qwen2.5-0.5b 1,32
ONESHOT=2 TRIGGER=start b q.one2.trig $V qwen2.5-0.5b 1,32
ONESHOT=2 TRIGGER=start ONESHOT_BN2=16 b q.one2.bn16.trig $V qwen2.5-0.5b 32
ONESHOT=2 TRIGGER=start ONESHOT_WARPS=4 b q.one2.w4.trig $V qwen2.5-0.5b 32
ONESHOT=2 b q.one2 $V qwen2.5-0.5b 32
b q.head.2 src qwen2.5-0.5b 32
ONESHOT=1 TRIGGER=start b q.one1.trig.2 $V qwen2.5-0.5b 32
ONESHOT=2 TRIGGER=start b q.one2.trig.2 $V qwen2.5-0.5b 32
b p.head src phi-1.5 32
TRIGGER=start b p.trig $V phi-1.5 32
tar czf $OUT/p.tgz -C $OUT p && rm -rf $OUT/p
