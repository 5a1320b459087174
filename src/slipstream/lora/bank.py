"""The engine's LoRA slots: per layer and fused projection, stacks A [slots + 1, capacity x rank, K]
and B [slots + 1, N, capacity x rank] on the device (slot 0 is no adapter), the packed rank of each
slot, and which adapter each slot holds.

Adapters are loaded by name (read, checked and packed on the caller's thread) and kept on the host;
a request names one and holds its slot from submit to release (`acquire` / `release`). An adapter
not in a slot is copied into one when a request needs it — on a stream of its own, into a slot that
no sequence holds (so no step in flight or queued reads it: a slot's last reader was a sequence's
step, committed before its release) — evicting the least recently idle adapter. When every slot
serves running requests, the request waits on the host (`wait`), as vLLM's scheduler holds back a
request whose adapter finds no slot, instead of being refused: the bank's loader thread copies its
adapter in once a slot falls idle and hands the request its slot, in the order requests came, so
no copy ever runs on the loop thread. The step's rows carry their slots on the device (`rows`), so
captured graphs serve any mix."""
from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict, deque
from pathlib import Path
from typing import Callable

import torch

from ..kernels.lora import LoraDelta, LoraWeights
from .adapter import PackedAdapter, read_adapter


class LayerLora:
    """One layer's stacks and the step's slot per token: what the layer's projections add. A norm
    before a projection may compute the projection's shrink itself (`shrunk`, kernels.norm.
    rms_norm_shrink): the projection then gets that LoraDelta and only expands."""

    def __init__(self, stacks: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], slots: torch.Tensor) -> None:
        self.stacks, self.slots = stacks, slots
        self.shrunk: dict[str, LoraDelta] = {}

    def __getitem__(self, target: str) -> LoraWeights | LoraDelta:
        """The `lora` argument of `kernels.linear` for one of the layer's projections."""
        return self.shrunk.get(target) or LoraWeights(*self.stacks[target], self.slots)


class LoraRows:
    def __init__(self, bank: "LoraBank", slots: torch.Tensor) -> None:
        self.bank, self.slots = bank, slots

    def layer(self, i: int) -> LayerLora:
        return LayerLora(self.bank.stacks[i], self.slots)


