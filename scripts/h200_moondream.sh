#!/usr/bin/env bash
# The Moondream 2 run on the H200 (see docs/benchmarks.md): build random:moondream2 (1.93B parameters,
# the release's layout), the GPU tests (the full-size preset against tests/moondream_reference.py in
# bf16 among them), the vision anchor (../shared/anchors/vision_floor.py, carried as .anchors), then
# the Moondream workloads of `bench` (bench/moondream.py), pipelined beside blocking. STAGES picks a
# subset; ENGINE_ARGS go to every bench. Everything lands in $OUT/moondream.tgz.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=${OUT:-results}/md
mkdir -p "$R"
STAGES=${STAGES:-build tests anchor query skills}
has() { [[ " $STAGES " == *" $1 "* ]]; }
bench() {  # bench NAME LIMIT ARGS...: one bench, its table on stdout and in $R/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout "$limit" python3 -m slipstream bench --model random:moondream2 ${ENGINE_ARGS:-} "$@" --out "$R/$name.json" \
    2>"$R/$name.err" | tee "$R/$name.txt"
  tail -2 "$R/$name.err" | grep -v "capturing"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$R/gpu.txt"
has build && (time timeout 300 python3 -c "from slipstream.models.random_checkpoint import cached_checkpoint as c; \
print(c('moondream2'))") 2>&1 | tail -4 | tee "$R/build.txt"
if has tests; then
  timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_moondream.py tests/test_gpu.py tests/test_models.py \
    tests/test_kernels.py -k "${TEST_FILTER:-}" 2>&1 | tail -6 | tee "$R/gpu_tests.txt"
fi
has anchor && (cd "$R" && OUT=. timeout 150 python3 "$OLDPWD/.anchors/vision_floor.py") 2>&1 | tail -8 | tee "$R/vision_floor.txt"
has query && bench md2-query 420 --workload md2-encoder,md2-query --streams 1,8,64 --max-num-seqs 64 --profile
has skills && bench md2-skills 420 --workload md2-caption,md2-point,md2-detect,md2-reuse --streams 1,32 \
  --max-tokens 128 --max-num-seqs 64
tar czf "${OUT:-results}/moondream.tgz" -C "$(dirname "$R")" md
