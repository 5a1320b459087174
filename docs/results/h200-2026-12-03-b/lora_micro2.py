"""The adapted projections one at a time on the Qwen2.5-0.5B shapes, as a decode step runs them (32
rows, 8 adapters of rank 16 over the rows, stacks of max_lora_rank 16), each in a CUDA graph of 50
calls: µs per call of the GEMM alone, the shrink alone, the shrink + the GEMM with the expand in its
epilogue, and the same with no row under an adapter. Usage: python lora_micro2.py"""
import json, os
import torch
from slipstream.kernels.linear import linear
from slipstream.kernels import lora as L
from slipstream.kernels.lora import LoraWeights, shrink

dev = torch.device("cuda")
torch.manual_seed(0)
# (K, N, capacity, how the engine calls it)
SHAPES = {"qkv": (896, 1152, 3, {}), "o": (896, 896, 1, {"defer": True}), "gate_up": (896, 9728, 2, {"act": "swiglu"}),
          "down": (4864, 896, 1, {"defer": True})}
ROWS, SLOTS, RANK = 32, 8, 16


def timed(fn, reps=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(ts)[3]


out = {}
print(f"{'target':8s} {'K':>5s} {'N':>5s} {'gemm':>7s} {'shrink':>7s} {'lora':>7s} {'lora, no rows':>13s} µs")
for name, (k, n, cap, how) in SHAPES.items():
    width = cap * RANK
    x = torch.randn(ROWS, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    res = torch.randn(ROWS, n, device=dev, dtype=torch.bfloat16)
    a = torch.randn(SLOTS + 1, width, k, device=dev, dtype=torch.bfloat16) * 0.02
    b = torch.randn(SLOTS + 1, n, width, device=dev, dtype=torch.bfloat16) * 0.02
    ranks = torch.full((SLOTS + 1,), width, dtype=torch.int32, device=dev); ranks[0] = 0
    slots = (torch.arange(ROWS, device=dev) % SLOTS + 1).to(torch.int64)
    none = torch.zeros_like(slots)
    kw = dict(how, residual=res) if how.get("defer") else how
    t_gemm = timed(lambda: linear(x, w, **kw))
    for splits in (8, 4, 2, 1):  # (the shrink's largest feature split)
        L.MAX_SPLITS = splits
        t_shrink = timed(lambda: shrink(x, a, ranks, slots))
        t_lora = timed(lambda: linear(x, w, **kw, lora=LoraWeights(a, b, ranks, slots)))
        t_none = timed(lambda: linear(x, w, **kw, lora=LoraWeights(a, b, ranks, none)))
        out[f"{name} splits<={splits}"] = dict(k=k, n=n, gemm=t_gemm, shrink=t_shrink, lora=t_lora, lora_no_rows=t_none)
        print(f"{name:8s} {k:5d} {n:5d} {t_gemm:7.2f} {t_shrink:7.2f} {t_lora:7.2f} {t_none:13.2f}  splits<={splits}")
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "lora_micro2.json"), "w"), indent=1)
