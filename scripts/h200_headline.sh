#!/usr/bin/env bash
# The headline run on the H200 (see docs/benchmarks.md): GPU tests, the plain-graph anchor
# (../shared/anchors/graph_floor.py, carried as .anchors), then the decode table with the profiler
# and the --short workload for both benchmark shapes, and the zombie tax. Each stage has a time
# limit so the whole run fits one device call; everything lands in $OUT/headline.tgz. Sampled
# decoding (temperature 0.8, and with top-p 0.9; Qwen shape, 32 streams) runs on src/ and on any
# source tree carried under .variants/ (scripts/ab_bench.sh), for a before/after in the same call;
# scripts/sample_bench.py times the sampler alone.
set -uo pipefail
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
R=${OUT:-results}/r
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$R/gpu.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_kernels.py tests/test_models.py 2>&1 | tail -3 | tee "$R/gpu_tests.txt"
(cd "$R" && OUT=. timeout 100 python3 "$OLDPWD/.anchors/graph_floor.py") 2>&1 | tail -9 | tee "$R/graph_floor.txt"
for m in phi-1.5 qwen2.5-0.5b; do
  timeout 130 python3 -m slipstream bench --model random:$m --streams 1,8,32,64 --prompt-tokens 64 --max-tokens 128 \
    --profile --out "$R/$m.json" 2>/dev/null | tail -12
done
for m in phi-1.5 qwen2.5-0.5b; do
  timeout 50 python3 -m slipstream bench --model random:$m --streams 1,8,32 --prompt-tokens 64 --short \
    --out "$R/$m.short.json" 2>/dev/null | tail -7
done
BENCH_ARGS="--temperature 0.8" OUT=$R timeout 90 bash scripts/ab_bench.sh qwen2.5-0.5b 32 head $(ls .variants 2>/dev/null)
BENCH_ARGS="--temperature 0.8 --top-p 0.9" AB_TAG=p0.9 OUT=$R timeout 90 bash scripts/ab_bench.sh qwen2.5-0.5b 32 head \
  $(ls .variants 2>/dev/null)
timeout 90 python3 scripts/sample_bench.py 32 151936 2>&1 | tee "$R/sample_bench.txt"
timeout 40 python3 -m slipstream bench --model random:phi-1.5 --streams 1,32 --prompt-tokens 64 --max-tokens 16 --zombie \
  --out "$R/phi-1.5.zombie.json" 2>/dev/null | tail -9
tar czf "${OUT:-results}/headline.tgz" -C "$(dirname "$R")" r
