"""Throughput benchmarks, pipelined vs blocking, with the real bookkeeping (detokenization and
hand-off of every pass's text deltas to a consumer thread, as the server's engine process does).

- decode: `streams` requests of `prompt_tokens` random tokens, `max_tokens` outputs each, EOS
  ignored. Output tokens/s = all output tokens / wall time from the first submit to the last
  result; ms/step = median (and p99) interval between consecutive decode-step commits (DESIGN §5).
- short: `streams` closed-loop clients, each sending requests of 1-4 output tokens one after the
  other, so prefill and admission dominate (the point-and-detect case); reports requests/s.
- zombie: outputs ended by a stop token (a zombie step follows) vs the same tokens ended by max_tokens.
- constrained (json<fraction>): the decode workload with a fraction of streams under a JSON schema.
- `lora` (lora<N>, lora-none): the decode workload in an engine with N LoRA slots, its streams under
  N random adapters round-robin, and under none, beside the plain engine's decode rows.
- `temperature` > 0 (sampled<T>, sampled<T>p<P> with `top_p` < 1): the decode workload drawing
  tokens at that temperature (from that nucleus), one seed per stream.
On a GPU each run also measures copy bandwidth and reports the floor (DESIGN §5) beside each figure."""
from __future__ import annotations

import json
import queue
import random
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from ..engine import LLM
from ..profiler import HOST_PHASES
from ..sampling import SamplingParams


@dataclass
class BenchResult:
    workload: str  # "decode" | "sampled<T>" | "short" | "zombie-eos" | "zombie-len" | "json<fraction>"
    mode: str
    streams: int
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    wall_s: float
    tok_s: float
    ms_per_step: float
    ms_per_step_p99: float
    decode_steps: int
    requests: int
    requests_s: float
    ttft_ms_mean: float


class Consumer:
    """Receives every text delta on its own thread, as the server's engine process ships them: the
    callbacks append to a batch that the loop thread hands over once a pass (`LLM.after_callbacks`),
    so the consumer wakes once a step, not once a token."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.batch: list[tuple[int, str]] = []  # (the callbacks run one at a time, on the loop thread)
        self.text: dict[int, list[str]] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        llm.after_callbacks = self._ship

    def push(self, request_id: int, num_tokens: int, delta: str) -> None:
        self.batch.append((request_id, delta))

    def _ship(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            self.queue.put(batch)

    def _run(self) -> None:
        while (batch := self.queue.get()) is not None:
            for request_id, delta in batch:
                self.text.setdefault(request_id, []).append(delta)

    def close(self) -> None:
        """After every result: the loop has shipped the last batch with its last callbacks."""
        self.llm.after_callbacks = None
        self.queue.put(None)
        self.thread.join()


def decode_step_ms(commit_log: list[tuple[str, float]]) -> list[float]:
    """Intervals between consecutive decode commits (pairs straddling a prefill are skipped)."""
    return [(b[1] - a[1]) * 1e3 for a, b in zip(commit_log, commit_log[1:]) if a[0] == b[0] == "decode"]


JSON_BENCH_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


_TOKENS = random.Random(0)  # the token ids of every prompt the benchmarks draw (random_prompts)


def random_prompts(llm: LLM, lengths: list[int]) -> list[np.ndarray]:
    """Prompts of random token ids, each new in this process (one seeded stream draws them all): no
    workload is served from the prefix cache unless it is the one measuring it. As int64 arrays,
    which the garbage collector does not walk: while young, a list of 1,024 ints adds to every
    collection that meets it, and each collection holds the loop thread (the engine keeps prompts
    as arrays for the same reason; interference's 200 arrivals were 200 such lists)."""
    vocab = llm.core.model_config.vocab_size
    return [np.array([_TOKENS.randrange(vocab) for _ in range(n)], np.int64) for n in lengths]


def run_case(llm: LLM, streams: int, prompt_tokens: int, max_tokens: int, constrained: float = 0.0,
             temperature: float = 0.0, top_p: float = 1.0, loras: list[str] | None = None) -> BenchResult:
    """The decode workload; `constrained` is the fraction of streams under a JSON schema, the others
    sample at `temperature` (0: greedy), from the nucleus `top_p`; `loras`: stream i decodes under
    adapter i mod len(loras)."""
    prompts = random_prompts(llm, [prompt_tokens] * streams)
    n_json = round(constrained * streams)
    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, json_schema=JSON_BENCH_SCHEMA)] * n_json
    params += [SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=temperature, top_p=top_p,
                              seed=i, lora=loras[i % len(loras)] if loras else None) for i in range(streams - n_json)]
    log = llm.core.scheduler.commit_log
    log.clear()
    consumer = Consumer(llm)
    t0 = time.perf_counter()
    ids = llm.submit_many(prompts, params, on_token=consumer.push)
    outs = [llm.result(i) for i in ids]
    wall = time.perf_counter() - t0
    consumer.close()
    nucleus = f"p{top_p:g}" if top_p < 1 else ""
    label = f"json{constrained:g}" if constrained else f"sampled{temperature:g}{nucleus}" if temperature else \
        f"lora{len(loras)}" if loras else "decode"
    return _result(llm, label, streams, prompt_tokens, max_tokens, outs, wall)


