"""`GET /metrics` in Prometheus's text format: requests by finish reason, TTFT / ITL / end-to-end
latency histograms as the API process sees them, the TTFT split along the first token's path
(seconds summed per hop: the API process to the engine's receipt, the engine to its commit of the
first text, back to the API process; bench-serve turns them into means), and the engine's own
figures from the stats it sends twice a second: requests running and waiting, KV pages (and the
prefix cache's), steps, prompt tokens and those found cached, and (step timing on) GPU busy and idle
time over the steps and idle per step, read from CUDA events on the compute stream."""
from __future__ import annotations

import bisect
import time
from typing import AsyncIterator, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..profiler import IDLE_BUCKETS
from .client import EngineClient
from .protocol import Delta

disable_created_metrics()  # (no *_created series beside every counter and histogram)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def histogram_family(name: str, help_: str, bounds: Sequence[float], counts: Sequence[int],
                     total: float) -> HistogramMetricFamily:
    """Counts per bucket (each bound's, then the rest) as Prometheus's cumulative `le` buckets."""
    cumulative, buckets = 0, []
    for bound, count in zip((*map(floatToGoString, bounds), "+Inf"), counts):
        cumulative += count
        buckets.append((bound, cumulative))
    return HistogramMetricFamily(name, help_, buckets=buckets, sum_value=total)


