"""The engine process: the LLM and its loop thread, fed by the API process over a Unix socket
(channel.py).

Its main thread receives `Generate` / `Skill` / `Abort`, validates, tokenizes (chat templates
included), compiles grammars and decodes images, then queues the sequences: that work stays off
the loop thread. It answers each request at once: queued (the API process starts a streamed
response then, while the engine prefills, so that only the first token's own frame is left on its
path) or refused, with the reason. Text is detokenized where the engine already does it, at commit
(text.py), so the stop strings are decided there and only new text travels; the per-token hooks and
`on_finish` only append to a batch, which the loop thread ships after each pass
(`LLM.after_callbacks`): one message per commit however many requests moved, sent by the loop itself
because a sender thread would wait for the interpreter lock while the loop goes on to its next step
(~0.3 ms of the first token's path on the H200, docs/server.md). A thread of its own sends the stats."""
from __future__ import annotations

import dataclasses
import faulthandler
import os
import select
import signal
import socket
import threading
import time
from typing import Any, Callable

import msgspec
from tqdm import tqdm

from ..cli import configure_logging
from ..engine import LLM, RequestOutput
from ..models.moondream.skills import SPATIAL_SKILLS
from ..sampling import SamplingParams
from ..scheduler import Sequence
from .channel import CHUNK, Frames, Outbox
from .protocol import Abort, Delta, Generate, Ready, Skill, Stats, TokenLogprob, ToEngine


def run_engine(model: str | None, options: dict[str, Any], loras: dict[str, str], wire: socket.socket,
               busy_poll: bool = False) -> None:
    """The engine process's entry point: load the model and its adapters, say Ready on `wire` (its end
    of the socket pair), then serve until the API process is gone (`busy_poll`: see `_next_chunk`).
    SIGUSR1 prints every thread's stack to stderr (a stuck engine, diagnosed live)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    configure_logging()  # (the graphs' capture line, as an engine in the API process would print it)
    # (tqdm's default lock includes a multiprocessing semaphore; the API process terminates this one, so the
    # semaphore would outlive it and multiprocessing's resource tracker would warn of a leak at shutdown)
    tqdm.set_lock(threading.RLock())
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    outbox, encoder = Outbox(wire), msgspec.msgpack.Encoder()
    llm = LLM(model, **options)
    for name, path in loras.items():
        llm.load_lora(name, path)
    outbox.send(encoder.encode(Ready(model=model or "SmolLM2-135M-Instruct", max_model_len=llm.core.max_model_len,
                                     vocab_size=llm.core.model_config.vocab_size,
                                     max_prompt_bytes=llm.core.max_model_len * llm.tokenizer.max_token_bytes,
                                     moondream=llm.core.moondream is not None, loras=list(loras))))
    threading.Thread(target=_send_stats, args=(llm, outbox, encoder), daemon=True).start()
    decoder = msgspec.msgpack.Decoder(ToEngine)
    server = _Server(llm, lambda delta: outbox.send(encoder.encode([delta])),
                     lambda batch: outbox.send(encoder.encode(batch)))
    frames = Frames()
    while chunk := (_next_chunk(wire, llm) if busy_poll else wire.recv(CHUNK)):
        for message in frames.feed(chunk):
            server.handle(decoder.decode(message))
    os._exit(0)  # (the API process closed its end: it is gone, and what runs here serves no one)


def _next_chunk(wire: socket.socket, llm: LLM) -> bytes:
    """The next bytes from the API process, polled for without sleeping while the engine is idle
    (`serve --busy-poll`): this thread reads a request as it lands instead of being woken for it.
    While the loop thread runs or is about to, it waits in the kernel as without the option, looking
    again each millisecond: a poller holding the interpreter lock between its polls would keep the
    loop waiting for it."""
    readable = select.poll()
    readable.register(wire, select.POLLIN)
    while True:
        if llm.idle:
            try:
                return wire.recv(CHUNK, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
        if readable.poll(1):
            return wire.recv(CHUNK)


def _exit_with_parent(parent: int) -> None:
    """Exit once the API process is gone, however it went, even while the model loads (a SIGKILL
    runs no shutdown): an orphaned engine would hold its GPU's memory."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


