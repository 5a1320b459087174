"""Where a constrained tick's host time goes on the device's host, by function (inclusive µs per call:
median, p90; calls per tick): 64 rows, 100% JSON (the constrained bench's schema), 1,024 tokens.
Usage: MODEL=random:qwen2.5-0.5b ROWS=64 FRAC=1 python tickparts.py"""
import os, time
from collections import defaultdict
import numpy as np
from slipstream import LLM, scheduler, runner as runner_mod, device
from slipstream.bench import decode
from slipstream.constrain import grammar

T = defaultdict(list)
ON = [False]
def wrap(cls, name, key):
    raw = cls.__dict__[name]
    is_cm = isinstance(raw, classmethod)
    f = raw.__func__ if is_cm else raw
    def g(*a, **k):
        if not ON[0]:
            return f(*a, **k)
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[key].append(time.perf_counter() - t)
    setattr(cls, name, classmethod(g) if is_cm else g)

S, R = scheduler.Scheduler, runner_mod.ModelRunner
for n in ("tick", "_launch_next", "_plan", "_commit_tokens", "_commit_rest", "_finalize"):
    wrap(S, n, "S" + n)
for n in ("launch_forward", "_stage_decode", "launch_sampling", "wait_tokens", "release", "mask_rows"):
    wrap(R, n, "R." + n)
wrap(device.DeviceLayer, "upload_ahead", "L.upload_ahead")
wrap(device.HostLanding, "start", "landing.start")
wrap(grammar.GrammarConstraint, "fill_masks", "fill_masks")
wrap(grammar.GrammarConstraint, "advance", "advance")
llm = LLM(os.environ.get("MODEL", "random:qwen2.5-0.5b"), max_num_seqs=64)
g = llm.core.runner.graphs
if g is not None:
    from slipstream import cuda_graphs
    wrap(cuda_graphs.StepGraphs, "replay_decode", "G.replay_decode")
    wrap(cuda_graphs.StepGraphs, "replay_sampling", "G.replay_sampling")
rows, frac = int(os.environ.get("ROWS", 64)), float(os.environ.get("FRAC", 1))
decode.run_case(llm, rows, 64, 32, constrained=frac)
for rep in range(int(os.environ.get("REPS", 2))):
    T.clear(); ON[0] = True
    r = decode.run_case(llm, rows, 64, int(os.environ.get("TOKENS", 1024)), constrained=frac)
    ON[0] = False
    ticks = len(T["Stick"])
    print(f"rep {rep}: ms/step {r.ms_per_step:.3f}, ticks {ticks}")
    for k in sorted(T, key=lambda k: -np.median(T[k]) * len(T[k])):
        v = np.array(T[k]) * 1e6
        print(f"  {k:20s} per tick {len(v) / ticks:5.1f}  median {np.median(v):7.1f}  p90 {np.percentile(v, 90):7.1f} µs")
llm.shutdown()
