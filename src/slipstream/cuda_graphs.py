"""CUDA graphs of the decode step: one per (slot, batch-size bucket, sampling fused or not).

Every input of a decode forward lives at a fixed address (the slot's packed metadata on the
device, the last-token table, the KV pages), so each slot's forward is captured once per bucket
and replayed. The fused variant also captures greedy sampling (argmax, the last-token scatter and
the copy into the slot's sampled buffer) for steps with no mask, penalty, temperature or logprobs.
All graphs share one memory pool: they run one at a time on the one compute stream."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

if TYPE_CHECKING:
    from .runner import ModelRunner

log = logging.getLogger("slipstream")


class DecodeGraphs:
    def __init__(self, runner: "ModelRunner", buckets: list[int]) -> None:
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        stream = runner.layer.compute_stream
        width = runner.max_pages_per_seq
        torch.cuda.synchronize()  # weights, cache and slot buffers were made on the default stream
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):  # warm-up: compile kernels, create cuBLAS workspaces
            for slot in runner.slots:
                runner.stage_padding(slot, max(buckets))
            for b in buckets:
                runner.greedy_tail(runner.slots[0], b, runner.decode_forward(runner.slots[0], b, width))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # (capture empties the cache too): what grows from here is the graphs' pool
        before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        todo = [(slot, b, fused) for slot in runner.slots for b in buckets for fused in (False, True)]
        for slot, b, fused in tqdm(todo, desc="capturing CUDA graphs", unit="graph", leave=False):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                logits = runner.decode_forward(slot, b, width)
                if fused:
                    runner.greedy_tail(slot, b, logits)
            self.graphs[(slot.index, b, fused)] = (graph, logits)
        with torch.cuda.stream(stream):  # the first replay uploads a graph to the device: do it now, on padding
            for graph, _ in self.graphs.values():
                graph.replay()
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - t0
        self.memory_bytes = torch.cuda.memory_reserved() - before
        log.info("captured %d decode graphs (buckets %s) in %.1f s; graph memory %.1f MiB", len(self.graphs),
                 buckets, self.capture_seconds, self.memory_bytes / 2**20)

    def __len__(self) -> int:
        return len(self.graphs)

    def replay(self, slot_index: int, rows: int, fused: bool) -> torch.Tensor:
        graph, logits = self.graphs[(slot_index, rows, fused)]
        graph.replay()
        return logits
