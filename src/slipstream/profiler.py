"""The bubble profiler: per-step GPU timestamps from CUDA events on the compute stream (forward
start, forward end, sampling end) and CPU time per scheduler tick, for `slipstream bench --profile`;
and `StepClock`, its always-on counterpart for a server's /metrics (busy and idle time per step).

GPU idle between steps is the gap on the compute stream from one step's sampling end to the next
step's forward start — read from the device timeline, never inferred from wall time."""
from __future__ import annotations

import bisect
import time
from pathlib import Path

import numpy as np
import torch

# where a tick's CPU time goes: planning and staging a step and queueing its forward (a grammar step's
# fill posted to the matcher process); a commit's tokens in (constraints advanced); the rest of the
# commit (text, stop checks, callbacks, releases: while the matcher process fills, when a constrained
# step waits for its masks); the constrained rows' bitmask fill here and the wait for the matcher
# process's; queueing sampling (the bitmask upload, and the accept posted to the matcher process)
HOST_PHASES = ("launch", "commit", "text", "mask_fill", "sampling")


# upper bounds (seconds) of the buckets of GPU idle per step that StepClock counts
IDLE_BUCKETS = (2e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)


class StepClock:
    """GPU busy and idle time per step, cheap enough to leave on (EngineConfig.step_timing): two
    timing events a step, in a ring, read when the step commits — by then both have passed (its
    tokens' copy waited on an event recorded after them), so reading them never waits. A step's
    idle time is the gap from the previous step's end to its start, counted only when the loop had
    work all along between them (`pause` marks where it ran out, so waiting for traffic is not idle).
    On the CPU stand-in the stamps are host times: the forward ran when it was queued."""

    RING = 4  # steps whose stamps are kept (two in flight, and the one before them)

    def __init__(self, layer) -> None:
        self.layer = layer
        self.stamps = [(layer.timing_event(), layer.timing_event()) for _ in range(self.RING)]
        self.busy_seconds = 0.0
        self.idle_seconds = 0.0
        self.steps = 0
        self.idle_counts = [0] * (len(IDLE_BUCKETS) + 1)  # per bucket of IDLE_BUCKETS, then the rest
        self._previous: int | None = None  # index of the last step committed, while the loop had work

    def started(self, step) -> None:
        self.layer.record_timing(self.stamps[step.index % self.RING][0])

    def ended(self, step) -> None:
        self.layer.record_timing(self.stamps[step.index % self.RING][1])

    def committed(self, step) -> None:
        start, end = self.stamps[step.index % self.RING]
        self.busy_seconds += self.layer.elapsed_ms(start, end) / 1e3
        self.steps += 1
        if self._previous == step.index - 1:
            idle = max(0.0, self.layer.elapsed_ms(self.stamps[self._previous % self.RING][1], start) / 1e3)
            self.idle_seconds += idle
            self.idle_counts[bisect.bisect_left(IDLE_BUCKETS, idle)] += 1
        self._previous = step.index

    def pause(self) -> None:
        """The loop ran out of work: the gap before the next step is not the engine's."""
        self._previous = None


