"""Benchmarks of the traffic users send: prompts of mixed lengths, arrivals over time (DESIGN §5).

- mixed: `requests` requests whose prompt and output lengths are drawn uniformly (seeded) from
  `prompt_range` and `output_range`, EOS ignored, greedy; submitted all at once (rate inf) or as
  Poisson arrivals at `rate` requests/s. Output tok/s, total (prompt + output) tok/s, and TTFT,
  TPOT, ITL and end-to-end latency percentiles.
- prefill: 64 prompts of random lengths 16-1024 (the lengths of ../shared/anchors/prefill_floor.py)
  and 64 prompts of their mean length, one output token each: prompt tok/s.
- ttft: one request at a time (light load) per prompt length: TTFT percentiles.
- interference: `decoding` requests decoding while a prompt of `arrival_tokens` tokens arrives at
  every step: the decoding requests' ITL beside their ITL without arrivals.
- shared-prefix: 256 requests of a 1,000-token shared prefix (a system prompt) and 50 unique
  tokens, 64 output tokens each, all at once; with the prefix cache, and again with its lookups and
  registration switched off in the same engine (on another prefix): TTFT and throughput.
Every token's commit time is taken in the engine's per-token callback (on the loop thread), and the
text deltas go to a consumer thread once a pass, as the server's engine process ships them."""
from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ..engine import LLM, RequestOutput
from ..sampling import SamplingParams
from .decode import Consumer, format_profile, new_profiler, random_prompts, take_profile, write_report

R = TypeVar("R")


@dataclass
class TrafficResult:
    workload: str  # "mixed" | "prefill random" | "prefill equal" | "ttft <n>" | "interference" | "decode only"
    mode: str
    rate: float  # requests/s offered (inf: all at once)
    requests: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    output_tok_s: float
    total_tok_s: float
    requests_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    tpot_ms_p50: float
    tpot_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    e2e_ms_p50: float
    e2e_ms_p99: float
    prefill_steps: int
    decode_steps: int
    ttft_ms_quantiles: list[float]  # at 0, 1, ..., 100 %: the CDF the plot draws
    itl_ms_quantiles: list[float]


class TokenClock:
    """Commit time of every token per request id; the deltas go on to a consumer thread."""

    def __init__(self, llm: LLM) -> None:
        self.times: dict[int, list[float]] = defaultdict(list)
        self.consumer = Consumer(llm)

    def push(self, request_id: int, num_tokens: int, delta: str) -> None:
        self.times[request_id].append(time.perf_counter())
        self.consumer.push(request_id, num_tokens, delta)

    def close(self) -> None:
        self.consumer.close()


def _pct(xs: list[float], q: float | np.ndarray) -> float | np.ndarray:
    return np.percentile(xs, q) * 1e3 if len(xs) else np.full(np.shape(q), np.nan)


def summarize(llm: LLM, workload: str, rate: float, outs: list[RequestOutput], clock: TokenClock, wall: float,
              steps_before: dict[str, int], only: set[int] | None = None) -> TrafficResult:
    """Throughput over all of `outs`; latencies over the requests in `only` (all when None)."""
    timed = [o for o in outs if only is None or o.request_id in only]
    ttft = [o.metrics.ttft for o in timed if o.metrics.ttft is not None]
    tpot, itl, e2e = [], [], []
    for o in timed:
        t = clock.times.get(o.request_id, [])
        if len(t) > 1:
            tpot.append((t[-1] - t[0]) / (len(t) - 1))
            itl.extend(np.diff(t))
        if o.metrics.ttft is not None:
            e2e.append(o.metrics.ttft + o.metrics.decode_seconds)
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    output = sum(len(o.token_ids) for o in outs)
    stats = llm.stats()
    p = [float(x) for x in (*_pct(ttft, [50, 99]), *_pct(tpot, [50, 99]), *_pct(itl, [50, 99]), *_pct(e2e, [50, 99]))]
    grid = np.arange(101)
    return TrafficResult(workload, llm.core.config.mode, rate, len(outs), prompt, output, wall, output / wall,
                         (prompt + output) / wall, len(outs) / wall, *p,
                         stats["prefill_steps"] - steps_before["prefill_steps"],
                         stats["decode_steps"] - steps_before["decode_steps"],
                         [round(float(x), 4) for x in _pct(ttft, grid)], [round(float(x), 4) for x in _pct(itl, grid)])


