"""Decode throughput benchmark: output tok/s and ms/step at several stream counts, pipelined vs
blocking, with the real bookkeeping (detokenization, hand-off of every text delta to a consumer
thread, as a server would).

Definitions (DESIGN.md §5): output tokens/s = all output tokens / wall time from the first submit
to the last result; ms/step = median (and p99) interval between consecutive decode-step commits."""
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
    steps = decode_step_ms(list(log))
    tokens = sum(len(o.token_ids) for o in outs)
    return BenchResult(llm.core.config.mode, streams, prompt_tokens, max_tokens, tokens, wall, tokens / wall,
                       float(np.median(steps)) if steps else float("nan"),
                       float(np.percentile(steps, 99)) if steps else float("nan"), len(steps))


def run(model: str | None, streams: list[int], modes: list[str], prompt_tokens: int, max_tokens: int,
        device: str | None, dtype: str, out: Path | None) -> list[BenchResult]:
    results = []
    bar = tqdm(total=len(streams) * len(modes), desc="bench", unit="case")
    for mode in modes:
        llm = LLM(model, device=device, dtype=dtype, mode=mode, max_num_seqs=max(streams))
        try:
            run_case(llm, min(streams), prompt_tokens, min(max_tokens, 8), seed=99)  # warm-up
            for n in streams:
                bar.set_postfix_str(f"{mode} x{n}")
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
    by = {(r.streams, r.mode): r for r in results}
    lines = [f"{'streams':>7} {'mode':>9} {'tok/s':>9} {'ms/step':>8} {'p99':>7} {'pipelined/blocking':>19}"]
    for r in sorted(results, key=lambda r: (r.streams, r.mode != "blocking")):
        other = by.get((r.streams, "blocking"))
        ratio = f"{r.tok_s / other.tok_s:.3f}" if r.mode == "pipelined" and other else ""
        lines.append(f"{r.streams:>7} {r.mode:>9} {r.tok_s:>9.1f} {r.ms_per_step:>8.2f} {r.ms_per_step_p99:>7.2f} "
                     f"{ratio:>19}")
    return "\n".join(lines)
