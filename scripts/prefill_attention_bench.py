"""The packed prefill attention against torch's variable-length FlashAttention on the H200: the
anchor's 64 prompts of random lengths 16-1024 (../shared/anchors/prefill_floor.py), whole prompts,
bf16, the Qwen2.5-0.5B (GQA 14/2) and Phi-1.5 (MHA 32) shapes, head_dim 64. slipstream's kernel reads
K/V from scattered pages (16-token pages, the engine's layout) and rotates q as it loads it;
`varlen_attn` (torch >= 2.11) reads contiguous K/V, with GQA's K/V repeated to every query head where
torch has no GQA argument. Prints ms and TFLOP/s (causal: 2 x 2 x sum(n^2 / 2) x H x D) and writes
JSON. Usage: python3 scripts/prefill_attention_bench.py [OUT.json]"""
import inspect
import json
import sys

import numpy as np
import torch

from slipstream.bench.traffic import prefill_lengths
from slipstream.kernels.attention import num_programs, plan_programs, tokens_per_program
from slipstream.kernels.packed_attention import packed_attention


def timed(fn, repeats=20) -> float:
    for _ in range(3):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in events]))


def main() -> None:
    torch.manual_seed(0)
    lens = np.array(prefill_lengths())
    total, page = int(lens.sum()), 16
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    results = {}
    for name, h, kvh in (("qwen2.5-0.5b", 14, 2), ("phi-1.5", 32, 32)):
        d = 64
        flops = 2 * 2 * float((lens.astype(np.float64) ** 2 / 2).sum()) * h * d
        q = torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(total, kvh, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        widths = -(-lens // page)
        pages = torch.randperm(int(widths.sum()), device="cuda") + 1
        table = torch.zeros(len(lens), int(widths.max()), dtype=torch.int64, device="cuda")
        k_pages = torch.zeros(int(widths.sum()) + 1, page, kvh, d, device="cuda", dtype=torch.bfloat16)
        v_pages = torch.zeros_like(k_pages)
        start = 0
        for s, (n, w) in enumerate(zip(lens, widths)):
            table[s, :w] = pages[start:start + w]
            start += w
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), device="cuda")
        pos = torch.cat([torch.arange(n, device="cuda") for n in lens])
        seq_of = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))
        slots = table[seq_of, pos // page] * page + pos % page
        k_pages.view(-1, kvh, d)[slots] = k
        v_pages.view(-1, kvh, d)[slots] = v
        bq = tokens_per_program(h // kvh)
        programs = np.zeros((2, num_programs(total, len(lens), bq)), np.int64)
        plan_programs(lens, bq, total, programs)
        programs = torch.tensor(programs, device="cuda")
        ctx = torch.tensor(lens, device="cuda")
        no_rope = torch.zeros(1, 0, device="cuda")
        row = {"slipstream packed_attention": timed(lambda: packed_attention(q, k_pages, v_pages, table, ctx, cu,
                                                                             programs, d ** -0.5, no_rope, no_rope))}
        if varlen_attn is not None:
            args = inspect.signature(varlen_attn).parameters
            kw = {"is_causal": True} if "is_causal" in args else {"window_size": (-1, 0)}
            kk, vv = (x.repeat_interleave(h // kvh, dim=1) for x in (k, v))
            cu32, m = cu.to(torch.int32), int(lens.max())
            row["torch varlen_attn (FlashAttention)"] = timed(lambda: varlen_attn(q, kk, vv, cu32, cu32, m, m, **kw))
        results[name] = {k: {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)} for k, ms in row.items()}
        for kernel, r in results[name].items():
            print(f"{name:>14} {kernel:>36}: {r['ms']:7.3f} ms {r['tflops']:7.1f} TFLOP/s")
    if len(sys.argv) > 1:
        json.dump(results, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
