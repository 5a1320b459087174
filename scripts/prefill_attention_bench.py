"""The packed prefill attention on the H200, bf16, head_dim 64, the Qwen2.5-0.5B (GQA 14/2) and
Phi-1.5 (MHA 32) shapes, over 16-token pages in scattered order (the engine's layout), q taken as
rotated (no rotary tables). Each figure is the median of CUDA-graph replays.

1. Against torch's variable-length FlashAttention: the anchor's 64 prompts of random lengths
   16-1024 (../shared/anchors/prefill_floor.py), whole. `varlen_attn` (torch >= 2.11) reads
   contiguous K/V, GQA's repeated to every query head where torch has no GQA argument. TFLOP/s
   counts the causal work, 2 x 2 x sum(n^2 / 2) x H x D.
2. Steps as the engine packs them (decode rows are chunks of one token), with the long tiles' keys
   split over programs as the runner plans them, against no split, other balancing targets and 8 warps:
   the interference workload's step (32 decode rows beside a 512-token chunk of a 1024-token
   prompt), an 864-token prompt beside 64 decode rows, and 256 decode rows of ~620 tokens beside a
   512-token chunk (the mixed workload at max_num_seqs 256).
3. Phi's decode rows alone (32 of 200 tokens, 256 of 620): the packed kernel (its one-query form)
   against the paged-decode kernel's forms and configurations, in TB/s of K/V read.

Prints tables and writes JSON. Usage: python3 scripts/prefill_attention_bench.py [OUT.json]"""
import inspect
import json
import sys

import numpy as np
import torch
import triton.testing

from slipstream.bench.traffic import prefill_lengths
from slipstream.kernels import sm_count
from slipstream.kernels.attention import PROGRAMS_PER_SM, program_list
from slipstream.kernels.packed_attention import packed_attention
from slipstream.kernels.paged_decode import paged_decode_attention

PAGE, D = 16, 64
SHAPES = {"qwen2.5-0.5b": (14, 2), "phi-1.5": (32, 32)}


def timed(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, return_mode="median")


