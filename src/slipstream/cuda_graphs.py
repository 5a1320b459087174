"""CUDA graphs of the step's forward: decode steps per (slot, batch-size bucket, sampling fused or
not, and in an engine with LoRA slots, LoRA kernels or not: a step in which no row holds an adapter
runs as an engine without LoRA runs it); prefill steps per (slot, token bucket) up to the final
norm of their sampled rows, then their LM head per (slot, batch-size bucket of those rows, sampling
fused or not); and of a step's sampling where it is not fused (a constrained or tempered step's)
per (slot, batch-size bucket, runner.SAMPLING_VARIANTS).

Every input of a forward lives at a fixed address (the slot's packed metadata on the device, the
last-token table, the KV pages), and so does its output (the slot's logits buffer), so each slot's
forward is captured once per bucket and replayed. The fused variants also capture greedy
sampling (argmax, the last-token scatter and the copy into the slot's sampled buffer) for steps
with no mask, penalty, temperature or logprobs; the sampling graphs, replayed at finalize, read
the bitmask from the slot's device buffer (`launch_sampling` copies it up on the upload stream
first). A prefill step's grid is fixed per token bucket: its padding tokens write the scratch
page, and the packed attention's unused programs exit. Its head is apart so that it computes the
logits of the rows the step samples, not of every row the bucket could sample (Qwen2.5-0.5B: 256
rows of 152k fp32 logits, where 32 decode rows and a prompt chunk sample 33).
A prefill graph's replay is followed by two small eager kernels (`settle`): see there.
All graphs share one memory pool: they run one at a time on the one compute stream, and since no
graph's output is an allocation of its own, what one leaves in the pool the next one reuses."""
from __future__ import annotations

import bisect
import logging
import time

import torch
from tqdm import tqdm

from .runner import SAMPLING_VARIANTS, ModelRunner, SamplingFlags
from .slot import DecodeSlot

log = logging.getLogger("slipstream")


def sampling_flags(variant: tuple[bool, bool, bool]) -> SamplingFlags:
    """The flags of a captured sampling variant (masked, any_random, any_filter): no penalties, no logprobs."""
    return SamplingFlags(any_random=variant[1], any_filter=variant[2], any_penalty=False, logprobs=None)


