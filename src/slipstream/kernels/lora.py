"""Triton: batched LoRA over the rows of a step, each row under its own adapter slot (or none):
`out[t] = base[t] + (x[t] @ A[s_t].T) @ B[s_t].T`, as a shrink (x -> v, the rank's few columns) and
an expand (v -> out), the slots read from device memory so a CUDA graph serves any mix.

A shrink program covers a tile of rows (decode rows in any order, or a prompt chunk's tokens), one
adapter slot and a share of the input's features: it multiplies the tile's rows of that slot by the
slot's A on the tensor cores and writes fp32 partials (a program whose tile lacks its slot exits).
An expand program covers a tile of rows and of output columns: it sums the partials as it reads v,
then loops over the slots, each B tile read once per row tile with the other slots' rows masked out
of v. Slot 0 is no adapter: its rows get base unchanged. Each slot's packed rank (`ranks`) bounds the
loops: adapters of low rank read only their own columns of the stacks sized for the largest.

Why the split: a decode step has one or two row tiles. Looping over the slots and all the features
inside each row tile's program, the H200 measured a Qwen2.5-0.5B decode step with 8 adapters over 32
rows at 11x the step without LoRA; splitting the features alone (up to 76 partials for the expand to
sum) at 3.8x; slots in the grid and at most MAX_SPLITS partials at 3.1x (docs/benchmarks.md, runs p
and q). The expand writes into a separate output where asked, so
adding a delta to the residual stream needs no copy first.

The torch reference rounds as the kernels do: v is rounded to the activation dtype, the product
accumulated in fp32 onto base read in fp32, rounded once."""
from __future__ import annotations

import torch

from . import HAS_TRITON, INTERPRET, sm_count, triton_rows

BLOCK_M, BLOCK_N, BLOCK_R, BLOCK_K = 16, 64, 16, 64  # rows, output columns, rank columns, features a tile
PROGRAMS_PER_SM = 2  # the shrink's feature split aims at this many programs per SM
MAX_SPLITS = 8

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
                       stride_vs, stride_v, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                       UPCAST: tl.constexpr):
        """Program (row tile, feature split, slot): the split's partial x @ A[s].T, in fp32, for the
        tile's rows of slot s (a program whose tile holds none writes nothing)."""
        s = tl.program_id(2) + 1
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rr = tl.arange(0, BLOCK_R)
        rk = tl.arange(0, BLOCK_K)
        mine = tl.load(slot_ptr + rm, mask=rm < T, other=0) == s
        if tl.sum(mine.to(tl.int32)) > 0:
            rank = tl.load(rank_ptr + s)
            k_from = tl.program_id(1) * K_SPLIT
            k_to = tl.minimum(k_from + K_SPLIT, K)
            acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
            for k0 in range(k_from, k_to, BLOCK_K):
                kk = k0 + rk
                x = tl.load(x_ptr + rm[:, None] * stride_x + kk[None, :], mask=mine[:, None] & (kk[None, :] < k_to),
                            other=0.0)
                a = tl.load(a_ptr + s * stride_as + rr[:, None] * stride_ar + kk[None, :],
                            mask=(rr[:, None] < rank) & (kk[None, :] < k_to), other=0.0)
                acc += _dot(x, a, UPCAST)
            tl.store(vp_ptr + tl.program_id(1) * stride_vs + rm[:, None] * stride_v + rr[None, :], acc,
                     mask=mine[:, None] & (rr[None, :] < R))

    @triton.jit
    def _expand_kernel(vp_ptr, b_ptr, rank_ptr, slot_ptr, base_ptr, out_ptr, T, N, SPLITS, stride_vs, stride_v,
                       stride_bs, stride_bn, stride_base, stride_o, NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, UPCAST: tl.constexpr):
        """Program (row tile, output columns): v summed over the splits and rounded, times B[s].T for
        each slot, its rows alone (no branch in the slot loop: a slot the tile lacks loads nothing)."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rr = tl.arange(0, BLOCK_R)
        slots = tl.load(slot_ptr + rm, mask=rm < T, other=0)
        widest = tl.max(tl.load(rank_ptr + slots), axis=0)  # (slot 0's rank: 0)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for r0 in range(0, widest, BLOCK_R):
            r = r0 + rr
            v = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
            for split in range(SPLITS):
                v += tl.load(vp_ptr + split * stride_vs + rm[:, None] * stride_v + r[None, :],
                             mask=(slots[:, None] > 0) & (r[None, :] < widest), other=0.0)
            v = v.to(out_ptr.dtype.element_ty)
            for s in range(1, NUM_SLOTS + 1):
                mine = slots == s
                present = tl.sum(mine.to(tl.int32)) > 0
                b = tl.load(b_ptr + s * stride_bs + rn[:, None] * stride_bn + r[None, :],
                            mask=present & (rn[:, None] < N) & (r[None, :] < tl.load(rank_ptr + s)), other=0.0)
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


def feature_split(rows: int, k: int, slots: int) -> int:
    """Features per shrink program (a multiple of BLOCK_K): all of them where the row tiles fill the
    GPU (a prompt chunk), else split so that row tiles x slots x splits reach PROGRAMS_PER_SM per SM,
    in at most MAX_SPLITS parts (the expand reads each part)."""
    programs = PROGRAMS_PER_SM * (sm_count() if torch.cuda.is_available() else 132)
    splits = max(1, min(programs // (triton.cdiv(rows, BLOCK_M) * slots), MAX_SPLITS, triton.cdiv(k, BLOCK_K)))
    return triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K


def lora_add_triton(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
                    slots: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    t, k = x.shape
    n, width = out.shape[1], a.shape[1]
    base = out if base is None else base
    num_slots = a.shape[0] - 1
    k_split = feature_split(t, k, num_slots)
    splits = triton.cdiv(k, k_split)
    partials = torch.empty((splits, t, width), dtype=torch.float32, device=x.device)
    upcast = x.dtype == torch.float32 or INTERPRET
    common = dict(BLOCK_M=BLOCK_M, UPCAST=upcast, num_warps=4)
    _shrink_kernel[(triton.cdiv(t, BLOCK_M), splits, num_slots)](
        x, a, ranks, slots, partials, t, k, width, k_split, x.stride(0), a.stride(0), a.stride(1),
        partials.stride(0), partials.stride(1), BLOCK_R=max(16, triton.next_power_of_2(width)), BLOCK_K=BLOCK_K,
        **common)
    _expand_kernel[(triton.cdiv(t, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        partials, b, ranks, slots, base, out, t, n, splits, partials.stride(0), partials.stride(1), b.stride(0),
        b.stride(1), base.stride(0), out.stride(0), NUM_SLOTS=num_slots, BLOCK_N=BLOCK_N, BLOCK_R=BLOCK_R, **common)
    return out
