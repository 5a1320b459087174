"""Throughput benchmarks, pipelined vs blocking, with the real bookkeeping (detokenization and
hand-off of every text delta to a consumer thread, as a server would).

- decode: `streams` requests of `prompt_tokens` random tokens, `max_tokens` outputs each, EOS
  ignored. Output tokens/s = all output tokens / wall time from the first submit to the last
  result; ms/step = median (and p99) interval between consecutive decode-step commits (DESIGN §5).
- short: `streams` closed-loop clients, each sending requests of 1-4 output tokens one after the
  other, so prefill and admission dominate (the point-and-detect case); reports requests/s."""
from __future__ import annotations

import json
import queue
import random
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .engine import LLM
from .sampling import SamplingParams


@dataclass
class BenchResult:
    workload: str  # "decode" | "short"
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


class Consumer:
    """Receives every text delta on its own thread, like a server's response writer."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.text: dict[int, list[str]] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def push(self, request_id: int, num_tokens: int, delta: str) -> None:
        self.queue.put((request_id, delta))

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            self.text.setdefault(item[0], []).append(item[1])

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()


def decode_step_ms(commit_log: list[tuple[str, float]]) -> list[float]:
    """Intervals between consecutive decode commits (pairs straddling a prefill are skipped)."""
    return [(b[1] - a[1]) * 1e3 for a, b in zip(commit_log, commit_log[1:]) if a[0] == b[0] == "decode"]


def run_case(llm: LLM, streams: int, prompt_tokens: int, max_tokens: int, seed: int = 0) -> BenchResult:
    rng = random.Random(seed)
    vocab = llm.core.model_config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(prompt_tokens)] for _ in range(streams)]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    log = llm.core.scheduler.commit_log
    log.clear()
    consumer = Consumer()
    t0 = time.perf_counter()
    ids = [llm.submit(p, params, on_token=consumer.push) for p in prompts]
    outs = [llm.result(i) for i in ids]
    wall = time.perf_counter() - t0
    consumer.close()
    return _result(llm, "decode", streams, prompt_tokens, max_tokens, outs, wall)


def run_short_case(llm: LLM, streams: int, prompt_tokens: int, requests_per_stream: int = 16,
                   seed: int = 0) -> BenchResult:
    vocab = llm.core.model_config.vocab_size
    log = llm.core.scheduler.commit_log
    log.clear()
    consumer = Consumer()
    outs: list = []

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        for _ in range(requests_per_stream):
            prompt = [rng.randrange(vocab) for _ in range(prompt_tokens)]
            params = SamplingParams(max_tokens=rng.randint(1, 4), ignore_eos=True)
            outs.append(llm.result(llm.submit(prompt, params, on_token=consumer.push)))

    clients = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    wall = time.perf_counter() - t0
    consumer.close()
    return _result(llm, "short", streams, prompt_tokens, 4, outs, wall)


def _result(llm: LLM, workload: str, streams: int, prompt_tokens: int, max_tokens: int, outs: list,
            wall: float) -> BenchResult:
    steps = decode_step_ms(list(llm.core.scheduler.commit_log))
    tokens = sum(len(o.token_ids) for o in outs)
    return BenchResult(workload, llm.core.config.mode, streams, prompt_tokens, max_tokens, tokens, wall, tokens / wall,
                       float(np.median(steps)) if steps else float("nan"),
                       float(np.percentile(steps, 99)) if steps else float("nan"), len(steps), len(outs),
                       len(outs) / wall)


def run(model: str | None, streams: list[int], modes: list[str], prompt_tokens: int, max_tokens: int,
        device: str | None, dtype: str, out: Path | None, short: bool = False) -> list[BenchResult]:
    results = []
    bar = tqdm(total=len(streams) * len(modes), desc="bench", unit="case")
    for mode in modes:
        llm = LLM(model, device=device, dtype=dtype, mode=mode, max_num_seqs=max(streams))
        try:
            run_case(llm, max(streams), prompt_tokens, 8, seed=99)  # warm-up
            for n in streams:
                bar.set_postfix_str(f"{mode} x{n}")
                if short:
                    results.append(run_short_case(llm, n, prompt_tokens))
                else:
                    results.append(run_case(llm, n, prompt_tokens, max_tokens))
                bar.update()
        finally:
            llm.shutdown()
    bar.close()
    print(format_table(results))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([asdict(r) for r in results], indent=1))
        print(f"wrote {out}")
    return results


def format_table(results: list[BenchResult]) -> str:
    by = {(r.workload, r.streams, r.mode): r for r in results}
    lines = [f"{'workload':>8} {'streams':>7} {'mode':>9} {'tok/s':>9} {'req/s':>8} {'ms/step':>8} {'p99':>7} "
             f"{'pipelined/blocking':>19}"]
    for r in sorted(results, key=lambda r: (r.workload, r.streams, r.mode != "blocking")):
        other = by.get((r.workload, r.streams, "blocking"))
        ratio = f"{r.tok_s / other.tok_s:.3f}" if r.mode == "pipelined" and other else ""
        lines.append(f"{r.workload:>8} {r.streams:>7} {r.mode:>9} {r.tok_s:>9.1f} {r.requests_s:>8.1f} "
                     f"{r.ms_per_step:>8.2f} {r.ms_per_step_p99:>7.2f} {ratio:>19}")
    return "\n".join(lines)
