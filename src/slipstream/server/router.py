"""Data parallelism on one host (`slipstream serve --data-parallel N`): one engine process per GPU
behind the one API process, which routes each request to a replica and restarts a replica whose
process dies (its requests in flight fail at once, as with one engine; the others serve on).

Routing: to the replica that served the longest start of this prompt lately, where its prefix
cache would likely hit — an approximate index of chained hashes over the prompt's blocks (text
characters or token ids; an image's bytes), as SGLang's cache-aware router keeps over text — if
that start is long enough and the replica is not much busier than the least busy; otherwise to
the replica with the fewest requests in flight. `/metrics` counts which rule decided."""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter, OrderedDict
from typing import Any, AsyncIterator

import msgspec
import numpy as np

from .client import EngineClient, EngineDead
from .protocol import Delta, Generate, Ready, Skill, Stats

BLOCK_CHARS, BLOCK_IDS = 256, 64  # a prompt's blocks for the index: ~64 tokens of text, 64 token ids
MIN_BLOCKS = 2  # a shared start of fewer blocks routes by load
BALANCE = 16  # the replica holding the prefix is taken while it has at most this many more requests in flight


class PrefixIndex:
    """Chained hashes of prompt blocks -> the replica that last served a prompt starting so, an LRU
    of at most `capacity` blocks."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._owner: OrderedDict[bytes, int] = OrderedDict()

    @staticmethod
    def keys(message: Generate | Skill) -> list[bytes]:
        if isinstance(message, Skill):  # (the image's prefix is the one worth finding)
            return [hashlib.blake2b(message.image, digest_size=16).digest()] * MIN_BLOCKS
        if message.messages is not None:
            units: bytes | np.ndarray = "".join(f"{m.get('role')}\n{m.get('content')}\n"
                                                for m in message.messages).encode()
            block = BLOCK_CHARS
        elif isinstance(message.prompt, str):
            units, block = message.prompt.encode(), BLOCK_CHARS
        else:
            units, block = np.asarray(message.prompt or [], dtype=np.int64), BLOCK_IDS
        keys, parent = [], b""
        for i in range(len(units) // block):
            piece = units[i * block:(i + 1) * block]
            parent = hashlib.blake2b(parent + (piece if isinstance(piece, bytes) else piece.tobytes()),
                                     digest_size=16).digest()
            keys.append(parent)
        return keys

    def best(self, keys: list[bytes]) -> tuple[int | None, int]:
        """The replica that served the longest run of these keys, and how many it matched."""
        owner, matched = None, 0
        for i, key in enumerate(keys):
            replica = self._owner.get(key)
            if replica is None:
                break
            owner, matched = replica, i + 1
        return owner, matched

    def record(self, keys: list[bytes], replica: int) -> None:
        for key in keys:
            self._owner[key] = replica
            self._owner.move_to_end(key)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)


class Replicas:
    """N EngineClients behind EngineClient's interface (what app.py and metrics.py use)."""

    def __init__(self, model: str | None, options: dict[str, Any], loras: dict[str, str] | None,
                 devices: list[str], busy_poll: bool = False) -> None:
        self._make = lambda device: EngineClient(model, {**options, "device": device}, loras, busy_poll)
        self.devices = devices
        self.clients = [self._make(d) for d in devices]
        self.index = PrefixIndex()
        self.decisions: Counter[str] = Counter({"prefix": 0, "least_outstanding": 0})
        self.routed = [0] * len(devices)
        self.restarts = 0
        self.ready: Ready | None = None  # (every replica serves the same model; kept while one restarts)
        self.started = 0
        self._supervisors: list[asyncio.Task] = []

    async def start(self, timeout: float = 600.0) -> None:
        await asyncio.gather(*(c.start(timeout) for c in self.clients))
        self.ready, self.started = self.clients[0].ready, self.clients[0].started
        self._supervisors = [asyncio.create_task(self._supervise(i)) for i in range(len(self.clients))]

    async def stop(self) -> None:
        for task in self._supervisors:
            task.cancel()
        await asyncio.gather(*(c.stop() for c in self.clients))

    @property
    def dead(self) -> str | None:
        """None while any replica serves."""
        if any(self._alive(c) for c in self.clients):
            return None
        return "every engine process is gone (" + "; ".join(c.dead or "starting" for c in self.clients) + ")"

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in self.clients)

    @property
    def stats(self) -> Stats | None:
        """The replicas' stats summed (the idle histogram bucket by bucket)."""
        parts = [c.stats for c in self.clients if c.stats is not None]
        if not parts:
            return None
        total = {}
        for name in Stats.__struct_fields__:
            values = [getattr(s, name) for s in parts]
            total[name] = [sum(v) for v in zip(*values)] if isinstance(values[0], list) else sum(values)
        return Stats(**total)

    async def request(self, message: Generate | Skill, choices: int = 1) -> AsyncIterator[list[Delta]]:
        client = self.clients[self._pick(message)]
        async for batch in client.request(message, choices):
            yield batch

    def replica_states(self) -> list[tuple[bool, int, int]]:
        """(up, requests in flight, requests routed to it) per replica."""
        return [(self._alive(c), c.in_flight, n) for c, n in zip(self.clients, self.routed)]

    def _pick(self, message: Generate | Skill) -> int:
        alive = [i for i, c in enumerate(self.clients) if self._alive(c)]
        if not alive:
            raise EngineDead(self.dead)
        keys = self.index.keys(message)
        least = min(alive, key=lambda i: self.clients[i].in_flight)
        owner, matched = self.index.best(keys)
        if (owner in alive and matched >= MIN_BLOCKS
                and self.clients[owner].in_flight <= self.clients[least].in_flight + BALANCE):
            chosen, rule = owner, "prefix"
        else:
            chosen, rule = least, "least_outstanding"
        self.decisions[rule] += 1
        self.routed[chosen] += 1
        self.index.record(keys, chosen)
        return chosen

    @staticmethod
    def _alive(client: EngineClient) -> bool:
        return client.ready is not None and client.dead is None

    async def _supervise(self, i: int) -> None:
        """Restart replica i whenever its engine process dies (its client has failed its requests)."""
        while True:
            await asyncio.sleep(0.2)
            if self.clients[i].dead is None:
                continue
            with contextlib.suppress(Exception):
                await self.clients[i].stop()
            replacement = self._make(self.devices[i])
            self.clients[i] = replacement
            try:
                await replacement.start()
                self.restarts += 1
            except (EngineDead, msgspec.DecodeError, OSError):
                replacement.dead = "restart failed"
                await asyncio.sleep(5)  # (then try again)
