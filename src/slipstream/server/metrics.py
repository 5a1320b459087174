"""`GET /metrics` in Prometheus's text format: requests by finish reason, TTFT / ITL / end-to-end
latency histograms as the API process sees them, and the engine's gauges (requests running and
waiting, KV pages in use, steps) from the stats it sends twice a second."""
from __future__ import annotations

import time
from typing import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .client import EngineClient
from .protocol import Delta

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServerMetrics:
    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self.registry = r = CollectorRegistry()
        self.requests = Counter("slipstream_requests", "Requests ended, by finish reason (client_gone: the client "
                                "left first)", ["finish_reason"], registry=r)
        self.ttft = Histogram("slipstream_time_to_first_token_seconds", "Arrival to first text", registry=r,
                              buckets=LATENCY_BUCKETS)
        self.itl = Histogram("slipstream_inter_token_latency_seconds", "Between output tokens (a delta's time over "
                             "its tokens)", registry=r, buckets=LATENCY_BUCKETS)
        self.e2e = Histogram("slipstream_e2e_request_latency_seconds", "Arrival to the last token", registry=r,
                             buckets=LATENCY_BUCKETS)
        self.gauges = {name: Gauge(f"slipstream_{name}", help_, registry=r) for name, help_ in (
            ("requests_running", "Requests holding a row in the engine"),
            ("requests_waiting", "Requests queued in the engine"),
            ("requests_in_flight", "Requests the API process is serving"),
            ("kv_pages_in_use", "KV cache pages held"),
            ("kv_pages_total", "KV cache pages"),
            ("prefill_steps", "Prefill steps run so far"),
            ("decode_steps", "Decode steps run so far"))}

    def render(self) -> bytes:
        stats, g = self.engine.stats, self.gauges
        g["requests_in_flight"].set(self.engine.in_flight)
        if stats is not None:
            g["requests_running"].set(stats.running)
            g["requests_waiting"].set(stats.waiting)
            g["kv_pages_in_use"].set(stats.kv_pages_total - stats.kv_pages_free)
            g["kv_pages_total"].set(stats.kv_pages_total)
            g["prefill_steps"].set(stats.prefill_steps)
            g["decode_steps"].set(stats.decode_steps)
        return generate_latest(self.registry)

    async def observe(self, deltas: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        """The request's deltas, timed on their way through."""
        start = last = time.perf_counter()
        tokens, reason = 0, "client_gone"
        try:
            async for delta in deltas:
                now = time.perf_counter()
                if delta.completion_tokens > tokens:
                    if tokens == 0:
                        self.ttft.observe(now - start)
                    else:
                        per_token = (now - last) / (delta.completion_tokens - tokens)
                        for _ in range(delta.completion_tokens - tokens):
                            self.itl.observe(per_token)
                    tokens, last = delta.completion_tokens, now
                if delta.finish_reason is not None:
                    reason = delta.finish_reason
                    self.e2e.observe(now - start)
                yield delta
        finally:
            self.requests.labels(reason).inc()
            await deltas.aclose()
