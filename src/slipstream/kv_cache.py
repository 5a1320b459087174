"""The paged KV cache: device storage, and the host-side page pool that hands pages out.

A request's pages are allocated in full at admission (prompt + max_tokens + one zombie step), so
a running sequence never runs out and nothing is ever preempted. Page 0 is the scratch page:
padded rows of a batch write their KV there, and it is never handed to a sequence.

Pages are held by reference count. With prefix caching, a full page whose KV is written is
registered under its key — a chained hash of every token up to its end (`chain_keys`) — and a later
request whose prompt starts the same way holds the same pages instead of prefilling them again. A
page nobody holds is free; a registered one stays readable in LRU order until an allocation needs
it, which evicts the least recently released first. A page that a sequence, a zombie or an image
prefix holds — and so every page an in-flight step reads or writes — is never evicted."""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch

SCRATCH_PAGE = 0


class OutOfPages(RuntimeError):
    pass


def chain_keys(tokens: Sequence[int], page_size: int, salt: bytes = b"", extra: bytes = b"",
              extra_until: int = 0, keys: list[bytes] | None = None) -> list[bytes]:
    """Keys of the full pages of `tokens`: page i's is a hash of page i-1's key and its own tokens,
    so equal keys mean equal tokens from the start. `salt` roots the chain (what else the KV
    depends on); `extra` is mixed into every page that overlaps positions [0, extra_until) (an
    image's digest over its prefix, whose token ids are placeholders). `keys`: ones already known
    for the first pages, extended."""
    keys = list(keys or ())
    parent = keys[-1] if keys else hashlib.blake2b(b"slipstream" + salt, digest_size=16).digest()
    ids = np.asarray(tokens, dtype=np.int64)
    for i in range(len(keys), len(ids) // page_size):
        h = hashlib.blake2b(parent, digest_size=16)
        if i * page_size < extra_until:
            h.update(extra)
        h.update(ids[i * page_size:(i + 1) * page_size].tobytes())
        parent = h.digest()
        keys.append(parent)
    return keys


class PagePool:
    def __init__(self, num_pages: int, page_size: int, caching: bool = False) -> None:
        if num_pages < 2:
            raise ValueError(f"the KV cache needs at least 2 pages (one is scratch), got {num_pages}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.caching = caching
        self._free = list(range(num_pages - 1, SCRATCH_PAGE, -1))
        self._refs: dict[int, int] = {}  # held pages -> holders
        self._index: dict[bytes, int] = {}  # key -> registered page
        self._keys: dict[int, bytes] = {}  # registered page -> key
        self._unheld: OrderedDict[int, None] = OrderedDict()  # registered pages nobody holds, oldest first

    @property
    def total(self) -> int:
        """Pages that can be handed out (the scratch page excluded)."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        """Pages an allocation can take: free ones, and cached ones nobody holds."""
        return len(self._free) + len(self._unheld)

    @property
    def num_cached(self) -> int:
        return len(self._keys)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def allocate(self, n: int) -> list[int]:
        """`n` pages held once each: free ones first, then the least recently released cached ones
        (their keys dropped)."""
        if n > self.num_free:
            raise OutOfPages(f"asked for {n} KV pages, {self.num_free} free")
        pages = []
        for _ in range(n):
            if self._free:
                page = self._free.pop()
            else:
                page, _ = self._unheld.popitem(last=False)
                del self._index[self._keys.pop(page)]
            self._refs[page] = 1
            pages.append(page)
        return pages

    def hold(self, pages: list[int]) -> None:
        """Hold pages once more (cached pages found by `lookup` among them)."""
        for p in pages:
            if p in self._refs:
                self._refs[p] += 1
            elif p in self._unheld:
                del self._unheld[p]
                self._refs[p] = 1
            else:
                raise AssertionError(f"KV page {p} is neither held nor cached")

    def release(self, pages: list[int]) -> None:
        """Let go of pages once each; one nobody holds is free, or cached (the last released is the
        last evicted, so release a sequence's pages back to front: its deepest pages go first)."""
        for p in pages:
            refs = self._refs.get(p)
            if refs is None:
                raise AssertionError(f"KV page {p} released more often than held")
            if refs > 1:
                self._refs[p] = refs - 1
                continue
            del self._refs[p]
            if p in self._keys:
                self._unheld[p] = None
            else:
                self._free.append(p)

    def register(self, page: int, key: bytes) -> None:
        """The page's KV is written (or queued on the compute stream, which orders every later
        read after it): later lookups of `key` find it. A key already registered keeps its page."""
        if self.caching and key not in self._index and page not in self._keys:
            self._index[key] = page
            self._keys[page] = key

    def lookup(self, keys: list[bytes]) -> list[int]:
        """The registered pages of the longest run of `keys` from the first (not yet held)."""
        pages = []
        for key in keys:
            page = self._index.get(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def held(self, page: int) -> bool:
        return page in self._refs

    def unheld(self, pages: list[int]) -> int:
        """How many of `pages` nobody holds (they count in num_free until held)."""
        return sum(1 for p in pages if p in self._unheld)


class KVCache:
    """Per-layer K and V pages: tensor [layers, 2, num_pages, page_size, kv_heads, head_dim]."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.page_size = page_size
        self.data = torch.zeros(num_layers, 2, num_pages, page_size, num_kv_heads, head_dim, dtype=dtype,
                                device=device)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, 0], self.data[i, 1]

    @staticmethod
    def bytes_per_page(num_layers: int, page_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
        return num_layers * 2 * page_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