class LatencyHistogram:
    """A histogram that only the API process's event loop updates: no lock, and a delta's tokens
    counted in one call. (prometheus_client's Histogram takes a lock and walks its buckets once per
    token: py-spy put it at ~7% of the API process's samples streaming 12.5k tokens/s from a fake
    engine on the CPU machine; this one cut the process's CPU time over such runs by ~4%.)"""

    def __init__(self, name: str, help_: str, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.name, self.help, self.bounds = name, help_, tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += times
        self.total += seconds * times

    def family(self) -> HistogramMetricFamily:
        return histogram_family(self.name, self.help, self.bounds, self.counts, self.total)


class ServerMetrics:
    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self.registry = r = CollectorRegistry()
        self.requests = Counter("slipstream_requests", "Requests ended, by finish reason (client_gone: the client "
                                "left first)", ["finish_reason"], registry=r)
        self.ttft = LatencyHistogram("slipstream_time_to_first_token_seconds", "Arrival to first text")
        self.itl = LatencyHistogram("slipstream_inter_token_latency_seconds", "Between output tokens (a delta's "
                                    "time over its tokens)")
        self.e2e = LatencyHistogram("slipstream_e2e_request_latency_seconds", "Arrival to the last token")
        self.first_token_path = Counter("slipstream_first_token_path_seconds", "TTFT by hop, summed over the "
                                        "requests counted in first_token_path_requests (api_to_engine: arrival to "
                                        "the engine process's receipt; engine: to the loop's commit of the first "
                                        "text; engine_to_api: back in the API process)", ["hop"], registry=r)
        self.first_token_paths = Counter("slipstream_first_token_path_requests", "Requests whose first token's "
                                         "path is counted", registry=r)
        self.in_flight = Gauge("slipstream_requests_in_flight", "Requests the API process is serving", registry=r)
        r.register(_Histograms((self.ttft, self.itl, self.e2e)))
        r.register(_EngineCollector(engine))
        if hasattr(engine, "replica_states"):  # (serve --data-parallel: server/router.py)
            r.register(_RouterCollector(engine))

    def render(self) -> bytes:
        self.in_flight.set(self.engine.in_flight)
        return generate_latest(self.registry)

    async def observe(self, batches: AsyncIterator[list[Delta]]) -> AsyncIterator[list[Delta]]:
        """The request's batches of deltas, timed on their way through (each choice's tokens apart)."""
        start = time.monotonic()  # (the engine's stamps are on this clock)
        tokens: dict[int, tuple[int, float]] = {}  # choice -> (tokens so far, time of the last)
        reason = "client_gone"
        try:
            async for batch in batches:
                now = time.monotonic()
                for delta in batch:
                    seen, last = tokens.get(delta.index, (0, start))
                    if delta.completion_tokens > seen:
                        if not tokens:
                            self.ttft.observe(now - start)
                            if delta.stamps is not None:
                                self._observe_path(start, *delta.stamps, now)
                        elif seen:
                            new = delta.completion_tokens - seen
                            self.itl.observe((now - last) / new, new)
                        tokens[delta.index] = (delta.completion_tokens, now)
                    if delta.error is not None:
                        reason = "error"
                    elif delta.finish_reason is not None:
                        reason = delta.finish_reason
                yield batch
            if reason != "client_gone":
                self.e2e.observe(time.monotonic() - start)
        finally:
            self.requests.labels(reason).inc()
            await batches.aclose()

    def _observe_path(self, arrived: float, received: float, committed: float, back: float) -> None:
        for hop, seconds in (("api_to_engine", received - arrived), ("engine", committed - received),
                             ("engine_to_api", back - committed)):
            self.first_token_path.labels(hop).inc(seconds)
        self.first_token_paths.inc()


class _Histograms:
    def __init__(self, histograms: Sequence[LatencyHistogram]) -> None:
        self.histograms = histograms

    def collect(self) -> Iterator[Metric]:
        for histogram in self.histograms:
            yield histogram.family()


class _EngineCollector:
    """The engine's latest stats, as Prometheus metrics at each scrape."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats
        if s is None:
            return
        for name, help_, value in (("requests_running", "Requests holding a row in the engine", s.running),
                                   ("requests_waiting", "Requests queued in the engine", s.waiting),
                                   ("kv_pages_in_use", "KV cache pages held", s.kv_pages_total - s.kv_pages_free),
                                   ("kv_pages_total", "KV cache pages", s.kv_pages_total),
                                   ("kv_pages_cached", "KV pages the prefix cache can find (held or not)",
                                    s.kv_pages_cached)):
            yield GaugeMetricFamily(f"slipstream_{name}", help_, value=value)
        for name, help_, value in (("prefill_steps", "Steps with prompt tokens run", s.prefill_steps),
                                   ("decode_steps", "Decode-only steps run", s.decode_steps),
                                   ("prompt_tokens", "Prompt tokens admitted", s.prompt_tokens),
                                   ("cached_prompt_tokens", "Prompt tokens whose KV was found cached (the hit rate "
                                    "is this over prompt_tokens)", s.cached_prompt_tokens),
                                   ("timed_steps", "Steps whose GPU time is counted (step timing on)", s.timed_steps),
                                   ("gpu_busy_seconds", "GPU time from steps' first kernels to their last",
                                    s.gpu_busy_seconds),
                                   ("gpu_idle_seconds", "GPU idle between consecutive steps while the engine had "
                                    "work", s.gpu_idle_seconds)):
            yield CounterMetricFamily(f"slipstream_{name}", help_, value=value)
        if s.gpu_idle_counts:
            yield histogram_family("slipstream_gpu_idle_per_step_seconds", "GPU idle before a step, after the one "
                                   "before it, while the engine had work", IDLE_BUCKETS, s.gpu_idle_counts,
                                   s.gpu_idle_seconds)


class _RouterCollector:
    """Data parallelism: which rule routed the requests, each replica's state, restarts."""

    def __init__(self, replicas) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily("slipstream_router_decisions", "Requests routed, by the rule that chose the "
                                        "replica (prefix: where its prompt's start was served lately)", labels=["rule"])
        for rule, count in sorted(self.replicas.decisions.items()):
            decisions.add_metric([rule], count)
        yield decisions
        up = GaugeMetricFamily("slipstream_replica_up", "The replica's engine process serves", labels=["replica"])
        busy = GaugeMetricFamily("slipstream_replica_requests_in_flight", "Requests the replica serves",
                                 labels=["replica"])
        routed = CounterMetricFamily("slipstream_replica_requests", "Requests routed to the replica", labels=["replica"])
        for i, (alive, in_flight, n) in enumerate(self.replicas.replica_states()):
            up.add_metric([str(i)], float(alive))
            busy.add_metric([str(i)], in_flight)
            routed.add_metric([str(i)], n)
        yield up
        yield busy
        yield routed
        yield CounterMetricFamily("slipstream_replica_restarts", "Engine processes restarted after dying",
                                  value=self.replicas.restarts)
