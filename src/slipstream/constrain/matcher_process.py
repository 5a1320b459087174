"""XGrammar's matchers in a process of their own, beside the engine's loop.

A constrained tick's grammar work — each row's accept of the token it just sampled, then the next
step's bitmasks — took ~0.7 ms of a 1.5 ms tick at 64 rows on the H200's host (docs/benchmarks.md,
run a), as long as the loop thread's own Python; in one process the two share an interpreter lock,
and every arrangement of them over threads (runs v, z, e, g, h) lost to it. Here the matchers live in
a helper process. It reads each step's sampled tokens where the device copy lands them and writes
the next step's bitmasks where the upload reads them, in host memory both processes map
(device.SharedHost); it starts the moment the tokens land, while the loop thread launches the next
forward and runs the commit's text work; the loop thread posts which rows to accept and fill (two
messages a tick) and waits for a counter. Grammars compile on the helper's control thread: XGrammar
lets go of the interpreter lock inside a compile (a 16 ms one on the CPU machine left another thread
running throughout), so the job thread keeps filling meanwhile.

Job channel: from the loop thread only, taken in order by the helper's job thread:
  ("bind", row, mid)                   the matcher made at submit as `mid` now serves `row`
  ("free", row)                        the row's sequence was released
  ("accept", slot, indices, rows, job) wait for those landed tokens of `slot`, publish `job` as read; each
                                       row's matcher accepts its token
  ("fill", slot, indices, rows, job)   each row's next bitmask into `slot`'s (all allowed where its grammar
                                       has ended), then `job` published as filled
Control channel: from any thread, one request at a time:
  ("compile", option, text) -> ("ok", mid, stop ids) | ("error", message)   a pending matcher for a request
  ("discard", mid)                     a request never admitted lets go of its pending matcher (no answer)
  ("stats",) -> dict                   the cache and the live matchers (tests, metrics)

Invariants (tests/test_matcher_process.py):
  1. A step's masks are filled only after every accept posted before them (one channel, in order):
     masks from committed state, as in one process.
  2. An accept reads a row's token only once it has landed: the runner sets the rows to -1 before
     the copy (HostLanding.start), and no token id is negative; and before the landing buffer is
     written again (the slot's next landing, or the CPU stand-in's poison at release), the loop
     waits until the helper has read it (HostLanding.reader).
  3. A matcher lives from its compile to its row's free or its discard: none outlives its request.
  4. If the helper fails or dies, the loop's next wait raises with the reason: nothing hangs.
"""
from __future__ import annotations

import gc
import mmap
import os
import select
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ..runner import SIGNAL_WORDS

# the signals (ModelRunner.signals) this process publishes: the last fill job done, the last accept job
# whose landed tokens it has read, a failure
FILLED, READ, FAILED = 0, 1, 2
SPIN_SECONDS = 0.005  # the job thread polls this long for the next message before it sleeps in the kernel
WAIT_TIMEOUT = 60.0  # seconds the loop waits for a fill before it calls the helper stuck


