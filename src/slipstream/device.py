"""The device layer: a compute stream, a copy stream, events and pinned host buffers on CUDA, and
a CPU stand-in with the same interface that makes ordering bugs visible instead of hiding them.

The stand-in lands a device-to-host copy in its host buffer only when the copy is waited on, and
poisons a landing buffer when its slot is released: code that reads a landing buffer before
waiting, or after release, reads POISON."""
from __future__ import annotations

import ctypes
import mmap
import os
import time
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

POISON = -(2**62)


class HostLanding:
    """A pinned host buffer that receives one device-to-host copy per step."""

    def __init__(self, layer: "DeviceLayer", shape: tuple[int, ...], dtype: torch.dtype,
                 shared: "SharedHost | None" = None) -> None:
        self.layer = layer
        self.host = shared.take(shape, dtype) if shared is not None else layer.pinned(shape, dtype)
        self._host_np = self.host.numpy()
        self._done = layer.event()
        self._pending: torch.Tensor | None = None
        self._n = 0
        self.reader: Callable[[], None] | None = None  # waits until another process has read what landed
        self.poison()

    def start(self, src: torch.Tensor, after: object, unlanded: bool = False) -> None:
        """Copy `src` into the first rows of the host buffer once `after` (an event on the compute
        stream, recorded when `src` was written) has passed, on the copy stream. `unlanded` first
        sets those rows to -1, which no token id is: another process that reads them (the matcher
        process) sees when the copy has landed."""
        self._n = src.shape[0]
        self._wait_for_reader()
        if unlanded:
            self._host_np[: self._n] = -1
        if self.layer.is_cuda:
            with self.layer.on(self.layer.copy_stream):
                self.layer.copy_stream.wait_event(after)
                self.host[: self._n].copy_(src, non_blocking=True)
                self._done.record(self.layer.copy_stream)
        else:
            self._pending = src.clone()

    def wait(self) -> torch.Tensor:
        """Block until the copy has landed; returns the landed rows."""
        if self.layer.is_cuda:
            self._done.synchronize()
        elif self._pending is not None:
            self.host[: self._n].copy_(self._pending)
            self._pending = None
        return self.host[: self._n]

    def poison(self) -> None:
        if not self.layer.is_cuda:
            self._wait_for_reader()
            self.host.fill_(POISON)

    def _wait_for_reader(self) -> None:
        """Before the buffer is written again: another process reading the last landing has read it."""
        if self.reader is not None:
            reader, self.reader = self.reader, None
            reader()


class SharedHost:
    """Host memory that another process maps too (an anonymous memfd, handed over by descriptor),
    pinned for the device's copies: the slots' landed tokens and bitmasks live here, so the matcher
    process (constrain/matcher_process.py) reads the one and writes the other with no copy between
    processes. Tensors are carved from it in order (`take`), each at a 64-byte boundary."""

    def __init__(self, layer: "DeviceLayer", nbytes: int) -> None:
        nbytes = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        self.fd = os.memfd_create("slipstream-host")
        os.ftruncate(self.fd, nbytes)
        self.buffer = mmap.mmap(self.fd, nbytes)
        self.nbytes, self.used = nbytes, 0
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))
        if layer.is_cuda:
            cudart = torch.cuda.cudart()
            status = cudart.cudaHostRegister(self.address, nbytes, 0)
            if int(status) != 0:
                raise RuntimeError(f"cudaHostRegister of {nbytes} bytes of shared host memory failed: {status}")
            # unregistered before the mapping goes (a later mapping at the same address must not find it pinned)
            weakref.finalize(self, cudart.cudaHostUnregister, self.address)

    def offset(self, part: torch.Tensor | np.ndarray) -> int:
        """Where `part` (taken from here, or a numpy view of it) starts in the block."""
        return (part.data_ptr() if isinstance(part, torch.Tensor) else part.ctypes.data) - self.address

    @staticmethod
    def size(parts: list[tuple[tuple[int, ...], torch.dtype]]) -> int:
        """Bytes that `take` needs for these (shape, dtype) parts, taken in any order."""
        return sum(-(-int(np.prod(shape)) * dtype.itemsize // 64) * 64 for shape, dtype in parts)

    def take(self, shape: tuple[int, ...] | int, dtype: torch.dtype) -> torch.Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        offset = -(-self.used // 64) * 64
        count = int(np.prod(shape))
        self.used = offset + count * dtype.itemsize
        if self.used > self.nbytes:
            raise ValueError(f"shared host memory of {self.nbytes} bytes is full")
        return torch.frombuffer(self.buffer, dtype=dtype, count=count, offset=offset).view(shape)


class _HostStamp:
    time = 0.0


class DeviceLayer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            self.compute_stream = torch.cuda.Stream(device)
            self.copy_stream = torch.cuda.Stream(device)
            self.upload_stream = torch.cuda.Stream(device)

    def enter_loop_thread(self) -> None:
        """Make the compute stream current for the calling (loop) thread, once everything start-up
        queued on other streams (weights, zeroed buffers) has finished: the loop never waits on them."""
        if self.is_cuda:
            torch.cuda.set_device(self.device)
            torch.cuda.synchronize(self.device)
            torch.cuda.set_stream(self.compute_stream)

    @contextmanager
    def on(self, stream: torch.cuda.Stream) -> Iterator[None]:
        """Queue work on `stream`, then on the compute stream again (the loop thread's current stream:
        torch.cuda.stream() would look the current stream up first, a cost a tick pays per copy)."""
        torch.cuda.set_stream(stream)
        try:
            yield
        finally:
            torch.cuda.set_stream(self.compute_stream)

    def pinned(self, shape: tuple[int, ...] | int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, pin_memory=self.is_cuda)

    def event(self) -> object:
        return torch.cuda.Event() if self.is_cuda else None

    def timing_event(self) -> object:
        """An event that stamps the time it passes: a timing CUDA event, or on the CPU a host stamp."""
        return torch.cuda.Event(enable_timing=True) if self.is_cuda else _HostStamp()

    def record_timing(self, event: object) -> None:
        if self.is_cuda:
            event.record(self.compute_stream)
        else:
            event.time = time.perf_counter()

    def elapsed_ms(self, start: object, end: object) -> float:
        """Milliseconds between two timing events that have both passed (a CUDA event not yet
        passed raises rather than waits)."""
        return start.elapsed_time(end) if self.is_cuda else (end.time - start.time) * 1e3

    def record(self, event: object) -> None:
        """Record `event` on the compute stream."""
        if self.is_cuda:
            event.record(self.compute_stream)

    def upload(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Host-to-device copy from a pinned staging buffer, ordered on the compute stream."""
        dst.copy_(src, non_blocking=True)

    def upload_ahead(self, dst: torch.Tensor, src: torch.Tensor, done: object) -> None:
        """Host-to-device copy from a pinned staging buffer on the upload stream, so it runs while
        the compute stream is still busy with the step before; the compute stream waits for it
        (`done`, an event) before anything queued after this call. The caller guarantees that no
        queued work still reads `dst` (a slot's buffers are restaged only after its last commit)."""
        if not self.is_cuda:
            dst.copy_(src)
            return
        with self.on(self.upload_stream):
            dst.copy_(src, non_blocking=True)
            done.record(self.upload_stream)
        self.compute_stream.wait_event(done)

    def landing(self, shape: tuple[int, ...], dtype: torch.dtype, shared: SharedHost | None = None) -> HostLanding:
        return HostLanding(self, shape, dtype, shared)
