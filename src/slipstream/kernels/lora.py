"""Triton: batched LoRA over the rows of a step, each row under its own adapter slot (or none):
`out[t] = base[t] + (x[t] @ A[s_t].T) @ B[s_t].T`, as a shrink (x -> v, the rank's few columns) and
an expand (v -> out), the slots read from device memory so a CUDA graph serves any mix.

A program covers a tile of rows (decode rows in any order, or a prompt chunk's tokens) and loops
over the adapter slots present in it: the rows of other slots are masked out of its operand, so
each present slot's A or B tile is read once per row tile and multiplied on the tensor cores, and
a tile of one adapter (a prompt chunk) costs one pass. Slot 0 is no adapter: its rows get base
unchanged. Each slot's packed rank (`ranks`) bounds its loops: adapters of low rank read only their
own columns of the stacks sized for the largest.

A decode step has one or two row tiles, so the shrink also splits the input's features over
programs (enough to fill the GPU) and writes fp32 partials, which the expand sums as it reads v:
without the split a 32-row step ran its 4,864-feature shrink on two programs (the H200 measured a
Qwen2.5-0.5B decode step with 8 adapters at 11x the step without LoRA). The expand writes into a
separate output where asked, so adding a delta to the residual stream needs no copy first.

The torch reference rounds as the kernels do: v is rounded to the activation dtype, the product
accumulated in fp32 onto base read in fp32, rounded once."""
from __future__ import annotations

import torch

from . import HAS_TRITON, INTERPRET, sm_count, triton_rows

