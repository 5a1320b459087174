"""Sampling cost per decode step (H200): the torch sampler against the fused kernel
(kernels/sample.py) over [rows, vocab] fp32 logits, greedy and tempered, with and without a grammar
bitmask; CUDA-graph replays, µs. Usage: python scripts/sample_bench.py [rows] [vocab]"""
import sys

import torch
import triton.testing

from slipstream.kernels.sample import fused_sample
from slipstream.sampling import apply_bitmask, gumbel_noise

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 32
vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 151936
logits = torch.randn(rows, vocab, device="cuda") * 3
words = torch.randint(-2**31, 2**31 - 1, (rows, -(-vocab // 32)), dtype=torch.int32, device="cuda")
seeds = torch.randint(0, 2**62, (rows,), device="cuda")
token_index = torch.arange(rows, device="cuda")


def torch_sampler(temperature, mask, random):
    """sampling.sample's torch path (what ran before the fused kernel)."""
    x = apply_bitmask(logits, mask) if mask is not None else logits
    greedy = x.argmax(-1)
    if not random:
        return greedy
    noisy = (x / temperature.float().clamp_min(1e-6)[:, None] + gumbel_noise(seeds, token_index, vocab)).argmax(-1)
    return torch.where(temperature > 0, noisy, greedy)


print(f"{rows} rows x {vocab} vocab ({rows * vocab * 4 / 1e6:.1f} MB of fp32 logits)")
print(f"{'case':>22} {'torch us':>9} {'fused us':>9}")
for name, temp in (("greedy", 0.0), ("temperature 0.8", 0.8)):
    temperature = torch.full((rows,), temp, dtype=torch.float64, device="cuda")
    key = (seeds, token_index) if temp > 0 else (None, None)
    for mask in (None, words):
        t_torch = triton.testing.do_bench_cudagraph(lambda: torch_sampler(temperature, mask, temp > 0),
                                                    return_mode="median")
        t_fused = triton.testing.do_bench_cudagraph(lambda: fused_sample(logits, mask, temperature, *key),
                                                    return_mode="median")
        label = name + (" + mask" if mask is not None else "")
        print(f"{label:>22} {t_torch * 1e3:>9.1f} {t_fused * 1e3:>9.1f}", flush=True)