def _submit(llm: LLM, prompts: list[list[int]], params: list[SamplingParams], rate: float, clock: TokenClock,
            rng: random.Random) -> list[int]:
    """All at once (rate inf), or one by one at Poisson arrival times; returns the request ids."""
    if rate == float("inf"):
        return llm.submit_many(prompts, params, on_token=clock.push)
    ids, start, due = [], time.perf_counter(), 0.0
    for prompt, p in zip(prompts, params):
        due += rng.expovariate(rate)
        delay = start + due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        ids.append(llm.submit(prompt, p, on_token=clock.push))
    return ids


def run_mixed(llm: LLM, requests: int, prompt_range: tuple[int, int], output_range: tuple[int, int],
              rate: float = float("inf"), seed: int = 0) -> TrafficResult:
    rng = random.Random(seed)
    shapes = [(rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(requests)]
    prompts = random_prompts(llm, [p for p, _ in shapes])
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for _, n in shapes]
    clock, before = TokenClock(llm), llm.stats()
    t0 = time.perf_counter()
    ids = _submit(llm, prompts, params, rate, clock, rng)
    outs = [llm.result(i) for i in ids]
    wall = time.perf_counter() - t0
    clock.close()
    return summarize(llm, "mixed", rate, outs, clock, wall, before)


