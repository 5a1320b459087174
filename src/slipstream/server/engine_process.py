"""The engine process: the LLM and its loop thread, fed over ZMQ by the API process.

Its main thread receives `Generate` / `Abort`, validates and tokenizes (chat templates included)
and submits: that work stays off the loop thread. Text is detokenized where the engine already
does it, at commit (text.py), so the stop strings are decided there and only new text travels;
`on_token` and `on_finish` only append to an outbox, which a sender thread drains and ships in
batches, one message per batch however many requests moved."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import msgspec
import zmq

from ..engine import LLM, RequestOutput
from ..sampling import SamplingParams
from .protocol import Abort, Delta, Generate, Ready, Stats, ToEngine


def run_engine(model: str | None, options: dict[str, Any], requests_addr: str, outputs_addr: str) -> None:
    """The engine process's entry point: load the model, say Ready, then serve until killed."""
    ctx = zmq.Context()
    outputs = ctx.socket(zmq.PUSH)
    outputs.connect(outputs_addr)
    encoder = msgspec.msgpack.Encoder()
    llm = LLM(model, **options)
    outputs.send(encoder.encode(Ready(model=model or "SmolLM2-135M-Instruct", max_model_len=llm.core.max_model_len)))
    outbox: queue.SimpleQueue[Delta] = queue.SimpleQueue()
    threading.Thread(target=_send_batches, args=(llm, outbox, outputs, encoder), daemon=True).start()
    requests = ctx.socket(zmq.PULL)
    requests.connect(requests_addr)
    decoder = msgspec.msgpack.Decoder(ToEngine)
    running = _Running()
    while True:
        message = decoder.decode(requests.recv())
        if isinstance(message, Abort):
            rid = running.engine_id(message.id)
            if rid is not None:
                llm.abort(rid)
            continue
        try:
            running.started(message.id, _submit(llm, message, outbox, running))
        except (ValueError, TypeError) as e:
            outbox.put(Delta(message.id, finish_reason="error", error=str(e), invalid=True))


class _Running:
    """Request id -> engine id while a request runs. Its end (on the loop thread) may come before
    its start is recorded (on this thread): the lock orders the two."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._ended: set[str] = set()
        self._lock = threading.Lock()

    def started(self, request_id: str, engine_id: int) -> None:
        with self._lock:
            if request_id in self._ended:
                self._ended.discard(request_id)
            else:
                self._ids[request_id] = engine_id

    def ended(self, request_id: str) -> None:
        with self._lock:
            if self._ids.pop(request_id, None) is None:
                self._ended.add(request_id)

    def engine_id(self, request_id: str) -> int | None:
        with self._lock:
            return self._ids.get(request_id)


def _submit(llm: LLM, message: Generate, outbox: queue.SimpleQueue, running: _Running) -> int:
    params = SamplingParams(**message.params)
    if message.messages is not None:
        prompt: str | list[int] = llm.core.render_chat(message.messages)
    elif message.prompt is not None:
        prompt = message.prompt
    else:
        raise ValueError("a request needs a prompt or messages")
    request_id = message.id

    def on_token(_rid: int, n: int, delta: str) -> None:
        if delta:
            outbox.put(Delta(request_id, delta, n))

    def on_finish(out: RequestOutput | None, error: BaseException | None) -> None:
        running.ended(request_id)
        if error is not None or out is None:
            outbox.put(Delta(request_id, finish_reason="error", error=repr(error)))
        else:
            outbox.put(Delta(request_id, completion_tokens=len(out.token_ids), finish_reason=out.finish_reason,
                             prompt_tokens=len(out.prompt_token_ids)))

    return llm.submit(prompt, params, on_token, on_finish)


def _send_batches(llm: LLM, outbox: queue.SimpleQueue, socket: zmq.Socket, encoder: msgspec.msgpack.Encoder,
                  stats_every: float = 0.5) -> None:
    """The one thread that sends: batches of deltas as they come, the engine's stats between them."""
    next_stats = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= next_stats:
            stats = llm.stats()
            socket.send(encoder.encode(Stats(**{k: stats[k] for k in Stats.__struct_fields__})))
            next_stats = now + stats_every
        try:
            batch = [outbox.get(timeout=max(0.0, next_stats - now))]
        except queue.Empty:
            continue
        while True:
            try:
                batch.append(outbox.get_nowait())
            except queue.Empty:
                break
        socket.send(encoder.encode(batch))
