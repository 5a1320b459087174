"""A trace folder's requests as spans along the first token's path (median and mean µs).
Usage: python spans.py DIR [DIR ...]"""
import glob, sys
import numpy as np

SPANS = [("client send -> API handler", "c0_send", "a1_handler"), ("API: body, checks, send", "a1_handler", "a3_zsent"),
         ("ZMQ to engine", "a3_zsent", "e0_recv"), ("engine: handle", "e0_recv", "e1_queued"),
         ("engine: loop wakes", "e1_queued", "e2_woke"), ("engine: to first token", "e2_woke", "e4_on_token"),
         ("engine: ship", "e4_on_token", "e6_shipped"), ("ZMQ to API", "e6_shipped", "a4_received"),
         ("API: first text frame", "a4_received", "a7_text"), ("to the client", "a7_text", "c2_first"),
         ("client TTFT", "c0_send", "c2_first"), ("engine recv -> first token", "e0_recv", "e4_on_token")]


def requests(d):
    events = []
    for path in [p for r in ("api", "engine", "client") for p in glob.glob(f"{d}/{r}.*.txt")]:
        for line in open(path):
            if line.strip():
                label, t = line.split()
                events.append((int(t), label))
    events.sort()
    starts = [i for i, (_, l) in enumerate(events) if l == "c0_send"]
    for a, b in zip(starts, starts[1:] + [len(events)]):
        first = {}
        for t, l in events[a:b]:
            first.setdefault(l, t)
        sent = [t for t, l in events[a:b] if l == "a7_sent" and t >= first.get("a4_received", 1 << 62)]
        if sent:
            first["a7_text"] = sent[0]
        if all(k in first for k in ("c0_send", "c2_first", "e4_on_token", "a7_text")):
            yield first


for d in sys.argv[1:]:
    rows = list(requests(d))
    print(f"== {d}: {len(rows)} requests")
    for name, a, b in SPANS:
        v = np.array([(r[b] - r[a]) / 1e3 for r in rows if a in r and b in r])
        print(f"  {name:28s} p50 {np.median(v):8.1f}  mean {v.mean():8.1f}")
