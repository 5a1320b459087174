"""The steps in flight: a CUDA-free state machine over launch, finalize and commit.

A step is launched (its forward queued, and its sampling too when it has no constrained row),
finalized (sampling queued; constrained steps only, after the previous commit), and committed
(its tokens read on the host). `depth` is the number of steps that may be in flight: 2 for the
pipelined loop, 1 for the blocking loop. Both run the same tick (see `Scheduler.tick`).

Invariants (each has a unit test in tests/test_pipeline.py):
  1. At most `depth` steps are in flight, and `depth` never exceeds the number of slots.
  2. Each in-flight step holds exactly one slot; no slot is held by two steps.
  3. Steps commit in the order they were launched.
  4. A step commits only after it has been finalized (its sampling is queued).
  5. A slot is released by the commit of the step that holds it, and only then.
  6. With depth 1, every step commits before the next one launches.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Step:
    """One unit of GPU work. A "decode" step has one token for each of its sequences (the captured
    graphs run it); a "prefill" step packs prompt chunks, `chunks[i]` = (first prompt token, tokens)
    of `seqs[num_decode + i]`, beside decode rows for its first `num_decode` sequences. `sampled`
    are the sequences that sample a token, in row order: the decode rows, then the prompts whose
    last chunk this is."""

    index: int
    kind: str  # "prefill" | "decode"
    seqs: list[Any]
    chunks: list[tuple[int, int]] = field(default_factory=list)
    sampled: list[Any] = field(default_factory=list)
    constrained: bool = False
    images: list[Any] = field(default_factory=list)  # image prefixes (scheduler.ImagePrefix) it prefills first
    page_copies: list[tuple[int, int]] = field(default_factory=list)  # (from, to): KV pages it copies before that
    uploads: Any = None  # host tensors its asynchronous copies read, kept until it commits
    slot: int = -1
    finalized: bool = False
    num_rows: int = 0  # sampling rows, padding included
    grammar_fill: tuple[Any, int, list[int]] | None = None  # the matcher process, its fill job of the masks, their rows

    @property
    def num_decode(self) -> int:
        return len(self.seqs) - len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return self.num_decode + sum(n for _, n in self.chunks)


class Pipeline:
    def __init__(self, depth: int, num_slots: int = 2) -> None:
        if not 1 <= depth <= num_slots:
            raise ValueError(f"depth must be in [1, {num_slots}], got {depth}")
        self.depth = depth
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.inflight: deque[Step] = deque()
        self.launched = 0

    def can_launch(self) -> bool:
        return len(self.inflight) < self.depth

    def launch(self, step: Step) -> int:
        """Give the step a slot and put it in flight; returns the slot index."""
        if not self.can_launch():
            raise AssertionError(f"launch with {len(self.inflight)} steps in flight at depth {self.depth}")
        step.slot = self.free_slots.pop()
        self.inflight.append(step)
        self.launched += 1
        return step.slot

    def finalize(self, step: Step) -> None:
        if step not in self.inflight or step.finalized:
            raise AssertionError(f"finalize of step {step.index}, which is not in flight or already finalized")
        step.finalized = True

    def unfinalized(self) -> list[Step]:
        return [s for s in self.inflight if not s.finalized]

    def oldest(self) -> Step | None:
        return self.inflight[0] if self.inflight else None

    def commit_oldest(self) -> Step:
        """Take the oldest step out of flight and free its slot (call after its commit is done)."""
        step = self.inflight[0]
        if not step.finalized:
            raise AssertionError(f"commit of step {step.index} before its sampling was finalized")
        self.inflight.popleft()
        self.free_slots.append(step.slot)
        return step
