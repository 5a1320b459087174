"""The API process's side of the engine: it starts the engine process, sends it requests and
routes its batches of deltas to each request's asyncio queue. If the engine process dies, every
request in flight ends at once with an error and later ones are refused (`/health` says so).

The sockets are plain pyzmq ones, read by a callback on the event loop's own readiness watch of
the socket, not zmq.asyncio's: a future for each receive cost ~0.1 ms of the first token's path on
the H200 (docs/server.md). Sends never block the event loop: the requests socket's queue is
unbounded, and with no engine process connected a send fails at once (EngineDead)."""
from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator

import msgspec
import zmq

from .engine_process import run_engine
from .protocol import Abort, Delta, FromEngine, Generate, Ready, Skill, Stats


class EngineDead(RuntimeError):
    pass


class _Inbox:
    """A request's deltas as they arrive, taken in batches: a list and a future to wake its reader
    (an asyncio.Queue's put and get cost ~3 µs each a delta, and the API process handles one delta
    per running request per engine step)."""

    __slots__ = ("deltas", "_waiter")

    def __init__(self) -> None:
        self.deltas: list[Delta] = []
        self._waiter: asyncio.Future | None = None

    def put(self, delta: Delta) -> None:
        self.deltas.append(delta)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[Delta]:
        """Everything that arrived since the last take, waiting for one delta at least."""
        while not self.deltas:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        batch, self.deltas = self.deltas, []
        return batch


class EngineClient:
    def __init__(self, model: str | None, options: dict[str, Any], loras: dict[str, str] | None = None,
                 busy_poll: bool = False) -> None:
        """`loras`: adapters the engine loads at start, name -> path (served as those model names);
        `busy_poll`: the engine process polls for requests while idle (`serve --busy-poll`)."""
        self.model, self.options, self.loras, self.busy_poll = model, options, dict(loras or {}), busy_poll
        self.ready: Ready | None = None
        self.stats: Stats | None = None  # the engine's latest (it sends them twice a second)
        self.dead: str | None = None
        self.started = int(time.time())
        self._inboxes: dict[str, _Inbox] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(FromEngine)

    async def start(self, timeout: float = 600.0) -> None:
        """Start the engine process and wait until its model is loaded."""
        folder = Path(tempfile.mkdtemp(prefix="slipstream-"))
        requests_addr, outputs_addr = f"ipc://{folder}/requests", f"ipc://{folder}/outputs"
        self._ctx = zmq.Context()
        self._requests = self._ctx.socket(zmq.PUSH)
        self._requests.setsockopt(zmq.SNDHWM, 0)
        self._requests.bind(requests_addr)
        self._outputs = self._ctx.socket(zmq.PULL)
        self._outputs.bind(outputs_addr)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._outputs.getsockopt(zmq.FD), self._receive)
        self._process = multiprocessing.get_context("spawn").Process(
            target=run_engine,
            args=(self.model, self.options, self.loras, requests_addr, outputs_addr, self.busy_poll),
            daemon=True, name="slipstream-engine")
        self._process.start()
        deadline = self._loop.time() + timeout
        while self.ready is None:
            if not self._process.is_alive():
                raise EngineDead(f"the engine process exited (code {self._process.exitcode}) while loading the "
                                 f"model; its error is above")
            if self._loop.time() > deadline:
                raise EngineDead(f"the engine process did not load the model within {timeout:.0f} s")
            await asyncio.sleep(0.05)
        self._watch = asyncio.create_task(self._watch_process())

    async def request(self, message: Generate | Skill, choices: int = 1) -> AsyncIterator[list[Delta]]:
        """The request's deltas, in batches of what arrived since the last (so a response writer
        that falls behind sends fewer, larger chunks instead of a growing backlog), until each of its
        `choices` has ended or one failed. Leaving early (a client gone), or a failure while other
        choices run, aborts it in the engine."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        inbox = self._inboxes[message.id] = _Inbox()
        left = choices
        try:
            self._send(message)
            while left:
                batch = await inbox.take()
                yield batch
                for delta in batch:
                    if delta.invalid:  # (refused before anything was queued)
                        left = 0
                    elif delta.error is not None:
                        return
                    elif delta.finish_reason is not None:
                        left -= 1
        finally:
            self._inboxes.pop(message.id, None)
            if left and self.dead is None:
                with contextlib.suppress(EngineDead):
                    self._send(Abort(message.id))

    def _send(self, message: Generate | Skill | Abort) -> None:
        try:
            self._requests.send(self._encoder.encode(message), zmq.NOBLOCK)
        except zmq.Again:  # (no engine connected: a blocking send would stop the event loop for good)
            raise EngineDead("the engine process is not connected; it has exited") from None

    @property
    def in_flight(self) -> int:
        return len(self._inboxes)

    def _receive(self) -> None:
        """Everything the engine sent since the last call (the socket's descriptor says only that its
        state changed, so it is drained until it holds nothing)."""
        while self._outputs.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            message = self._decoder.decode(self._outputs.recv(zmq.NOBLOCK))
            if isinstance(message, list):
                for delta in message:
                    inbox = self._inboxes.get(delta.id)
                    if inbox is not None:
                        inbox.put(delta)
            elif isinstance(message, Stats):
                self.stats = message
            else:
                self.ready = message

    async def _watch_process(self) -> None:
        while self._process.is_alive():
            await asyncio.sleep(0.1)
        self.dead = f"the engine process exited (code {self._process.exitcode})"
        for request_id, inbox in list(self._inboxes.items()):
            inbox.put(Delta(request_id, finish_reason="error", error=self.dead))

    async def stop(self, grace: float = 5.0) -> None:
        if getattr(self, "_watch", None) is not None:
            self._watch.cancel()
        if getattr(self, "_outputs", None) is not None:
            self._loop.remove_reader(self._outputs.getsockopt(zmq.FD))
        if getattr(self, "_process", None) is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(grace)
            if self._process.is_alive():
                self._process.kill()
        if getattr(self, "_ctx", None) is not None:
            self._ctx.destroy(linger=0)