class Step:
    """A packed step's attention inputs on the GPU: chunks (tokens, context) over scattered pages."""

    def __init__(self, chunks: list[tuple[int, int]], h: int, kvh: int) -> None:
        self.lens = np.array([n for n, _ in chunks])
        self.contexts = np.array([c for _, c in chunks])
        self.h, self.kvh, self.tokens = h, kvh, int(self.lens.sum())
        widths = -(-self.contexts // PAGE)
        order = torch.randperm(int(widths.sum()), device="cuda") + 1
        self.table = torch.zeros(len(chunks), int(widths.max()), dtype=torch.int64, device="cuda")
        start = 0
        for s, w in enumerate(widths):
            self.table[s, :w] = order[start:start + w]
            start += w
        self.k_pages = torch.randn(int(widths.sum()) + 1, PAGE, kvh, D, device="cuda", dtype=torch.bfloat16)
        self.v_pages = torch.randn_like(self.k_pages)
        self.q = torch.randn(self.tokens, h, D, device="cuda", dtype=torch.bfloat16)
        self.query_start = torch.tensor(np.concatenate([[0], np.cumsum(self.lens)]), device="cuda")
        self.ctx = torch.tensor(self.contexts, device="cuda")

    def run(self, parallel: int, **config):
        programs = torch.tensor(program_list(self.lens, self.contexts, self.tokens, self.h, self.kvh, parallel),
                                device="cuda")
        no_rope = torch.zeros(1, 0, device="cuda")
        splits = int((programs[4] >= 0).sum())
        return splits, lambda: packed_attention(self.q, self.k_pages, self.v_pages, self.table, self.ctx,
                                                self.query_start, programs, D ** -0.5, no_rope, no_rope, **config)


CONFIGS = [(4, 3), (8, 3), (4, 2), (8, 2), (4, 4), (8, 4)]  # packed kernel (warps, stages); the first is the default


def against_flash(results: dict) -> None:
    lens = np.array(prefill_lengths())
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    print("1. 64 whole prompts of random lengths 16-1024")
    for name, (h, kvh) in SHAPES.items():
        flops = 2 * 2 * float((lens.astype(np.float64) ** 2 / 2).sum()) * h * D
        step = Step([(n, n) for n in lens], h, kvh)
        row = {f"slipstream packed_attention, {w} warps, {st} stages":
               timed(step.run(PROGRAMS_PER_SM * sm_count() // kvh, num_warps=w, num_stages=st)[1])
               for w, st in CONFIGS}
        if varlen_attn is not None:
            args = inspect.signature(varlen_attn).parameters
            kw = {"is_causal": True} if "is_causal" in args else {"window_size": (-1, 0)}
            pos = torch.cat([torch.arange(n, device="cuda") for n in lens])
            seq_of = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))
            slots = step.table[seq_of, pos // PAGE] * PAGE + pos % PAGE
            k, v = (x.view(-1, kvh, D)[slots].repeat_interleave(h // kvh, dim=1) for x in (step.k_pages, step.v_pages))
            cu, m = step.query_start.to(torch.int32), int(lens.max())
            row["torch varlen_attn (FlashAttention)"] = timed(lambda: varlen_attn(step.q, k, v, cu, cu, m, m, **kw))
        results["flash"][name] = {k: {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)} for k, ms in row.items()}
        for kernel, r in results["flash"][name].items():
            print(f"{name:>14} {kernel:>50}: {r['ms']:7.3f} ms {r['tflops']:7.1f} TFLOP/s")


STEPS = {"32 decode rows (ctx 200) + 512 of a 1024-token prompt": [(1, 200)] * 32 + [(512, 1024)],
         "64 decode rows (ctx 100) + an 864-token prompt": [(1, 100)] * 64 + [(864, 864)],
         "256 decode rows (ctx 620) + 512 of a 1024-token prompt": [(1, 620)] * 256 + [(512, 1024)]}


def split_steps(results: dict) -> None:
    print("\n2. packed steps, us: long tiles' keys split for `parallel` tiles at once (1: no split)")
    for name, (h, kvh) in SHAPES.items():
        for label, chunks in STEPS.items():
            step = Step(chunks, h, kvh)
            row = {}
            for per_sm, warps in ((0, 4), (1, 4), (2, 4), (4, 4), (0, 8), (2, 8)):
                parallel = max(1, per_sm * sm_count() // kvh)
                splits, fn = step.run(parallel, num_warps=warps)
                row[f"parallel {parallel} ({per_sm}/SM), {warps} warps"] = {"us": round(timed(fn) * 1e3, 1),
                                                                          "split programs": splits}
            results["steps"][f"{name}: {label}"] = row
            print(f"{name:>14} {label}: " + ", ".join(f"{k} {v['us']} ({v['split programs']} split)"
                                                      for k, v in row.items()))


def decode_rows(results: dict) -> None:
    print("\n3. Phi-1.5 shape, decode rows alone: us, TB/s of K/V read")
    h, kvh = SHAPES["phi-1.5"]
    for rows, ctx in ((32, 200), (256, 620)):
        step = Step([(1, ctx)] * rows, h, kvh)
        kv_bytes = 2 * rows * ctx * kvh * D * 2
        variants = {"packed kernel (one-query form)": step.run(1)[1]}
        for dot in (False, True):
            for ppb in (2, 4, 8):
                for warps in (2, 4):
                    variants[f"paged_decode dot={dot} pages/block={ppb} warps={warps}"] = (
                        lambda dot=dot, ppb=ppb, warps=warps: paged_decode_attention(
                            step.q, step.k_pages, step.v_pages, step.table, step.ctx, D ** -0.5, dot=dot,
                            pages_per_block=ppb, num_warps=warps))
        for label, fn in variants.items():
            us = timed(fn) * 1e3
            results["decode_rows"][f"{rows} x {ctx}: {label}"] = {"us": round(us, 1),
                                                                  "TB/s": round(kv_bytes / us / 1e6, 2)}
            print(f"  {rows} x {ctx} {label:>44}: {us:8.1f} us {kv_bytes / us / 1e6:5.2f} TB/s")


def main() -> None:
    torch.manual_seed(0)
    results = {"flash": {}, "steps": {}, "decode_rows": {}}
    against_flash(results)
    split_steps(results)
    decode_rows(results)
    if len(sys.argv) > 1:
        json.dump(results, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
