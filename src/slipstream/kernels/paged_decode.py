"""Triton paged-decode attention: one query token per row over that row's KV pages.

One program per (row, KV head) walks the row's pages up to its context length, a block of
`pages_per_block` pages per iteration (their loads in flight together; the GQA form loads the
page-table entries a block ahead), with an online softmax,
serving all query heads of the GQA group at once (padded to 16 rows for tl.dot; fp32 inputs use
IEEE dots, half-precision inputs TF32 on their fp32 upcast). The page table has a fixed width and
the context lengths live on the device, so one launch shape serves every step of a batch-size
bucket — which is what a CUDA graph needs. In a decode step each program first applies the rotary
to q and to the step's k and writes k and v into their slot (`new_token`), so the rotary and the
KV write cost no launch of their own. Runs on CPU under TRITON_INTERPRET=1 (bf16 is upcast in-kernel).

Long contexts with few (row, KV head) pairs — any model at low batch — would leave most SMs
idle, so the GQA form splits the context, and an MHA model then takes that form too, each head a
group of one (unsplit, one row of the Phi-1.5 shape at a 760-token context took 1.95 ms a decode
step against 1.07 ms at 64 tokens: docs/benchmarks.md, run o). Program (row, KV head, s) walks
blocks [s * per_split, (s + 1) * per_split), per_split BLOCKS_PER_SPLIT for GQA and
MHA_BLOCKS_PER_SPLIT for MHA. A row whose context fits one split is done by
split 0 alone, exactly as without splitting (the other programs exit at once), so short contexts
pay nothing; longer rows leave per-split softmax partials and the last split to arrive merges them
(in split order, deterministic) and writes the output."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRET, arrival_counters, pdl_args, sm_count

BLOCKS_PER_SPLIT = 8  # blocks of pages one program walks before the context is split (8 x 4 pages x 16 = 512 tokens)
MHA_BLOCKS_PER_SPLIT = 2  # the same for an MHA model's heads (128 tokens): a group of one has 16x less to do a block
# The reduction form's block of pages and warps: 4 and 4, and 2 and 2 where its programs number at least
# WIDE_PROGRAMS_PER_SM per SM. Phi-1.5 shape on the H200 (docs/benchmarks.md, run s), us at contexts 200 /
# 620 / 1,300: 32 rows 20.6 / 50.0 / 98.6 with (4, 4) against 19.3 / 56.5 / 112.8 with (2, 2); 48 rows
# 33.7 / 80.5 / 164.6 against 26.6 / 69.6 / 139.8; 128 rows 75.5 / 182.2 against 60.2 / 165.0.
WIDE_PROGRAMS_PER_SM = 10


@triton.jit
def _block_pages(page_table_ptr, row, start, ctx, stride_pt, PAGE: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr):
    """The page of each token slot of a row's `start`-th block of PAGES_PER_BLOCK pages (0 past the
    context)."""
    p = start * PAGES_PER_BLOCK + tl.arange(0, PAGE * PAGES_PER_BLOCK) // PAGE
    return tl.load(page_table_ptr + row * stride_pt + p, mask=p < tl.cdiv(ctx, PAGE), other=0).to(tl.int64)


@triton.jit
def _load_kv_block(k_ptr, v_ptr, page, kv_head, start, ctx, stride_kp, stride_ks, stride_kh, HEAD_DIM: tl.constexpr,
                   PAGE: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr):
    """K and V (fp32) of the `start`-th block of a row, whose pages are `page` (their loads in flight
    together), and which of its tokens are inside the context."""
    BLOCK: tl.constexpr = PAGE * PAGES_PER_BLOCK
    offs = tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM)
    base = page[:, None] * stride_kp + (offs % PAGE)[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
    valid = start * BLOCK + offs < ctx
    k = tl.load(k_ptr + base, mask=valid[:, None], other=0.0).to(tl.float32)
    v = tl.load(v_ptr + base, mask=valid[:, None], other=0.0).to(tl.float32)
    return k, v, valid


@triton.jit
def _rope(head_ptr, d, mask, cos_ptr, sin_ptr, pos, stride_ct, ROT: tl.constexpr):
    """Rotate-half rotary (fp32) over the first ROT features of the head(s) at `head_ptr` + d, with
    the tables' entries at `pos` rounded to the heads' dtype (as the torch path's rows are)."""
    half: tl.constexpr = ROT // 2
    rotated = d < ROT
    partner = tl.where(d < half, d + half, d - half)
    dtype = head_ptr.dtype.element_ty
    cos = tl.load(cos_ptr + pos * stride_ct + d, mask=rotated, other=1.0).to(dtype).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_ct + d, mask=rotated, other=0.0).to(dtype).to(tl.float32)
    x = tl.load(head_ptr + d, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(head_ptr + partner, mask=mask & rotated, other=0.0).to(tl.float32)
    return tl.where(rotated, x * cos + tl.where(d < half, -1.0, 1.0) * xp * sin, x)


@triton.jit
def _load_q(head_ptr, d, mask, cos_ptr, sin_ptr, pos, stride_ct, ROT: tl.constexpr):
    """The query head(s) at `head_ptr` + d in fp32; with ROT > 0 rotated first, and rounded to the
    input dtype as a stored rotated q would be."""
    if ROT == 0:
        return tl.load(head_ptr + d, mask=mask, other=0.0).to(tl.float32)
    q = _rope(head_ptr, d, mask, cos_ptr, sin_ptr, pos, stride_ct, ROT)
    return q.to(head_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _store_new_token(k_new_ptr, v_new_ptr, k_ptr, v_ptr, slot_ptr, cos_ptr, sin_ptr, row, pos, kv_head, stride_kt,
                     stride_knh, stride_vt, stride_vnh, stride_ct, stride_kp, stride_ks, stride_kh,
                     HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, ROT: tl.constexpr):
    """This step's K (rotated) and V of one row and KV head into their slot of the pages, visible to
    the whole program before it reads the row's pages."""
    d = tl.arange(0, HEAD_DIM)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    dst = (slot // PAGE) * stride_kp + (slot % PAGE) * stride_ks + kv_head * stride_kh + d
    k = _rope(k_new_ptr + row * stride_kt + kv_head * stride_knh, d, d < HEAD_DIM, cos_ptr, sin_ptr, pos,
              stride_ct, ROT)
    tl.store(k_ptr + dst, k.to(k_ptr.dtype.element_ty))
    v = tl.load(v_new_ptr + row * stride_vt + kv_head * stride_vnh + d)
    tl.store(v_ptr + dst, v.to(v_ptr.dtype.element_ty))
    tl.debug_barrier()


@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, context_lens_ptr, part_acc_ptr, part_ml_ptr,
                         arrivals_ptr, k_new_ptr, v_new_ptr, cos_ptr, sin_ptr, slot_ptr, scale, blocks_per_split,
                         stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt,
                         stride_kt, stride_knh, stride_vt, stride_vnh, stride_ct,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                         PAGES_PER_BLOCK: tl.constexpr, PRECISION: tl.constexpr, DOT: tl.constexpr, ROT: tl.constexpr,
                         PDL: tl.constexpr):
    """ROT > 0: q and the step's k still need rotary (over their first ROT features), and the step's
    K/V are written into the pages here, by the program that reads them, before it attends."""
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # The context lengths and the page table are step inputs, copied in before the step's first
    # kernel, so they may be read before waiting on the previous kernel.
    ctx = tl.load(context_lens_ptr + row)
    if ctx == 0:  # not a row of this launch (a packed step's rows past its decode rows: packed_step)
        return
    if not DOT:
        if PDL:  # q, k and v come from the previous kernel (see skinny_gemm)
            tl.extra.cuda.gdc_wait()
        if ROT > 0:
            _store_new_token(k_new_ptr, v_new_ptr, k_ptr, v_ptr, slot_ptr, cos_ptr, sin_ptr, row, ctx - 1, kv_head,
                             stride_kt, stride_knh, stride_vt, stride_vnh, stride_ct, stride_kp, stride_ks, stride_kh,
                             HEAD_DIM, PAGE, ROT)
        _single_head(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, cos_ptr, sin_ptr, ctx, scale, row, kv_head,
                     stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt, stride_ct,
                     HEAD_DIM, PAGE, PAGES_PER_BLOCK, ROT, PDL)
        return
    BLOCK: tl.constexpr = PAGE * PAGES_PER_BLOCK
    n_blocks = tl.cdiv(ctx, BLOCK)
    first = split * blocks_per_split
    if first < n_blocks:  # (splits past the context exit at once)
        page = _block_pages(page_table_ptr, row, first, ctx, stride_pt, PAGE, PAGES_PER_BLOCK)
        if PDL:
            tl.extra.cuda.gdc_wait()
        if ROT > 0:
            if (n_blocks - 1) // blocks_per_split == split:  # the split holding the new token writes it
                _store_new_token(k_new_ptr, v_new_ptr, k_ptr, v_ptr, slot_ptr, cos_ptr, sin_ptr, row, ctx - 1,
                                 kv_head, stride_kt, stride_knh, stride_vt, stride_vnh, stride_ct, stride_kp,
                                 stride_ks, stride_kh, HEAD_DIM, PAGE, ROT)
        _group_split(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, part_acc_ptr, part_ml_ptr, arrivals_ptr, cos_ptr,
                     sin_ptr, page, ctx, n_blocks, first, blocks_per_split, scale, row, kv_head, split, stride_qb,
                     stride_qh, stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt, stride_ct, GROUP,
                     GROUP_PAD, HEAD_DIM, PAGE, PAGES_PER_BLOCK, PRECISION, ROT, PDL)


@triton.jit
def _group_split(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, part_acc_ptr, part_ml_ptr, arrivals_ptr, cos_ptr,
                 sin_ptr, page, ctx, n_blocks, first, blocks_per_split, scale, row, kv_head, split, stride_qb,
                 stride_qh, stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt, stride_ct,
                 GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                 PAGES_PER_BLOCK: tl.constexpr, PRECISION: tl.constexpr, ROT: tl.constexpr, PDL: tl.constexpr):
    """A GQA group's query heads (padded to 16 rows for tl.dot) over one split of a row's context;
    the last split to arrive merges the others' softmax partials. Each block's page-table entries
    are loaded a block ahead (the first block's before the wait), so no K/V load waits on one."""
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    live = g < GROUP
    d = tl.arange(0, HEAD_DIM)
    q = _load_q(q_ptr + row * stride_qb + heads[:, None] * stride_qh, d[None, :], live[:, None], cos_ptr, sin_ptr,
                ctx - 1, stride_ct, ROT) * scale
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(first, tl.minimum(first + blocks_per_split, n_blocks)):
        k, v, valid = _load_kv_block(k_ptr, v_ptr, page, kv_head, start, ctx, stride_kp, stride_ks, stride_kh,
                                     HEAD_DIM, PAGE, PAGES_PER_BLOCK)
        page = _block_pages(page_table_ptr, row, start + 1, ctx, stride_pt, PAGE, PAGES_PER_BLOCK)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        w = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(w, axis=1)
        acc = acc * alpha[:, None] + tl.dot(w, v, input_precision=PRECISION)
        m = m_new
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    out_ptrs = out_ptr + row * stride_ob + heads[:, None] * stride_oh + d[None, :]
    n_splits = tl.cdiv(n_blocks, blocks_per_split)
    if n_splits == 1:
        tl.store(out_ptrs, (acc / denom[:, None]).to(out_ptr.dtype.element_ty), mask=live[:, None])
    else:
        parts = (row * tl.num_programs(1) + kv_head) * tl.num_programs(2)
        out, merged = _arrive(part_acc_ptr, part_ml_ptr, arrivals_ptr, parts, split, n_splits, acc, m, denom, g, d,
                              GROUP_PAD, HEAD_DIM)
        if merged:
            tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=live[:, None])


@triton.jit
def _arrive(part_acc_ptr, part_ml_ptr, arrivals_ptr, parts, index, count, acc, m, denom, r, d, ROWS: tl.constexpr,
            HEAD_DIM: tl.constexpr):
    """One split of a softmax over keys: leave this split's partial (acc [ROWS, HEAD_DIM], running max
    m, denominator) as partial `parts + index` of `count`, and count the arrival at counter `parts`.
    The last split to arrive merges all the partials in split order (deterministic whichever arrives
    last), resets the counter for the next launch (and graph replay), and returns (output, True);
    the others return (anything, False)."""
    tile = r[:, None] * HEAD_DIM + d[None, :]
    tl.store(part_acc_ptr + (parts + index) * ROWS * HEAD_DIM + tile, acc)
    tl.store(part_ml_ptr + (parts + index) * 2 * ROWS + r, m)
    tl.store(part_ml_ptr + (parts + index) * 2 * ROWS + ROWS + r, denom)
    tl.debug_barrier()  # every thread's partial is written before the arrival is counted
    merged = tl.atomic_add(arrivals_ptr + parts, 1, sem="acq_rel") == count - 1
    if merged:
        m = tl.load(part_ml_ptr + parts * 2 * ROWS + r, cache_modifier=".cg")
        denom = tl.load(part_ml_ptr + parts * 2 * ROWS + ROWS + r, cache_modifier=".cg")
        acc = tl.load(part_acc_ptr + parts * ROWS * HEAD_DIM + tile, cache_modifier=".cg")
        for other in range(1, count):
            m_o = tl.load(part_ml_ptr + (parts + other) * 2 * ROWS + r, cache_modifier=".cg")
            d_o = tl.load(part_ml_ptr + (parts + other) * 2 * ROWS + ROWS + r, cache_modifier=".cg")
            acc_o = tl.load(part_acc_ptr + (parts + other) * ROWS * HEAD_DIM + tile, cache_modifier=".cg")
            m_new = tl.maximum(m, m_o)
            alpha, beta = tl.exp(m - m_new), tl.exp(m_o - m_new)
            denom = denom * alpha + d_o * beta
            acc = acc * alpha[:, None] + acc_o * beta[:, None]
            m = m_new
        tl.atomic_xchg(arrivals_ptr + parts, 0)
    return acc / denom[:, None], merged


@triton.jit
def _single_head(q_ptr, k_ptr, v_ptr, out_ptr, page_table_ptr, cos_ptr, sin_ptr, ctx, scale, row, head, stride_qb,
                 stride_qh, stride_kp, stride_ks, stride_kh, stride_ob, stride_oh, stride_pt, stride_ct,
                 HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr, ROT: tl.constexpr,
                 PDL: tl.constexpr):
    """One query head per KV head (MHA): scores and the weighted sum as row reductions, without
    padding the single query row to a 16-row tensor-core tile. Its pages are loaded in the block
    that uses them: loading them a block ahead, as the GQA form does, made it slower on the H200
    (docs/kernel-notes.md, variant 16)."""
    d = tl.arange(0, HEAD_DIM)
    q = _load_q(q_ptr + row * stride_qb + head * stride_qh, d, d < HEAD_DIM, cos_ptr, sin_ptr, ctx - 1, stride_ct,
                ROT) * scale
    BLOCK: tl.constexpr = PAGE * PAGES_PER_BLOCK
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    denom = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for start in range(0, tl.cdiv(ctx, BLOCK)):
        page = _block_pages(page_table_ptr, row, start, ctx, stride_pt, PAGE, PAGES_PER_BLOCK)
        k, v, valid = _load_kv_block(k_ptr, v_ptr, page, head, start, ctx, stride_kp, stride_ks, stride_kh, HEAD_DIM,
                                     PAGE, PAGES_PER_BLOCK)
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
                           new_token: tuple[torch.Tensor, ...] | None = None, pages_per_block: int | None = None,
                           num_warps: int | None = None, dot: bool | None = None,
                           blocks_per_split: int | None = None) -> torch.Tensor:
    """Same contract as kernels.attention.decode_attention: q [B, H, D] -> [B, H, D]. `dot` picks the
    tensor-core formulation (default: for GQA groups, and for MHA when the (row, KV head) pairs alone
    cannot fill the GPU) or the reduction one (default: for MHA otherwise); the former then splits
    contexts longer than `blocks_per_split` blocks of `pages_per_block` pages (by default
    BLOCKS_PER_SPLIT for GQA, MHA_BLOCKS_PER_SPLIT for MHA). `new_token` = (k, v, cos, sin, slot_mapping)
    fuses the step's rotary and KV write in: q and k ([B, KVH, D], any strides) are rotated by the
    tables cos/sin ([positions, ROT]) at each row's position, context_lens - 1 (the entries rounded
    to q's dtype), and k, v stored at `slot_mapping` before attending; without it q is rotated
    already and the pages hold the token. `pages_per_block` and `num_warps` default to 4 and 4, and
    for the reduction form to reduction_config's for its programs."""
    b, h, d = q.shape
    _, page, kvh, _ = k_pages.shape
    group = h // kvh
    few = b * kvh < _split_below()
    use_dot = (group > 1 or few) if dot is None else dot
    if not use_dot and group > 1:
        raise ValueError(f"the reduction form serves one query head per KV head; these are {group}: use dot")
    default_pages, default_warps = (4, 4) if use_dot else reduction_config(b * kvh)
    pages_per_block, num_warps = pages_per_block or default_pages, num_warps or default_warps
    group_pad = max(16, triton.next_power_of_2(group))
    out = torch.empty_like(q) if out is None else out
    splits, per_split = 1, 1 << 30  # (unsplit: one program walks a row's whole context)
    if use_dot and few:
        per_split = blocks_per_split or (BLOCKS_PER_SPLIT if group > 1 else MHA_BLOCKS_PER_SPLIT)
        splits = triton.cdiv(triton.cdiv(page_table.shape[1], pages_per_block), per_split)
    # fp32 partials and int32 counters even when nothing splits: the merge is compiled either way
    parts = b * kvh * splits if splits > 1 else 1
    part_acc = torch.empty((parts, group_pad, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((parts, 2, group_pad), dtype=torch.float32, device=q.device)
    arrivals = arrival_counters(q.device, parts)
    if new_token is not None:
        k_new, v_new, cos, sin, slots = new_token
        rot = cos.shape[-1]
    else:  # (unused arguments of the right types)
        k_new, v_new, cos, sin, slots, rot = q, q, q[:, 0], q[:, 0], context_lens, 0
    _paged_decode_kernel[(b, kvh, splits)](
        q, k_pages, v_pages, out, page_table, context_lens, part_acc, part_ml, arrivals, k_new, v_new, cos, sin, slots,
        scale, per_split, q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        out.stride(0), out.stride(1), page_table.stride(0), k_new.stride(0), k_new.stride(1), v_new.stride(0),
        v_new.stride(1), cos.stride(0),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d, PAGE=page, PAGES_PER_BLOCK=pages_per_block,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", DOT=use_dot, ROT=rot, num_warps=num_warps,
        **pdl_args())
    return out


def _split_below() -> int:
    """Split contexts while (row, KV head) pairs number fewer than twice the SMs (always when interpreted)."""
    if INTERPRET:
        return 1 << 30
    return 2 * sm_count()


def reduction_config(programs: int) -> tuple[int, int]:
    """Pages per block and warps of the reduction form's `programs` programs (one per row and head)."""
    sms = 132 if INTERPRET else sm_count()  # (interpreted: as many as the H200 has)
    return (2, 2) if programs >= WIDE_PROGRAMS_PER_SM * sms else (4, 4)
