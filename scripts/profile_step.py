"""Where a decode step's GPU time goes (H200): a torch.profiler kernel table of eager decode steps
(graphs off, so kernels are visible), and the paged-decode kernel at the benchmark shape against
dense SDPA over the same keys. Usage: python scripts/profile_step.py [random:phi-1.5] [streams]"""
import sys

import torch
import torch.nn.functional as F
import triton.testing

from slipstream import LLM, SamplingParams
from slipstream.kernels.paged_decode import paged_decode_attention

model = sys.argv[1] if len(sys.argv) > 1 else "random:phi-1.5"
streams = int(sys.argv[2]) if len(sys.argv) > 2 else 32

with LLM(model, max_num_seqs=streams, cuda_graphs=False) as llm:
    prompts = [[(i * 7 + j) % 1000 for j in range(64)] for i in range(streams)]
    llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))

cfg = dict(h=32, kvh=32, d=64) if "phi" in model else dict(h=14, kvh=2, d=64)
b, page = streams, 16
for ctx in (128, 192):
    q = torch.randn(b, cfg["h"], cfg["d"], device="cuda", dtype=torch.bfloat16)
    pages = b * ctx // page + 1
    kp = torch.randn(pages, page, cfg["kvh"], cfg["d"], device="cuda", dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    table = torch.arange(1, pages, device="cuda").view(b, -1)
    lens = torch.full((b,), ctx, device="cuda")
    for dot in ((True, False) if cfg["h"] == cfg["kvh"] else (True,)):
        for ppb in (2, 4, 8):
            for warps in (2, 4, 8):
                ms = triton.testing.do_bench(
                    lambda: paged_decode_attention(q, kp, vp, table, lens, 0.125, pages_per_block=ppb, num_warps=warps,
                                                   dot=dot), return_mode="median")
                print(f"ctx {ctx} paged_decode dot={dot} pages_per_block={ppb} num_warps={warps}: {ms * 1e3:.1f} us")
    k = kp[1:].reshape(b, ctx, cfg["kvh"], cfg["d"]).transpose(1, 2)
    v = vp[1:].reshape(b, ctx, cfg["kvh"], cfg["d"]).transpose(1, 2)
    ms = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=cfg["h"] != cfg["kvh"]),
                                 return_mode="median")
    print(f"ctx {ctx} dense SDPA over the same keys: {ms * 1e3:.1f} us; KV bytes {2 * kp[1:].numel() * 2 / 1e6:.1f} MB")
