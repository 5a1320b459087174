"""Triton: batched LoRA over the rows of a step, each row under its own adapter slot (or none):
`out[t] += (x[t] @ A[s_t].T) @ B[s_t].T`, as a shrink (x -> v, the rank's few columns) and an
expand (v -> out, accumulated), the slots read from device memory so a CUDA graph serves any mix.

A program covers a tile of rows (decode rows in any order, or a prompt chunk's tokens) and loops
over the adapter slots present in it: the rows of other slots are masked out of its operand, so
each present slot's A or B tile is read once per row tile and multiplied on the tensor cores, and
a tile of one adapter (a prompt chunk) costs one pass. Slot 0 is no adapter: its rows are skipped
and their output left untouched. Each slot's packed rank (`ranks`) bounds its loops: adapters of
low rank read only their own columns of the stacks sized for the largest.

The torch reference rounds as the kernels do: v is rounded to the activation dtype, the product
accumulated in fp32 onto out read in fp32, rounded once."""
from __future__ import annotations

import torch

from . import HAS_TRITON, INTERPRET, triton_rows

BLOCK_M, BLOCK_N, BLOCK_R = 16, 64, 16  # rows, output columns, rank columns a tile (not tuned on the H200 yet)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(a, b, UPCAST: tl.constexpr):
        if UPCAST:  # fp32 inputs, or bf16 in the CPU interpreter
            return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        return tl.dot(a, tl.trans(b))

    @triton.jit
    def _shrink_kernel(x_ptr, a_ptr, rank_ptr, slot_ptr, v_ptr, T, K, R, stride_x, stride_as, stride_ar, stride_v,
                       NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                       UPCAST: tl.constexpr):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rr = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        rk = tl.arange(0, BLOCK_K)
        slots = tl.load(slot_ptr + rm, mask=rm < T, other=0)
        acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
        for s in range(1, NUM_SLOTS + 1):
            rank = tl.load(rank_ptr + s)
            mine = slots == s
            if (tl.sum(mine.to(tl.int32)) > 0) & (tl.program_id(1) * BLOCK_R < rank):
                for k0 in range(0, K, BLOCK_K):
                    kk = k0 + rk
                    x = tl.load(x_ptr + rm[:, None] * stride_x + kk[None, :], mask=mine[:, None] & (kk[None, :] < K),
                                other=0.0)
                    a = tl.load(a_ptr + s * stride_as + rr[:, None] * stride_ar + kk[None, :],
                                mask=(rr[:, None] < rank) & (kk[None, :] < K), other=0.0)
                    acc += _dot(x, a, UPCAST)
        tl.store(v_ptr + rm[:, None] * stride_v + rr[None, :], acc.to(v_ptr.dtype.element_ty),
                 mask=(rm[:, None] < T) & (rr[None, :] < R))

    @triton.jit
    def _expand_kernel(v_ptr, b_ptr, rank_ptr, slot_ptr, out_ptr, T, N, stride_v, stride_bs, stride_bn, stride_o,
                       NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                       UPCAST: tl.constexpr):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rr = tl.arange(0, BLOCK_R)
        slots = tl.load(slot_ptr + rm, mask=rm < T, other=0)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for s in range(1, NUM_SLOTS + 1):
            rank = tl.load(rank_ptr + s)
            mine = slots == s
            if tl.sum(mine.to(tl.int32)) > 0:
                for r0 in range(0, rank, BLOCK_R):
                    r = r0 + rr
                    v = tl.load(v_ptr + rm[:, None] * stride_v + r[None, :], mask=mine[:, None] & (r[None, :] < rank),
                                other=0.0)
                    b = tl.load(b_ptr + s * stride_bs + rn[:, None] * stride_bn + r[None, :],
                                mask=(rn[:, None] < N) & (r[None, :] < rank), other=0.0)
                    acc += _dot(v, b, UPCAST)
        ok = (slots > 0)[:, None] & (rn[None, :] < N)
        ptrs = out_ptr + rm[:, None] * stride_o + rn[None, :]
        base = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
        tl.store(ptrs, (base + acc).to(out_ptr.dtype.element_ty), mask=ok)


def lora_add_reference(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
                       slots: torch.Tensor) -> torch.Tensor:
    """out [T, N] += (x [T, K] @ a[s].T) @ b[s].T per row's slot s (a [S+1, R, K], b [S+1, N, R]; slot
    0: nothing), in place. Reads the slots on the host (a CPU engine's path, and the tests')."""
    for s in torch.unique(slots).tolist():
        if s == 0:
            continue
        rows = (slots == s).nonzero().flatten()
        r = int(ranks[s])
        v = (x[rows].float() @ a[s, :r].float().T).to(x.dtype)
        out[rows] = (out[rows].float() + v.float() @ b[s, :, :r].float().T).to(out.dtype)
    return out


def lora_add(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
             slots: torch.Tensor) -> torch.Tensor:
    """`lora_add_reference`, by the two kernels where x is on CUDA (graph-capturable: the slots
    stay on the device)."""
    if triton_rows(x) and triton_rows(out):
        return lora_add_triton(out, x, a, b, ranks, slots)
    return lora_add_reference(out, x, a, b, ranks, slots)


def lora_add_triton(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
                    slots: torch.Tensor) -> torch.Tensor:
    t, k = x.shape
    n, width = out.shape[1], a.shape[1]
    v = torch.empty((t, width), dtype=x.dtype, device=x.device)
    upcast = x.dtype == torch.float32 or INTERPRET
    common = dict(NUM_SLOTS=a.shape[0] - 1, BLOCK_M=BLOCK_M, UPCAST=upcast, num_warps=4)
    _shrink_kernel[(triton.cdiv(t, BLOCK_M), triton.cdiv(width, BLOCK_R))](
        x, a, ranks, slots, v, t, k, width, x.stride(0), a.stride(0), a.stride(1), v.stride(0), BLOCK_R=BLOCK_R,
        BLOCK_K=64, **common)
    _expand_kernel[(triton.cdiv(t, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        v, b, ranks, slots, out, t, n, v.stride(0), b.stride(0), b.stride(1), out.stride(0), BLOCK_N=BLOCK_N,
        BLOCK_R=BLOCK_R, **common)
    return out

