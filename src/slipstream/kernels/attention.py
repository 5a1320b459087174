"""Attention over the paged KV cache: the step's inputs, the dispatch to the Triton kernels on CUDA,
and the plain-torch reference path (CPU, and shapes the kernels do not serve).

Pages are [num_pages, page_size, kv_heads, head_dim]; a token's KV lives at flat slot
page * page_size + offset, and `slot_mapping` gives that slot for every token of a step."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import HAS_TRITON


@dataclass
class AttentionInputs:
    """Where a step's tokens sit in the paged cache. A decode step has one token per row
    (`query_start` None); a packed step carries chunks of any length, one per sequence, packed one
    after the other (a decode row among them is a chunk of one token), each at the end of its
    sequence's context and attending to the keys its earlier chunks and steps wrote."""

    slot_mapping: torch.Tensor  # [T]: each token's KV slot, page * page_size + offset
    page_table: torch.Tensor  # [S, P]: each sequence's pages
    context_lens: torch.Tensor  # [S]: keys each sequence attends to, this step's tokens included
    query_start: torch.Tensor | None = None  # [S + 1] (packed): sequence s's tokens are [query_start[s], [s + 1])
    programs: torch.Tensor | None = None  # [PROGRAM_FIELDS, G] (packed): the Triton kernel's grid (plan_programs)
    decode_lens: torch.Tensor | None = None  # [R] (packed): contexts of the step's leading decode rows, then 0
    host_lens: list[tuple[int, int]] | None = None  # (tokens, context) per sequence, for the torch path
    block_len: int = 0  # > 0: sequences of this many tokens from position 0, each attending to all of
    # itself (Moondream's image prefix: bidirectional, no page table needed)

    @property
    def packed(self) -> bool:
        return self.query_start is not None


PACKED_BLOCK_M = 64  # the packed kernel's query rows (tokens x query heads of a GQA group) per program
KEY_BLOCK = 32  # keys per iteration of the packed kernel (64: 13-15% slower on the H200, run s)
MIN_SPLIT_BLOCKS = 8  # a tile's keys are split over programs only in runs of at least this many blocks
SPLIT_PARTIALS = 1024  # softmax partials (tiles x KV heads) one packed launch may leave for merging
PROGRAMS_PER_SM = 2  # tiles per SM the splits balance over (of none, 1, 2, 4: 2 the fastest on the H200, run m)
# a program's fields: sequence (-1: padding), first token, first and end key block it walks, its
# partial (-1: the tile is not split, the program writes the output), its tile's first partial and count
PROGRAM_FIELDS = 7


