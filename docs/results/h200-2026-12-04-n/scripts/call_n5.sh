#!/usr/bin/env bash
# run n, call 5 (issue 19, diagnostic; run l's call 4 again on main after runs m and n): where the LoRA step's
# extra time sits now. Each variant removes one piece of LoRA's work from the kernels (its result unused, so
# the compiler drops its loads; tokens wrong, timing only): the norms' shrink of the next projection
# (norm-next), the norms' delta of the previous one (norm-prev), gate_up's shares of down's shrink
# (gemm-shares), and those three with the GEMMs' expand (all).
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=$OUT/n5; mkdir -p $R
trap 'tar czf $OUT/n5.tgz -C $OUT n5' EXIT
N=src/slipstream/kernels/norm.py; G=src/slipstream/kernels/skinny_gemm.py
cp $N /tmp/n.orig; cp $G /tmp/g.orig
next() { sed -i 's/        v = tl.sum(a.to(tl.float32) \* y.to(tl.float32)\[None, :\], axis=1)/        v = tl.zeros([16], tl.float32)/' $N; }
prev() { sed -i 's/            acc += delta$/            pass/' $N; }
expand() { sed -i 's/            acc = lora_delta(v, lb, UPCAST)$/            pass/' $G; }
shares() { sed -i 's/            part = lora_shrink_part(y, slots, next_a, SLOTS_P2, BLOCK_M, NEXT_W, UPCAST)/            part = tl.zeros([BLOCK_M, NEXT_W], tl.float32)/' $G; }
for v in main norm-next norm-prev gemm-shares all; do
  cp /tmp/n.orig $N; cp /tmp/g.orig $G
  case $v in
    norm-next) next ;; norm-prev) prev ;; gemm-shares) shares ;; all) next; prev; expand; shares ;;
  esac
  echo "== $v $(date +%T) changed lines: $( (diff /tmp/n.orig $N; diff /tmp/g.orig $G) | grep -c '^>')"
  timeout 120 python3 -m slipstream bench --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 \
    --max-tokens 512 --mode pipelined --out $R/lora.$v.json > $R/lora.$v.txt 2>$R/lora.$v.err
  grep -A4 "workload" $R/lora.$v.txt || tail -3 $R/lora.$v.err
done
cp /tmp/n.orig $N; cp /tmp/g.orig $G
date +%T
