"""Sampling parameters and the on-device sampler.

Randomness is stateless: the noise for vocabulary entry v of the token at index i of a request
with seed s is a counter-based hash of (s, i, v). A row's sample therefore does not depend on
which batch it lands in, on the pipeline depth, or on any generator object (which a CUDA graph
could not capture)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import torch

_M32 = 0xFFFFFFFF


class TokenConstraint(Protocol):
    """A per-request state machine over committed tokens that decides which tokens may come next.

    `advance` runs at commit with the committed token; `fill_mask` runs at finalize, after the
    commit of the previous step, and writes a packed bitmask (bit v of word v // 32 set = token v
    allowed) into `words`, which arrives zeroed."""

    def advance(self, token_id: int) -> None: ...

    def fill_mask(self, words: np.ndarray) -> None: ...


@dataclass
class SamplingParams:
    """Per-request decoding options. temperature 0 is greedy; any other value samples with
    Gumbel-max noise keyed by (seed, token index). `seed=None` draws a fresh seed at submit."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    constraint: Callable[[], TokenConstraint] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")

    def resolved_seed(self) -> int:
        return self.seed if self.seed is not None else random.getrandbits(62)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix in int64 arithmetic. Multipliers stay below 2**31 so no product
    overflows int64, which keeps the result bit-identical on every device."""
    x = x & _M32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & _M32
    x = ((x ^ (x >> 16)) * 0x297A2D39) & _M32
    return x ^ (x >> 15)


def gumbel_noise(seeds: torch.Tensor, token_index: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape [rows, vocab_size] from (seed, token index, vocab id)."""
    row_key = _mix32(_mix32(seeds ^ (seeds >> 32)) ^ _mix32(token_index * 0x1B873593 + 0x68E31DA4))
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    h = _mix32(row_key[:, None] ^ _mix32(vocab + 0x5BD1E995)[None, :])
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


def apply_bitmask(logits: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Set logits of tokens whose bit is clear in the packed int32 bitmask to -inf."""
    vocab = torch.arange(logits.shape[-1], device=logits.device)
    allowed = ((words[:, vocab >> 5] >> (vocab & 31)) & 1).bool()
    return logits.masked_fill(~allowed, float("-inf"))


def sample(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
           token_index: torch.Tensor, mask_words: torch.Tensor | None, any_random: bool) -> torch.Tensor:
    """One token per row: argmax where temperature is 0, else argmax(logits / T + Gumbel noise).
    `any_random` (known on the host) skips the noise when every row is greedy."""
    logits = logits.float()
    if mask_words is not None:
        logits = apply_bitmask(logits, mask_words)
    greedy = logits.argmax(dim=-1)
    if not any_random:
        return greedy
    t = temperature.to(torch.float32).clamp_min(1e-6)[:, None]
    noisy = (logits / t + gumbel_noise(seeds, token_index, logits.shape[-1])).argmax(dim=-1)
    return torch.where(temperature > 0, noisy, greedy)
