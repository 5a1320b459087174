"""Triton: attention of a packed step — chunks of any length from any number of sequences (a
decode row is a chunk of one token) in one launch per layer, over the paged KV cache.

A step's tokens are packed sequence after sequence (`query_start`). Each sequence's chunk sits at
the end of its context (`context_lens`, this step's tokens included): its token t is at position
context - chunk + t and attends causally to every key up to that position, the earlier ones read
from the pages its earlier chunks (or steps) wrote. Before the attention, `store_kv` rotates the
step's k and writes k and v into their slots (one launch); the attention kernel rotates q as it
loads it, so neither q nor k needs a rotary pass of its own. Each block's page-table entries are
loaded a block ahead, so no K/V load waits on one.

The grid is a list of programs built on the host (attention.plan_programs), each covering a tile
of BLOCK_Q tokens of one sequence for one KV head; a tile holds those tokens' query heads of the
GQA group (BLOCK_Q x GROUP_PAD rows), so GQA reads each K/V block once for the group. A tile walks
the keys up to its last token's position one block after another, so a long chunk's last tile
walks its whole context while short tiles are long done; the planner splits a long tile's keys over
several programs, as the decode kernel splits long contexts: each leaves a softmax partial and the
last to arrive merges them (paged_decode._arrive). An MHA model's decode rows (chunks of one token)
would each fill one row of a 64-row tile, so `packed_step` gives them to the decode kernel; a GQA
group's fill a tile's group rows and stay here. Programs past the end of the list exit, and padding
programs (sequence -1) zero their tokens' output: a step padded to a CUDA-graph bucket replays one
fixed grid whatever its composition, and padding rows carry zeros, not stale memory, into the next
GEMM."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRET, arrival_counters, pdl_args
from .attention import KEY_BLOCK, AttentionInputs, Rope, split_capacity, tokens_per_program
from .paged_decode import _arrive, _load_q, _rope, paged_decode_attention


@triton.jit
def _store_kv_kernel(k_new_ptr, v_new_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, positions_ptr, slot_ptr, KVH,
                     stride_kt, stride_knh, stride_vt, stride_vnh, stride_ct, stride_kp, stride_ks, stride_kh,
                     KVH_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, ROT: tl.constexpr,
                     PDL: tl.constexpr):
    """One token's K (rotated over its first ROT features at its position) and V into its slot."""
    t = tl.program_id(0)
    h = tl.arange(0, KVH_PAD)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    live = h < KVH
    if PDL:
        tl.extra.cuda.gdc_wait()
    slot = tl.load(slot_ptr + t).to(tl.int64)
    k_src = k_new_ptr + t * stride_kt + h * stride_knh
    if ROT > 0:
        k = _rope(k_src, d, live, cos_ptr, sin_ptr, tl.load(positions_ptr + t), stride_ct, ROT)
    else:
        k = tl.load(k_src + d, mask=live, other=0.0)
    v = tl.load(v_new_ptr + t * stride_vt + h * stride_vnh + d, mask=live, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    dst = (slot // PAGE) * stride_kp + (slot % PAGE) * stride_ks + h * stride_kh + d
    tl.store(k_ptr + dst, k.to(k_ptr.dtype.element_ty), mask=live)
    tl.store(v_ptr + dst, v.to(v_ptr.dtype.element_ty), mask=live)


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, positions_ptr, H, stride_t, stride_h, stride_ct, H_PAD: tl.constexpr,
                   HEAD_DIM: tl.constexpr, ROT: tl.constexpr):
    """One token's heads rotated over their first ROT features at its position, in place."""
    t = tl.program_id(0)
    h = tl.arange(0, H_PAD)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    live = h < H
    heads = x_ptr + t * stride_t + h * stride_h
    x = _rope(heads, d, live, cos_ptr, sin_ptr, tl.load(positions_ptr + t), stride_ct, ROT)
    tl.store(heads + d, x.to(x_ptr.dtype.element_ty), mask=live)


@triton.jit
def _packed_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, context_lens_ptr, query_start_ptr,
                             programs_ptr, cos_ptr, sin_ptr, part_acc_ptr, part_ml_ptr, arrivals_ptr, scale, num_tokens,
                             capacity, stride_prog, stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_ot,
                             stride_oh, stride_pt, stride_ct, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                             BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                             ROT: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(programs_ptr + pid)
    first = tl.load(programs_ptr + stride_prog + pid)
    rows: tl.constexpr = BLOCK_Q * GROUP_PAD
    r = tl.arange(0, rows)
    g = r % GROUP_PAD
    heads = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM)
    if PDL:  # q comes from the GEMM before, the pages from store_kv
        tl.extra.cuda.gdc_wait()
    if seq < 0:
        if first >= 0:  # padding tokens: zeros
            t = first + r // GROUP_PAD
            ok = (t < num_tokens) & (g < GROUP)
            zero = tl.zeros([rows, HEAD_DIM], tl.float32).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + t[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :], zero,
                     mask=ok[:, None])
        return
    start = tl.load(query_start_ptr + seq)
    n = tl.load(query_start_ptr + seq + 1) - start
    ctx = tl.load(context_lens_ptr + seq)
    page_row = page_table_ptr + seq * stride_pt
    key_begin = tl.load(programs_ptr + 2 * stride_prog + pid)
    key_end = tl.load(programs_ptr + 3 * stride_prog + pid)
    part = tl.load(programs_ptr + 4 * stride_prog + pid)
    t = first + r // GROUP_PAD
    live = (t < n) & (g < GROUP)
    pos = ctx - n + t  # each row's position; it sees the keys at positions <= pos
    q_rows = q_ptr + (start + t)[:, None] * stride_qt + heads[:, None] * stride_qh
    q = _load_q(q_rows, d[None, :], live[:, None], cos_ptr, sin_ptr, pos[:, None], stride_ct, ROT) * scale
    if not UPCAST:
        q = q.to(k_ptr.dtype.element_ty)
    kv_end = tl.minimum(ctx, ctx - n + first + BLOCK_Q)  # the tile's last position + 1
    m = tl.full([rows], float("-inf"), tl.float32)
    denom = tl.zeros([rows], tl.float32)
    acc = tl.zeros([rows, HEAD_DIM], tl.float32)
    kpos = key_begin * BLOCK_N + tl.arange(0, BLOCK_N)
    page = tl.load(page_row + kpos // PAGE, mask=kpos < kv_end, other=0).to(tl.int64)
    for block in range(key_begin, key_end):
        in_ctx = kpos < kv_end
        base = page[:, None] * stride_kp + (kpos % PAGE)[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        k = tl.load(k_ptr + base, mask=in_ctx[:, None], other=0.0)
        v = tl.load(v_ptr + base, mask=in_ctx[:, None], other=0.0)
        next_kpos = kpos + BLOCK_N  # the next block's pages, loaded while this block computes
        page = tl.load(page_row + next_kpos // PAGE, mask=next_kpos < kv_end, other=0).to(tl.int64)
        if UPCAST:  # fp32 inputs, or bf16 in the CPU interpreter
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        # (finite: in a split a row may see no key of a block, or of its whole split; such weights
        # are dropped by the rescaling once a visible key arrives, here or at the merge)
        s = tl.where(kpos[None, :] <= pos[:, None], s, -1.0e30)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        w = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(w, axis=1)
        if UPCAST:
            acc = acc * alpha[:, None] + tl.dot(w, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(w.to(v.dtype), v)
        m = m_new
        kpos = next_kpos
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    out_ptrs = out_ptr + (start + t)[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    if part < 0:
        tl.store(out_ptrs, (acc / denom[:, None]).to(out_ptr.dtype.element_ty), mask=live[:, None])
    else:  # one split of a long tile's keys: the last to arrive merges the tile's partials
        tile = kv_head * capacity + tl.load(programs_ptr + 5 * stride_prog + pid)
        out, merged = _arrive(part_acc_ptr, part_ml_ptr, arrivals_ptr, tile, part - (tile - kv_head * capacity),
                              tl.load(programs_ptr + 6 * stride_prog + pid), acc, m, denom, r, d, rows, HEAD_DIM)
        if merged:
            tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=live[:, None])


def supported(head_dim: int, page_size: int) -> bool:
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0 and page_size & (page_size - 1) == 0


def store_kv(k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
             slot_mapping: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor) -> None:
    """k, v [T, KVH, D] (any strides, features contiguous): k rotated over the tables' ROT features
    (cos/sin [positions, ROT], fp32; ROT 0: no rotary) at `positions`, both stored at `slot_mapping`."""
    t, kvh, d = k.shape
    page = k_pages.shape[1]
    _store_kv_kernel[(t,)](
        k, v, k_pages, v_pages, cos, sin, positions, slot_mapping, kvh, k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), cos.stride(0), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        KVH_PAD=triton.next_power_of_2(kvh), HEAD_DIM=d, PAGE=page, ROT=cos.shape[-1],
        num_warps=min(4, max(1, kvh * d // 512)), **pdl_args())


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] (any strides, features contiguous) rotated in place over the tables' ROT features
    (cos/sin [positions, ROT], fp32) at `positions`, in fp32, rounded once; returns x."""
    t, h, d = x.shape
    _rotary_kernel[(t,)](x, cos, sin, positions, h, x.stride(0), x.stride(1), cos.stride(0),
                         H_PAD=triton.next_power_of_2(h), HEAD_DIM=d, ROT=cos.shape[-1],
                         num_warps=min(4, max(1, h * d // 512)))
    return x


def packed_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                     context_lens: torch.Tensor, query_start: torch.Tensor, programs: torch.Tensor, scale: float,
                     cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None, num_warps: int = 4,
                     num_stages: int = 3) -> torch.Tensor:
    """q [T, H, D] (unrotated; any strides, features contiguous) -> [T, H, D]. Sequence s's tokens
    are q[query_start[s]:query_start[s + 1]], the last of its context_lens[s] positions; its keys
    are in the pages of page_table[s]. `programs` [PROGRAM_FIELDS, G] (attention.plan_programs) sets
    the grid; q is rotated with cos/sin [positions, ROT] (ROT 0: q is used as it is). The warps and
    stages are the kernel's configuration (scripts/prefill_attention_bench.py sweeps them)."""
    t, h, d = q.shape
    _, page, kvh, _ = k_pages.shape
    group = h // kvh
    group_pad = triton.next_power_of_2(group)
    block_q = tokens_per_program(group)
    capacity = split_capacity(kvh)
    out = torch.empty_like(q) if out is None else out
    parts = capacity * kvh
    part_acc = torch.empty((parts, block_q * group_pad, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((parts, 2, block_q * group_pad), dtype=torch.float32, device=q.device)
    _packed_attention_kernel[(programs.shape[1], kvh)](
        q, k_pages, v_pages, out, page_table, context_lens, query_start, programs, cos, sin, part_acc, part_ml,
        arrival_counters(q.device, parts), scale, t, capacity, programs.stride(0), q.stride(0), q.stride(1),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), out.stride(0), out.stride(1), page_table.stride(0),
        cos.stride(0), GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, HEAD_DIM=d, PAGE=page, BLOCK_N=KEY_BLOCK,
        ROT=cos.shape[-1], UPCAST=INTERPRET or q.dtype == torch.float32, num_warps=num_warps, num_stages=num_stages,
        **pdl_args())
    return out


def packed_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: Rope, attn: AttentionInputs,
                pages: tuple[torch.Tensor, torch.Tensor], scale: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """A packed step's attention: q, k, v [T, heads, D] unrotated -> [T, H, D]. store_kv writes every
    token's K/V; the decode kernel serves the step's leading decode rows where `attn.decode_lens`
    has any (their contexts, then 0 for rows its programs skip), at its own occupancy, where an MHA
    decode row in a packed tile fills one of 64 rows (on the H200, 256 Phi-shaped rows of 620 tokens
    read K/V at 2.3 TB/s as tiles, 3.7 in the decode kernel); the packed kernel serves the rest."""
    store_kv(k, v, rope.cos, rope.sin, rope.positions, attn.slot_mapping, *pages)
    out = torch.empty_like(q) if out is None else out
    rows = attn.decode_lens.shape[0]
    if rows:  # (its fused KV write stores the same values store_kv did)
        paged_decode_attention(q[:rows], *pages, attn.page_table[:rows], attn.decode_lens, scale, out[:rows],
                               new_token=(k[:rows], v[:rows], rope.cos, rope.sin, attn.slot_mapping[:rows]))
    return packed_attention(q, *pages, attn.page_table, attn.context_lens, attn.query_start, attn.programs, scale,
                            rope.cos, rope.sin, out)
