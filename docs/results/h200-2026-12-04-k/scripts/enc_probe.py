"""Where the Moondream vision encoder's time goes at 5 / 9 crops (random bf16 weights, the engine's
VisionEncoder): graph ms beside the floor, a kernel profile of one eager forward grouped by kind,
and the attention alone by head dim, layout and backend."""
import json, os, sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "src")
from slipstream.bench.decode import median_cuda_ms
from slipstream.models.moondream.config import VisionConfig
from slipstream.models.moondream.vision import VisionEncoder

out = os.environ.get("R", ".")
res = {}
dev = "cuda"
torch.manual_seed(0)
cfg = VisionConfig()
enc = VisionEncoder(cfg)
with torch.no_grad():
    for name, p in enc.named_parameters():
        if name.endswith("weight") and p.dim() == 2:
            p.normal_(0, 0.02)
        elif "ln" in name and name.endswith("weight"):
            p.fill_(1.0)
        else:
            p.normal_(0, 0.02)
enc = enc.to(dev, torch.bfloat16).eval()
sq = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
peak = 2 * 8192 ** 3 / median_cuda_ms(lambda: sq @ sq)
del sq
res["peak_tflops"] = peak / 1e9
params = sum(p.numel() for n, p in enc.named_parameters() if not n.startswith("proj_mlp"))


def graph_ms(fn):
    with torch.no_grad():
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    return median_cuda_ms(g.replay, repeats=20)


def kind(name):
    n = name.lower()
    if "gemm" in n or "sm90" in n or "cutlass" in n or "cublas" in n or "nvjet" in n:
        return "gemm"
    if "fmha" in n or "flash" in n or "attention" in n or "cudnn" in n or "sdpa" in n:
        return "attention"
    if "norm" in n:
        return "norm"
    return "other"


for n in (5, 9):
    x = torch.randint(0, 256, (n, 3, 378, 378), dtype=torch.uint8, device=dev)
    ms = graph_ms(lambda: enc.encode(enc.normalize(x)))
    floor = 2 * params * 729 * n / peak
    res[f"encode {n}"] = dict(ms=ms, floor_ms=floor, x_floor=ms / floor)
    print(f"encode {n} crops: {ms:.3f} ms, floor {floor:.3f}, {ms / floor:.3f}x", flush=True)
    with torch.no_grad():
        for _ in range(2):
            enc.encode(enc.normalize(x))
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            enc.encode(enc.normalize(x))
            torch.cuda.synchronize()
    by_kind, by_name = defaultdict(float), defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time if hasattr(e, "device_time") else e.cuda_time
            by_kind[kind(e.name)] += us
            by_name[e.name][0] += us
            by_name[e.name][1] += 1
    res[f"kinds {n}"] = {k: v / 1000 for k, v in by_kind.items()}
    print(f"  by kind (ms, eager kernels): " + ", ".join(f"{k} {v / 1000:.3f}" for k, v in sorted(by_kind.items())))
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:14]
    res[f"top {n}"] = [(k[:110], v[0] / 1000, v[1]) for k, v in top]
    for k, (us, c) in top:
        print(f"   {us / 1000:7.3f} ms x{c:3d}  {k[:110]}")

# attention alone, one layer's shape at 5 crops
n, h, s = 5, 16, 729
res["attention"] = {}
for d in (64, 72, 80, 96, 128):
    qkv = torch.randn(n * s, 3 * h * d, device=dev, dtype=torch.bfloat16)
    q, k, v = qkv.view(n, s, 3, h, d).permute(2, 0, 3, 1, 4)
    qc, kc, vc = (t.contiguous() for t in (q, k, v))
    for label, args in (("strided", (q, k, v)), ("contiguous", (qc, kc, vc))):
        for backend in ("default", "cudnn", "flash", "efficient"):
            try:
                if backend == "default":
                    f = lambda: F.scaled_dot_product_attention(*args)
                else:
                    bk = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                          "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
                    def f(bk=bk):
                        with sdpa_kernel(bk):
                            return F.scaled_dot_product_attention(*args)
                ms = median_cuda_ms(f, repeats=20)
            except Exception as e:  # a backend that refuses the shape
                ms = float("nan")
            res["attention"][f"d{d} {label} {backend}"] = ms
            print(f"attention d={d} {label:10s} {backend:9s}: {ms * 1000:7.1f} us", flush=True)

# the encoder's GEMM shapes at 5 crops, each alone
m = 5 * 729
res["gemms"] = {}
for name, (k_, n_) in dict(qkv=(1152, 3456), proj=(1152, 1152), fc1=(1152, 4304), fc2=(4304, 1152)).items():
    a = torch.randn(m, k_, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n_, k_, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n_, device=dev, dtype=torch.bfloat16)
    ms = median_cuda_ms(lambda: F.linear(a, w, b), repeats=20)
    tf = 2 * m * k_ * n_ / ms / 1e9
    res["gemms"][name] = dict(us=ms * 1000, tflops=tf)
    print(f"gemm {name} [{m}x{k_}]x[{k_}x{n_}]: {ms * 1000:.1f} us, {tf:.0f} TFLOP/s", flush=True)
json.dump(res, open(f"{out}/enc_probe.json", "w"), indent=1)