class StepGraphs:
    def __init__(self, runner: ModelRunner, decode_buckets: list[int], token_buckets: list[int]) -> None:
        """`token_buckets` may be empty: prefill steps then run eagerly."""
        self.decode: dict[tuple[int, int, bool, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.adapted = (False, True) if runner.lora is not None else (False,)  # (LoRA kernels in the forward)
        self.packed: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.head: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.sampling: dict[tuple[int, int, tuple[bool, bool, bool]], torch.cuda.CUDAGraph] = {}
        self.token_buckets = token_buckets
        dtype, device = runner.model.lm_head.weight.dtype, runner.layer.device
        self.settle_rows = torch.zeros(2, 1, 64, dtype=dtype, device=device)  # (in and out of `settle`'s norms)
        self.settle_weight = torch.ones(64, dtype=dtype, device=device)
        stream = runner.layer.compute_stream
        width = runner.max_pages_per_seq
        torch.cuda.synchronize()  # weights, cache and slot buffers were made on the default stream
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):  # warm-up: compile kernels, create cuBLAS workspaces
            slot = runner.slots[0]
            for n in token_buckets:
                runner.stage_padding(slot, n, packed=True)
                runner.packed_forward(slot, n, runner.logit_rows(n))
            runner.stage_padding(slot, max(decode_buckets))
            for b in decode_buckets:
                for adapted in self.adapted:
                    runner.greedy_tail(slot, b, runner.decode_forward(slot, b, width, adapted))
                if token_buckets:
                    runner.greedy_tail(slot, b, runner.head_forward(slot, b))
                for variant in SAMPLING_VARIANTS:
                    runner.sample_rows(slot, b, variant[0], sampling_flags(variant), slot.logits_buffer[:b])
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # (capture empties the cache too): what grows from here is the graphs' pool
        before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()

        def capture(forward, *args, fused: bool = False) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = forward(*args)
                if fused:
                    runner.greedy_tail(args[0], args[1], out)
            return graph, out

        def capture_sampling(slot: DecodeSlot, rows: int, variant: tuple[bool, bool, bool]) -> torch.cuda.CUDAGraph:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                runner.sample_rows(slot, rows, variant[0], sampling_flags(variant), slot.logits_buffer[:rows])
            return graph

        per_bucket = 2 * (len(self.adapted) + bool(token_buckets)) + len(SAMPLING_VARIANTS)
        bar = tqdm(total=len(runner.slots) * (len(token_buckets) + per_bucket * len(decode_buckets)),
                   desc="capturing CUDA graphs", unit="graph", leave=False)
        for slot in runner.slots:
            for n in token_buckets:
                self.packed[(slot.index, n)] = capture(runner.packed_forward, slot, n, runner.logit_rows(n))[0]
                bar.update()
            for b in decode_buckets:
                for fused in (False, True):
                    for adapted in self.adapted:
                        self.decode[(slot.index, b, fused, adapted)] = capture(runner.decode_forward, slot, b, width,
                                                                               adapted, fused=fused)
                        bar.update()
                    if token_buckets:
                        self.head[(slot.index, b, fused)] = capture(runner.head_forward, slot, b, fused=fused)
                        bar.update()
                for variant in SAMPLING_VARIANTS:
                    self.sampling[(slot.index, b, variant)] = capture_sampling(slot, b, variant)
                    bar.update()
        bar.close()
        with torch.cuda.stream(stream):  # the first replay uploads a graph to the device: do it now, on padding
            for slot in runner.slots:
                for n in token_buckets:
                    runner.stage_padding(slot, n, packed=True)
                    self.packed[(slot.index, n)].replay()
                runner.stage_padding(slot, max(decode_buckets))
                for b in decode_buckets:
                    for fused in (False, True):
                        for adapted in self.adapted:
                            self.decode[(slot.index, b, fused, adapted)][0].replay()
                        if token_buckets:
                            self.head[(slot.index, b, fused)][0].replay()
                    for variant in SAMPLING_VARIANTS:
                        self.sampling[(slot.index, b, variant)].replay()
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - t0
        self.memory_bytes = torch.cuda.memory_reserved() - before
        log.info("captured %d graphs (decode rows %s, prefill tokens %s) in %.1f s; graph memory %.1f MiB", len(self),
                 decode_buckets, token_buckets, self.capture_seconds, self.memory_bytes / 2**20)

    def __len__(self) -> int:
        return len(self.decode) + len(self.packed) + len(self.head) + len(self.sampling)

    def token_bucket(self, tokens: int) -> int:
        """The smallest captured prefill size that holds `tokens` tokens."""
        return self.token_buckets[bisect.bisect_left(self.token_buckets, tokens)]

    def replay_decode(self, slot_index: int, rows: int, fused: bool, adapted: bool) -> torch.Tensor:
        graph, logits = self.decode[(slot_index, rows, fused, adapted)]
        graph.replay()
        return logits

    def replay_sampling(self, slot_index: int, rows: int, variant: tuple[bool, bool, bool]) -> None:
        self.sampling[(slot_index, rows, variant)].replay()

    def replay_packed(self, slot_index: int, tokens: int) -> None:
        self.packed[(slot_index, tokens)].replay()
        self.settle()

    def replay_head(self, slot_index: int, rows: int, fused: bool) -> torch.Tensor:
        graph, logits = self.head[(slot_index, rows, fused)]
        graph.replay()
        return logits

    def settle(self) -> None:
        """Two eager RMSNorms over a scratch row, queued behind a prefill graph. Replaying a prefill
        graph leaves the device in a state in which the decode graphs replay ~6% slower (Qwen2.5-0.5B,
        32 rows: 0.81 against 0.76 ms a step; their kernels stop overlapping under PDL) until eager
        kernels run on the stream, and it stays so for every later decode step. Two chained kernels
        restore the fast state (RMSNorms, skinny GEMMs, the LM head: all alike); one was not enough
        (docs/benchmarks.md, runs u and x). They cost two launches (~10 µs of host) a prefill step."""
        from .kernels.norm import rms_norm

        a, b = self.settle_rows
        rms_norm(rms_norm(a, self.settle_weight, 1e-6, out=b), self.settle_weight, 1e-6, out=a)
