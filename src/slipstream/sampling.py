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

from .kernels import triton_rows

_M32 = 0xFFFFFFFF


class TokenConstraint(Protocol):
    """A per-request state machine over committed tokens that decides which tokens may come next.

    `advance` runs at commit with the committed token; `fill_mask` runs at finalize, after the
    commit of the previous step, and writes a packed bitmask (bit v of word v // 32 set = token v
    allowed) into `words`, which arrives zeroed. (Grammars are not this kind: their matchers live in
    the matcher process, constrain/matcher_process.py.)"""

    def advance(self, token_id: int) -> None: ...

    def fill_mask(self, words: np.ndarray) -> None: ...

    def is_terminated(self) -> bool:
        """True once the constraint has accepted its end (the request then stops)."""
        ...


MAX_LOGPROBS = 20
GRAMMAR_OPTIONS = ("json_schema", "json_object", "regex", "choice", "grammar")  # structured output, one at most


@dataclass
class SamplingParams:
    """Per-request decoding options, as in vLLM.

    temperature 0 is greedy; otherwise tokens are drawn from softmax(penalized logits / T) after
    top-k / top-p / min-p filtering, with Gumbel-max noise keyed by (seed, token index), so a
    seeded request samples the same tokens in any batch and either mode. `seed=None` draws a
    fresh seed at submit. `stop` strings are matched on the detokenized text and cut from it.
    `logprobs=n` returns, per generated token, its log-probability and the top n (0 <= n <= 20)
    under the model's raw distribution.

    Structured output (at most one): `json_schema` (dict or JSON text), `json_object` (any JSON
    object), `regex`, `choice` (a list of strings), `grammar` (EBNF). Outputs are valid by
    construction; JSON uses compact separators. A bad schema, regex or grammar raises ValueError
    at submit. `lora`: the name of a loaded LoRA adapter (LLM.load_lora) to decode under."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    json_schema: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    constraint: Callable[[], TokenConstraint] | None = None  # a custom per-request constraint factory
    lora: str | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, what: str, value: object) -> None:
            if not ok:
                raise ValueError(f"{what}, got {value!r}")

        need(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens must be an integer >= 1",
             self.max_tokens)
        need(self.temperature >= 0.0 and np.isfinite(self.temperature), "temperature must be a finite number >= 0",
             self.temperature)
        need(isinstance(self.top_k, int) and self.top_k >= 0, "top_k must be an integer >= 0 (0 disables it)",
             self.top_k)
        need(0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]", self.top_p)
        need(0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]", self.min_p)
        need(self.repetition_penalty > 0.0 and np.isfinite(self.repetition_penalty),
             "repetition_penalty must be a finite number > 0", self.repetition_penalty)
        need(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]", self.presence_penalty)
        need(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]", self.frequency_penalty)
        need(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
             "seed must be an integer in [0, 2**63)", self.seed)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        need(all(isinstance(x, str) and x for x in self.stop), "stop must be non-empty strings", self.stop)
        need(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "stop_token_ids must be non-negative integers", self.stop_token_ids)
        need(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
             f"logprobs must be an integer in [0, {MAX_LOGPROBS}]", self.logprobs)
        asked = [name for name in (*GRAMMAR_OPTIONS, "constraint") if getattr(self, name) not in (None, False)]
        need(len(asked) <= 1, "give at most one of json_schema, json_object, regex, choice, grammar", asked)
        need(self.json_schema is None or isinstance(self.json_schema, (dict, str)), "json_schema must be a dict or a "
             "JSON string", self.json_schema)
        need(self.regex is None or (isinstance(self.regex, str) and self.regex), "regex must be a non-empty string",
             self.regex)
        need(self.grammar is None or (isinstance(self.grammar, str) and self.grammar),
             "grammar must be a non-empty EBNF string", self.grammar)
        need(self.choice is None or (isinstance(self.choice, (list, tuple)) and self.choice
                                     and all(isinstance(c, str) and c for c in self.choice)),
             "choice must be a non-empty list of non-empty strings", self.choice)
        need(self.lora is None or (isinstance(self.lora, str) and self.lora), "lora must be an adapter's name",
             self.lora)

    @property
    def grammar_option(self) -> tuple[str, object] | None:
        """(option name, value) of the structured-output option asked for, if any."""
        for name in GRAMMAR_OPTIONS:
            if getattr(self, name) not in (None, False):
                return name, getattr(self, name)
        return None

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def filtered(self) -> bool:
        return self.temperature > 0 and (self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0)

    def resolved_seed(self) -> int:
        return self.seed if self.seed is not None else random.getrandbits(62)


@dataclass
class SamplerInputs:
    """One step's per-row sampling parameters (device views into the slot) and host-known flags
    that skip the work no row asked for."""

    temperature: torch.Tensor
    seeds: torch.Tensor
    token_index: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    repetition_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    any_random: bool
    any_filter: bool
    any_penalty: bool


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


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor,
                    p: SamplerInputs) -> torch.Tensor:
    """vLLM's penalties. `counts` [rows, vocab] counts each row's generated tokens and `prompt_mask`
    marks its prompt tokens; both live on the device and are updated by sampling itself, so they
    include the previous step's token even before that step commits on the host."""
    seen = (counts > 0) | prompt_mask
    rep = p.repetition_penalty.to(logits.dtype)[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    logits = logits - p.frequency_penalty.to(logits.dtype)[:, None] * counts
    return logits - p.presence_penalty.to(logits.dtype)[:, None] * (counts > 0)


def apply_filters(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
                  ) -> torch.Tensor:
    """Per-row top-k, top-p and min-p on tempered logits; the most likely token always survives."""
    vals, idx = scaled.sort(dim=-1, descending=True)
    probs = vals.softmax(dim=-1)
    rank = torch.arange(vals.shape[-1], device=vals.device)[None, :]
    remove = (top_k[:, None] > 0) & (rank >= top_k[:, None])
    remove |= (probs.cumsum(dim=-1) - probs) > top_p.to(probs.dtype)[:, None]
    remove |= probs < min_p.to(probs.dtype)[:, None] * probs[:, :1]
    remove[:, 0] = False
    return torch.empty_like(scaled).scatter_(-1, idx, vals.masked_fill(remove, float("-inf")))


def sample_reference(logits: torch.Tensor, mask_words: torch.Tensor | None, temperature: torch.Tensor,
                     seeds: torch.Tensor | None, token_index: torch.Tensor | None = None,
                     filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """kernels.sample.fused_sample's contract in torch (its reference): the bitmask applied, then
    argmax where temperature is 0 (every row when `seeds` is None), else argmax(filtered logits / T
    + Gumbel noise keyed by (seed, token index, vocab id)); `filters` = per-row (top_k, top_p, min_p)."""
    if mask_words is not None:
        logits = apply_bitmask(logits, mask_words)
    greedy = logits.argmax(dim=-1)
    if seeds is None:
        return greedy
    scaled = logits / temperature.to(torch.float32).clamp_min(1e-6)[:, None]
    if filters is not None:
        scaled = apply_filters(scaled, *filters)
    noisy = (scaled + gumbel_noise(seeds, token_index, logits.shape[-1])).argmax(dim=-1)
    return torch.where(temperature > 0, noisy, greedy)


def sample(logits: torch.Tensor, p: SamplerInputs, mask_words: torch.Tensor | None,
           counts: torch.Tensor | None = None, prompt_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row: argmax where temperature is 0, else argmax(filtered logits / T + Gumbel).
    On CUDA, sampling after the penalties is one kernel (kernels.sample), with the same result
    (penalties leave masked-out logits at -inf; top-k and top-p differ only in which of several
    tokens with exactly equal logits at the cut they keep, which the sort leaves unspecified)."""
    logits = logits.float()
    if p.any_penalty:
        logits = apply_penalties(logits, counts, prompt_mask, p)
    seeds = p.seeds if p.any_random else None
    filters = (p.top_k, p.top_p, p.min_p) if p.any_filter else None
    if triton_rows(logits):
        from .kernels.sample import fused_sample

        return fused_sample(logits, mask_words, p.temperature, seeds, p.token_index, filters=filters)
    return sample_reference(logits, mask_words, p.temperature, seeds, p.token_index, filters)


def top_logprobs(logits: torch.Tensor, tokens: torch.Tensor, n: int) -> torch.Tensor:
    """[rows, 1 + 2n] float64: the sampled token's logprob, the top-n logprobs, the top-n ids."""
    lp = logits.float().log_softmax(dim=-1)
    top = lp.topk(n, dim=-1)
    return torch.cat([lp.gather(1, tokens[:, None]).double(), top.values.double(), top.indices.double()], dim=1)