class MatcherProcess:
    """The engine's side: starts the helper, compiles through it, posts the loop's jobs."""

    def __init__(self, shared: Any, signals: np.ndarray, layout: tuple[int, list[tuple[int, int]]], max_rows: int,
                 words: int, vocab: list[str], vocab_size: int, stop_ids: list[int], threads: int,
                 cache_size: int = 256) -> None:
        """`shared`: the runner's device.SharedHost, `signals` the runner's counters in it; `layout`: where
        those are in it, and each slot's landed tokens and bitmask (ModelRunner.shared_layout)."""
        jobs, their_jobs = socket.socketpair()
        control, their_control = socket.socketpair()
        package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")]))}
        fds = (shared.fd, their_jobs.fileno(), their_control.fileno())
        entry = "import sys; from slipstream.constrain.matcher_process import main; main(sys.argv[1:])"
        self.proc = subprocess.Popen([sys.executable, "-c", entry, *map(str, fds)], pass_fds=fds, env=env)
        their_jobs.close(), their_control.close()
        self.jobs, self.control = Connection(jobs.detach()), Connection(control.detach())
        self.signals = signals
        self.lock = threading.Lock()  # one control request at a time
        self.discarded: list[int] = []  # pending matchers to discard with the next control request
        self.posted = 0  # fill jobs posted
        self.accepts = 0  # accept jobs posted
        self.failure: str | None = None  # what the helper reported when it failed
        with self.lock:
            self.control.send((shared.nbytes, layout, max_rows, words, vocab, vocab_size, stop_ids, threads,
                               cache_size))
            self._answer()

    def compile(self, option: str, text: str) -> tuple[int, frozenset[int]]:
        """A pending matcher for one request (ValueError naming the option for a bad grammar)."""
        with self.lock:
            self._flush_discards()
            self._send(self.control, ("compile", option, text))
            answer = self._answer()
        if answer[0] == "error":
            raise ValueError(f"invalid {option}: {answer[1]}")
        return answer[1], frozenset(answer[2])

    def discard(self, mid: int) -> None:
        """Never waits (a collection may call it on the loop thread): while another request is in
        flight, the discard goes with the next one."""
        self.discarded.append(mid)
        if self.lock.acquire(blocking=False):
            try:
                self._flush_discards()
            finally:
                self.lock.release()

    def _flush_discards(self) -> None:
        try:
            while self.discarded:
                self.control.send(("discard", self.discarded.pop()))
        except OSError:  # (closed: the helper, and its matchers, are gone)
            self.discarded.clear()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            self._flush_discards()
            self._send(self.control, ("stats",))
            return self._answer()

    def _answer(self) -> Any:
        try:
            return self.control.recv()
        except (EOFError, OSError):
            raise self._exited() from None

    def _send(self, conn: Connection, message: tuple) -> None:
        try:
            conn.send(message)
        except OSError:
            raise self._exited() from None

    def _exited(self) -> RuntimeError:
        return RuntimeError(f"the matcher process exited (code {self.proc.wait()}); its error is above in stderr")

    # ---- the loop thread's jobs ------------------------------------------------------------------
    def post(self, message: tuple) -> None:
        self._send(self.jobs, message)

    def post_fill(self, slot: int, indices: list[int], rows: list[int]) -> int:
        self.posted += 1
        self.post(("fill", slot, indices, rows, self.posted))
        return self.posted

    def post_accept(self, slot: int, indices: list[int], rows: list[int]) -> int:
        self.accepts += 1
        self.post(("accept", slot, indices, rows, self.accepts))
        return self.accepts

    def wait_filled(self, job: int) -> None:
        """Until the helper has filled job `job`'s masks."""
        self._wait(FILLED, job)

    def wait_read(self, job: int) -> None:
        """Until the helper has read the tokens of accept job `job` (invariant 2)."""
        self._wait(READ, job)

    def _wait(self, signal: int, job: int) -> None:
        """Polls shared memory, letting go of the interpreter lock between looks (another thread may
        ship what the commit produced meanwhile)."""
        signals, spins, start = self.signals, 0, time.perf_counter()
        while signals[signal] < job:
            if signals[FAILED]:
                if self.failure is None:
                    self.failure = self.jobs.recv()
                raise RuntimeError(f"the matcher process failed: {self.failure}")
            spins += 1
            if spins % 4096 == 0:
                if self.proc.poll() is not None:
                    raise self._exited()
                if time.perf_counter() - start > WAIT_TIMEOUT:
                    raise RuntimeError(f"the matcher process has not done job {job} in {WAIT_TIMEOUT:.0f} s")
            time.sleep(0)

    def close(self) -> None:
        for conn in (self.jobs, self.control):
            conn.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def finalize_discard(owner: object, process: MatcherProcess, mid: int, bound: list[bool]) -> None:
    """When `owner` (a request's constraint) is collected without ever having been bound to a row,
    its pending matcher is discarded."""
    weakref.finalize(owner, lambda: bound[0] or process.discard(mid))


