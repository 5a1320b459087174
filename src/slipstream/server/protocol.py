"""Messages between the API process and the engine process (msgpack, typed by msgspec).

API -> engine: `Generate` (a prompt or chat messages and the sampling fields), `Abort`.
Engine -> API: batches of `Delta` (a request's new text; the last one carries its finish reason,
token counts or an error), one `Ready` when the model is loaded, and `Stats` twice a second."""
from __future__ import annotations

import msgspec


class Generate(msgspec.Struct, tag=True):
    id: str
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    params: dict = {}


class Abort(msgspec.Struct, tag=True):
    id: str


class Delta(msgspec.Struct, tag=True):
    id: str
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None  # set on a request's last delta
    prompt_tokens: int = 0
    error: str | None = None  # the request failed: `invalid` says whether its input was at fault
    invalid: bool = False


class Ready(msgspec.Struct, tag=True):
    model: str
    max_model_len: int


class Stats(msgspec.Struct, tag=True):
    """LLM.stats() of the engine: KV pages, requests running and waiting, steps so far."""
    kv_pages_total: int
    kv_pages_free: int
    running: int
    waiting: int
    prefill_steps: int
    decode_steps: int


ToEngine = Generate | Abort
FromEngine = list[Delta] | Ready | Stats
