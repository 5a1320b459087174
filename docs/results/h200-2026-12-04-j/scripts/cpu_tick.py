"""Host cost of a constrained decode tick on the CPU machine, compute stubbed out: the forward returns
random logits, sampling is timed and subtracted. Phases in µs per tick (median). Usage:
MODEL=random:qwen2.5-0.5b ROWS=64 FRAC=1 TOKENS=256 python cpu_tick.py"""
import os, time, functools
from collections import defaultdict
import numpy as np, torch
from slipstream import LLM, scheduler, runner as runner_mod
from slipstream.bench import decode
from slipstream.constrain import grammar

T = defaultdict(list)
ON = [False]
EXCL = [0.0]
def wrap(obj, name, key, exclude=False):
    f = getattr(obj, name)
    is_cm = isinstance(obj.__dict__.get(name), classmethod)
    raw = f.__func__ if is_cm else f
    def g(*a, **k):
        if not ON[0]:
            return raw(*a, **k)
        e0 = EXCL[0]
        t = time.perf_counter()
        try:
            return raw(*a, **k)
        finally:
            d = time.perf_counter() - t
            if exclude:
                EXCL[0] += d
            T[key].append(d - (EXCL[0] - e0) if not exclude else d)
    setattr(obj, name, classmethod(g) if is_cm else g)

S, R = scheduler.Scheduler, runner_mod.ModelRunner
llm = LLM(os.environ.get("MODEL", "random:qwen2.5-0.5b"), max_num_seqs=64, mode=os.environ.get("MODE", "pipelined"))
run = llm.core.runner
V = run.vocab_size
gen = torch.Generator().manual_seed(0)
bank = [torch.randn(64, V, generator=gen) for _ in range(4)]
it = [0]
def fake_forward(self, slot, rows, width, adapted=False):
    it[0] += 1
    return bank[it[0] % 4][:rows]
R.decode_forward = fake_forward
wrap(R, "sample_rows", "compute:sample", exclude=True)
wrap(S, "tick", "tick")
wrap(S, "_plan", "plan")
if hasattr(R, "stage"):
    wrap(R, "stage", "stage"); wrap(S, "_after_commit", "after_commit")
    import concurrent.futures
    wrap(concurrent.futures.Future, "result", "fill_join")
wrap(R, "launch_forward", "launch_forward")
wrap(R, "_stage_decode", "stage_decode")
wrap(S, "_commit_tokens", "commit_tokens")
wrap(R, "wait_tokens", "wait_tokens")
wrap(S, "_commit_rest", "commit_rest")
wrap(S, "_finalize", "finalize")
wrap(R, "launch_sampling", "launch_sampling")
if hasattr(grammar.GrammarConstraint, "fill_masks"): wrap(grammar.GrammarConstraint, "fill_masks", "fill_masks")
rows, frac = int(os.environ.get("ROWS", 64)), float(os.environ.get("FRAC", 1))
decode.run_case(llm, rows, 64, 32, constrained=frac)
for rep in range(int(os.environ.get("REPS", 2))):
    T.clear(); EXCL[0] = 0; ON[0] = True
    r = decode.run_case(llm, rows, 64, int(os.environ.get("TOKENS", 256)), constrained=frac)
    ON[0] = False
    print(f"rep {rep}: ticks {len(T['tick'])}")
    for k in sorted(T, key=lambda k: -np.median(T[k])):
        v = np.array(T[k]) * 1e6
        print(f"  {k:16s} n={len(v):5d} median {np.median(v):8.1f} p90 {np.percentile(v, 90):8.1f} µs")
llm.shutdown()