class StepProfiler:
    def __init__(self, compute_stream: torch.cuda.Stream, max_steps: int = 1024) -> None:
        self.stream = compute_stream
        self.events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(max_steps)]
        self.kinds: dict[int, str] = {}
        self.tokens: dict[int, int] = {}
        self.first: int | None = None
        self.ticks: list[tuple[float, float, float]] = []  # (start, end, seconds blocked on a copy event)
        # CPU seconds per tick in each part of the scheduler's work (HOST_PHASES), for ticks that have it
        self.host: dict[str, list[float]] = {name: [] for name in HOST_PHASES}
        self._tick_host: dict[str, float] = {}
        torch.cuda.synchronize()
        self.origin = torch.cuda.Event(enable_timing=True)
        self.origin.record(compute_stream)
        torch.cuda.synchronize()
        self.origin_time = time.perf_counter()

    def mark(self, step, which: int) -> None:
        """Record event `which` (0 forward start, 1 forward end, 2 sampling end) of `step`."""
        if self.first is None:
            self.first = step.index
        i = step.index - self.first
        if i < len(self.events):
            self.kinds[i] = step.kind
            self.tokens[i] = step.num_tokens
            self.events[i][which].record(self.stream)

    def phase(self, name: str, seconds: float) -> None:
        """Add CPU seconds to one of HOST_PHASES for the current tick."""
        self._tick_host[name] = self._tick_host.get(name, 0.0) + seconds

    def tick(self, start: float, end: float, waited: float) -> None:
        self.ticks.append((start, end, waited))
        for name, seconds in self._tick_host.items():
            self.host[name].append(seconds)
        self._tick_host = {}

    def steps(self) -> list[dict[str, float]]:
        """Per recorded step: kind and its three GPU timestamps (ms since the origin)."""
        torch.cuda.synchronize()
        return [{"index": i, "kind": self.kinds[i], "tokens": self.tokens[i],
                 **{k: self.origin.elapsed_time(e) for k, e in zip(("start", "forward_end", "end"), self.events[i])}}
                for i in sorted(self.kinds)]

    def summary(self) -> dict[str, float]:
        steps = self.steps()
        decode = [s for s in steps if s["kind"] == "decode"]
        pairs = [(a, b) for a, b in zip(steps, steps[1:]) if a["kind"] == b["kind"] == "decode"]
        cpu = [(end - start - waited) * 1e3 for start, end, waited in self.ticks]

        def stats(name: str, xs: list[float]) -> dict[str, float]:
            return {f"{name}_median_ms": float(np.median(xs)) if xs else float("nan"),
                    f"{name}_p99_ms": float(np.percentile(xs, 99)) if xs else float("nan")}

        prefill = [s for s in steps if s["kind"] == "prefill"]
        busy = sum(s["end"] - s["start"] for s in steps)
        return {**stats("prefill_gpu", [s["end"] - s["start"] for s in prefill]), "prefill_steps": len(prefill),
                **stats("prefill_tokens", [s["tokens"] / 1e3 for s in prefill]),  # (in thousands of tokens)
                **stats("gpu_idle_any", [b["start"] - a["end"] for a, b in zip(steps, steps[1:])]),
                "gpu_busy_fraction": busy / (steps[-1]["end"] - steps[0]["start"]) if steps else float("nan"),
                **stats("forward", [s["forward_end"] - s["start"] for s in decode]),
                **stats("sampling", [s["end"] - s["forward_end"] for s in decode]),
                **stats("gpu_busy", [s["end"] - s["start"] for s in decode]),
                **stats("gpu_idle", [b["start"] - a["end"] for a, b in pairs]),
                **stats("step", [b["start"] - a["start"] for a, b in pairs]),
                **stats("cpu_bookkeeping", cpu),
                **{k: v for name in HOST_PHASES
                   for k, v in stats(f"host_{name}", [t * 1e3 for t in self.host[name]]).items()},
                "decode_steps": len(decode)}

    def cpu_spans(self) -> list[tuple[float, float, float]]:
        """Ticks as (start ms, end ms, waited ms) on the GPU timeline's clock (aligned at the origin)."""
        return [((s - self.origin_time) * 1e3, (e - self.origin_time) * 1e3, w * 1e3) for s, e, w in self.ticks]


def plot_timeline(profiles: dict[str, StepProfiler], path: Path, num_steps: int = 8) -> None:
    """A PNG of a few consecutive decode steps per mode: GPU forward/sampling bars over CPU ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(profiles), 1, figsize=(12, 2.2 * len(profiles)), squeeze=False)
    for ax, (mode, prof) in zip(axes[:, 0], profiles.items()):
        steps = [s for s in prof.steps() if s["kind"] == "decode"]
        window = steps[len(steps) // 2: len(steps) // 2 + num_steps]
        if not window:
            continue
        t0, t1 = window[0]["start"], window[-1]["end"]
        for s in window:
            ax.broken_barh([(s["start"] - t0, s["forward_end"] - s["start"])], (10, 8), color="tab:blue")
            ax.broken_barh([(s["forward_end"] - t0, s["end"] - s["forward_end"])], (10, 8), color="tab:orange")
        for start, end, waited in prof.cpu_spans():
            if end >= t0 and start <= t1:
                ax.broken_barh([(start - t0, end - start - waited)], (0, 8), color="tab:gray")
        ax.set_yticks([4, 14], ["CPU busy", "GPU"])
        ax.set_xlim(0, t1 - t0)
        ax.set_title(f"{mode}: GPU forward (blue), sampling (orange); CPU bookkeeping per tick (gray)", fontsize=9)
    axes[-1, 0].set_xlabel("ms")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
