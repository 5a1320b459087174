"""The HTTP side (FastAPI): /v1/models, /v1/completions, /v1/chat/completions (SSE streaming,
`stream_options.include_usage`), /health, /metrics. Errors are OpenAI-shaped: 400 naming the
field for a bad request, 401 without the API key, 429 over the in-flight limit, 500 when the
engine fails, 503 when it is gone. A client that disconnects aborts its request in the engine."""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .client import EngineClient, EngineDead
from .metrics import ServerMetrics
from .openai_fields import FieldError, sampling_fields
from .protocol import Delta

MAX_BODY_BYTES = 8 << 20


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def build_app(engine: EngineClient, api_key: str | None = None, max_in_flight: int = 4096) -> FastAPI:
    """`max_in_flight`: requests served at once (running, queued in the engine, or streaming out);
    one more gets a 429 with Retry-After instead of a queue that grows without bound."""
    metrics = ServerMetrics(engine)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await engine.start()
        yield
        await engine.stop()

    app = FastAPI(title="slipstream", lifespan=lifespan)

    def refused(request: Request) -> Response | None:
        """401 without the key (a check in each /v1/ handler: an HTTP middleware would hide the
        client's disconnect from the handler)."""
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error")
        return None

    @app.get("/health")
    async def health() -> Response:
        if engine.dead is not None:
            return error(503, engine.dead, "engine_dead")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if (no := refused(request)) is not None:
            return no
        return JSONResponse({"object": "list", "data": [{"id": engine.ready.model, "object": "model",
                                                         "owned_by": "slipstream",
                                                         "max_model_len": engine.ready.max_model_len}]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, chat=True)

    async def _serve(request: Request, chat: bool) -> Response:
        if (no := refused(request)) is not None:
            return no
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return error(413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise FieldError("body", "the request body must be a JSON object")
            params = sampling_fields(body, chat, engine.ready.max_model_len)
            source = _source(body, chat)
        except orjson.JSONDecodeError as e:
            return error(400, f"the request body is not JSON: {e}")
        except FieldError as e:
            return error(400, str(e), param=e.param)
        if engine.dead is not None:
            return error(503, engine.dead, "engine_dead")
        if engine.in_flight >= max_in_flight:
            response = error(429, f"the server is serving {engine.in_flight} requests, its limit; retry shortly",
                             "rate_limit_error")
            response.headers["Retry-After"] = "1"
            return response
        deltas = metrics.observe(engine.generate(params, **source))
        try:
            first = await anext(deltas)
        except EngineDead as e:
            return error(503, str(e), "engine_dead")
        if first.error is not None:
            await deltas.aclose()
            return error(400 if first.invalid else 500, first.error, "invalid_request_error" if first.invalid
                         else "engine_error")
        reply = _Reply(chat, engine.ready.model)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_sse(reply, first, deltas, usage), media_type="text/event-stream")
        return await _whole(request, reply, first, deltas)

    return app


def _source(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise FieldError("messages", "messages must be a non-empty list of objects")
        return {"messages": [_text_message(m) for m in messages]}
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # (a batch of one, as the openai client sends a single prompt sometimes)
    if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt
                                                          and all(isinstance(t, int) for t in prompt)):
        raise FieldError("prompt", "prompt must be a non-empty string or list of token ids (one prompt a request)")
    return {"prompt": prompt}


def _text_message(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts: text only for now
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise FieldError("messages", "only text content parts are supported by this server yet")
        content = "".join(p.get("text", "") for p in content)
    if not isinstance(content, str) or not isinstance(message.get("role"), str):
        raise FieldError("messages", "each message needs a role and text content")
    return {"role": message["role"], "content": content}


class _Reply:
    """The response objects of one request, completion or chat."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _wrap(self, choices: list[dict], chunk: bool, usage: dict | None = None) -> dict[str, Any]:
        kind = ("chat.completion" + (".chunk" if chunk else "")) if self.chat else "text_completion"
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None or not chunk:
            out["usage"] = usage
        return out

    def chunk(self, text: str, finish_reason: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
        return self._wrap([choice], chunk=True)

    def whole(self, text: str, last: Delta) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": last.finish_reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": last.finish_reason, "logprobs": None}
        return self._wrap([choice], chunk=False, usage=usage(last))

    def usage_chunk(self, last: Delta) -> dict[str, Any]:
        return self._wrap([], chunk=True, usage=usage(last))


def usage(last: Delta) -> dict[str, int]:
    return {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
            "total_tokens": last.prompt_tokens + last.completion_tokens}


async def _sse(reply: _Reply, first: Delta, deltas: AsyncIterator[Delta], include_usage: bool) -> AsyncIterator[bytes]:
    """SSE frames; a client gone closes this generator, whose `finally` aborts the request."""
    delta, opened = first, False
    try:
        while True:
            if delta.error is not None:
                yield b"data: " + orjson.dumps({"error": {"message": delta.error, "type": "engine_error"}}) + b"\n\n"
                break
            if delta.text or not opened or delta.finish_reason is not None:
                finish = delta.finish_reason if delta.finish_reason != "abort" else "stop"
                yield b"data: " + orjson.dumps(reply.chunk(delta.text, finish, first=not opened)) + b"\n\n"
                opened = True
            if delta.finish_reason is not None:
                if include_usage:
                    yield b"data: " + orjson.dumps(reply.usage_chunk(delta)) + b"\n\n"
                break
            delta = await anext(deltas)
        yield b"data: [DONE]\n\n"
    finally:
        await deltas.aclose()


async def _whole(request: Request, reply: _Reply, first: Delta, deltas: AsyncIterator[Delta]) -> Response:
    """Collect the text; a client gone meanwhile cancels the collection, which aborts the request."""
    async def collect() -> Response:
        parts, delta = [first.text], first
        while delta.finish_reason is None:
            delta = await anext(deltas)
            parts.append(delta.text)
        if delta.error is not None:
            return error(500, delta.error, "engine_error")
        return JSONResponse(reply.whole("".join(parts), delta))

    task = asyncio.ensure_future(collect())
    while not task.done():
        await asyncio.wait({task}, timeout=0.25)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await deltas.aclose()
            return Response(status_code=499)
    return task.result()
