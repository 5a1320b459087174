"""Where a Moondream 2 image step's GPU time goes (800x600 image, tiling 2x4: 9 crops), by part, each
part run eagerly under torch.profiler (kernel time summed, so launch gaps do not count), plus the
captured graph's replay (CUDA events) and its kernels as the profiler sees them. Prints tables;
writes $OUT/md_profile.json. Usage: python md_profile.py"""
import json, os, time
from collections import defaultdict
import numpy as np, torch
from torch.profiler import profile, ProfilerActivity
from slipstream import LLM
from slipstream.bench.moondream import synthetic_images
from slipstream.kernels.attention import AttentionInputs
from slipstream.models.moondream.config import PREFIX_LEN
from slipstream.models.moondream.image import make_crops, prepare_image

out_dir = os.environ.get("OUT", ".")
t0 = time.time()
llm = LLM(os.environ.get("MODEL", "random:moondream2"), max_num_seqs=8)
print(f"engine up in {time.time() - t0:.0f} s", flush=True)
run = llm.core.runner
heads, kv, vision = run.heads, run.kv, run.heads.cfg.vision
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
img = synthetic_images(1, 0)[0]
crops_host = prepare_image(img, vision)
from dataclasses import replace
image = replace(crops_host, pixels=crops_host.pixels.to(dev), plans=tuple(p.to(dev) for p in crops_host.plans))
print("tiling", image.tiling, "crops", image.count)
slots = torch.arange(PREFIX_LEN, device=dev) + kv.page_size  # (pages 1.., free: no request runs)
text = heads.text
ACT = [ProfilerActivity.CUDA] if dev.type == "cuda" else [ProfilerActivity.CPU]
KIND = torch.autograd.DeviceType.CUDA if dev.type == "cuda" else torch.autograd.DeviceType.CPU
state = {}


def p_crops():
    state["crops"] = make_crops(image, vision)

def p_normalize():
    state["x"] = heads.vision.normalize(state["crops"])

def p_encode():
    state["feat"] = heads.vision.encode(state["x"])

def p_reconstruct():
    state["joined"] = heads.vision.reconstruct(state["feat"], image.tiling)[None]

def p_proj():
    j = state["joined"]
    state["img"] = heads.vision.proj_mlp(j.view(-1, j.shape[-1])).view(1, PREFIX_LEN - 1, -1)

def p_text():
    images = state["img"]
    dim = images.shape[-1]
    bos = text.model.embed_tokens.weight[heads.bos].expand(1, 1, dim)
    x = torch.cat([bos, images.to(bos.dtype)], dim=1).reshape(PREFIX_LEN, dim)
    positions = torch.arange(PREFIX_LEN, device=dev)
    rope = text.rotary.table(positions, x.dtype)
    attn = AttentionInputs(slots, None, None, block_len=PREFIX_LEN)
    for i, layer in enumerate(text.model.layers):
        x = layer(x, rope, attn, kv.layer(i), None)
    state["x_text"] = x

PARTS = [("make_crops", p_crops), ("normalize", p_normalize), ("encode (27 blocks)", p_encode),
         ("reconstruct", p_reconstruct), ("proj_mlp", p_proj), ("text prefix (730 pos)", p_text)]
for _ in range(3):
    for _, f in PARTS:
        f()
torch.cuda.synchronize() if dev.type == "cuda" else None


def kernels(prof):
    agg = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == KIND:
            agg[e.name][0] += e.device_time_total / 1e3 if hasattr(e, "device_time_total") else e.cuda_time_total / 1e3
            agg[e.name][1] += 1
    return agg

report = {"parts": {}, "graph": {}}
total = 0.0
print(f"\n{'part':24s} {'GPU ms':>8s} {'kernels':>8s}   top kernels (ms)")
for name, f in PARTS:
    with profile(activities=ACT) as prof:
        f(); torch.cuda.synchronize() if dev.type == "cuda" else None
    agg = kernels(prof)
    ms = sum(v[0] for v in agg.values()); n = sum(v[1] for v in agg.values())
    total += ms
    top = sorted(agg.items(), key=lambda kv: -kv[1][0])[:6]
    report["parts"][name] = {"ms": ms, "kernels": n, "top": [(k[:90], v[0], v[1]) for k, v in top]}
    print(f"{name:24s} {ms:8.3f} {n:8d}")
    for k, v in top:
        print(f"    {v[0]:7.3f} ms  x{v[1]:<4d} {k[:110]}")
print(f"{'sum of parts':24s} {total:8.3f}")

# the captured graph of this tiling, as the engine replays it
g = getattr(run, "image_graphs", None)
if g is not None:
    g.crops[:image.count].copy_(state["crops"])
    s = torch.cuda.current_stream()
    times = []
    for _ in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.prefill(image.tiling, slots); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    report["graph"]["replay_ms_median"] = float(np.median(times[2:]))
    print(f"\ngraph replay (tiling {image.tiling}): {np.median(times[2:]):.3f} ms median")
    with profile(activities=ACT) as prof:
        g.prefill(image.tiling, slots); torch.cuda.synchronize()
    agg = kernels(prof)
    ms = sum(v[0] for v in agg.values()); n = sum(v[1] for v in agg.values())
    report["graph"]["kernel_ms"] = ms; report["graph"]["kernels"] = n
    top = sorted(agg.items(), key=lambda kv: -kv[1][0])[:25]
    report["graph"]["top"] = [(k[:120], v[0], v[1]) for k, v in top]
    print(f"graph kernels seen by the profiler: {n}, summed {ms:.3f} ms")
    for k, v in top:
        print(f"    {v[0]:7.3f} ms  x{v[1]:<4d} {k[:110]}")
json.dump(report, open(os.path.join(out_dir, "md_profile.json"), "w"), indent=1)
llm.shutdown()