def tokens_per_program(group: int) -> int:
    """Tokens of one sequence a packed-attention program covers, for GQA groups of `group` heads."""
    return max(1, PACKED_BLOCK_M // (1 << (group - 1).bit_length()))


def split_capacity(kv_heads: int) -> int:
    """Split programs one packed launch may hold (each leaves a partial per KV head)."""
    return max(8, SPLIT_PARTIALS // kv_heads)


def num_programs(num_tokens: int, num_seqs: int, per_program: int, kv_heads: int) -> int:
    """An upper bound on the packed kernel's programs for `num_tokens` tokens (padding included) in at
    most `num_seqs` sequences, each of whose last tile may be partial, and the split programs: a CUDA
    graph's fixed grid."""
    return num_tokens // per_program + num_seqs + 1 + split_capacity(kv_heads)


def split_blocks(blocks: np.ndarray, parallel: int, capacity: int) -> int:
    """Key blocks per program when tiles walking `blocks` key blocks each are split: about an equal
    share of the step's blocks over the `parallel` programs the GPU runs at once (so the longest
    program is no longer than the balanced wave), at least MIN_SPLIT_BLOCKS, and coarser where the
    split programs would outnumber `capacity`."""
    per = max(MIN_SPLIT_BLOCKS, -(-int(blocks.sum()) // max(1, parallel)))
    while int((-(-blocks[blocks > per] // per)).sum()) > capacity:
        per = per * 3 // 2
    return per


def plan_programs(chunk_lens: np.ndarray, contexts: np.ndarray, per_program: int, num_tokens: int,
                  out: np.ndarray, parallel: int, capacity: int, decode_rows: int = 0) -> None:
    """Fill `out` [PROGRAM_FIELDS, G] with the packed kernel's programs for the step's chunks, which
    follow its `decode_rows` decode rows (one token each, served by the decode kernel: packed_step).
    A tile is `per_program` tokens of one chunk; it walks the key blocks up to its last token's
    position, and a tile walking more than `split_blocks` blocks is split into programs of that many,
    which leave softmax partials for the last of them to merge. Then padding programs (sequence -1,
    first token counted from the step's start) up to `num_tokens`, then (-1, -1), which exit at once.
    `parallel`: tiles the GPU runs at once (programs per KV head); `capacity`: split_capacity."""
    tiles = -(-chunk_lens // per_program)
    seq = decode_rows + np.repeat(np.arange(len(chunk_lens)), tiles)
    first = (np.arange(len(seq)) - np.repeat(np.cumsum(tiles) - tiles, tiles)) * per_program
    n, ctx = chunk_lens[seq - decode_rows], contexts[seq - decode_rows]
    blocks = -(-np.minimum(ctx, ctx - n + first + per_program) // KEY_BLOCK)
    per = split_blocks(blocks, parallel, capacity) if len(blocks) else 1
    splits = np.where(blocks > per, -(-blocks // per), 1)
    g = int(splits.sum())
    index = np.arange(g) - np.repeat(np.cumsum(splits) - splits, splits)  # each program's split of its tile
    split = np.repeat(splits > 1, splits)
    part = np.cumsum(split) - 1
    out[0, :g], out[1, :g] = np.repeat(seq, splits), np.repeat(first, splits)
    out[2, :g] = np.where(split, index * per, 0)
    out[3, :g] = np.where(split, np.minimum((index + 1) * per, np.repeat(blocks, splits)), np.repeat(blocks, splits))
    out[4, :g] = np.where(split, part, -1)
    out[5, :g] = np.where(split, part - index, -1)
    out[6, :g] = np.repeat(splits, splits)
    real = decode_rows + int(chunk_lens.sum())
    pad = -(-(num_tokens - real) // per_program)
    out[0, g:] = -1
    out[1, g:g + pad] = real + np.arange(pad) * per_program
    out[1, g + pad:] = -1
    out[2:, g:] = -1


def program_list(chunk_lens: np.ndarray, contexts: np.ndarray, num_tokens: int, heads: int, kv_heads: int,
                 parallel: int, decode_rows: int = 0) -> np.ndarray:
    """plan_programs for a model's heads into a new array of the grid's size (the runner plans into
    its slot's buffer)."""
    per_program = tokens_per_program(heads // kv_heads)
    out = np.zeros((PROGRAM_FIELDS, num_programs(num_tokens, decode_rows + len(chunk_lens), per_program, kv_heads)),
                   np.int64)
    plan_programs(chunk_lens, contexts, per_program, num_tokens, out, parallel, split_capacity(kv_heads), decode_rows)
    return out


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
    and out (into `out` when given). On CUDA a decode step runs all of it in one Triton kernel, a
    packed step in three (packed_attention.packed_step), and an image prefix's blocks rotate q and k
    in place and store K/V in three before SDPA (twelve torch launches a layer took 1.5 of the
    prefix's 4.8 ms on the H200, docs/benchmarks.md run a); everything else runs the torch path."""
    if attn.block_len:
        if q.is_cuda and triton_serves(True, q.shape[-1], pages[0].shape[1]):
            from .packed_attention import rotary_, store_kv

            q, k = (rotary_(x, rope.cos, rope.sin, rope.positions) for x in (q, k))
            store_kv(k, v, rope.cos[:, :0], rope.sin[:, :0], rope.positions, attn.slot_mapping, *pages)
        else:
            q, k = apply_rotary(q, *rope.rows), apply_rotary(k, *rope.rows)
            write_kv(*pages, k, v, attn.slot_mapping)
        o = block_attention(q, k, v, attn.block_len, scale)
        return o if out is None else out.copy_(o)
    if q.is_cuda and triton_serves(attn.packed, q.shape[-1], pages[0].shape[1]):
        if not attn.packed:
            from .paged_decode import paged_decode_attention

            return paged_decode_attention(q, *pages, attn.page_table, attn.context_lens, scale, out,
                                          new_token=(k, v, rope.cos, rope.sin, attn.slot_mapping))
        from .packed_attention import packed_step

        return packed_step(q, k, v, rope, attn, pages, scale, out)
    q, k = apply_rotary(q, *rope.rows), apply_rotary(k, *rope.rows)
    write_kv(*pages, k, v, attn.slot_mapping)
    if attn.packed:
        o = packed_attention_reference(q, *pages, attn.page_table, attn.host_lens, scale)
    else:
        o = decode_attention(q, *pages, attn.page_table, attn.context_lens, scale)
    return o if out is None else out.copy_(o)


def triton_serves(packed: bool, head_dim: int, page_size: int) -> bool:
    """The Triton kernels serve CUDA steps where their tile shapes fit (else the reference, which a
    packed step runs from host lengths: such steps cannot be captured in a graph)."""
    if not HAS_TRITON:
        return False
    if packed:
        from .packed_attention import supported
    else:
        from .paged_decode import supported
    return supported(head_dim, page_size)


def write_kv(k_pages: torch.Tensor, v_pages: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V ([tokens, kv_heads, head_dim]) at their slots."""
    k_pages.view(-1, *k_pages.shape[2:]).index_copy_(0, slot_mapping, k)
    v_pages.view(-1, *v_pages.shape[2:]).index_copy_(0, slot_mapping, v)


def packed_attention_reference(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                               page_table: torch.Tensor, host_lens: list[tuple[int, int]], scale: float
                               ) -> torch.Tensor:
    """kernels.packed_attention's contract in torch, with q rotated and the step's KV already in the
    pages: q [T, H, D]; sequence s has host_lens[s] = (n, context): its n tokens are the last n
    positions of its context, each attending to the keys at positions up to its own. Tokens after
    the last sequence's (a step's padding) get zeros."""
    out, start = torch.zeros_like(q), 0
    page = k_pages.shape[1]
    for s, (n, ctx) in enumerate(host_lens):
        pages = page_table[s, : -(-ctx // page)]
        k, v = (x[pages].flatten(0, 1)[:ctx].transpose(0, 1) for x in (k_pages, v_pages))
        qs = q[start:start + n].transpose(0, 1)
        causal = torch.arange(ctx, device=q.device)[None, :] <= torch.arange(ctx - n, ctx, device=q.device)[:, None]
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=causal, scale=scale, enable_gqa=k.shape[0] != q.shape[1])
        out[start:start + n] = o.transpose(0, 1)
        start += n
    return out


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_len: int, scale: float) -> torch.Tensor:
    """Blocks of `block_len` tokens, each token attending to every token of its block (no mask):
    q [T, H, D], k and v [T, KVH, D], T a multiple of block_len."""
    def blocks(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1, block_len, *x.shape[1:]).transpose(1, 2)

    o = F.scaled_dot_product_attention(blocks(q), blocks(k), blocks(v), scale=scale,
                                       enable_gqa=k.shape[1] != q.shape[1])
    return o.transpose(1, 2).reshape(q.shape)


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
