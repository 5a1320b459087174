"""Host time of a tick's copies and events on the device layer of the tree on PYTHONPATH: a step's
metadata uploaded ahead, and an event with a landing of 64 tokens (median µs of 2,000)."""
import statistics
import time

import torch

from slipstream.device import DeviceLayer

layer = DeviceLayer(torch.device("cuda:0"))
layer.enter_loop_thread()
meta_host = layer.pinned(60_000, torch.int64)
meta_dev = torch.zeros(60_000, dtype=torch.int64, device="cuda")
sampled = torch.zeros(256, dtype=torch.int64, device="cuda")
up, ev = layer.event(), layer.event()
landing = layer.landing((256,), torch.int64)


def timed(fn, n=2000):
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t)
        torch.cuda.synchronize()
    return statistics.median(out) / 1e3


def land():
    layer.record(ev)
    landing.start(sampled[:64], ev)


print(f"upload_ahead {timed(lambda: layer.upload_ahead(meta_dev, meta_host, up)):.1f} us")
print(f"record+landing {timed(land):.1f} us")
print(f"landing wait {timed(lambda: (land(), landing.wait())):.1f} us (with the landing)")