def run_short_case(llm: LLM, streams: int, prompt_tokens: int, requests_per_stream: int = 16,
                   seed: int = 0) -> BenchResult:
    log = llm.core.scheduler.commit_log
    log.clear()
    consumer = Consumer(llm)
    outs: list = []

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        for prompt in random_prompts(llm, [prompt_tokens] * requests_per_stream):
            params = SamplingParams(max_tokens=rng.randint(1, 4), ignore_eos=True)
            outs.append(llm.result(llm.submit(prompt, params, on_token=consumer.push)))

    wall = run_threads(streams, client)
    consumer.close()
    return _result(llm, "short", streams, prompt_tokens, 4, outs, wall)


def _result(llm: LLM, workload: str, streams: int, prompt_tokens: int, max_tokens: int, outs: list,
            wall: float) -> BenchResult:
    steps = decode_step_ms(list(llm.core.scheduler.commit_log))
    tokens = sum(len(o.token_ids) for o in outs)
    return BenchResult(workload, llm.core.config.mode, streams, prompt_tokens, max_tokens, tokens, wall, tokens / wall,
                       float(np.median(steps)) if steps else float("nan"),
                       float(np.percentile(steps, 99)) if steps else float("nan"), len(steps), len(outs),
                       len(outs) / wall, float(np.mean([o.metrics.ttft for o in outs])) * 1e3)


def run_zombie_cases(llm: LLM, streams: int, prompt_tokens: int, max_tokens: int = 16) -> list[BenchResult]:
    """The zombie tax: short outputs ended by a stop token (the step after it is already in flight,
    so it runs as a zombie) vs the same tokens ended by max_tokens (known in advance, never zombied)."""
    prompts = random_prompts(llm, [prompt_tokens] * streams)
    ref = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))]
    ends = [max(j for j in range(len(r)) if r[j] not in r[:j]) for r in ref]  # a token seen first at j
    by_stop = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=[r[j]]) for r, j in zip(ref, ends)]
    by_length = [SamplingParams(max_tokens=j + 1, ignore_eos=True) for j in ends]
    results = []
    for name, params in (("zombie-eos", by_stop), ("zombie-len", by_length)):
        log = llm.core.scheduler.commit_log
        log.clear()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        results.append(_result(llm, name, streams, prompt_tokens, max_tokens, outs, time.perf_counter() - t0))
    return results


def copy_bandwidth(n_bytes: int = 1 << 31) -> float:
    """Bytes read + written per second by a large device-to-device copy (the floor's bandwidth)."""
    import torch

    x = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    return 2 * n_bytes / (median_cuda_ms(lambda: y.copy_(x)) / 1e3)


def median_cuda_ms(fn, repeats: int = 10) -> float:
    """fn's GPU time in ms, the median of `repeats` runs between CUDA events, after 3 warm-ups."""
    import torch

    with torch.no_grad():
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return float(np.median(times))


def floor_ms(llm: LLM, streams: int, context: int, bandwidth: float) -> float:
    """(weight bytes + KV bytes read at `context`) / copy bandwidth: the fastest a decode step can be."""
    model = llm.core.runner.model
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    kv = llm.core.runner.kv.data
    kv_per_token = kv[:, :, :1, :1].numel() * kv.element_size()
    return (weights + streams * context * kv_per_token) / bandwidth * 1e3