class LoraBank:
    def __init__(self, layers, max_loras: int, max_rank: int, dtype: torch.dtype, device: torch.device) -> None:
        """`layers`: the model's decoder layers (each says its `lora_targets`)."""
        if max_loras < 1 or max_rank < 1:
            raise ValueError(f"max_loras and max_lora_rank must be >= 1, got {max_loras} and {max_rank}")
        self.max_loras, self.max_rank, self.dtype, self.device = max_loras, max_rank, dtype, device
        self.targets = [layer.lora_targets() for layer in layers]
        n = max_loras + 1
        self.stacks = [{name: (torch.zeros(n, t.capacity * max_rank, t.in_features, dtype=dtype, device=device),
                               torch.zeros(n, t.out_features, t.capacity * max_rank, dtype=dtype, device=device),
                               torch.zeros(n, dtype=torch.int32, device=device))
                        for name, t in targets.items()} for targets in self.targets]
        self._adapters: dict[str, PackedAdapter] = {}
        self._uids: dict[str, bytes] = {}
        self._ids = itertools.count(1)
        self._slot_of: dict[str, int] = {}
        self._holder: list[str | None] = [None] * n
        self._refs = [0] * n
        self._idle: OrderedDict[int, None] = OrderedDict()  # slots holding an adapter nobody uses, oldest first
        self._loading: set[str] = set()
        self._waiters: deque[tuple[int, str, Callable[[int], None]]] = deque()  # (key, adapter, granted), in order
        self._loader: threading.Thread | None = None  # serves the waiters (started by the first)
        self._closed = False
        self._cv = threading.Condition()
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def names(self) -> list[str]:
        with self._cv:
            return list(self._adapters)

    def load(self, name: str, path: str | Path) -> None:
        """Read, check and pack the adapter, then copy it into a slot if one is free or idle."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a LoRA adapter needs a non-empty name, got {name!r}")
        adapter = read_adapter(name, path, self.targets, self.max_rank, self.dtype)
        with self._cv:
            if name in self._adapters:
                raise ValueError(f"a LoRA adapter named {name!r} is loaded already; unload_lora({name!r}) first")
            self._adapters[name] = adapter
            self._uids[name] = f"{name}#{next(self._ids)}".encode()
        try:
            slot, _ = self.acquire(name)
            self.release(slot)
        except ValueError:
            pass  # (every slot serves running requests: it is copied in when a request needs it)

    def unload(self, name: str) -> None:
        with self._cv:
            if name not in self._adapters:
                raise ValueError(f"no LoRA adapter named {name!r} is loaded")
            slot = self._slot_of.get(name)
            if (slot is not None and (self._refs[slot] or name in self._loading)) or \
                    any(w[1] == name for w in self._waiters):
                raise ValueError(f"LoRA adapter {name!r} serves requests still running; unload it once they end")
            if slot is not None:
                del self._slot_of[name]
                self._holder[slot] = None
                self._idle.pop(slot, None)
                self._cv.notify_all()  # (a free slot for a waiting request)
            del self._adapters[name], self._uids[name]

    def acquire(self, name: str, wait: bool = False) -> tuple[int, bytes]:
        """The slot holding `name` (copied in first where it is not), held once more, and the
        adapter's id (what the prefix cache keys its KV by). Where no slot can be had now — every
        one serves running requests, or requests already wait for one — the slot is 0 with `wait`
        (the caller then `wait`s for one), and a ValueError without."""
        with self._cv:
            if name not in self._adapters:
                loaded = ", ".join(self._adapters) or "none"
                raise ValueError(f"no LoRA adapter named {name!r} is loaded (loaded: {loaded}); load_lora it first")
            while name in self._loading:
                self._cv.wait()
            uid = self._uids[name]
            queued = self._waiters and name not in self._slot_of  # (a copy-in waits its turn behind them)
            claim = None if queued else self._claim(name)
            if claim is None:
                if wait:
                    return 0, uid
                raise ValueError(f"all {self.max_loras} LoRA slots hold adapters of running requests; retry when "
                                 f"one ends, or build the engine with more (max_loras)")
            adapter = self._adapters[name]
        slot, copy = claim
        if copy:
            self._fill(name, adapter, slot)
        return slot, uid

    def wait(self, key: int, name: str, granted: Callable[[int], None]) -> None:
        """Queue a request (`key`) for a slot holding `name`, for which `acquire(name, wait=True)`
        gave 0: once one can be had, the loader thread holds it for the request (copying the
        adapter in first where needed) and calls `granted(slot)`; requests are served in the order
        they came, but one whose adapter is already in a slot is not held back behind a copy-in."""
        with self._cv:
            if self._closed:
                raise RuntimeError("the LoRA bank is closed")
            self._waiters.append((key, name, granted))
            if self._loader is None:
                self._loader = threading.Thread(target=self._serve_waiters, name="slipstream-lora", daemon=True)
                self._loader.start()
            self._cv.notify_all()

    def cancel(self, key: int) -> bool:
        """Take a waiting request out of the queue; False if it is not waiting (granted already)."""
        with self._cv:
            for i, waiter in enumerate(self._waiters):
                if waiter[0] == key:
                    del self._waiters[i]
                    return True
        return False

    def waiting(self) -> int:
        with self._cv:
            return len(self._waiters)

    def release(self, slot: int) -> None:
        """A sequence that held the slot is done (on the loop thread)."""
        with self._cv:
            self._refs[slot] -= 1
            if self._refs[slot] == 0:
                self._idle[slot] = None
                if self._waiters:
                    self._cv.notify_all()

    def close(self) -> None:
        """Stop the loader thread; requests still waiting are dropped (the engine fails them)."""
        with self._cv:
            self._closed = True
            self._waiters.clear()
            self._cv.notify_all()
        if self._loader is not None and self._loader is not threading.current_thread():
            self._loader.join()

    def _claim(self, name: str) -> tuple[int, bool] | None:
        """Under the lock: the slot for `name`, held once more, and whether the adapter must be copied
        into it (a free slot, else the least recently idle one); None when every slot is held."""
        slot = self._slot_of.get(name)
        if slot is not None:
            self._refs[slot] += 1
            self._idle.pop(slot, None)
            return slot, False
        free = next((s for s in range(1, self.max_loras + 1) if self._holder[s] is None), None)
        if free is None:
            if not self._idle:
                return None
            free, _ = self._idle.popitem(last=False)
            del self._slot_of[self._holder[free]]
        self._holder[free], self._slot_of[name], self._refs[free] = name, free, 1
        self._loading.add(name)
        return free, True

    def _fill(self, name: str, adapter: PackedAdapter, slot: int) -> None:
        try:
            self._copy(adapter, slot)
        finally:
            with self._cv:
                self._loading.discard(name)
                self._cv.notify_all()

    def _next_waiter(self) -> tuple[str, Callable[[int], None], tuple[int, bool]] | None:
        """Under the lock: the first waiter that can be served now (its adapter, its callback), its
        slot claimed."""
        can_copy = any(h is None for h in self._holder[1:]) or bool(self._idle)
        for i, (_, name, granted) in enumerate(self._waiters):
            if name in self._loading:
                continue
            if name in self._slot_of or can_copy:
                del self._waiters[i]
                return name, granted, self._claim(name)
        return None

    def _serve_waiters(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (served := self._next_waiter()) is None:
                    self._cv.wait()
                if self._closed:
                    return
                name, granted, (slot, copy) = served
                adapter = self._adapters[name]
            if copy:
                self._fill(name, adapter, slot)
            granted(slot)

    def held(self, slot: int) -> int:
        with self._cv:
            return self._refs[slot]

    def rows(self, slots: torch.Tensor) -> LoraRows:
        return LoraRows(self, slots)

    def _copy(self, adapter: PackedAdapter, slot: int) -> None:
        """The adapter into the slot's rows of every stack (projections it leaves out: rank 0)."""
        context = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with context:
            for i, layer in enumerate(self.stacks):
                for name, (a, b, r) in layer.items():
                    packed = adapter.weights.get((i, name))
                    if packed is not None:  # (zero past its rank: packed so)
                        a[slot].copy_(packed[0])
                        b[slot].copy_(packed[1])
                        r[slot].fill_(packed[2])
                    else:  # (the decode kernels read a slot's whole width, whatever its rank: kernels.lora.lora_b)
                        a[slot].zero_()
                        b[slot].zero_()
                        r[slot].fill_(0)
        if self._stream is not None:
            self._stream.synchronize()
