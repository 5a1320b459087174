"""Each LoRA decode kernel's cost in a chain of its own launches (a CUDA graph of N launches, PDL as in the
step): µs a launch, Qwen2.5-0.5B shapes, 32 rows under 8 adapter slots (rows' slots 1..8), or all rows
in slot 0 ("none": masks load nothing), beside the plain kernel. Usage: python kbench.py [ROWS]"""
import json, os, sys
import torch
from slipstream.kernels.linear import PendingSum
from slipstream.kernels.lora import LoraDelta, LoraWeights
from slipstream.kernels.norm import add_rms_norm, rms_norm_shrink
from slipstream.kernels.skinny_gemm import default_config, next_shrink_parts, skinny_linear

dev, bf16 = "cuda", torch.bfloat16
N_LAUNCH, REPS = 64, 30
torch.manual_seed(0)


def chain_us(fn):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(N_LAUNCH):
            fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / N_LAUNCH)
    ts.sort()
    return ts[len(ts) // 2]


def r(*shape, dtype=bf16, scale=0.02):
    return (torch.randn(*shape, device=dev) * scale).to(dtype)


def weights(width, k, n, rank, slots):
    ranks = torch.tensor([0] + [width] * 8, dtype=torch.int32, device=dev)
    return LoraWeights(r(9, width, k), r(9, n, width), ranks, slots)


def run(rows, rank):
    res, h, w = r(rows, 896, scale=1.0), r(rows, 896, scale=1.0), r(896, scale=1.0)
    partials3 = r(3, rows, 896, dtype=torch.float32, scale=1.0)
    partials4 = r(4, rows, 896, dtype=torch.float32, scale=1.0)
    out = {}
    labels = os.environ.get("LABELS", "lora,none").split(",")
    for label, slots in (("lora", torch.arange(rows, device=dev) % 8 + 1), ("none", torch.zeros(rows, dtype=torch.int64, device=dev))):
        if label not in labels:
            continue
        qkv = weights(3 * rank, 896, 1152, rank, slots)
        gu = weights(2 * rank, 896, 9728, rank, slots)
        o = weights(rank, 896, 896, rank, slots)
        down = weights(rank, 4864, 896, rank, slots)
        parts = next_shrink_parts(h, gu.b[0], down.a.shape[1])
        parts.copy_(torch.randn_like(parts) * 0.01)
        x = r(rows, 896, scale=1.0)
        qkv_d = LoraDelta(r(rows, 3 * rank, scale=0.5), qkv.b, qkv.ranks, slots)
        gu_d = LoraDelta(r(rows, 2 * rank, scale=0.5), gu.b, gu.ranks, slots)
        wq, wgu, wo, wd = r(1152, 896), r(9728, 896), r(896, 896), r(896, 4864)
        hid = r(rows, 4864, scale=1.0)
        cases = {
            "norm2 o-delta+gu-shrink": lambda: rms_norm_shrink(PendingSum(partials3, None, res, (h, o)), w, 1e-6, gu),
            "norm2 o-delta": lambda: add_rms_norm(PendingSum(partials3, None, res, (h, o)), w, 1e-6),
            "norm2 gu-shrink": lambda: rms_norm_shrink(PendingSum(partials3, None, res), w, 1e-6, gu),
            "norm1 down-parts+qkv-shrink": lambda: rms_norm_shrink(PendingSum(partials4, None, res, (parts, down)), w, 1e-6, qkv),
            "norm1 down-parts": lambda: add_rms_norm(PendingSum(partials4, None, res, (parts, down)), w, 1e-6),
            "norm1 qkv-shrink": lambda: rms_norm_shrink(PendingSum(partials4, None, res), w, 1e-6, qkv),
            "qkv expand": lambda: skinny_linear(x, wq, wq[:, 0].contiguous(), lora=qkv_d),
            "gate_up expand": lambda: skinny_linear(x, wgu, act="swiglu", lora=gu_d),
            "gate_up expand+shares": lambda: skinny_linear(x, wgu, act="swiglu", lora=gu_d, shrink_next=down, next_parts=parts),
        }
        for name, fn in cases.items():
            out[f"{name} [{label}]"] = chain_us(fn)
    bq = r(1152)
    plain = {
        "norm plain (3 partials)": lambda: add_rms_norm(PendingSum(partials3, None, res), w, 1e-6),
        "norm plain (4 partials)": lambda: add_rms_norm(PendingSum(partials4, None, res), w, 1e-6),
        "qkv plain": lambda: skinny_linear(x, wq, bq),
        "gate_up plain": lambda: skinny_linear(x, wgu, act="swiglu"),
        "o plain (defer)": lambda: skinny_linear(h, wo, defer=True),
        "down plain (defer)": lambda: skinny_linear(hid, wd, defer=True),
    }
    for name, fn in plain.items():
        out[name] = chain_us(fn)
    # pairs as in the step: the deferred GEMM, then the norm finishing its sum (with the adapter's delta)
    import inspect
    early = {"early_dependents": True} if "early_dependents" in inspect.signature(skinny_linear).parameters else {}
    slots = torch.arange(rows, device=dev) % 8 + 1
    qkv, gu = weights(3 * rank, 896, 1152, rank, slots), weights(2 * rank, 896, 9728, rank, slots)
    o, down = weights(rank, 896, 896, rank, slots), weights(rank, 4864, 896, rank, slots)
    parts = next_shrink_parts(h, wgu, down.a.shape[1])
    parts.copy_(torch.randn_like(parts) * 0.01)
    pairs = {
        "pair o+norm2 plain": lambda: add_rms_norm(PendingSum(skinny_linear(h, wo, defer=True), None, res), w, 1e-6),
        "pair o+norm2 lora": lambda: rms_norm_shrink(PendingSum(skinny_linear(h, wo, defer=True, **early), None, res, (h, o)), w, 1e-6, gu),
        "pair down+norm1 plain": lambda: add_rms_norm(PendingSum(skinny_linear(hid, wd, defer=True), None, res), w, 1e-6),
        "pair down+norm1 lora": lambda: rms_norm_shrink(PendingSum(skinny_linear(hid, wd, defer=True, **early), None, res, (parts, down)), w, 1e-6, qkv),
    }
    for name, fn in pairs.items():
        out[name] = chain_us(fn)
    return out


results = {}
for rows, rank in [tuple(map(int, c.split('x'))) for c in os.environ.get('CASES', '32x16,32x4').split(',')]:
    res_ = run(rows, rank)
    results[f"rows{rows}_rank{rank}"] = res_
    print(f"\n== {rows} rows, rank {rank} (µs a launch, chain of {N_LAUNCH})")
    for k, v in res_.items():
        print(f"  {k:42s} {v:7.2f}")
json.dump(results, open(os.path.join(os.environ.get("OUT", "."), "kbench.json"), "w"), indent=1)