# ---- the helper process ---------------------------------------------------------------------------
class Helper:
    """The helper process's state: the shared memory mapped, XGrammar's compiler and its cache, the
    matchers pending (compiled at submit) and bound (by row); a control thread and a job thread."""

    def __init__(self, fd: int, start: tuple) -> None:
        import xgrammar as xgr

        from .grammar import tokenizer_info

        nbytes, (signals, slot_parts), max_rows, words, vocab, vocab_size, stop_ids, threads, cache_size = start
        self.map = mmap.mmap(fd, nbytes)
        self.signals = np.frombuffer(self.map, np.int64, SIGNAL_WORDS, signals)
        self.tokens = [np.frombuffer(self.map, np.int64, max_rows, t) for t, _ in slot_parts]
        self.masks = [np.frombuffer(self.map, np.int32, max_rows * words, m).reshape(max_rows, words)
                      for _, m in slot_parts]
        info = tokenizer_info(vocab, vocab_size, stop_ids)
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads)
        self.batch = xgr.BatchGrammarMatcher(threads)
        self.accept = xgr.BatchGrammarMatcher.batch_accept_token
        self.matcher = xgr.GrammarMatcher
        self.cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.cache_size = cache_size
        self.compiled = 0
        self.pending: dict[int, Any] = {}
        self.bound: dict[int, Any] = {}
        self.mids = 0

    def serve_control(self, control: Connection) -> None:
        from .grammar import compile_grammar, xgrammar_message

        while True:
            try:
                request = control.recv()
            except (EOFError, OSError):
                return
            if request[0] == "compile":
                key = request[1:]
                compiled = self.cache.get(key)
                try:
                    if compiled is None:
                        compiled = compile_grammar(self.compiler, *key)
                        self.compiled += 1
                except Exception as e:  # (XGrammar raises RuntimeError for a bad grammar)
                    control.send(("error", xgrammar_message(e)))
                    continue
                self.cache[key] = compiled
                self.cache.move_to_end(key)
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
                matcher = self.matcher(compiled)
                self.mids += 1
                self.pending[self.mids] = matcher
                control.send(("ok", self.mids, matcher.stop_token_ids))
            elif request[0] == "discard":
                self.pending.pop(request[1], None)
            elif request[0] == "stats":
                control.send({"cache": list(self.cache), "compiled": self.compiled, "pending": len(self.pending),
                              "bound": sorted(self.bound)})

    def serve_jobs(self, jobs: Connection) -> None:
        poller = select.poll()
        poller.register(jobs.fileno(), select.POLLIN)
        try:
            while True:
                message = self._next(jobs, poller)
                if message[0] == "bind":
                    self.bound[message[1]] = self.pending.pop(message[2])
                elif message[0] == "free":
                    del self.bound[message[1]]
                elif message[0] == "accept":
                    self._accept(*message[1:])
                else:
                    self._fill(*message[1:])
        except (EOFError, OSError):
            return
        except BaseException as e:  # a bug: the loop's next wait raises it
            jobs.send(f"{type(e).__name__}: {e}")
            self.signals[FAILED] = 1

    def _next(self, jobs: Connection, poller: select.poll) -> tuple:
        deadline = time.perf_counter() + SPIN_SECONDS
        while not poller.poll(0) and time.perf_counter() < deadline:
            pass
        return jobs.recv()

    def _accept(self, slot: int, indices: list[int], rows: list[int], job: int) -> None:
        tokens, at = self.tokens[slot], np.asarray(indices)
        while (tokens[at] < 0).any():  # (invariant 2: until the copy lands)
            pass
        landed = tokens[at].tolist()
        self.signals[READ] = job
        accepted = self.accept([self.bound[r] for r in rows], landed)
        if not all(accepted):
            bad = accepted.index(False)
            raise RuntimeError(f"token {landed[bad]} of row {rows[bad]} was sampled against its grammar mask")

    def _fill(self, slot: int, indices: list[int], rows: list[int], job: int) -> None:
        mask, live, at = self.masks[slot], [], []
        for i, r in zip(indices, rows):
            matcher = self.bound[r]
            if matcher.is_terminated():  # (a row whose grammar has ended is a zombie now: anything goes)
                mask[i] = -1
            else:
                live.append(matcher)
                at.append(i)
        if live:
            self.batch.batch_fill_next_token_bitmask(live, mask, at)
        self.signals[FILLED] = job


def main(argv: list[str]) -> None:
    fd, job_fd, control_fd = map(int, argv)
    jobs, control = Connection(job_fd), Connection(control_fd)
    helper = Helper(fd, control.recv())
    gc.collect()
    gc.freeze()  # (start-up's objects out of the collector's view: no long collection between a landing and a fill)
    control.send(("ready",))
    threading.Thread(target=helper.serve_jobs, args=(jobs,), daemon=True, name="matcher-jobs").start()
    helper.serve_control(control)


if __name__ == "__main__":
    main(sys.argv[1:])