class _Server:
    """Turns messages into queued sequences, and their callbacks into batches of deltas that `send`
    ships once each group of callbacks is done; `reply` answers each request at once: queued, or
    refused."""

    def __init__(self, llm: LLM, reply: Callable[[Delta], None], send: Callable[[list[Delta]], None]) -> None:
        self.llm, self.reply, self.send = llm, reply, send
        self.running = _Running()
        self.pieces = _TokenPieces(llm)
        self.batch: list[Delta] = []  # (the callbacks run one at a time, on the loop thread)
        llm.after_callbacks = self._ship

    def _ship(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            self.send(batch)

    def handle(self, message: Generate | Skill | Abort) -> None:
        received = time.monotonic()
        if isinstance(message, Abort):
            for engine_id in self.running.engine_ids(message.id):
                self.llm.abort(engine_id)
            return
        try:
            if isinstance(message, Generate):
                seqs = self._generate(message)
            else:
                seqs = [self.llm.skill_sequence(message.image, message.skill, message.argument, message.settings)]
        except (ValueError, TypeError) as e:
            self.reply(Delta(message.id, finish_reason="error", error=str(e), invalid=True))
            return
        except Exception as e:  # (a bug, not the input: this request fails, the engine serves on)
            self.reply(Delta(message.id, finish_reason="error", error=f"preparing the request failed: {e!r}"))
            return
        spatial = isinstance(message, Skill) and message.skill in SPATIAL_SKILLS  # (answers come at the end)
        queued = []
        for index, seq in enumerate(seqs):
            ship = self.pieces.shipper()
            if not spatial:
                seq.on_token = self._on_token(message.id, index, ship, received)
            queued.append((seq, self._on_finish(message.id, index, seq, ship)))
        try:
            self.running.start(message.id, lambda: [self.llm.enqueue(seq, done) for seq, done in queued])
        except RuntimeError as e:  # the loop died: its death fails what was queued, and this request
            self.reply(Delta(message.id, finish_reason="error", error=str(e)))
            return
        self.reply(Delta(message.id, queued=True))

    def _generate(self, message: Generate) -> list[Sequence]:
        """The request's n sequences, validated and tokenized once; each choice's seed is offset by
        its index where a seed is given (as vLLM does), so the choices differ."""
        params = SamplingParams(**message.params)
        if message.messages is not None:
            prompt: str | list[int] = self.llm.core.render_chat(message.messages)
        elif message.prompt is not None:
            prompt = message.prompt
        else:
            raise ValueError("a request needs a prompt or messages")
        seqs = [self.llm.core.make_sequence(prompt, params, None)]
        try:
            for i in range(1, message.n):
                seqs.append(self.llm.core.make_sequence(seqs[0].prompt_ids, params if params.seed is None
                                                        else dataclasses.replace(params, seed=params.seed + i), None))
        except BaseException:
            self.llm.core.discard(seqs)
            raise
        return seqs

    def _on_token(self, request_id: str, index: int, ship: "_Shipper",
                  received: float) -> Callable[[Sequence, str], None]:
        first = True

        def on_token(seq: Sequence, delta: str) -> None:
            nonlocal first
            logprobs = ship(seq.output_ids, seq.logprobs, seq.params.logprobs)
            if delta or logprobs:
                stamps = (received, time.monotonic()) if first else None
                first = False
                self.batch.append(Delta(request_id, index, delta, len(seq.output_ids), logprobs=logprobs,
                                        stamps=stamps))

        return on_token

    def _on_finish(self, request_id: str, index: int, seq: Sequence,
                   ship: "_Shipper") -> Callable[[RequestOutput | None, BaseException | None], None]:
        """(Usage counts an image's prefix positions among the prompt's tokens, as vLLM does.)"""
        def on_finish(out: RequestOutput | None, error: BaseException | None) -> None:
            self.running.ended(request_id)
            if error is not None or out is None:
                self.batch.append(Delta(request_id, index, finish_reason="error", error=repr(error)))
                return
            self.batch.append(Delta(request_id, index, completion_tokens=len(out.token_ids),
                                  finish_reason=out.finish_reason, prompt_tokens=len(seq.prompt_ids),
                                  cached_tokens=out.cached_tokens,
                                  logprobs=ship(out.token_ids, out.logprobs or [], seq.params.logprobs),
                                  objects=out.objects))

        return on_finish


class _Running:
    """Request id -> its sequences' engine ids while any runs. A sequence may end (on the loop
    thread) before all of its request's sequences are queued (on this thread): the lock orders the
    two, and the request is forgotten when its last sequence ends."""

    def __init__(self) -> None:
        self._ids: dict[str, list[int]] = {}
        self._ended: dict[str, int] = {}
        self._lock = threading.Lock()

    def start(self, request_id: str, enqueue: Callable[[], list[int]]) -> None:
        with self._lock:
            self._ended[request_id] = 0
            try:
                self._ids[request_id] = enqueue()
            except BaseException:
                del self._ended[request_id]
                raise

    def ended(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._ended:
                self._ended[request_id] += 1
                if self._ended[request_id] == len(self._ids.get(request_id, ())):
                    del self._ended[request_id], self._ids[request_id]

    def engine_ids(self, request_id: str) -> list[int]:
        with self._lock:
            return list(self._ids.get(request_id, ()))


_Shipper = Callable[[list[int], list[dict[int, float]], "int | None"], "list[TokenLogprob] | None"]


class _TokenPieces:
    """Token ids -> their bytes, for logprobs (special tokens by their content)."""

    def __init__(self, llm: LLM) -> None:
        self.table = llm.tokenizer.token_bytes
        self.fast = llm.tokenizer.fast
        self._cache: dict[int, bytes] = {}

    def __call__(self, token: int) -> bytes:
        piece = self._cache.get(token)
        if piece is None:
            piece = self.table[token] if self.table is not None and token < len(self.table) else b""
            if not piece:
                piece = (self.fast.id_to_token(token) or "").encode() if self.table is not None else \
                    self.fast.decode([token], skip_special_tokens=False).encode()
            self._cache[token] = piece
        return piece

    def shipper(self) -> _Shipper:
        """A choice's logprobs not yet shipped, each call from where the last one stopped (its
        callbacks run one at a time, in token order: scheduler invariant 5)."""
        done = 0

        def ship(token_ids: list[int], entries: list[dict[int, float]], n: int | None) -> list[TokenLogprob] | None:
            nonlocal done
            if n is None or done >= len(entries):
                return None
            out = [TokenLogprob(self(tok), entry[tok], [(self(t), lp) for t, lp in list(entry.items())[:n]])
                   for tok, entry in zip(token_ids[done:], entries[done:])]
            done = len(entries)
            return out

        return ship


def _send_stats(llm: LLM, outbox: Outbox, encoder: msgspec.msgpack.Encoder, every: float = 0.5) -> None:
    fields = Stats.__struct_fields__
    while True:
        stats = llm.stats()
        outbox.send(encoder.encode(Stats(**{k: stats[k] for k in fields if k in stats})))
        time.sleep(every)
