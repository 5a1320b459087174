"""Merge a trace folder's stamps (client, api, engine) into one timeline per request and print the
median gap between consecutive events, in µs. Usage: python analyze.py DIR"""
import glob, sys
import numpy as np

d = sys.argv[1]
events = []
for path in [p for r in ("api", "engine", "client") for p in glob.glob(f"{d}/{r}.*.txt")]:
    for line in open(path):
        if not line.strip():
            continue
        label, t = line.split()
        events.append((int(t), label))
events.sort()
# requests: from each c0_send to the next c0_send
starts = [i for i, (_, l) in enumerate(events) if l == "c0_send"]
rows = []
for a, b in zip(starts, starts[1:] + [len(events)]):
    req = events[a:b]
    first = {}
    for t, l in req:
        if l == "t_tick":
            continue
        first.setdefault(l, t)
    # ticks between e2_woke and e4_on_token
    ticks = [t for t, l in req if l == "t_tick" and first.get("e2_woke", 0) <= t <= first.get("e4_on_token", 0)]
    for k, t in enumerate(ticks[:3]):
        first[f"t{k}_tick"] = t
    rows.append(first)
order = ["c0_send", "a0_asgi", "a1_handler", "a2_body", "a3_encoded", "a3_zsent", "e0_recv", "e1_queued", "e2_woke",
         "t0_tick", "t1_tick", "t2_tick", "e4_on_token", "e5_ship", "e6_shipped", "a4_received", "a5_start",
         "a6_frame", "a7_sent", "c1_headers", "c2_first"]
print(f"{len(rows)} requests")
full = [r for r in rows if all(k in r for k in ("c0_send", "c2_first", "e4_on_token"))]
print(f"{len(full)} complete")
prev = None
for k in order:
    vals = [r[k] for r in full if k in r]
    if len(vals) < len(full) // 2:
        continue
    if prev is not None:
        gaps = np.array([(r[k] - r[prev]) / 1e3 for r in full if k in r and prev in r])
        print(f"{prev:>12s} -> {k:<12s} p50 {np.median(gaps):8.1f}  mean {gaps.mean():8.1f}  p90 {np.percentile(gaps, 90):8.1f}")
    prev = k
tt = np.array([(r["c2_first"] - r["c0_send"]) / 1e3 for r in full])
eng = np.array([(r["e4_on_token"] - r["e0_recv"]) / 1e3 for r in full])
print(f"client TTFT p50 {np.median(tt):.1f} mean {tt.mean():.1f} µs; engine recv->on_token p50 {np.median(eng):.1f}")
print(f"outside the engine (TTFT - engine) p50 {np.median(tt - eng):.1f} mean {(tt - eng).mean():.1f} µs")
