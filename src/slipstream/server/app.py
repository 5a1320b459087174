"""The HTTP side (FastAPI): /v1/models, /v1/completions, /v1/chat/completions (SSE streaming,
`stream_options.include_usage`, n choices, logprobs; images in chat messages for Moondream 2),
Moondream's /v1/caption, /v1/query, /v1/point, /v1/detect, /health, /metrics. Errors are
OpenAI-shaped: 400 naming the field for a bad request, 401 without the API key, 413 for a body
too large (refused as it arrives), 429 over the in-flight limit, 500 when the engine fails, 503
when it is gone. A client that disconnects aborts its request in the engine."""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..models.moondream.skills import SKILLS
from . import openai_fields as fields
from .client import EngineClient, EngineDead
from .images import chat_image_request, skill_request
from .metrics import ServerMetrics
from .protocol import Delta, Generate, Skill
from .responses import Choices, OpenAIReply, openai_stream, skill_stream, skill_whole

MAX_BODY_BYTES = 32 << 20  # (a large photo as base64 fits)


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def build_app(engine: EngineClient, api_key: str | None = None, max_in_flight: int = 4096,
              busy_poll: bool = False) -> FastAPI:
    """`max_in_flight`: requests served at once (running, queued in the engine, or streaming out);
    one more gets a 429 with Retry-After instead of a queue that grows without bound. `busy_poll`:
    the event loop never waits in the kernel (`_never_sleep`)."""
    metrics = ServerMetrics(engine)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await engine.start()
        poller = asyncio.create_task(_never_sleep()) if busy_poll else None
        yield
        if poller is not None:
            poller.cancel()
        await engine.stop()

    # (FastAPI's OpenTelemetry hooks off: left on, each request looks up the global providers,
    # ~0.35 ms of the API process's time a request in a profile of a burst, docs/server.md)
    app = _App(title="slipstream", lifespan=lifespan, telemetry={"tracing": False, "metrics": False, "logs": False})

    def check_key(request: Request) -> None:
        """401 without the key (a check in each /v1/ handler: an HTTP middleware would hide the
        client's disconnect from the handler)."""
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise _Refused(error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error"))

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
        try:
            check_key(request)
        except _Refused as no:
            return no.response
        ready = engine.ready
        base = {"id": ready.model, "object": "model", "created": engine.started, "owned_by": "slipstream",
                "max_model_len": ready.max_model_len, "vocab_size": ready.vocab_size, "moondream": ready.moondream}
        adapters = [{**base, "id": name, "parent": ready.model} for name in ready.loras]
        return JSONResponse({"object": "list", "data": [base, *adapters]})

    def adapter(body: dict[str, Any]) -> str | None:
        """The LoRA adapter the request's `model` names (None: the base model), or a 404."""
        model = body.get("model")
        if model is None or model == engine.ready.model:
            return None
        if model in engine.ready.loras:
            return model
        raise _Refused(error(404, f"the model {model!r} does not exist; this server serves "
                                  f"{', '.join([engine.ready.model, *engine.ready.loras])}", param="model",
                             kind="not_found_error"))

    async def serve(request: Request, handle: Callable[[dict[str, Any]], Awaitable[Response]]) -> Response:
        """Key, body and fields checked, then `handle(body)`; every refusal is an OpenAI-shaped error."""
        try:
            check_key(request)
            body = await _json_body(request)
            if engine.dead is not None:
                return error(503, engine.dead, "engine_dead")
            if engine.in_flight >= max_in_flight:
                response = error(429, f"the server is serving {engine.in_flight} requests, its limit; retry "
                                      f"shortly", "rate_limit_error")
                response.headers["Retry-After"] = "1"
                return response
            return await handle(body)
        except _Refused as no:
            return no.response
        except fields.FieldError as e:
            return error(400, str(e), param=e.param)

    async def start(message: Generate | Skill, n: int = 1) -> tuple[list[Delta], AsyncIterator[list[Delta]]]:
        """Send the request; its first batch of deltas (the engine's word that it queued it, or its
        refusal, which refuses it here) and the rest."""
        batches = metrics.observe(engine.request(message, n))
        try:
            first = await anext(batches)
        except EngineDead as e:
            raise _Refused(error(503, str(e), "engine_dead")) from None
        failed = next((d for d in first if d.error is not None), None)
        if failed is not None:
            await batches.aclose()
            raise _Refused(error(400, failed.error) if failed.invalid else error(500, failed.error, "engine_error"))
        return first, batches

    async def openai(request: Request, chat: bool) -> Response:
        async def handle(body: dict[str, Any]) -> Response:
            request_id = uuid.uuid4().hex
            ready = engine.ready
            lora = adapter(body)
            image = chat_image_request(body, request_id) if chat else None
            if image is not None:
                if not ready.moondream:
                    raise fields.FieldError("messages", "this model takes no images (image_url parts need a "
                                                        "Moondream 2 model)")
                if lora is not None:
                    image.settings["lora"] = lora
                message, n, logprobs = image, 1, False
            else:
                params = fields.sampling_fields(body, chat, ready.max_model_len)
                if lora is not None:
                    params["lora"] = lora
                n, logprobs = fields.choices(body), "logprobs" in params
                if chat:
                    message = Generate(request_id, messages=fields.chat_messages(body, ready.max_prompt_bytes),
                                       params=params, n=n)
                else:
                    message = Generate(request_id, fields.completion_prompt(body, ready.max_model_len,
                                                                            ready.max_prompt_bytes), params=params, n=n)
            first, batches = await start(message, n)
            reply, choices = OpenAIReply(chat, ready.model, logprobs), Choices(n)
            if body.get("stream"):
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return EventStream(openai_stream(reply, choices, first, batches, usage))
            return await _whole(request, choices, first, batches, lambda: JSONResponse(reply.whole(choices)))

        return await serve(request, handle)

    async def completions(request: Request) -> Response:
        return await openai(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await openai(request, chat=True)

    def skill_route(skill: str) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            async def handle(body: dict[str, Any]) -> Response:
                if not engine.ready.moondream:
                    raise _Refused(error(404, f"/v1/{skill} needs a Moondream 2 model; this server runs "
                                              f"{engine.ready.model}"))
                message = skill_request(skill, body, uuid.uuid4().hex)
                if (lora := adapter(body)) is not None:
                    message.settings["lora"] = lora
                first, batches = await start(message)
                if body.get("stream"):
                    return EventStream(skill_stream(first, batches))
                choices = Choices(1)
                return await _whole(request, choices, first, batches,
                                    lambda: JSONResponse(skill_whole(skill, message.id, choices)))

            return await serve(request, handle)

        return route

    app.add_direct_route("/v1/completions", completions)
    app.add_direct_route("/v1/chat/completions", chat_completions)
    for skill in SKILLS:
        app.add_direct_route(f"/v1/{skill}", skill_route(skill))
    return app


async def _never_sleep() -> None:
    """Keeps the event loop looking at its sockets without waiting (`serve --busy-poll`): a request,
    or the engine's output, is read as it lands instead of after the loop's thread is woken for it."""
    while True:
        await asyncio.sleep(0)


Handler = Callable[[Request], Awaitable[Response]]


class _App(FastAPI):
    """FastAPI, but a POST to a generation route goes straight to its handler, past Starlette's
    middleware and router: ~0.1 ms of a request's first token path on the H200's host, whose CPUs
    run such code, cold after waiting for the request, several times slower than a warm loop does
    (docs/server.md, run p). The handlers read their bodies themselves, so FastAPI's dependency and
    validation machinery would only cost time too. They are also routes of the app, which serve
    them where the direct lookup does not find the path (an app mounted under a root path)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.direct: dict[str, Handler] = {}

    def add_direct_route(self, path: str, handler: Handler) -> None:
        self.add_route(path, handler, methods=["POST"])
        self.direct[path] = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.direct.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            await super().__call__(scope, receive, send)
        else:
            response = await handler(Request(scope, receive, send))
            await response(scope, receive, send)


async def _json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object; one too large is refused by its Content-Length, or as soon as what
    arrived passes the limit, without reading the rest."""
    def too_large() -> _Refused:  # (built only when refused: a response for every request cost ~50 µs, run p)
        return _Refused(error(413, f"request body over {MAX_BODY_BYTES} bytes"))

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large()
    raw = bytearray()
    async for piece in request.stream():
        raw += piece
        if len(raw) > MAX_BODY_BYTES:
            raise too_large()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise fields.FieldError(None, f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise fields.FieldError("body", "the request body must be a JSON object")
    return body


class EventStream(StreamingResponse):
    """Server-sent events, each frame sent as its generator yields it. Starlette's StreamingResponse
    runs the frames in an anyio task group beside a listener for the client's disconnect (uvicorn
    speaks ASGI 2.3, whose sends after a disconnect vanish silently); this sends them itself and
    listens with one asyncio task, looked at after each frame: the request's first frame leaves ~0.2
    ms sooner on the CPU machine (docs/server.md). A client gone closes the generator at its next
    frame (decode rows make one every step), whose `finally` aborts the request."""

    def __init__(self, frames: AsyncIterator[bytes]) -> None:
        super().__init__(frames, media_type="text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for frame in self.body_iterator:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
                if gone.done():
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            gone.cancel()
            await self.body_iterator.aclose()


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the request's body was read before the response began)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _whole(request: Request, choices: Choices, first: list[Delta], batches: AsyncIterator[list[Delta]],
                 respond: Callable[[], Response]) -> Response:
    """Collect every delta into `choices`, then `respond()`; a client gone meanwhile cancels the
    collection, which aborts the request."""
    async def collect() -> Response:
        batch: list[Delta] | None = first
        while batch is not None:
            for delta in batch:
                if delta.error is not None:
                    return error(500, delta.error, "engine_error")
                choices.add(delta)
            batch = await anext(batches, None)
        return respond()

    task = asyncio.ensure_future(collect())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return Response(status_code=499)
        return task.result()
    finally:
        await batches.aclose()
