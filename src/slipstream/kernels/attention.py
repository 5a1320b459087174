"""Attention over the paged KV cache in plain torch (the reference path; CPU and GPU).

Pages are [num_pages, page_size, kv_heads, head_dim]; a token's KV lives at flat slot
page * page_size + offset, and `slot_mapping` gives that slot for every token of a step."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import HAS_TRITON


@dataclass
class AttentionInputs:
    """Where a step's tokens sit in the paged cache. Prefill steps pack whole prompts
    (`seq_lens`, host ints); decode steps have one token per row (`page_table`, `context_lens`)."""

    is_prefill: bool
    slot_mapping: torch.Tensor
    seq_lens: list[int] | None = None
    page_table: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None


@dataclass
class Rope:
    """A step's rotary embedding: the model's cos/sin tables [max_len, rotary_dim] (fp32) and the
    tokens' positions. The torch path gathers the positions' rows once (`rows`, in the model's
    dtype); the Triton decode kernel reads each row's entry itself at the last position of its
    context, so a decode step launches no gather."""

    cos: torch.Tensor
    sin: torch.Tensor
    positions: torch.Tensor
    dtype: torch.dtype

    @functools.cached_property
    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [tokens, 1, rotary_dim] in the model's dtype."""
        return (self.cos[self.positions][:, None, :].to(self.dtype),
                self.sin[self.positions][:, None, :].to(self.dtype))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim]; rotates the first cos.shape[-1] features (rotate-half layout)."""
    dim = cos.shape[-1]
    rot = x[..., :dim]
    x1, x2 = rot.chunk(2, dim=-1)
    rot = rot * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([rot, x[..., dim:]], dim=-1) if dim < x.shape[-1] else rot


def rotary_paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: Rope, attn: AttentionInputs,
                           pages: tuple[torch.Tensor, torch.Tensor], scale: float,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary on q and k, the KV write into the pages, then attention: [tokens, heads, head_dim] in
    and out (into `out` when given). CUDA decode steps run all of it in one Triton kernel; everything
    else the torch path."""
    if not attn.is_prefill and q.is_cuda and _triton_decode(q.shape[-1], pages[0].shape[1]):
        from .paged_decode import paged_decode_attention

        return paged_decode_attention(q, *pages, attn.page_table, attn.context_lens, scale, out,
                                      new_token=(k, v, rope.cos, rope.sin, attn.slot_mapping))
    q, k = apply_rotary(q, *rope.rows), apply_rotary(k, *rope.rows)
    write_kv(*pages, k, v, attn.slot_mapping)
    if attn.is_prefill:
        o = prefill_attention(q, k, v, attn.seq_lens, scale)
    else:
        o = decode_attention(q, *pages, attn.page_table, attn.context_lens, scale)
    return o if out is None else out.copy_(o)


def _triton_decode(head_dim: int, page_size: int) -> bool:
    """The Triton kernels serve CUDA decode steps where their tile shapes fit (else the reference)."""
    if not HAS_TRITON:
        return False
    from .paged_decode import supported

    return supported(head_dim, page_size)


def write_kv(k_pages: torch.Tensor, v_pages: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V ([tokens, kv_heads, head_dim]) at their slots."""
    k_pages.view(-1, *k_pages.shape[2:]).index_copy_(0, slot_mapping, k)
    v_pages.view(-1, *v_pages.shape[2:]).index_copy_(0, slot_mapping, v)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int],
                      scale: float) -> torch.Tensor:
    """Causal attention of packed prompts over themselves. q [T, H, D], k/v [T, KVH, D];
    `seq_lens` (host ints) splits the T tokens into sequences. Consecutive prompts of equal length
    go through one batched call (views, no copies), so a burst of same-length prompts costs one
    launch per layer rather than one per prompt."""
    outs = []
    start, i = 0, 0
    while i < len(seq_lens):
        n, j = seq_lens[i], i
        while j < len(seq_lens) and seq_lens[j] == n:
            j += 1
        end = start + n * (j - i)
        qs, ks, vs = (x[start:end].view(j - i, n, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                           enable_gqa=qs.shape[1] != ks.shape[1])
        outs.append(o.transpose(1, 2).reshape(end - start, *q.shape[1:]))
        start, i = end, j
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                     context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per row over that row's pages. q [B, H, D]; page_table [B, P]; context_lens [B]
    counts the keys each row attends to (its own new token included)."""
    b, h, d = q.shape
    kvh = k_pages.shape[2]
    k = k_pages[page_table].reshape(b, -1, kvh, d)
    v = v_pages[page_table].reshape(b, -1, kvh, d)
    qg = q.view(b, kvh, h // kvh, d).float()
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k.float()) * scale
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < context_lens[:, None]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgl,blkd->bkgd", scores.softmax(dim=-1), v.float())
    return out.reshape(b, h, d).to(q.dtype)
