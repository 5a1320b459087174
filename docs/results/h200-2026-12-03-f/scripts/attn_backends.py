"""Moondream 2's vision encoder on the H200: its attention (9 crops x 16 heads x 729 tokens x head dim 72) by each
SDPA backend, and the whole encoder forward (9 crops, captured as a graph) under each. Random weights (VisionConfig())."""
import json, os, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from slipstream.models.moondream.config import VisionConfig
from slipstream.models.moondream.vision import VisionEncoder

torch.manual_seed(0)
cfg = VisionConfig()
dev, dt = "cuda", torch.bfloat16
n, heads, d = 9, cfg.enc_n_heads, cfg.enc_dim // cfg.enc_n_heads
print("heads", heads, "head dim", d)
qkv = torch.randn(n * 729, 3 * cfg.enc_dim, device=dev, dtype=dt)
q, k, v = qkv.view(-1, 729, 3, heads, d).permute(2, 0, 3, 1, 4)

def timed(fn, iters=50):
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(iters):
        fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / iters

res = {}
ref = None
for name, be in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("default", None)]:
    try:
        if be is None:
            f = lambda: F.scaled_dot_product_attention(q, k, v)
        else:
            def f(be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v)
        out = f()
        if ref is None:
            ref = out.float()
        diff = (out.float() - ref).abs().max().item()
        res[name] = {"attn_ms": timed(f), "max_diff_vs_cudnn": diff}
    except Exception as ex:
        res[name] = {"error": str(ex)[:200]}
    print(name, res[name], flush=True)

with torch.device(dev):
    enc = VisionEncoder(cfg).to(dt)
crops = torch.randn(n, 3, cfg.crop_size, cfg.crop_size, device=dev, dtype=dt)
for name, be in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
    try:
        with sdpa_kernel(be):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for _ in range(2):
                    enc.encode(crops)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                enc.encode(crops)
        res[name]["encoder_graph_ms"] = timed(g.replay, 20)
    except Exception as ex:
        res[name]["encoder_error"] = str(ex)[:200]
    print(name, res[name], flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "attn_backends.json"), "w"), indent=1)