BLOCK_M, BLOCK_N, BLOCK_R, BLOCK_K = 16, 64, 16, 64  # rows, output columns, rank columns, features a tile
PROGRAMS_PER_SM = 2  # the shrink's feature split aims at this many programs per SM

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(a, b, UPCAST: tl.constexpr):
        if UPCAST:  # fp32 inputs, or bf16 in the CPU interpreter
            return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        return tl.dot(a, tl.trans(b))

    @triton.jit
    def _shrink_kernel(x_ptr, a_ptr, rank_ptr, slot_ptr, vp_ptr, T, K, R, K_SPLIT, stride_x, stride_as, stride_ar,
                       stride_vs, stride_v, NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
        """Program (row tile, feature split): the split's partial x @ A[s].T for every row, in fp32."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rr = tl.arange(0, BLOCK_R)
        rk = tl.arange(0, BLOCK_K)
        k_from = tl.program_id(1) * K_SPLIT
        k_to = tl.minimum(k_from + K_SPLIT, K)
        slots = tl.load(slot_ptr + rm, mask=rm < T, other=0)
        acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        for s in range(1, NUM_SLOTS + 1):
            rank = tl.load(rank_ptr + s)
            mine = slots == s
            if tl.sum(mine.to(tl.int32)) > 0:
                for k0 in range(k_from, k_to, BLOCK_K):
                    kk = k0 + rk
                    x = tl.load(x_ptr + rm[:, None] * stride_x + kk[None, :],
                                mask=mine[:, None] & (kk[None, :] < k_to), other=0.0)
                    a = tl.load(a_ptr + s * stride_as + rr[:, None] * stride_ar + kk[None, :],
                                mask=(rr[:, None] < rank) & (kk[None, :] < k_to), other=0.0)
                    acc += _dot(x, a, UPCAST)
        tl.store(vp_ptr + tl.program_id(1) * stride_vs + rm[:, None] * stride_v + rr[None, :], acc,
                 mask=(rm[:, None] < T) & (rr[None, :] < R))

    @triton.jit
    def _expand_kernel(vp_ptr, b_ptr, rank_ptr, slot_ptr, base_ptr, out_ptr, T, N, SPLITS, stride_vs, stride_v,
                       stride_bs, stride_bn, stride_base, stride_o, NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, UPCAST: tl.constexpr):
        """Program (row tile, output columns): v summed over the splits and rounded, times B[s].T."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rr = tl.arange(0, BLOCK_R)
        slots = tl.load(slot_ptr + rm, mask=rm < T, other=0)
        widest = tl.load(rank_ptr)  # (slot 0's rank: 0)
        for s in range(1, NUM_SLOTS + 1):
            if tl.sum((slots == s).to(tl.int32)) > 0:
                widest = tl.maximum(widest, tl.load(rank_ptr + s))
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for r0 in range(0, widest, BLOCK_R):
            r = r0 + rr
            v = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
            for split in range(SPLITS):
                v += tl.load(vp_ptr + split * stride_vs + rm[:, None] * stride_v + r[None, :],
                             mask=(rm[:, None] < T) & (r[None, :] < widest), other=0.0)
            v = v.to(out_ptr.dtype.element_ty)
            for s in range(1, NUM_SLOTS + 1):
                rank = tl.load(rank_ptr + s)
                mine = slots == s
                if (tl.sum(mine.to(tl.int32)) > 0) & (r0 < rank):
                    b = tl.load(b_ptr + s * stride_bs + rn[:, None] * stride_bn + r[None, :],
                                mask=(rn[:, None] < N) & (r[None, :] < rank), other=0.0)
                    acc += _dot(tl.where(mine[:, None], v, 0.0).to(v.dtype), b, UPCAST)
        ok = (rm[:, None] < T) & (rn[None, :] < N)
        base = tl.load(base_ptr + rm[:, None] * stride_base + rn[None, :], mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rm[:, None] * stride_o + rn[None, :], (base + acc).to(out_ptr.dtype.element_ty), mask=ok)


def lora_add_reference(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
                       slots: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """out [T, N] = base + (x [T, K] @ a[s].T) @ b[s].T per row's slot s (a [S+1, R, K], b [S+1, N, R];
    slot 0: nothing; base: out itself, in place, when not given). Reads the slots on the host (a CPU
    engine's path, and the tests')."""
    if base is not None:
        out.copy_(base)
    for s in torch.unique(slots).tolist():
        if s == 0:
            continue
        rows = (slots == s).nonzero().flatten()
        r = int(ranks[s])
        v = (x[rows].float() @ a[s, :r].float().T).to(x.dtype)
        out[rows] = (out[rows].float() + v.float() @ b[s, :, :r].float().T).to(out.dtype)
    return out


def lora_add(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
             slots: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """`lora_add_reference`, by the two kernels where x is on CUDA (graph-capturable: the slots
    stay on the device)."""
    if triton_rows(x) and triton_rows(out) and (base is None or triton_rows(base)):
        return lora_add_triton(out, x, a, b, ranks, slots, base)
    return lora_add_reference(out, x, a, b, ranks, slots, base)


def feature_split(rows: int, k: int) -> int:
    """Features per shrink program (a multiple of BLOCK_K): all of them where the row tiles fill the
    GPU (a prompt chunk), else split so that row tiles x splits reach PROGRAMS_PER_SM per SM."""
    programs = PROGRAMS_PER_SM * (sm_count() if torch.cuda.is_available() else 132)
    splits = max(1, min(programs // triton.cdiv(rows, BLOCK_M), triton.cdiv(k, BLOCK_K)))
    return triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K


def lora_add_triton(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
                    slots: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    t, k = x.shape
    n, width = out.shape[1], a.shape[1]
    base = out if base is None else base
    k_split = feature_split(t, k)
    splits = triton.cdiv(k, k_split)
    partials = torch.empty((splits, t, width), dtype=torch.float32, device=x.device)
    upcast = x.dtype == torch.float32 or INTERPRET
    common = dict(NUM_SLOTS=a.shape[0] - 1, BLOCK_M=BLOCK_M, UPCAST=upcast, num_warps=4)
    _shrink_kernel[(triton.cdiv(t, BLOCK_M), splits)](
        x, a, ranks, slots, partials, t, k, width, k_split, x.stride(0), a.stride(0), a.stride(1),
        partials.stride(0), partials.stride(1), BLOCK_R=max(16, triton.next_power_of_2(width)), BLOCK_K=BLOCK_K,
        **common)
    _expand_kernel[(triton.cdiv(t, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        partials, b, ranks, slots, base, out, t, n, splits, partials.stride(0), partials.stride(1), b.stride(0),
        b.stride(1), base.stride(0), out.stride(0), BLOCK_N=BLOCK_N, BLOCK_R=BLOCK_R, **common)
    return out
