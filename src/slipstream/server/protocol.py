"""Messages between the API process and the engine process (msgpack, typed by msgspec).

API -> engine: `Generate` (a prompt or chat messages, the sampling fields, n choices), `Skill` (a
Moondream 2 skill on an image), `Abort`. Engine -> API: batches of `Delta` (a choice's new text and
its tokens' logprobs; a choice's last delta carries its finish reason, token counts, points or
boxes, or an error; its first delta with tokens, the engine's stamps of its first token's path;
and one delta a request, from the engine process's main thread, saying it was queued or refused),
one `Ready` when the model is loaded, and `Stats` twice a second."""
from __future__ import annotations

import msgspec


class Generate(msgspec.Struct, tag=True):
    id: str
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    params: dict = {}
    n: int = 1  # choices: n sequences on the one prompt, seeds seed, seed + 1, ... where a seed is given


class Skill(msgspec.Struct, tag=True):
    id: str
    skill: str  # caption | query | point | detect
    image: bytes  # the encoded image (decoded and tiled in the engine process, off its loop thread)
    argument: str  # caption's length, query's question, point's and detect's object
    settings: dict = {}


class Abort(msgspec.Struct, tag=True):
    id: str


class TokenLogprob(msgspec.Struct, array_like=True):
    """One generated token: its bytes, its logprob, and the top alternatives (bytes, logprob)."""
    token: bytes
    logprob: float
    top: list[tuple[bytes, float]]


class Delta(msgspec.Struct, tag=True, omit_defaults=True):
    """(Fields left at their defaults are not sent.)"""
    id: str
    index: int = 0  # the choice
    text: str = ""
    completion_tokens: int = 0  # the choice's tokens so far
    finish_reason: str | None = None  # set on a choice's last delta
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's, found in the prefix cache
    logprobs: list[TokenLogprob] | None = None  # the tokens committed since the choice's last delta
    objects: list[dict] | None = None  # point / detect: the points or boxes
    error: str | None = None  # the request failed: `invalid` says whether its input was at fault
    invalid: bool = False
    # the engine queued the request: a delta of its own, sent by the main thread once it has queued it
    # (the loop thread sends the first tokens, so they may, rarely, arrive first)
    queued: bool = False
    # a choice's first delta with tokens: when the engine process received the request and when the
    # loop committed that text (time.monotonic: one clock for every process of a Linux host)
    stamps: tuple[float, float] | None = None


class Ready(msgspec.Struct, tag=True):
    model: str
    max_model_len: int
    vocab_size: int
    max_prompt_bytes: int  # longer prompt text cannot fit the context (tokens cover at most this many bytes)
    moondream: bool = False
    loras: list[str] = []  # adapters served as models of these names


class Stats(msgspec.Struct, tag=True):
    """LLM.stats() of the engine: KV pages (and those the prefix cache keeps), requests running and
    waiting, steps so far, prompt tokens admitted and found cached, and with
    step timing on, GPU busy and idle seconds over the timed steps and idle per step by bucket
    (profiler.IDLE_BUCKETS)."""
    kv_pages_total: int
    kv_pages_free: int
    running: int
    waiting: int
    prefill_steps: int
    decode_steps: int
    kv_pages_cached: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    timed_steps: int = 0
    gpu_busy_seconds: float = 0.0
    gpu_idle_seconds: float = 0.0
    gpu_idle_counts: list[int] = []


ToEngine = Generate | Skill | Abort
FromEngine = list[Delta] | Ready | Stats


def merge(batch: list[Delta]) -> list[Delta]:
    """A batch of deltas as one per choice (in order of first appearance): texts and logprobs
    joined, the last token count, and the end (finish reason, counts, objects, error) where one came."""
    merged: dict[int, Delta] = {}
    for d in batch:
        m = merged.get(d.index)
        if m is None:
            merged[d.index] = msgspec.structs.replace(d, logprobs=list(d.logprobs) if d.logprobs else None)
            continue
        m.text += d.text
        m.completion_tokens = max(m.completion_tokens, d.completion_tokens)
        if d.logprobs:
            m.logprobs = (m.logprobs or []) + d.logprobs
        if d.finish_reason is not None or d.error is not None:
            m.finish_reason, m.prompt_tokens, m.cached_tokens = d.finish_reason, d.prompt_tokens, d.cached_tokens
            m.objects = d.objects
            m.error, m.invalid = d.error, d.invalid
    return list(merged.values())
