#!/usr/bin/env bash
# Issue 19 on the H200 (docs/benchmarks.md): the GPU tests of LoRA (graphs, kernels) and of the sync-free
# loop, then the prefix cache's workloads — 256 requests on a 1,000-token system prompt with the cache on and
# off (Qwen2.5-0.5B shape), a caption plus 4 queries per image with and without reuse (random:moondream2) —
# and the LoRA decode step: 8 random adapters of rank 16 over 32 rows against the engine without LoRA, with
# the profiler's split; `lora-ab` (not in the default STAGES) runs that step for the working tree's LoRA kernels
# beside those of LORA_BASE (default cb95fd4, run p's), alternating. Carry .whl (scripts/h200_wheels.sh) for the
# server-side tests it does not run. STAGES picks a subset.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=${OUT:-results}/r
mkdir -p "$R"
STAGES=${STAGES:-tests prefix md2 lora}
has() { [[ " $STAGES " == *" $1 "* ]]; }
bench() {  # bench NAME LIMIT ARGS...
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout "$limit" python3 -m slipstream bench "$@" --out "$R/$name.json" 2>"$R/$name.err" | tee "$R/$name.txt"
  tail -2 "$R/$name.err" | grep -v "capturing"
}
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$R/gpu.txt"
git log -1 --format=%h 2>/dev/null | tee "$R/commit.txt"
if has tests; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_kernels.py \
    -k "lora or never_synchronizes or step_clock" 2>&1 | tail -3 | tee "$R/gpu_tests.txt"
fi
has prefix && bench qwen.shared-prefix 240 --model random:qwen2.5-0.5b --workload shared-prefix
has md2 && bench md2.reuse 300 --model random:moondream2 --workload md2-reuse --mode pipelined --max-num-seqs 64
has lora && bench qwen.lora 300 --model random:qwen2.5-0.5b --streams 32 --lora 8 --lora-rank 16 --max-tokens 512 \
  --mode pipelined --profile
if has lora-ab; then
  mkdir -p .variants/lora-base && git archive "${LORA_BASE:-cb95fd4}" src | tar x -C .variants/lora-base
  BENCH_ARGS="--lora 8 --lora-rank 16" OUT=$R bash scripts/ab_bench.sh qwen2.5-0.5b 32 head lora-base head lora-base
fi
tar czf "${OUT:-results}/prefix_lora.tgz" -C "$(dirname "$R")" r
