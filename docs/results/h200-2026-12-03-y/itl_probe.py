"""Interference ITL tail (Qwen shape): per-step GPU time, GPU gap before it, commit interval, host tick,
for the slowest commit intervals; then ITL p50/p99 at other chunk sizes. Usage: python itl_probe.py OUT"""
import json, sys, time
import numpy as np
from slipstream import LLM
from slipstream.bench import traffic
from slipstream.bench.decode import new_profiler

out = sys.argv[1]
import os
llm = LLM(os.environ.get("MODEL", "random:qwen2.5-0.5b"), mode="pipelined")
traffic.run_mixed(llm, 8, (16, 64), (4, 8))
sched, runner = llm.core.scheduler, llm.core.runner
report = {"runs": []}
def analyze(row, chunk):
    steps = row['steps']
    g = [s["end"] - s["start"] for s in steps if s["tokens"] > 300]
    gap = [b["start"] - a["end"] for a, b in zip(steps, steps[1:]) if b["tokens"] > 300]
    print(f"chunk {chunk}: mixed steps {len(g)} gpu ms p50 {np.median(g):.3f} p95 {np.percentile(g,95):.3f} "
          f"p99 {np.percentile(g,99):.3f} max {max(g):.3f}; gap p50 {np.median(gap):.3f} p95 "
          f"{np.percentile(gap,95):.3f} p99 {np.percentile(gap,99):.3f} max {max(gap):.3f}")
    iv = np.diff(row["commits"])
    dec = [i for i, s in enumerate(steps) if s["tokens"] == 32 + chunk]  # (the mixed steps while 32 decode)
    lo, hi = min(dec), max(dec)
    worst = [w for w in np.argsort(iv)[::-1] if lo <= w + 1 <= hi][:6]
    for w in sorted(worst):
        s = steps[w + 1] if w + 1 < len(steps) else None
        if s:
            p = steps[w]
            print(f"  interval {iv[w]:.3f} ms before commit {w+1}: step {s['index']} {s['kind']} {s['tokens']} tok "
                  f"gpu {s['end']-s['start']:.3f} gap {s['start']-p['end']:.3f} start-vs-commit "
                  f"{row['commits'][w+1]-s['end']:.3f}")
            a, b = row["commits"][w], row["commits"][w + 1]
            for t0, t1, wt in row["ticks"]:
                if t1 > a - 0.5 and t0 < b:
                    print(f"     tick {t0 - a:+.3f}..{t1 - a:+.3f} waited {wt:.3f}")

def one(chunk, profile):
    sched.max_prefill_chunk = chunk
    prof = new_profiler(llm, max_steps=8192) if profile else None
    n0 = len(sched.commit_log)
    res = traffic.run_interference(llm, 32, 1024)
    runner.profiler = None
    inter = res[1]
    row = {"chunk": chunk, "itl_p50": inter.itl_ms_p50, "itl_p99": inter.itl_ms_p99,
           "decode_only_p50": res[0].itl_ms_p50, "q": inter.itl_ms_quantiles[85:]}
    if prof is not None:
        steps = prof.steps()
        commits = [t for _, t in list(sched.commit_log)[n0:]]
        row["steps"] = steps
        row["ticks"] = prof.cpu_spans()
        row["commits"] = [(t - prof.origin_time) * 1e3 for t in commits]
        row["host"] = {k: [x * 1e3 for x in v] for k, v in prof.host.items()}
        analyze(row, chunk)
    print(f"chunk {chunk}: ITL p50 {inter.itl_ms_p50:.3f} p99 {inter.itl_ms_p99:.3f} (decode-only p50 "
          f"{res[0].itl_ms_p50:.3f}); q85.. {[round(x, 2) for x in inter.itl_ms_quantiles[85:]]}", flush=True)
    report["runs"].append(row)
import torch
PLAN = [(int(c), True) for c in os.environ.get('CHUNKS', '320,320,320,256,256,256').split(',')]
for chunk, profile in PLAN:
    one(chunk, profile and torch.cuda.is_available())
json.dump(report, open(out, "w"))
llm.shutdown()
