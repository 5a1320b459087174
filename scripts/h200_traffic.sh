#!/usr/bin/env bash
# The traffic run on the H200 (see docs/benchmarks.md): the GPU tests, the packed-prefill anchor
# (../shared/anchors/prefill_floor.py, carried as .anchors), then per benchmark shape: the traffic
# workloads in one engine per mode (mixed all at once and as Poisson arrivals at 50% and 90% of its
# capacity, prefill tok/s, TTFT at light load, decoding while 1024-token prompts arrive), --short, and
# the decode table against the source tree carried as .variants/base (scripts/ab_bench.sh);
# pipelined beside blocking. STAGES, MODELS and WORKLOADS pick a subset; ENGINE_ARGS go to every bench.
# Each stage has a time limit so the run fits one device call; everything lands in $OUT/traffic.tgz.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=${OUT:-results}/t
mkdir -p "$R"
STAGES=${STAGES:-tests anchor traffic short decode}
MODELS=${MODELS:-qwen2.5-0.5b phi-1.5}
has() { [[ " $STAGES " == *" $1 "* ]]; }
bench() {  # bench NAME LIMIT ARGS...: one bench, its table on stdout and in $R/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout "$limit" python3 -m slipstream bench "$@" --out "$R/$name.json" 2>"$R/$name.err" | tee "$R/$name.txt"
  tail -2 "$R/$name.err" | grep -v "capturing"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$R/gpu.txt"
if has tests; then
  timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_kernels.py tests/test_models.py \
    -k "${TEST_FILTER:-}" 2>&1 | tail -4 | tee "$R/gpu_tests.txt"
fi
has anchor && (cd "$R" && OUT=. timeout 150 python3 "$OLDPWD/.anchors/prefill_floor.py") 2>&1 | tail -5 | tee "$R/prefill_floor.txt"
for m in $MODELS; do
  M="--model random:$m ${ENGINE_ARGS:-}"
  has traffic && bench "$m.traffic" 360 $M --workload ${WORKLOADS:-mixed,prefill,ttft,interference} --request-rate inf,50%,90% \
    --ttft-lengths ${TTFT_LENGTHS:-16,128,1024,2000} --decoding 32 --arrival-tokens 1024
  has short && bench "$m.short" 120 $M --streams 1,8,32 --prompt-tokens 64 --short
  has decode && OUT=$R timeout 200 bash scripts/ab_bench.sh "$m" 1,32,64 head $(ls .variants 2>/dev/null)
done
tar czf "${OUT:-results}/traffic.tgz" -C "$(dirname "$R")" t