def prefill_lengths(n: int = 64, seed: int = 3, low: int = 16, high: int = 1024) -> list[int]:
    """The anchor's prompt lengths (prefill_floor.py draws them the same way)."""
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def run_prefill(llm: LLM, repeats: int = 3) -> list[TrafficResult]:
    """Prompt tok/s of 64 random-length prompts and of 64 equal ones (their mean), one token each;
    the median of `repeats` runs."""
    lens = prefill_lengths()
    results = []
    for name, lengths in (("prefill random", lens), ("prefill equal", [sum(lens) // len(lens)] * len(lens))):
        runs = []
        for _ in range(repeats):
            prompts = random_prompts(llm, lengths)
            clock, before = TokenClock(llm), llm.stats()
            t0 = time.perf_counter()
            outs = llm.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True))
            wall = time.perf_counter() - t0
            clock.close()
            runs.append(summarize(llm, name, float("inf"), outs, clock, wall, before))
        results.append(sorted(runs, key=lambda x: x.wall_s)[len(runs) // 2])
    return results


def run_ttft(llm: LLM, lengths: list[int], repeats: int = 20, output_tokens: int = 16) -> list[TrafficResult]:
    """One request at a time: TTFT at light load for each prompt length."""
    results = []
    for n in lengths:
        outs, clock, before = [], TokenClock(llm), llm.stats()
        t0 = time.perf_counter()
        for prompt in random_prompts(llm, [n] * repeats):
            rid = llm.submit(prompt, SamplingParams(max_tokens=output_tokens, ignore_eos=True), on_token=clock.push)
            outs.append(llm.result(rid))
        clock.close()
        results.append(summarize(llm, f"ttft {n}", 0.0, outs, clock, time.perf_counter() - t0, before))
    return results


def run_interference(llm: LLM, decoding: int, arrival_tokens: int, steps: int = 200) -> list[TrafficResult]:
    """`decoding` requests decode `steps` tokens, first alone, then while an `arrival_tokens`-token
    prompt (one output token) arrives at every commit of the first one's tokens."""
    results = []
    for name in ("decode only", "interference"):
        prompts = random_prompts(llm, [64] * decoding)
        arrivals = random_prompts(llm, [arrival_tokens] * steps) if name == "interference" else []
        clock, before = TokenClock(llm), llm.stats()
        watched: list[int] = []  # the first stream's id: each of its commits brings an arrival
        arrived: list[int] = []
        lock = threading.Lock()

        def on_token(rid: int, n: int, delta: str) -> None:
            clock.push(rid, n, delta)
            if name == "interference" and n < steps:
                with lock:
                    if watched and rid == watched[0]:
                        arrived.append(llm.submit(arrivals[n], SamplingParams(max_tokens=1, ignore_eos=True)))

        t0 = time.perf_counter()
        with lock:
            ids = llm.submit_many(prompts, SamplingParams(max_tokens=steps, ignore_eos=True), on_token=on_token)
            watched.append(ids[0])
        outs = [llm.result(i) for i in ids]
        with lock:
            extra = list(arrived)
        outs += [llm.result(i) for i in extra]
        wall = time.perf_counter() - t0
        clock.close()
        results.append(summarize(llm, name, 0.0, outs, clock, wall, before, only=set(ids)))
    return results


def run_shared_prefix(llm: LLM, requests: int = 256, prefix_tokens: int = 1000, suffix_tokens: int = 50,
                      output_tokens: int = 64) -> list[TrafficResult]:
    """The shared-system-prompt workload, cache on, then off (an engine without caching runs it once)."""
    results = []
    modes = (True, False) if llm.core.pool.caching else (False,)
    for caching in modes:
        prefix = random_prompts(llm, [prefix_tokens])[0]
        prompts = [np.concatenate((prefix, p)) for p in random_prompts(llm, [suffix_tokens] * requests)]
        llm.core.pool.caching = caching  # (read by the loop thread at its next admission)
        clock, before = TokenClock(llm), llm.stats()
        t0 = time.perf_counter()
        ids = llm.submit_many(prompts, SamplingParams(max_tokens=output_tokens, ignore_eos=True), on_token=clock.push)
        outs = [llm.result(i) for i in ids]
        wall = time.perf_counter() - t0
        clock.close()
        results.append(summarize(llm, f"shared-prefix cache {'on' if caching else 'off'}", float("inf"), outs,
                                 clock, wall, before))
    llm.core.pool.caching = modes[0]
    return results


def _check_lengths(llm: LLM, workloads: list[str], prompt_range: tuple[int, int], output_range: tuple[int, int],
                   ttft_lengths: list[int], arrival_tokens: int) -> None:
    """Refuse, before any workload runs, prompts that leave the model no room to generate."""
    limit = llm.core.max_model_len
    asked = {"mixed": ("--prompt-range", prompt_range[1]), "ttft": ("--ttft-lengths", max(ttft_lengths)),
             "interference": ("--arrival-tokens", arrival_tokens), "shared-prefix": ("shared-prefix", 1050 + 64)}
    for workload, (flag, longest) in asked.items():
        if workload in workloads and longest >= limit:
            raise ValueError(f"{flag} asks for {longest}-token prompts; this model's max_model_len is {limit}")


def format_table(results: list[TrafficResult]) -> str:
    cols = ("workload", "mode", "rate", "req", "out tok/s", "total tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
            "ITL p50/p99 ms", "e2e p50/p99 ms", "steps P/D")
    lines = [" | ".join(cols)]
    for r in results:
        lines.append(" | ".join([
            r.workload, r.mode, f"{r.rate:g}", str(r.requests), f"{r.output_tok_s:,.0f}", f"{r.total_tok_s:,.0f}",
            f"{r.ttft_ms_p50:.1f}/{r.ttft_ms_p99:.1f}", f"{r.tpot_ms_p50:.2f}/{r.tpot_ms_p99:.2f}",
            f"{r.itl_ms_p50:.2f}/{r.itl_ms_p99:.2f}", f"{r.e2e_ms_p50:.0f}/{r.e2e_ms_p99:.0f}",
            f"{r.prefill_steps}/{r.decode_steps}"]))
    return "\n".join(lines)


def plot_latencies(results: list[TrafficResult], path: Path) -> None:
    """CDFs of TTFT and ITL per (workload, mode, rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    grid = np.arange(101) / 100
    for r in results:
        label = f"{r.workload} {r.mode}" + (f" {r.rate:.3g} req/s" if 0 < r.rate < float("inf") else "")
        for ax, q in zip(axes, (r.ttft_ms_quantiles, r.itl_ms_quantiles)):
            if not np.isnan(q).all():
                ax.plot(q, grid, label=label)
    for ax, name in zip(axes, ("TTFT", "inter-token latency")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests" if name == "TTFT" else "fraction of tokens")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def at_rates(rates: list[str], run: Callable[[float], R]) -> list[R]:
    """`run(rate)` for each of `rates` (parse_rates's forms), 'inf' first where percentages are
    asked for: they are of its requests/s."""
    ordered = [r for r in rates if r != "inf"]
    if "inf" in rates or any(r.endswith("%") for r in rates):
        ordered.insert(0, "inf")
    results, capacity = [], None
    for r in ordered:
        result = run(float("inf") if r == "inf" else float(r[:-1]) / 100 * capacity if r.endswith("%") else float(r))
        if r == "inf":
            capacity = result.requests_s
        results.append(result)
    return results


def parse_rates(values: list[str]) -> list[str]:
    """Request rates: numbers (requests/s), 'inf' (all at once) or 'P%' (of the capacity measured
    all at once in the same run, which then runs first)."""
    for v in values:
        try:
            float(v[:-1] if v.endswith("%") else v)
        except ValueError:
            raise ValueError(f"--request-rate takes numbers, 'inf' or percentages like 50%, got {v!r}") from None
    return values


def run(model: str | None, workloads: list[str], modes: list[str], device: str | None, dtype: str,
        out: Path | None, engine_options: dict, profile: bool = False, requests: int = 384,
        prompt_range: tuple[int, int] = (16, 1024), output_range: tuple[int, int] = (16, 384),
        rates: list[str] = ("inf",), ttft_lengths: list[int] = (16, 128, 1024, 4000), decoding: int = 32,
        arrival_tokens: int = 1024) -> list[TrafficResult]:
    """Run traffic workloads, one engine per mode; print a table, write JSON (and a PNG of latency
    CDFs). `profile`: the bubble profiler's split over each workload's first run."""
    results: list[TrafficResult] = []
    engine_stats, profiles = {}, {}
    for mode in modes:
        llm = LLM(model, device=device, dtype=dtype, mode=mode, **engine_options)
        try:
            if profile and not llm.core.layer.is_cuda:
                raise ValueError("--profile reads CUDA events on the compute stream: it needs a CUDA device")
            _check_lengths(llm, workloads, prompt_range, output_range, ttft_lengths, arrival_tokens)
            run_mixed(llm, 8, (16, 64), (4, 8))  # warm-up
            for workload in workloads:
                if profile:
                    new_profiler(llm, max_steps=8192)
                if workload == "mixed":
                    def mixed(rate: float) -> TrafficResult:
                        res = run_mixed(llm, requests, prompt_range, output_range, rate)
                        profiles.update(take_profile(llm, f"{mode} {workload}"))
                        return res

                    results.extend(at_rates(rates, mixed))
                elif workload == "prefill":
                    results.extend(run_prefill(llm, repeats=1 if profile else 3))
                elif workload == "ttft":
                    results.extend(run_ttft(llm, list(ttft_lengths)))
                elif workload == "interference":
                    results.extend(run_interference(llm, decoding, arrival_tokens))
                elif workload == "shared-prefix":
                    results.extend(run_shared_prefix(llm))
                else:
                    raise ValueError(f"unknown traffic workload {workload!r}")
                profiles.update(take_profile(llm, f"{mode} {workload}"))
            engine_stats[mode] = llm.stats()
        finally:
            llm.shutdown()
    print(format_table(results))
    if profiles:
        print(format_profile(profiles))
    write_report(out, {"results": [asdict(r) for r in results], "engine": engine_stats,
                       "engine_options": engine_options, "profile": profiles}, lambda png: plot_latencies(results, png))
    return results
