"""Host time of the interference workload's ticks, by function (inclusive µs: median, p90, max), the
slowest ticks' breakdown, and GC pauses. Usage: MODEL=... REPS=.. python hostsplit.py"""
import gc, os, sys, time, functools
from collections import defaultdict, deque
import numpy as np
from slipstream import LLM, engine
from slipstream.bench import traffic
from slipstream import scheduler, runner as runner_mod
T = defaultdict(list)
TICK = []  # this tick's (key, µs)
TICKS = []  # (tick µs, breakdown)
ON = [False]
def wrap(obj, name, key):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        if not ON[0]:
            return f(*a, **k)
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            d = time.perf_counter() - t
            T[key].append(d)
            if key == "S.tick":
                TICKS.append((d * 1e6, list(TICK)))
                TICK.clear()
            else:
                TICK.append((key, round(d * 1e6)))
    setattr(obj, name, g)
S, R = scheduler.Scheduler, runner_mod.ModelRunner
for n in ("tick", "_plan", "_register_launched", "_finalize", "_commit_tokens", "_commit_rest"):
    wrap(S, n, "S." + n)
for n in ("launch_forward", "_stage_packed", "_plan_programs", "sample_rows", "wait_tokens"):
    wrap(R, n, "R." + n)
wrap(engine.LLM, "submit", "LLM.submit")
GC = []
CENSUS = []
def on_gc(phase, info, t=[0.0]):
    if phase == "start":
        if ON[0] and info["generation"] >= 1:
            from collections import Counter
            young = [o for g in range(info["generation"] + 1) for o in gc.get_objects(g)]
            big = sorted(((len(o), type(o).__name__, repr(o)[:80]) for o in young
                          if isinstance(o, (list, dict, tuple, set, deque))), reverse=True)[:6]
            CENSUS.append((len(young), Counter(type(o).__name__ for o in young).most_common(10), big))
        t[0] = time.perf_counter()
    elif ON[0]:
        GC.append((info["generation"], (time.perf_counter() - t[0]) * 1e6, info["collected"]))
gc.callbacks.append(on_gc)
llm = LLM(os.environ.get("MODEL", "random:qwen2.5-0.5b"), mode="pipelined")
if "tiny" in os.environ.get("MODEL", ""):
    llm.core.scheduler.weight_kv_tokens = 1e9
if llm.core.runner.graphs is not None:
    wrap(type(llm.core.runner.graphs), "replay_packed", "G.replay_packed")
wrap(type(llm.core.layer), "upload_ahead", "L.upload_ahead")
traffic.run_mixed(llm, 8, (16, 64), (4, 8))
print("switch interval", sys.getswitchinterval(), "gc thresholds", gc.get_threshold(), "frozen", gc.get_freeze_count())
for rep in range(int(os.environ.get("REPS", 2))):
    T.clear(); TICKS.clear(); GC.clear(); ON[0] = True
    res = traffic.run_interference(llm, 32, 1024, steps=int(os.environ.get("STEPS", 200)))
    ON[0] = False
    print(f"ITL p50 {res[1].itl_ms_p50:.3f} p99 {res[1].itl_ms_p99:.3f} max {res[1].itl_ms_quantiles[-1]:.3f}; "
          f"gc {len(GC)} collections, gen>=1 {[g for g in GC if g[0] >= 1]}, longest {max([d for _, d, _ in GC], default=0):.0f} µs; gen0 {sorted(round(d) for g, d, _ in GC if g == 0)}")
    for c in CENSUS:
        print("  census", c)
    CENSUS.clear()
    for k in sorted(T, key=lambda k: -np.median(T[k]) * len(T[k])):
        v = np.array(T[k]) * 1e6
        print(f"  {k:20s} n={len(v):5d} median {np.median(v):7.1f} p90 {np.percentile(v, 90):7.1f} max {v.max():8.1f} µs")
    for d, parts in sorted(TICKS, key=lambda x: -x[0])[:4]:
        print(f"  slow tick {d:.0f} µs: {parts}")
llm.shutdown()
