"""The decode GEMMs of the benchmark shapes as a step runs them: back to back inside a CUDA graph,
over enough distinct weight copies (>= 256 MB) that every weight comes from HBM, not L2.
Times cuBLAS (`F.linear`, plus the separate activation / residual kernels it needs) against the
Triton skinny GEMM at several launch configurations; prints a table and writes JSON.
Usage: python scripts/gemm_sweep.py [out.json]"""
import itertools
import json
import sys

import torch
import torch.nn.functional as F

from slipstream.kernels import skinny_gemm
from slipstream.kernels.skinny_gemm import Config, default_config, skinny_linear

DT = torch.bfloat16
# (name, N, K, bias, act, act_from, residual): every linear of a decode step of the two benchmark shapes
SHAPES = [("phi in_proj", 14336, 2048, True, "gelu_tanh", 6144, False),
          ("phi out_proj", 2048, 10240, True, None, 0, True),
          ("phi head", 51200, 2048, True, None, 0, False),
          ("qwen qkv", 1152, 896, True, None, 0, False), ("qwen o", 896, 896, False, None, 0, True),
          ("qwen gate_up", 9728, 896, False, "swiglu", 0, False), ("qwen down", 896, 4864, False, None, 0, True),
          ("qwen head", 151936, 896, False, None, 0, False)]
CONFIGS = [Config(16, 128, 4, 4, split) for split in (1, 4, 8)] + [Config(32, 128, 4, 4, split) for split in (1, 4, 8)] + [
    Config(64, 128, 4, 4), Config(16, 64, 4, 8, 8)]


def graph_ms(fn, copies: int) -> float:
    """Per-call time of `fn(i)` for i in range(copies), captured once in a graph and replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(copies):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 20 / copies


def cublas(x, w, b, act, act_from, r):
    y = F.linear(x, w, b)
    if act == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    elif act:
        y[:, act_from:] = F.gelu(y[:, act_from:], approximate="tanh")
    return y + r if r is not None else y


results = []
for (name, n, k, has_bias, act, act_from, has_res), m in itertools.product(SHAPES, (1, 32, 64)):
    copies = max(4, -(-256 * 2**20 // (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda", dtype=DT) * 0.02 for _ in range(copies)]
    b = torch.randn(n, device="cuda", dtype=DT) if has_bias else None
    x = torch.randn(m, k, device="cuda", dtype=DT)
    r = torch.randn(m, n, device="cuda", dtype=DT) if has_res else None
    row = {"name": name, "m": m, "n": n, "k": k, "weight_mb": n * k * 2 / 1e6,
           "cublas_us": graph_ms(lambda i: cublas(x, ws[i], b, act, act_from, r), copies) * 1e3, "triton_us": {}}
    for cfg in [default_config(m, n, k), *CONFIGS]:
        try:
            row["triton_us"][",".join(map(str, cfg))] = graph_ms(
                lambda i, cfg=cfg: skinny_linear(x, ws[i], b, act, r, act_from=act_from, config=cfg), copies) * 1e3
        except Exception as e:  # a configuration that does not compile or fit is skipped
            print(f"  {name} m={m} {cfg}: {type(e).__name__}", flush=True)
    row["default"] = ",".join(map(str, default_config(m, n, k)))
    with_pdl = skinny_gemm.pdl_args
    skinny_gemm.pdl_args = lambda: {"PDL": False}
    row["default_without_pdl_us"] = graph_ms(lambda i: skinny_linear(x, ws[i], b, act, r, act_from=act_from), copies) * 1e3
    skinny_gemm.pdl_args = with_pdl
    best = min(row["triton_us"], key=row["triton_us"].get)
    row["best"] = best
    gbs = lambda us: row["weight_mb"] / us  # MB/us = TB/s
    print(f"{name:>13} m={m:>2}: cuBLAS {row['cublas_us']:7.1f} us ({gbs(row['cublas_us']):.2f} TB/s) | "
          f"default {row['default']:>12} {row['triton_us'][row['default']]:7.1f} us | best {best:>12} "
          f"{row['triton_us'][best]:7.1f} us ({gbs(row['triton_us'][best]):.2f} TB/s) | default without PDL "
          f"{row['default_without_pdl_us']:7.1f} us", flush=True)
    results.append(row)
    ws = None
    torch.cuda.empty_cache()
json.dump(results, open(sys.argv[1] if len(sys.argv) > 1 else "gemm_sweep.json", "w"), indent=1)
