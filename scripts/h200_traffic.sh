#!/usr/bin/env bash
# The traffic run on the H200 (see docs/benchmarks.md): the GPU tests, the packed-prefill anchor
# (../shared/anchors/prefill_floor.py, carried as .anchors), then for each benchmark shape the mixed
# workload (all at once, and Poisson arrivals at 50% and 90% of its capacity), prefill tok/s, TTFT at
# light load, decoding while prompts arrive, --short and the decode table; pipelined beside blocking.
# STAGES and MODELS pick a subset; ENGINE_ARGS go to every bench (e.g. "--max-num-seqs 256").
# Each stage has a time limit so the run fits one device call; everything lands in $OUT/traffic.tgz.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=${OUT:-results}/t
mkdir -p "$R"
STAGES=${STAGES:-tests anchor mixed prefill ttft interference short decode}
MODELS=${MODELS:-qwen2.5-0.5b phi-1.5}
has() { [[ " $STAGES " == *" $1 "* ]]; }
bench() {  # bench NAME LIMIT ARGS...: one bench, its table on stdout and in $R/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout "$limit" python3 -m slipstream bench "$@" --out "$R/$name.json" 2>"$R/$name.err" | tee "$R/$name.txt"
  tail -3 "$R/$name.err"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$R/gpu.txt"
git log -1 --format=%H 2>/dev/null | tee "$R/commit.txt"
if has tests; then
  timeout 400 python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_gpu.py tests/test_kernels.py tests/test_models.py} \
    2>&1 | tail -8 | tee "$R/gpu_tests.txt"
fi
has anchor && (cd "$R" && OUT=. timeout 150 python3 "$OLDPWD/.anchors/prefill_floor.py") 2>&1 | tail -6 | tee "$R/prefill_floor.txt"
for m in $MODELS; do
  M="--model random:$m ${ENGINE_ARGS:-}"
  has mixed && bench "$m.mixed" 300 $M --workload mixed --request-rate ${RATES:-inf,50%,90%}
  has prefill && bench "$m.prefill" 150 $M --workload prefill
  has ttft && bench "$m.ttft" 150 $M --workload ttft --ttft-lengths 16,128,1024,4000
  has interference && bench "$m.interference" 150 $M --workload interference --streams 32 --prompt-tokens 1024
  has short && bench "$m.short" 120 $M --streams 1,8,32 --prompt-tokens 64 --short
  has decode && bench "$m.decode" 150 $M --streams 1,8,32,64 --prompt-tokens 64 --max-tokens 128
done
tar czf "${OUT:-results}/traffic.tgz" -C "$(dirname "$R")" t
