# device call 1, carrying .variants/ (base = main 3276196, kvwait = variant/attn-kv-before-wait 40edbac,
# mha = variant/mha-head-groups 98ce99f, each `git archive <commit> src | tar x -C .variants/<name>`)
export PYTHONPATH=src SLIPSTREAM_CACHE=/tmp/slipstream-cache PYTHONUNBUFFERED=1
nvidia-smi -L; git log --oneline -1; mkdir -p $OUT
timeout 120 python3 scripts/launch_floor.py 2>&1 | tee $OUT/launch_floor.txt
for r in 1 2; do AB_TAG=r$r bash scripts/ab_bench.sh qwen2.5-0.5b 1,32 base kvwait; done
for h in 1 2 4 8; do SLIPSTREAM_MHA_HEADS=$h AB_TAG=h$h bash scripts/ab_bench.sh phi-1.5 1,32 mha; done
bash scripts/ab_bench.sh phi-1.5 1,32 base
cd $OUT && tar czf ab.tgz ab
