"""The vision encoder's parts in CUDA graphs (random bf16 weights, the engine's VisionEncoder): its
attention by backend, head dim and Triton configuration (kernels/vision_attention.py); the GEMMs
with and without their bias; the whole encoder with the Triton attention and with the output
biases left to the norms, at 5 and 9 crops."""
import json, os, sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "src")
from slipstream.bench.decode import median_cuda_ms
from slipstream.kernels.linear import PendingSum
from slipstream.kernels.norm import pending_layer_norm
from slipstream.kernels.vision_attention import vision_attention
from slipstream.models.moondream import vision as V
from slipstream.models.moondream.config import VisionConfig

out_dir = os.environ.get("R", ".")
res = {}
dev = "cuda"
torch.manual_seed(0)


def graph_ms(fn, reps=10):
    """ms of one fn() call: a graph of `reps` calls, replayed (median of 20) / reps."""
    with torch.no_grad():
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
    return median_cuda_ms(g.replay, repeats=20) / reps


# 1. attention, one layer at 5 crops
n, S, H = 5, 729, 16
res["attention_us"] = {}


def sdpa_fn(d, backend=None):
    qkv = torch.randn(n * S, 3 * H * d, device=dev, dtype=torch.bfloat16)
    q, k, v = qkv.view(n, S, 3, H, d).permute(2, 0, 3, 1, 4)
    if backend is None:
        return lambda: F.scaled_dot_product_attention(q, k, v)

    def f():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return f


for d in (64, 72, 80, 96, 128):
    for name, bk in (("default", None), ("flash", SDPBackend.FLASH_ATTENTION)):
        if name == "flash" and d not in (72, 96):
            continue
        try:
            us = 1000 * graph_ms(sdpa_fn(d, bk))
        except Exception as e:
            us = float("nan")
        res["attention_us"][f"sdpa {name} d{d}"] = us
        print(f"sdpa {name:8s} d={d:3d}: {us:6.1f} us", flush=True)

