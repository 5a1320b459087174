"""Response bodies: OpenAI's completion and chat objects (whole, and SSE chunks, n choices, logprobs
in each endpoint's own shape) and Moondream's skill answers (whole, and its stream's
`{"chunk", "completed"}` frames)."""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

import orjson

from ..models.moondream.skills import SPATIAL_SKILLS
from .protocol import Delta, TokenLogprob, merge

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


class Choices:
    """What a request's deltas add up to, per choice: text, logprobs, finish reason, tokens."""

    def __init__(self, n: int) -> None:
        self.text = [[] for _ in range(n)]
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.tokens = [0] * n
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.objects: list[dict] | None = None

    def add(self, delta: Delta) -> None:
        i = delta.index
        self.text[i].append(delta.text)
        self.logprobs[i].extend(delta.logprobs or ())
        self.tokens[i] = max(self.tokens[i], delta.completion_tokens)
        if delta.finish_reason is not None:
            self.finish[i] = delta.finish_reason
            self.prompt_tokens, self.cached_tokens = delta.prompt_tokens, delta.cached_tokens
            self.objects = delta.objects

    def usage(self) -> dict[str, int]:
        completion = sum(self.tokens)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def _finish_reason(reason: str | None) -> str | None:
    return "stop" if reason == "abort" else reason


class OpenAIReply:
    """The response objects of one completion or chat request."""

    def __init__(self, chat: bool, model: str, logprobs: bool) -> None:
        self.chat, self.model, self.with_logprobs = chat, model, logprobs
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._opened: set[int] = set()
        self._offsets: dict[int, int] = {}  # completions' text_offset so far, per choice

    def _wrap(self, choices: list[dict], chunk: bool, usage: dict | None = None) -> dict[str, Any]:
        kind = ("chat.completion" + (".chunk" if chunk else "")) if self.chat else "text_completion"
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None or not chunk:
            out["usage"] = usage
        return out

    def _logprobs(self, index: int, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.with_logprobs:
            return None
        if self.chat:
            return {"content": [{"token": _text(t.token), "logprob": t.logprob, "bytes": list(t.token),
                                 "top_logprobs": [{"token": _text(p), "logprob": lp, "bytes": list(p)}
                                                  for p, lp in t.top]} for t in tokens]}
        offsets, at = [], self._offsets.get(index, 0)
        for t in tokens:
            offsets.append(at)
            at += len(_text(t.token))
        self._offsets[index] = at
        return {"tokens": [_text(t.token) for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{_text(p): lp for p, lp in t.top} for t in tokens], "text_offset": offsets}

    def chunk(self, delta: Delta) -> dict[str, Any] | None:
        """A delta's SSE chunk, or None when it carries nothing to say (a chat choice's first chunk
        names the role, so the engine's word that it queued the request is one)."""
        i, first = delta.index, delta.index not in self._opened
        if not (delta.text or (first and self.chat) or delta.finish_reason is not None or delta.logprobs):
            return None
        self._opened.add(i)
        choice: dict[str, Any] = {"index": i}
        if self.chat:
            choice["delta"] = ({"role": "assistant", "content": delta.text} if first
                               else {"content": delta.text} if delta.text else {})
        else:
            choice["text"] = delta.text
        choice["logprobs"] = self._logprobs(i, delta.logprobs or [])
        choice["finish_reason"] = _finish_reason(delta.finish_reason)
        return self._wrap([choice], chunk=True)

    def usage_chunk(self, choices: Choices) -> dict[str, Any]:
        return self._wrap([], chunk=True, usage=choices.usage())

    def whole(self, choices: Choices) -> dict[str, Any]:
        out = []
        for i, (parts, finish) in enumerate(zip(choices.text, choices.finish)):
            text = "".join(parts)
            choice: dict[str, Any] = {"index": i}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self._logprobs(i, choices.logprobs[i])
            choice["finish_reason"] = _finish_reason(finish)
            out.append(choice)
        return self._wrap(out, chunk=False, usage=choices.usage())


async def openai_stream(reply: OpenAIReply, choices: Choices, first: list[Delta],
                        batches: AsyncIterator[list[Delta]], include_usage: bool) -> AsyncIterator[bytes]:
    """SSE frames, a chunk per choice per batch; a client gone closes this generator, whose
    `finally` aborts the request."""
    try:
        batch: list[Delta] | None = first
        while batch is not None:
            for delta in merge(batch):
                if delta.error is not None:
                    yield sse({"error": {"message": delta.error, "type": "engine_error"}})
                    yield DONE
                    return
                choices.add(delta)
                if (chunk := reply.chunk(delta)) is not None:
                    yield sse(chunk)
            batch = await anext(batches, None)
        if include_usage:
            yield sse(reply.usage_chunk(choices))
        yield DONE
    finally:
        await batches.aclose()


SKILL_ANSWERS = {"caption": "caption", "query": "answer", "point": "points", "detect": "objects"}


def skill_whole(skill: str, request_id: str, choices: Choices) -> dict[str, Any]:
    answer = choices.objects or [] if skill in SPATIAL_SKILLS else "".join(choices.text[0])
    return {"request_id": request_id, SKILL_ANSWERS[skill]: answer}


async def skill_stream(first: list[Delta], batches: AsyncIterator[list[Delta]]) -> AsyncIterator[bytes]:
    """Moondream's streamed caption or answer: `{"chunk": text, "completed": false}` frames, then
    `{"chunk": "", "completed": true}` (the moondream client reads these)."""
    try:
        batch: list[Delta] | None = first
        while batch is not None:
            for delta in merge(batch):
                if delta.error is not None:
                    yield sse({"error": delta.error, "completed": True})
                    return
                if delta.text:
                    yield sse({"chunk": delta.text, "completed": False})
            batch = await anext(batches, None)
        yield sse({"chunk": "", "completed": True})
    finally:
        await batches.aclose()
