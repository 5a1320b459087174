"""Sampling cost per decode step (H200): the torch sampler against the fused kernel
(kernels/sample.py) over [rows, vocab] fp32 logits, greedy and tempered, with and without a grammar
bitmask, and tempered with top-k / top-p / min-p (the kernel's candidate walk against the torch
sort); CUDA-graph replays, µs. Usage: python scripts/sample_bench.py [rows] [vocab]"""
import sys

import torch
import triton.testing

from slipstream.kernels.sample import fused_sample
from slipstream.sampling import sample_reference

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 32
vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 151936
logits = torch.randn(rows, vocab, device="cuda") * 3
words = torch.randint(-2**31, 2**31 - 1, (rows, -(-vocab // 32)), dtype=torch.int32, device="cuda")
seeds = torch.randint(0, 2**62, (rows,), device="cuda")
token_index = torch.arange(rows, device="cuda")


def per_row(top_k: int, top_p: float, min_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.full((rows,), top_k, device="cuda"), torch.full((rows,), top_p, dtype=torch.float64, device="cuda"),
            torch.full((rows,), min_p, dtype=torch.float64, device="cuda"))


print(f"{rows} rows x {vocab} vocab ({rows * vocab * 4 / 1e6:.1f} MB of fp32 logits)")
print(f"{'case':>32} {'torch us':>9} {'fused us':>9}")
for name, temp, filters in (("greedy", 0.0, None), ("temperature 0.8", 0.8, None),
                            ("T 0.8, top-k 50, top-p 0.9", 0.8, per_row(50, 0.9, 0.0)),
                            ("T 0.8, top-p 0.9", 0.8, per_row(0, 0.9, 0.0)),
                            ("T 0.8, min-p 0.05", 0.8, per_row(0, 1.0, 0.05))):
    temperature = torch.full((rows,), temp, dtype=torch.float64, device="cuda")
    key = (seeds, token_index) if temp > 0 else (None, None)
    for mask in (None, words):
        t_torch = triton.testing.do_bench_cudagraph(
            lambda: sample_reference(logits, mask, temperature, *key, filters=filters), return_mode="median")
        t_fused = triton.testing.do_bench_cudagraph(lambda: fused_sample(logits, mask, temperature, *key,
                                                                         filters=filters), return_mode="median")
        label = name + (" + mask" if mask is not None else "")
        print(f"{label:>32} {t_torch * 1e3:>9.1f} {t_fused * 1e3:>9.1f}", flush=True)
