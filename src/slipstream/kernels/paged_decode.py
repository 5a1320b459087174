"""Triton paged-decode attention: one query token per row over that row's KV pages.

One program per (row, KV head) walks the row's pages up to its context length, a block of
`pages_per_block` pages per iteration (their loads in flight together), with an online softmax,
serving all query heads of the GQA group at once (padded to 16 rows for tl.dot; fp32 inputs use
IEEE dots, half-precision inputs TF32 on their fp32 upcast). The page table has a fixed width and
the context lengths live on the device, so one launch shape serves every step of a batch-size
bucket — which is what a CUDA graph needs. Runs on CPU under
TRITON_INTERPRET=1 (bf16 is upcast in-kernel)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl_args


@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, context_lens_ptr, scale,
                         stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                         PAGES_PER_BLOCK: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    if PDL:  # everything it reads comes from earlier kernels (see skinny_gemm)
        tl.extra.cuda.gdc_wait()
    ctx = tl.load(context_lens_ptr + row)
    if not DOT:
        _single_head(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, ctx, scale, row, kv_head, stride_qb, stride_qh,
                     stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt, HEAD_DIM, PAGE,
                     PAGES_PER_BLOCK, PDL)
        return
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    live = g < GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=live[:, None], other=0.0)
    q = q.to(tl.float32) * scale
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    BLOCK: tl.constexpr = PAGE * PAGES_PER_BLOCK
    offs = tl.arange(0, BLOCK)  # token offsets of one block of pages, loaded together
    n_pages = tl.cdiv(ctx, PAGE)
    for start in range(0, tl.cdiv(ctx, BLOCK)):
        p = start * PAGES_PER_BLOCK + offs // PAGE
        page = tl.load(page_table_ptr + row * stride_pt + p, mask=p < n_pages, other=0).to(tl.int64)
        base = page[:, None] * stride_kp + (offs % PAGE)[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        valid = start * BLOCK + offs < ctx
        k = tl.load(k_ptr + base, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + base, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        w = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(w, axis=1)
        acc = acc * alpha[:, None] + tl.dot(w, v, input_precision=PRECISION)
        m = m_new
    out = acc / denom[:, None]
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + row * stride_ob + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=live[:, None])


@triton.jit
def _single_head(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, ctx, scale, row, head, stride_qb, stride_qh,
                 stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt, HEAD_DIM: tl.constexpr,
                 PAGE: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One query head per KV head (MHA): scores and the weighted sum as row reductions, without
    padding the single query row to a 16-row tensor-core tile."""
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale
    BLOCK: tl.constexpr = PAGE * PAGES_PER_BLOCK
    offs = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    denom = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    n_pages = tl.cdiv(ctx, PAGE)
    for start in range(0, tl.cdiv(ctx, BLOCK)):
        p = start * PAGES_PER_BLOCK + offs // PAGE
        page = tl.load(page_table_ptr + row * stride_pt + p, mask=p < n_pages, other=0).to(tl.int64)
        base = page[:, None] * stride_kp + (offs % PAGE)[:, None] * stride_ks + head * stride_kh + d[None, :]
        valid = start * BLOCK + offs < ctx
        k = tl.load(k_ptr + base, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + base, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        w = tl.exp(s - m_new)
        denom = denom * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
        m = m_new
    out = acc / denom
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + row * stride_ob + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def supported(head_dim: int, page_size: int) -> bool:
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0 and page_size >= 16 and page_size & (page_size - 1) == 0


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                           context_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                           pages_per_block: int = 4, num_warps: int = 4, dot: bool | None = None) -> torch.Tensor:
    """Same contract as kernels.attention.decode_attention: q [B, H, D] -> [B, H, D]. `dot` picks the
    tensor-core formulation (default: for GQA groups) or the reduction one (default: for MHA)."""
    b, h, d = q.shape
    _, page, kvh, _ = k_pages.shape
    group = h // kvh
    out = torch.empty_like(q) if out is None else out
    _paged_decode_kernel[(b, kvh)](
        q, k_pages, v_pages, out, page_table, context_lens, scale,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        out.stride(0), out.stride(1), page_table.stride(0),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d, PAGE=page,
        PAGES_PER_BLOCK=pages_per_block,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", DOT=group > 1 if dot is None else dot,
        num_warps=num_warps, **pdl_args())
    return out
