"""kernel table of Qwen decode steps, eager and in graphs (session 6 diagnostic)"""
import sys
import torch
from torch.profiler import ProfilerActivity, profile
from slipstream import LLM, SamplingParams

streams = 32
for graphs in (False, True):
    with LLM("random:qwen2.5-0.5b", max_num_seqs=streams, cuda_graphs=graphs) as llm:
        prompts = [[(i * 7 + j) % 1000 for j in range(64)] for i in range(streams)]
        llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    print("graphs" if graphs else "eager", sys.argv[1])
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]:
        print(f"  {e.key[:40]:40s} n={e.count:6d} avg={e.device_time_total / max(1, e.count):8.2f}us tot={e.device_time_total/1e3:8.2f}ms")
