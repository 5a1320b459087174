"""Where a LoRA decode step's GPU time goes, by kernel and adapter rank: 32 streams of 64-token prompts,
under 8 random adapters of each rank in RANKS (max_lora_rank = that rank), and in an engine without
LoRA slots (plain). Each case runs twice under torch.profiler, 1 and 1 + STEPS output tokens; the
difference / STEPS is a decode step's kernels (the prefill's drop out). Prints µs a step by kernel
name, per case side by side; writes $OUT/lora_step_profile.json. Usage: python lora_step_profile.py"""
import json, os, tempfile, time
from collections import defaultdict
from pathlib import Path
import torch
from torch.profiler import profile, ProfilerActivity
from slipstream import LLM, SamplingParams
from slipstream.bench.decode import random_prompts
from slipstream.lora.adapter import write_random_adapter

GPU = torch.cuda.is_available()
SYNC = torch.cuda.synchronize if GPU else (lambda: None)
STEPS, STREAMS, MODEL = int(os.environ.get("STEPS", 64)), 32, os.environ.get("MODEL", "random:qwen2.5-0.5b")
out_dir = os.environ.get("OUT", ".")


def kernels(llm, loras, tokens):
    prompts = random_prompts(llm, [64] * STREAMS)
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, lora=loras[i % len(loras)] if loras else None)
              for i in range(STREAMS)]
    SYNC()
    with profile(activities=[ProfilerActivity.CUDA if GPU else ProfilerActivity.CPU]) as prof:
        for i in llm.submit_many(prompts, params):
            llm.result(i)
        SYNC()
    agg = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == (torch.autograd.DeviceType.CUDA if GPU else torch.autograd.DeviceType.CPU):
            agg[e.name][0] += (e.device_time_total if GPU else e.cpu_time_total)
            agg[e.name][1] += 1
    return agg


def per_step(llm, loras):
    kernels(llm, loras, 8)  # (warm-up: graphs captured)
    short, long = kernels(llm, loras, 1), kernels(llm, loras, 1 + STEPS)
    return {k: ((v[0] - short.get(k, [0, 0])[0]) / STEPS, (v[1] - short.get(k, [0, 0])[1]) / STEPS)
            for k, v in long.items()}


cases = {}
t0 = time.time()
with LLM(MODEL, max_num_seqs=STREAMS) as llm:
    cases["plain"] = per_step(llm, None)
for rank in [int(r) for r in os.environ.get("RANKS", "4,16").split(",")]:
    with LLM(MODEL, max_num_seqs=STREAMS, max_loras=8, max_lora_rank=rank) as llm:
        names = [f"a{i}" for i in range(8)]
        with tempfile.TemporaryDirectory() as tmp:
            for i, n in enumerate(names):
                llm.load_lora(n, str(write_random_adapter(llm.core.lora.targets, Path(tmp) / n, rank, seed=i)))
        cases[f"r{rank}"] = per_step(llm, names)
print(f"({time.time() - t0:.0f} s)")
names = sorted({k for c in cases.values() for k in c}, key=lambda k: -max(c.get(k, (0, 0))[0] for c in cases.values()))
print(f"{'kernel':60s} " + " ".join(f"{c:>18s}" for c in cases))
print(f"{'':60s} " + " ".join(f"{'us/step  n/step':>18s}" for c in cases))
for k in names:
    row = [cases[c].get(k, (0.0, 0.0)) for c in cases]
    if max(abs(r[0]) for r in row) < 1.0:
        continue
    print(f"{k[:60]:60s} " + " ".join(f"{r[0]:9.1f} {r[1]:7.1f} " for r in row))
print(f"{'total':60s} " + " ".join(f"{sum(v[0] for v in cases[c].values()):9.1f} {sum(v[1] for v in cases[c].values()):7.1f} "
                                  for c in cases))
json.dump({c: {k: list(v) for k, v in d.items()} for c, d in cases.items()},
          open(os.path.join(out_dir, "lora_step_profile.json"), "w"), indent=1)
