"""Where LoRA applies in the engine's fused projections. A model's projections are fused after
loading (q/k/v into one GEMM, gate and up interleaved into another, Phi's four into two), so an
adapter's modules are parts of them: each part reads some input columns of a fused linear and
writes some of its output rows. An adapter packs its parts' A and B into one [rank, K] and one
[N, rank] per fused linear (B placed at the part's rows, A at its columns), so one shrink and one
expand serve all of a fused projection's parts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

ALL = slice(None)


class Part(NamedTuple):
    inputs: slice = ALL  # the fused linear's input columns this module reads
    outputs: slice = ALL  # and its output rows (a step of 2: gate or up in the interleaved GEMM)


@dataclass(frozen=True)
class LoraTarget:
    """A fused linear [N, K] and the adapter modules (PEFT's names, relative to a layer) it holds;
    `capacity` parts of max_lora_rank each fit its packed rank (an alias of several parts, such as
    Moondream's fused `attn.qkv`, counts as one)."""
    in_features: int
    out_features: int
    parts: dict[str, Part] = field(default_factory=dict)
    capacity: int = 1
    aliases: frozenset[str] = frozenset()  # parts that stand for others (Moondream's names)

    def rows(self, name: str) -> int:
        return len(range(self.out_features)[self.parts[name].outputs])

    def cols(self, name: str) -> int:
        return len(range(self.in_features)[self.parts[name].inputs])