qkv = torch.randn(n * S, 3 * H * 72, device=dev, dtype=torch.bfloat16)
q, k, v = qkv.view(n, S, 3, H, 72).permute(2, 0, 3, 1, 4)
ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).transpose(1, 2).reshape(n * S, H * 72)
best = None
for bm, bn, w, st in ((128, 64, 8, 2), (128, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 4, 2),
                      (64, 64, 4, 2), (64, 128, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3), (64, 32, 4, 2)):
    try:
        f = lambda: vision_attention(qkv, S, H, bm, bn, w, st)
        err = (f().float() - ref).abs().max().item()
        us = 1000 * graph_ms(f)
    except Exception as e:
        print(f"triton {bm}x{bn} w{w} s{st}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
        continue
    res["attention_us"][f"triton {bm}x{bn} w{w} s{st}"] = us
    print(f"triton {bm}x{bn} w{w} s{st}: {us:6.1f} us, max err {err:.4f}", flush=True)
    if best is None or us < best[0]:
        best = (us, (bm, bn, w, st))
res["best_triton"] = best
print("best triton", best, flush=True)

# 2. the GEMMs at 5 crops, alone, with and without bias
m = n * S
res["gemm_us"] = {}
for name, (k_, n_) in dict(qkv=(1152, 3456), proj=(1152, 1152), fc1=(1152, 4304), fc2=(4304, 1152)).items():
    a = torch.randn(m, k_, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n_, k_, device=dev, dtype=torch.bfloat16) * 0.02
    b = torch.randn(n_, device=dev, dtype=torch.bfloat16) * 0.02
    for label, f in (("bias", lambda: F.linear(a, w, b)), ("nobias", lambda: F.linear(a, w)),
                     ("gelu", lambda: torch._addmm_activation(b, a, w.t(), use_gelu=True))):
        if label == "gelu" and name != "fc1":
            continue
        us = 1000 * graph_ms(f)
        res["gemm_us"][f"{name} {label}"] = us
        print(f"gemm {name:4s} {label:6s}: {us:6.1f} us, {2 * m * k_ * n_ / us / 1e6:.0f} TFLOP/s", flush=True)

# 3. the encoder, by variant
cfg = VisionConfig()
enc = V.VisionEncoder(cfg)
with torch.no_grad():
    for name, p in enc.named_parameters():
        p.copy_(torch.ones_like(p) if ("ln" in name and name.endswith("weight")) else torch.randn_like(p) * 0.02)
enc = enc.to(dev, torch.bfloat16).eval()
sq = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
peak = 2 * 8192 ** 3 / median_cuda_ms(lambda: sq @ sq)
del sq
params = sum(p.numel() for nm, p in enc.named_parameters() if not nm.startswith("proj_mlp"))
orig_attn, orig_block = V.VisionAttention.forward, V.VisionBlock.forward
bm, bn, w, st = best[1] if best else (128, 64, 8, 2)


def triton_attn(self, x):
    return self.proj(vision_attention(self.qkv(x), S, self.heads, bm, bn, w, st))


def bias_in_norm(self, x, normed, next_norm):
    a = self.attn
    core = vision_attention(a.qkv(normed), S, a.heads, bm, bn, w, st) if TRITON else \
        F.scaled_dot_product_attention(*a.qkv(normed).view(-1, S, 3, a.heads, 72).permute(2, 0, 3, 1, 4)).transpose(1, 2).reshape(normed.shape)
    x, normed = pending_layer_norm(PendingSum(F.linear(core, a.proj.weight)[None], a.proj.bias, x),
                                   self.ln2.weight, self.ln2.bias, self.ln2.eps)
    h = torch._addmm_activation(self.mlp.fc1.bias, normed, self.mlp.fc1.weight.t(), use_gelu=True)
    return pending_layer_norm(PendingSum(F.linear(h, self.mlp.fc2.weight)[None], self.mlp.fc2.bias, x),
                              next_norm.weight, next_norm.bias, next_norm.eps)


res["encoder"] = {}
for crops in (5, 9):
    x = torch.randint(0, 256, (crops, 3, 378, 378), dtype=torch.uint8, device=dev)
    floor = 2 * params * 729 * crops / peak
    outs = {}
    for variant in ("base", "triton_attn", "bias_in_norm", "both", "base again"):
        TRITON = variant == "both"
        V.VisionAttention.forward = triton_attn if variant == "triton_attn" else orig_attn
        V.VisionBlock.forward = bias_in_norm if variant in ("bias_in_norm", "both") else orig_block
        fn = lambda: enc.encode(enc.normalize(x))
        with torch.no_grad():
            outs[variant] = fn().float()
        ms = graph_ms(fn, reps=1)
        err = (outs[variant] - outs["base"]).abs().max().item()
        res["encoder"][f"{variant} {crops}"] = dict(ms=ms, floor_ms=floor, x_floor=ms / floor, max_diff=err)
        print(f"encoder {crops} crops {variant:12s}: {ms:.3f} ms, {ms / floor:.3f}x floor ({floor:.3f}), "
              f"max diff vs base {err:.4f} (base max {outs['base'].abs().max().item():.2f})", flush=True)
    # kernel kinds of the last variant with everything on
    TRITON = True
    V.VisionAttention.forward, V.VisionBlock.forward = orig_attn, bias_in_norm
    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    by_name = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += e.device_time
            by_name[e.name][1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:10]
    res[f"both kernels {crops}"] = [(k_[:100], v_[0] / 1000, v_[1]) for k_, v_ in top]
    for k_, (us, c) in top:
        print(f"   {us / 1000:7.3f} ms x{c:3d}  {k_[:100]}")
    V.VisionAttention.forward, V.VisionBlock.forward = orig_attn, orig_block
json.dump(res, open(f"{out_dir}/enc_probe2.json", "w"), indent=1)
