# device call 4, carrying .variants/ (base = main `git archive main src` at 67fbb95; early = base with
# docs/results/h200-2026-11-29-j/variants/early.patch (variant 28); ef = early plus the first weight
# tile loaded before gdc_wait, variants/early-firsttile.patch here, variant 31)
export PYTHONUNBUFFERED=1; mkdir -p $OUT
for r in 1 2; do AB_TAG=r$r bash scripts/ab_bench.sh qwen2.5-0.5b 1,32 base ef early; done
EARLY_WAVES=3 AB_TAG=w3 bash scripts/ab_bench.sh qwen2.5-0.5b 1,32 ef
bash scripts/ab_bench.sh phi-1.5 1,32 base ef
cd $OUT && tar czf ab.tgz ab
