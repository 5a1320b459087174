"""The paged KV cache: device storage, and the host-side page pool that hands pages out.

A request's pages are allocated in full at admission (prompt + max_tokens + one zombie step), so
a running sequence never runs out and nothing is ever preempted. Page 0 is the scratch page:
padded rows of a batch write their KV there, and it is never handed to a sequence."""
from __future__ import annotations

import torch

SCRATCH_PAGE = 0


class OutOfPages(RuntimeError):
    pass


class PagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"the KV cache needs at least 2 pages (one is scratch), got {num_pages}")
        self.page_size = page_size
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, SCRATCH_PAGE, -1))
        self._allocated: set[int] = set()

    @property
    def total(self) -> int:
        """Pages that can be handed out (the scratch page excluded)."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} KV pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        self._allocated.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if p not in self._allocated:
                raise AssertionError(f"KV page {p} freed twice or never allocated")
            self._allocated.remove(p)
            self._free.append(p)


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
