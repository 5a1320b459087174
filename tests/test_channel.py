"""The wire between the API process and an engine process: frames come out as they went in,
however the stream is cut; a sender never waits for a reader that has stopped reading, yet every
frame arrives, each sender's in its order, once the reader reads again; and a sender whose reader
is gone drops its frames without raising."""
from __future__ import annotations

import random
import socket
import threading
import time

from slipstream.server.channel import Frames, Outbox, frame


def test_frames_come_out_whole_and_in_order_however_the_stream_is_cut():
    rng = random.Random(0)
    messages = [b"", b"x", bytes(range(256)) * 40] + [rng.randbytes(rng.randrange(1, 3000)) for _ in range(50)]
    stream = b"".join(b"".join(frame(m)) for m in messages)
    for cuts in ([1] * 300, [3, 7, 2], [len(stream)], [rng.randrange(1, 900) for _ in range(40)]):
        frames, got, at, i = Frames(), [], 0, 0
        while at < len(stream):
            step = cuts[i % len(cuts)]
            got += frames.feed(stream[at:at + step])
            at, i = at + step, i + 1
        assert got == messages


def test_a_sender_never_waits_for_a_reader_that_stopped_and_every_frame_arrives_in_its_senders_order():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        outbox = Outbox(theirs)
        payload = bytes(50_000)  # (40 of them from each of 3 threads: many times the socket's buffer)
        slowest = []

        def send(sender: int) -> None:
            worst = 0.0
            for i in range(40):
                start = time.perf_counter()
                outbox.send(bytes([sender, i]) + payload)
                worst = max(worst, time.perf_counter() - start)
            slowest.append(worst)

        senders = [threading.Thread(target=send, args=(k,)) for k in range(3)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(10)
        assert len(slowest) == 3 and max(slowest) < 0.5  # (with no one reading)
        frames, got = Frames(), []
        while len(got) < 120:
            got += frames.feed(ours.recv(1 << 16))
        assert all(len(m) == 2 + len(payload) for m in got)
        for sender in range(3):
            assert [m[1] for m in got if m[0] == sender] == list(range(40))


def test_a_sender_whose_reader_is_gone_drops_its_frames_without_raising():
    """(The engine's loop thread sends there: the API process's death must not kill the loop first.)"""
    ours, theirs = socket.socketpair()
    with theirs:
        outbox = Outbox(theirs)
        ours.close()
        for _ in range(3):
            outbox.send(b"x" * 100_000)
