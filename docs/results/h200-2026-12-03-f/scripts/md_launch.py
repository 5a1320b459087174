"""Host time of a Moondream 2 image request's parts at 1 client (issue 17: the image step's launch read
3.5 ms at its p99 in run b, the GPU waiting between requests): the caller's side (load, prepare, submit)
and the loop's launch of an image step, split by function (perf_counter around each, µs, median over
the requests), beside the GPU time of the image graph (CUDA events). Usage: python md_launch.py"""
import json, os, time
from collections import defaultdict
import numpy as np, torch
from slipstream import LLM, runner as runner_mod, cuda_graphs, scheduler
from slipstream.bench.moondream import synthetic_images
import slipstream.models.moondream.image as image_mod
import slipstream.models.moondream.graphs as graphs_mod
import slipstream.models.moondream.api as api_mod

T = defaultdict(list)
ON = [False]


def wrap(owner, name, key=None):
    f = getattr(owner, name)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            if ON[0]:
                T[key or name].append((time.perf_counter() - t) * 1e6)
    setattr(owner, name, g)


R = runner_mod.ModelRunner
for n in ("launch_forward", "_prefill_images", "_stage_packed", "launch_sampling", "wait_tokens"):
    wrap(R, n)
wrap(cuda_graphs.StepGraphs, "replay_packed")
wrap(cuda_graphs.StepGraphs, "replay_head")
wrap(graphs_mod.ImageGraphs, "prefill", "image_graph_prefill")
wrap(image_mod, "make_crops")
wrap(api_mod, "prepare_image")
wrap(api_mod, "load_image")
wrap(scheduler.Scheduler, "_plan")
wrap(scheduler.Scheduler, "tick")
llm = LLM(os.environ.get("MODEL", "random:moondream2"), max_num_seqs=64)
wrap(llm.core.runner.layer, "upload_ahead")
imgs = synthetic_images(48, 1)
q = "What is the main object in this picture, what color is it, and where is it? Answer briefly."
settings = {"max_tokens": 8, "temperature": 0}
for im in imgs[:8]:
    llm.query(im, q, settings=settings)
ON[0] = True
lat = []
for im in imgs[8:]:
    t = time.perf_counter()
    llm.query(im, q, settings=settings)
    lat.append((time.perf_counter() - t) * 1e3)
ON[0] = False
print(f"latency p50 {np.median(lat):.2f} ms over {len(lat)} queries")
res = {k: {"n": len(v), "median_us": float(np.median(v)), "p90_us": float(np.percentile(v, 90)),
           "max_us": float(np.max(v))} for k, v in T.items()}
for k, v in sorted(res.items(), key=lambda kv: -kv[1]["median_us"]):
    print(f"  {k:22s} n={v['n']:4d} median {v['median_us']:9.1f} p90 {v['p90_us']:9.1f} max {v['max_us']:9.1f} µs")
# an image step's launch pieces by launch (the launches that ran _prefill_images)
json.dump({"latency_ms": lat, "parts": res}, open(os.path.join(os.environ.get("OUT", "."), "md_launch.json"), "w"))
llm.shutdown()
