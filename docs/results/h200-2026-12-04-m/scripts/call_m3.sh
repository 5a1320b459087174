#!/usr/bin/env bash
# run m, call 3 (issue 19, variants): o's delta in the norm after it — computed before the wait with o
# triggering early (main, ab054c0), without the early trigger (o-late), computed after the wait (posth),
# both (posth-late); and the GEMMs' expand taken out (no-expand; timing only, tokens wrong). kbench pairs
# and the LoRA step's bench each.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/m3; mkdir -p $R
trap 'tar czf $OUT/m3.tgz -C $OUT m3' EXIT
N=src/slipstream/kernels/norm.py; L=src/slipstream/kernels/linear.py; G=src/slipstream/kernels/skinny_gemm.py
cp $N /tmp/n.orig; cp $L /tmp/l.orig; cp $G /tmp/g.orig
late() { python3 - <<'PY'
p='src/slipstream/kernels/linear.py'; s=open(p).read()
old="""            return PendingSum(skinny_linear(x, weight, defer=True, early_dependents=True), bias, residual,
                              (x, lora._replace"""
assert old in s; open(p,'w').write(s.replace(old, old.replace("early_dependents=True", "early_dependents=False")))
PY
}
for v in main o-late posth posth-late no-expand main2; do
  cp /tmp/n.orig $N; cp /tmp/l.orig $L; cp /tmp/g.orig $G
  case $v in
    o-late) late ;; posth) cp .variants/m/v/norm_posth.py $N ;; posth-late) cp .variants/m/v/norm_posth.py $N; late ;;
    no-expand) sed -i 's/                acc += lora_delta(v, lb, UPCAST)/                pass/' $G ;;
  esac
  echo "== $v $(date +%T) changed lines: $( (diff /tmp/n.orig $N; diff /tmp/l.orig $L; diff /tmp/g.orig $G) | grep -c '^>')"
  OUT=$R CASES=32x16 LABELS=lora timeout 120 python3 .variants/m/kbench.py > $R/kbench.$v.txt 2>&1
  grep -E "pair|expand|norm2|plain" $R/kbench.$v.txt | grep -v none
  timeout 150 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$v.json 2>$R/lora.$v.err | grep -A4 "workload" | tee $R/lora.$v.txt
done
cp /tmp/n.orig $N; cp /tmp/l.orig $L; cp /tmp/g.orig $G
date +%T