def run_lora_cases(llm: LLM, streams: int, prompt_tokens: int, max_tokens: int, adapters: int,
                   rank: int) -> list[BenchResult]:
    """In an engine with LoRA slots: `adapters` random adapters of `rank` over the streams
    (round-robin), and the same streams under none (what the LoRA path costs rows without one)."""
    import tempfile

    from ..lora.adapter import write_random_adapter

    names = [f"bench{i}" for i in range(adapters)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            if name not in llm.core.lora.names():
                llm.load_lora(name, str(write_random_adapter(llm.core.lora.targets, Path(tmp) / name, rank, seed=i)))
    adapted = run_case(llm, streams, prompt_tokens, max_tokens, loras=names)
    llm.core.runner.profiler = None
    none = run_case(llm, streams, prompt_tokens, max_tokens)
    none.workload = "lora-none"
    return [adapted, none]


def run(model: str | None, streams: list[int], modes: list[str], prompt_tokens: int, max_tokens: int,
        device: str | None, dtype: str, out: Path | None, workload: str = "decode",
        profile: bool = False, constrained: list[float] | None = None, temperature: float = 0.0,
        top_p: float = 1.0, engine_options: dict | None = None, lora: int = 0,
        lora_rank: int = 16) -> list[BenchResult]:
    """Run one workload for every mode and stream count; print a table, write JSON (and PNGs).
    `lora` > 0 (the decode workload): each case also in an engine of that many LoRA slots, its
    streams under that many random adapters of `lora_rank`, and under none."""
    results, profiles, floors, engine_stats = [], {}, {}, {}
    bar = tqdm(total=len(streams) * len(modes), desc="bench", unit="case")
    bandwidth = None
    for mode in modes:
        options = {"max_num_seqs": max(streams), **(engine_options or {})}
        if lora:
            with LLM(model, device=device, dtype=dtype, mode=mode, max_loras=lora, max_lora_rank=lora_rank,
                     **options) as adapted:
                run_lora_cases(adapted, min(streams), prompt_tokens, 8, lora, lora_rank)  # (warm-up)
                for n in streams:
                    if profile and n == max(streams):  # (its first case: the rows under adapters)
                        profiles[f"{mode} lora{lora}"] = new_profiler(adapted)
                    results.extend(run_lora_cases(adapted, n, prompt_tokens, max_tokens, lora, lora_rank))
                    adapted.core.runner.profiler = None
                engine_stats[f"{mode} lora"] = adapted.stats()
        llm = LLM(model, device=device, dtype=dtype, mode=mode, **options)
        try:
            if profile and not llm.core.layer.is_cuda:
                raise ValueError("--profile reads CUDA events on the compute stream: it needs a CUDA device")
            if llm.core.config.device.type == "cuda" and bandwidth is None:
                bandwidth = copy_bandwidth()
            for n in sorted(set(streams)):  # warm-up: each batch shape's first use, the grammar's compile
                run_case(llm, n, prompt_tokens, 8, constrained=1.0 if workload == "constrained" else 0.0,
                         temperature=temperature, top_p=top_p)
            for n in streams:
                bar.set_postfix_str(f"{mode} x{n}")
                if workload == "short":
                    results.append(run_short_case(llm, n, prompt_tokens))
                elif workload == "zombie":
                    results.extend(run_zombie_cases(llm, n, prompt_tokens))
                elif workload == "constrained":
                    for fraction in constrained:
                        if profile:
                            profiles[f"{mode} x{n} json{fraction:g}"] = new_profiler(llm)
                        results.append(run_case(llm, n, prompt_tokens, max_tokens, constrained=fraction))
                        llm.core.runner.profiler = None
                else:
                    if profile and n == max(streams):
                        profiles[mode] = new_profiler(llm)
                    results.append(run_case(llm, n, prompt_tokens, max_tokens, temperature=temperature, top_p=top_p))
                    llm.core.runner.profiler = None
                if bandwidth:
                    floors[n] = floor_ms(llm, n, prompt_tokens + max_tokens // 2, bandwidth)
                bar.update()
            engine_stats[mode] = llm.stats()
        finally:
            llm.shutdown()
    bar.close()
    print(format_table(results, floors))
    report = {"results": [asdict(r) for r in results], "copy_bandwidth_bytes_s": bandwidth, "engine": engine_stats,
              "floor_ms": floors, "profile": {m: p.summary() for m, p in profiles.items()}}
    if profiles:
        print(format_profile(report["profile"]))
    write_report(out, report)
    if out is not None:
        if profiles and workload == "decode":
            from ..profiler import plot_timeline

            plot_timeline(profiles, out.with_suffix(".timeline.png"))
        if workload == "decode" and len(streams) > 1:
            plot_throughput(results, floors, out.with_suffix(".png"))
    return results


def format_table(results: list[BenchResult], floors: dict[int, float] | None = None) -> str:
    floors = floors or {}
    by = {(r.workload, r.streams, r.mode): r for r in results}
    lines = [f"{'workload':>10} {'streams':>7} {'mode':>9} {'tok/s':>9} {'req/s':>8} {'ms/step':>8} {'p99':>7} "
             f"{'floor ms':>8} {'x floor':>7} {'pipelined/blocking':>19}"]
    for r in sorted(results, key=lambda r: (r.workload, r.streams, r.mode != "blocking")):
        other = by.get((r.workload, r.streams, "blocking"))
        ratio = f"{r.tok_s / other.tok_s:.3f}" if r.mode == "pipelined" and other else ""
        floor = floors.get(r.streams)
        lines.append(f"{r.workload:>10} {r.streams:>7} {r.mode:>9} {r.tok_s:>9.1f} {r.requests_s:>8.1f} "
                     f"{r.ms_per_step:>8.3f} {r.ms_per_step_p99:>7.3f} {floor or float('nan'):>8.3f} "
                     f"{r.ms_per_step / floor if floor else float('nan'):>7.2f} {ratio:>19}")
    return "\n".join(lines)


def format_profile(profile: dict[str, dict[str, float]]) -> str:
    """The profilers' summaries as a table: decode steps' split, host phases, then prefill steps."""
    cols = ("forward", "sampling", "gpu_busy", "cpu_bookkeeping", *(f"host_{p}" for p in HOST_PHASES), "gpu_idle",
            "step", "prefill_gpu")
    lines = [f"{'mode':>22} " + " ".join(f"{c + ' med/p99 ms':>24}" for c in cols)
             + f" {'steps D/P':>11} {'GPU busy':>8}"]
    for mode, p in profile.items():
        lines.append(f"{mode:>22} " + " ".join(f"{p[c + '_median_ms']:>11.3f}/{p[c + '_p99_ms']:<12.3f}"
                                             for c in cols)
                     + f" {p['decode_steps']:>5}/{p['prefill_steps']:<5} {p['gpu_busy_fraction']:>8.1%}")
    return "\n".join(lines)


def run_threads(n: int, target: Callable[[int], None]) -> float:
    """`target(0)` .. `target(n - 1)` on n threads started together; the wall seconds until all end."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def new_profiler(llm: LLM, max_steps: int = 4096):
    """A bubble profiler attached to the engine's runner (it records the steps from now on)."""
    from ..profiler import StepProfiler

    llm.core.runner.profiler = StepProfiler(llm.core.layer.compute_stream, max_steps=max_steps)
    return llm.core.runner.profiler


def take_profile(llm: LLM, name: str) -> dict[str, dict[str, float]]:
    """The attached profiler's summary under `name` (empty if none is attached), and the profiler detached."""
    profiler, llm.core.runner.profiler = llm.core.runner.profiler, None
    return {name: profiler.summary()} if profiler is not None else {}


def write_report(out: Path | None, report: dict, plot: Callable[[Path], None] | None = None) -> None:
    """The report as JSON at `out` (if given) and, with `plot`, its PNG beside it."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    if plot is not None:
        plot(out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}")
    else:
        print(f"wrote {out}")


def plot_throughput(results: list[BenchResult], floors: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in sorted({r.mode for r in results}):
        rs = sorted((r for r in results if r.mode == mode and r.workload == "decode"), key=lambda r: r.streams)
        ax.plot([r.streams for r in rs], [r.tok_s for r in rs], marker="o", label=mode)
    if floors:
        xs = sorted(floors)
        ax.plot(xs, [n / floors[n] * 1e3 for n in xs], linestyle="--", color="gray", label="floor (bandwidth)")
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("output tokens/s")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
