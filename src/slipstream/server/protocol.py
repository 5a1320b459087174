"""Messages between the API process and the engine process (msgpack, typed by msgspec).

API -> engine: `Generate` (a prompt or chat messages and the sampling fields), `Abort`.
Engine -> API: batches of `Delta` (a request's new text; the last one carries its finish reason,
token counts or an error) and one `Ready` when the model is loaded."""
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


ToEngine = Generate | Abort
FromEngine = list[Delta] | Ready
