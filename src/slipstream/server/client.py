"""The API process's side of the engine: it starts the engine process, sends it requests and
routes its batches of deltas to each request's asyncio queue. If the engine process dies, every
request in flight ends at once with an error and later ones are refused (`/health` says so).

The two talk over one Unix socket pair (channel.py), read here by asyncio's own transport: its
callback decodes each frame as it lands, with no future a message (zmq.asyncio's future for each
receive cost ~0.1 ms of the first token's path on the H200, docs/server.md). Sends never block the
event loop (the transport queues what the socket cannot take), and once the engine's end is closed
a send fails at once (EngineDead)."""
from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import time
from typing import Any, AsyncIterator

import msgspec

from .channel import Frames, frame
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
        ours, theirs = socket.socketpair()
        self._loop = asyncio.get_running_loop()
        self._wire, _ = await self._loop.connect_accepted_socket(lambda: _Wire(self), ours)
        self._process = multiprocessing.get_context("spawn").Process(
            target=run_engine, args=(self.model, self.options, self.loras, theirs, self.busy_poll),
            daemon=True, name="slipstream-engine")
        try:
            self._process.start()
        finally:
            theirs.close()  # (the engine's copy is its own: once it exits, this end reads the close)
        deadline = self._loop.time() + timeout
        while self.ready is None:
            if self.dead is not None:
                raise EngineDead(f"{self.dead} while loading the model; its error is above")
            if self._loop.time() > deadline:
                raise EngineDead(f"the engine process did not load the model within {timeout:.0f} s")
            await asyncio.sleep(0.05)

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
        if self._wire.is_closing():  # (its writes would vanish: the request would wait for good)
            raise EngineDead(self.dead or "the engine process has closed its connection")
        self._wire.writelines(frame(self._encoder.encode(message)))

    @property
    def in_flight(self) -> int:
        return len(self._inboxes)

    def _receive(self, data: bytes) -> None:
        message = self._decoder.decode(data)
        if isinstance(message, list):
            for delta in message:
                inbox = self._inboxes.get(delta.id)
                if inbox is not None:
                    inbox.put(delta)
        elif isinstance(message, Stats):
            self.stats = message
        else:
            self.ready = message

    def _lost(self) -> None:
        """The engine's end closed: the engine process has exited, or is exiting (its code is waited for
        briefly: it has nothing left to do)."""
        if self._process.is_alive():
            self._process.join(1.0)
        self.dead = f"the engine process exited (code {self._process.exitcode})"
        for request_id, inbox in list(self._inboxes.items()):
            inbox.put(Delta(request_id, finish_reason="error", error=self.dead))

    async def stop(self, grace: float = 5.0) -> None:
        if getattr(self, "_process", None) is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(grace)
            if self._process.is_alive():
                self._process.kill()
        if getattr(self, "_wire", None) is not None:
            self._wire.abort()


class _Wire(asyncio.Protocol):
    """The API process's end of the socket pair: each frame to the client as it completes."""

    def __init__(self, client: EngineClient) -> None:
        self.client, self.frames = client, Frames()

    def data_received(self, data: bytes) -> None:
        for message in self.frames.feed(data):
            self.client._receive(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost()
