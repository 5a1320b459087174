"""The wire between the API process and an engine process: one Unix stream socket pair, each
message a frame (its length, then its msgpack bytes).

Not ZMQ, which issue 18 named after vLLM V1: a ZMQ ipc message wakes three threads on its way
(the sender's I/O thread, the receiver's, then the receiving thread), and on the H200's host a
woken thread costs 20-40 µs. A round trip measured 208 µs through ZMQ with both receivers polling
against 30 µs through a Unix socket pair; in the server (`--busy-poll`) a lone request's hops to the
engine and back took 0.13 and 0.13 ms over ZMQ, 0.07 and 0.04 over this wire (docs/server.md, run r).
What ZMQ's I/O thread also gave, a sender that never waits for a slow reader, `Outbox` gives here;
the API process's side is asyncio's own transport, whose writes never block either."""
from __future__ import annotations

import collections
import socket
import struct
import threading

HEADER = struct.Struct("<I")  # a frame's length in bytes
CHUNK = 1 << 18  # the most bytes read at once


class Frames:
    """Cuts a byte stream into its frames, however its reads split them."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames that `data` completes, in order (none while a frame is still partial)."""
        self._buffer += data
        frames, start, end = [], 0, len(self._buffer)
        while end - start >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer, start)
            if end - start - HEADER.size < size:
                break
            start += HEADER.size
            frames.append(bytes(self._buffer[start:start + size]))
            start += size
        del self._buffer[:start]
        return frames


def frame(payload: bytes) -> list[bytes]:
    """A message as the pieces a writer sends in turn."""
    return [HEADER.pack(len(payload)), payload]


class Outbox:
    """Frames to the other process from any thread of this one, without ever blocking the sender:
    a frame goes straight into the socket's kernel buffer when it fits and nothing waits before it;
    otherwise it waits in a queue that a thread of its own drains. The engine's loop thread sends
    here, and a reader that falls behind must never stall the GPU's next step."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._backlog: collections.deque[bytes] = collections.deque()
        self._lock = threading.Lock()
        self._waiting = threading.Condition(self._lock)
        threading.Thread(target=self._drain, daemon=True, name="slipstream-outbox").start()

    def send(self, payload: bytes) -> None:
        data = b"".join(frame(payload))
        with self._lock:
            if not self._backlog:
                try:
                    sent = self._sock.send(data, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:  # (the other process is gone; this one is about to exit with it)
                    return
                if sent == len(data):
                    return
                data = data[sent:]
            self._backlog.append(data)
            self._waiting.notify()

    def _drain(self) -> None:
        """Sends the backlog's head while holding no lock (the senders append behind it meanwhile), then
        drops it: while anything is queued, every sender queues, so frames keep their order."""
        while True:
            with self._lock:
                while not self._backlog:
                    self._waiting.wait()
                head = self._backlog[0]
            try:
                self._sock.sendall(head)
            except OSError:  # (the other process is gone; this one is about to exit with it)
                return
            with self._lock:
                self._backlog.popleft()

