#!/usr/bin/env bash
# A/B of kernel variants in one device call: the decode bench for each source tree named, the
# working tree's src/ ("head") and any carried under .variants/NAME/src (e.g. made with
# `git archive COMMIT src | tar x -C .variants/NAME`), alternating so drift hits all alike.
# Usage: [BENCH_ARGS="--temperature 0.8"] [AB_TAG=t0.8] bash scripts/ab_bench.sh MODEL STREAMS NAME...
# (results in $OUT/ab/MODEL.NAME[.AB_TAG].json; BENCH_ARGS are passed on to the bench)
set -uo pipefail
model=$1 streams=$2
shift 2
mkdir -p "${OUT:-results}/ab"
for name in "$@"; do
  src=src
  [ "$name" != head ] && src=.variants/$name/src
  echo "== $model $name"
  PYTHONPATH=$src SLIPSTREAM_CACHE=/tmp/slipstream-cache timeout 120 python3 -m slipstream bench --model "random:$model" \
    --streams "$streams" --mode pipelined --prompt-tokens 64 --max-tokens 128 --profile \
    ${BENCH_ARGS:-} --out "${OUT:-results}/ab/$model.$name${AB_TAG:+.$AB_TAG}.json" 2>/dev/null | grep -v "^wrote"
done
