"""Triton: batched LoRA over the rows of a step, each row under its own adapter slot (or none):
`delta[t] = (x[t] @ A[s_t].T) @ B[s_t].T`, as a shrink (x -> v, the rank's few columns) and an
expand (v -> the output's columns), the slots read from device memory so a CUDA graph serves any mix.

The shrink: a program covers a tile of rows, one adapter slot and a share of the input's features;
it multiplies the tile's rows of that slot by the slot's A on the tensor cores (a program whose tile
lacks its slot exits). Where the features are split, each program leaves an fp32 partial and the
last to arrive at its (tile, slot) counter sums them in split order; v is rounded to the activation
dtype, as the reference rounds it. It joins the step's chain of PDL launches (see skinny_gemm).

The expand (`lora_delta`) is a tile of rows and output columns: one product of the rows' v, each
placed in its slot's rank columns, by every slot's B tile side by side (`lora_b`), whose loads are
issued before the GEMM's PDL wait (past ONE_PRODUCT_COLUMNS rank columns, a product per slot after
the main loop: `lora_delta_by_slot`). It runs inside the skinny GEMM, the one product as the
accumulator's start before the main loop, so the delta is in it before the bias, the activation
and the residual (kernels.linear): a decode step pays one launch per adapted projection, not three,
and keeps SwiGLU and the deferred residual sum fused; elsewhere (prefill steps) in an expand kernel
of its own after cuBLAS.

A Llama-family decode step launches no LoRA kernel at all: the RMSNorm before qkv and before
gate_up computes their shrink (a program per row and 16 rank columns, kernels.norm.rms_norm_shrink);
o's and down's GEMMs, whose split-K partials the RMSNorm after them sums (linear.PendingSum),
compute their own shrink in column tiles of their grid beside the weight's, every slot's A rows
for every row (skinny_gemm's `shrink`), and that RMSNorm sums each row's slot's columns of those
partials, rounds v and adds the delta, its B loaded before its wait (kernels.linear's
`lora_in_norm`, `LoraShrunk`). Those tiles cost a deferred GEMM bytes, not time: its grid stays one
wave, each tile streams its K range as the weight's do.

Why: a decode step has one or two row tiles. Looping over the slots and all the features inside
each row tile's program, the H200 measured a Qwen2.5-0.5B decode step with 8 adapters over 32 rows
at 11x the step without LoRA; splitting the features alone at 3.8x; slots in the grid and at most
MAX_SPLITS partials, which the expand summed chunk by chunk of the rank, at 3.1x, with the expand
at 6-15 µs a projection, a chain of dependent loads; in the GEMM's epilogue, a product per slot,
at 2.3x; one product over all slots, B loaded before the main loop, at 2.0x; the shrinks and the
deferred deltas in the norms, at 1.74x; the stacks and slots read before the wait in 16-byte loads,
the deferred deltas before the norms' waits, at 1.39x; the one product before the GEMM's main loop,
not after it, at 1.35x; down's shrink started by gate_up's tiles from their outputs, then o's and
down's in their GEMMs' own grids (above), at 1.22x (docs/benchmarks.md, runs p, q, a, b, c, m, n
and o; a step with no adapter row runs without any of this). Slot 0 is no adapter: its rows get
nothing added. The decode kernels read a slot's whole width, whatever its rank: the bank keeps
what no adapter fills at zero (lora.bank), so the masks of those loads depend only on constants
and the loads stay 16 bytes wide (masked by each slot's rank they were 2 bytes wide: 64 loads a
thread in qkv's GEMM, 1,584 instructions against 728 so). The shrink and prefill's expand read
only up to each slot's packed rank (`ranks`).

The torch reference rounds as the expand kernel does: v is rounded to the activation dtype, the
product accumulated in fp32 onto base read in fp32, rounded once."""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import HAS_TRITON, INTERPRET, arrival_counters, pdl_args, sm_count, triton_rows

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64  # rows, output columns, features a tile
PROGRAMS_PER_SM = 2  # the shrink's feature split aims at this many programs per SM
MAX_SPLITS = 8
ONE_PRODUCT_COLUMNS = 512  # the expand's rank columns in one product at most (one_product)
# The widest rows (features) an RMSNorm's program takes an adapter's work for, beside the row it holds
# a [16, features] tile of the next projection's A (kernels.norm.rms_norm_shrink) or the GEMM before's
# B (kernels.linear's lora_in_norm)
NORM_MAX_FEATURES = 2048


class LoraWeights(NamedTuple):
    """One projection's adapter stacks and each row's slot: what `kernels.linear` adds to its GEMM."""

    a: torch.Tensor  # [slots + 1, width, K]
    b: torch.Tensor  # [slots + 1, N, width]
    ranks: torch.Tensor  # [slots + 1] int32, each slot's packed rank (slot 0: 0)
    slots: torch.Tensor  # [rows] int64, 0 for a row without an adapter


class LoraDelta(NamedTuple):
    """The expand's operands: the shrink's v [rows, width] and the B stacks, ranks and slots."""

    v: torch.Tensor
    b: torch.Tensor
    ranks: torch.Tensor
    slots: torch.Tensor


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(a, b, UPCAST: tl.constexpr):
        if UPCAST:  # fp32 inputs, or bf16 in the CPU interpreter
            return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        return tl.dot(a, tl.trans(b))

    @triton.jit
    def lora_rows(v_ptr, rm, M, R, stride_v, BLOCK_R: tl.constexpr):
        """The rows rm's v (width R; zero past M): `lora_delta_by_slot`'s operand."""
        rr = tl.arange(0, BLOCK_R)
        return tl.load(v_ptr + rm[:, None] * stride_v + rr[None, :], mask=(rm[:, None] < M) & (rr[None, :] < R),
                       other=0.0)

    @triton.jit
    def lora_spread_rows(v_ptr, slots, rm, R, stride_v, SLOTS_P2: tl.constexpr, BLOCK_R: tl.constexpr):
        """Each row's v (width R) in its own slot's rank columns, zero in the others ([rows, SLOTS_P2 *
        BLOCK_R], column s * BLOCK_R + j = slot s + 1's rank column j; a row of slot 0 all zero):
        `lora_delta`'s operand, read so from memory (built in registers it took 197 of them a thread in
        qkv's GEMM for sm_90, 143 so)."""
        cols = tl.arange(0, SLOTS_P2 * BLOCK_R)
        mine = (slots[:, None] == (cols // BLOCK_R + 1)[None, :]) & (cols % BLOCK_R < R)[None, :]
        return tl.load(v_ptr + rm[:, None] * stride_v + (cols % BLOCK_R)[None, :], mask=mine, other=0.0)

    @triton.jit
    def lora_b(b_ptr, rn, N, R, stride_bs, stride_bn, NUM_SLOTS: tl.constexpr, SLOTS_P2: tl.constexpr,
               BLOCK_R: tl.constexpr):
        """For the columns rn, every slot's B side by side ([columns, SLOTS_P2 * BLOCK_R], column s *
        BLOCK_R + j = slot s + 1's rank column j, R of them): `lora_delta`'s operand, loaded before a
        GEMM's wait. Every slot's, whether or not a row holds it, and all R columns, whatever its
        rank (zeros past it: see the module's docstring)."""
        cols = tl.arange(0, SLOTS_P2 * BLOCK_R)
        col_slot = cols // BLOCK_R + 1
        j = cols % BLOCK_R
        return tl.load(b_ptr + col_slot[None, :] * stride_bs + rn[:, None] * stride_bn + j[None, :],
                       mask=((col_slot <= NUM_SLOTS) & (j < R))[None, :] & (rn[:, None] < N), other=0.0)

    @triton.jit
    def lora_delta(v, b, UPCAST: tl.constexpr):
        """fp32 [rows, columns]: each row's v times its slot's B, as one product over every slot's rank
        columns (`lora_spread_rows`' v, `lora_b`'s B; a row without an adapter has an all-zero v, so
        it gets an exact zero)."""
        return _dot(v, b, UPCAST)

    @triton.jit
    def lora_delta_by_slot(slots, v, b_ptr, rank_ptr, rn, N, stride_bs, stride_bn, NUM_SLOTS: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, UPCAST: tl.constexpr):
        """`lora_delta` as a product per slot, each slot's B read where a row of the tile holds it:
        where the slots' rank columns are too many for one product (ONE_PRODUCT_COLUMNS), and for a
        prefill step's row tiles, which hold one slot or two."""
        rr = tl.arange(0, BLOCK_R)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(1, NUM_SLOTS + 1):
            mine = slots == s
            present = tl.max(mine.to(tl.int32), axis=0) > 0
            b = tl.load(b_ptr + s * stride_bs + rn[:, None] * stride_bn + rr[None, :],
                        mask=present & (rn[:, None] < N) & (rr[None, :] < tl.load(rank_ptr + s)), other=0.0)
            acc += _dot(tl.where(mine[:, None], v, 0.0).to(v.dtype), b, UPCAST)
        return acc

    @triton.jit
    def _shrink_kernel(x_ptr, a_ptr, rank_ptr, slot_ptr, vp_ptr, v_ptr, arrivals_ptr, T, K, R, K_SPLIT, stride_x,
                       stride_as, stride_ar, stride_vs, stride_vp, stride_v, NUM_SLOTS: tl.constexpr,
                       SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                       UPCAST: tl.constexpr, PDL: tl.constexpr):
        """Program (row tile, feature split, slot): x @ A[s].T over the split's features for the
        tile's rows of slot s; v (rounded) once every split of the (tile, slot) is in."""
        s = tl.program_id(2) + 1
        tile = tl.program_id(0)
        rm = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        rr = tl.arange(0, BLOCK_R)
        rk = tl.arange(0, BLOCK_K)
        if PDL:  # x comes from the kernel before
            tl.extra.cuda.gdc_wait()
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
            out = mine[:, None] & (rr[None, :] < R)
            v_ptrs = v_ptr + rm[:, None] * stride_v + rr[None, :]
            if SPLITS == 1:
                tl.store(v_ptrs, acc.to(v_ptr.dtype.element_ty), mask=out)
            else:
                part = rm[:, None] * stride_vp + rr[None, :]
                tl.store(vp_ptr + tl.program_id(1) * stride_vs + part, acc, mask=out)
                tl.debug_barrier()  # every thread's partial is written before the arrival is counted
                counter = arrivals_ptr + tile * NUM_SLOTS + s - 1
                if tl.atomic_add(counter, 1, sem="acq_rel") == SPLITS - 1:
                    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
                    for split in tl.static_range(SPLITS):
                        acc += tl.load(vp_ptr + split * stride_vs + part, mask=out, other=0.0, cache_modifier=".cg")
                    tl.store(v_ptrs, acc.to(v_ptr.dtype.element_ty), mask=out)
                    tl.atomic_xchg(counter, 0)  # ready for the next launch (and graph replay)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def _expand_kernel(v_ptr, b_ptr, rank_ptr, slot_ptr, base_ptr, out_ptr, T, N, R, stride_v, stride_bs, stride_bn,
                       stride_base, stride_o, NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_R: tl.constexpr, UPCAST: tl.constexpr):
        """Program (row tile, output columns): base + each row's delta, rounded once. A prompt's rows
        are consecutive, so a row tile holds one or two slots: a product per slot (`lora_delta`'s
        one product over every slot's columns, tried here too, made a prefill step of 32 adapted
        prompts 1.2-1.7x slower, run b)."""
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        slots = tl.load(slot_ptr + rm, mask=rm < T, other=0)
        v = lora_rows(v_ptr, rm, T, R, stride_v, BLOCK_R)
        acc = lora_delta_by_slot(slots, v, b_ptr, rank_ptr, rn, N, stride_bs, stride_bn, NUM_SLOTS, BLOCK_M, BLOCK_N,
                                 BLOCK_R, UPCAST)
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
    in at most MAX_SPLITS parts."""
    programs = PROGRAMS_PER_SM * (sm_count() if torch.cuda.is_available() else 132)
    splits = max(1, min(programs // (triton.cdiv(rows, BLOCK_M) * slots), MAX_SPLITS, triton.cdiv(k, BLOCK_K)))
    return triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K


def rank_block(width: int) -> int:
    """The rank columns a program holds: the stacks' width, rounded up to a power of two (>= 16)."""
    return max(16, triton.next_power_of_2(width))


def one_product(num_slots: int, width: int) -> bool:
    """Whether the expand takes every slot's rank columns in one product (`lora_delta`): registers
    and shared memory grow with them (8 slots of packed width 192 in one spilled, 32 needed 512 KB
    of shared memory), so past ONE_PRODUCT_COLUMNS a product per slot (`lora_delta_by_slot`)."""
    return triton.next_power_of_2(num_slots) * rank_block(width) <= ONE_PRODUCT_COLUMNS


def shrink(x: torch.Tensor, a: torch.Tensor, ranks: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """v [T, width] = x @ a[s].T per row's slot s, rounded to x's dtype (rows of slot 0: unwritten)."""
    t, k = x.shape
    width, num_slots = a.shape[1], a.shape[0] - 1
    k_split = feature_split(t, k, num_slots)
    splits = triton.cdiv(k, k_split)
    tiles = triton.cdiv(t, BLOCK_M)
    v = torch.empty((t, width), dtype=x.dtype, device=x.device)
    partials = torch.empty((splits, t, width), dtype=torch.float32, device=x.device) if splits > 1 else v
    arrivals = arrival_counters(x.device, tiles * num_slots) if splits > 1 else v
    _shrink_kernel[(tiles, splits, num_slots)](
        x, a, ranks, slots, partials, v, arrivals, t, k, width, k_split, x.stride(0), a.stride(0), a.stride(1),
        partials.stride(0), partials.stride(1), v.stride(0), NUM_SLOTS=num_slots, SPLITS=splits, BLOCK_M=BLOCK_M,
        BLOCK_R=rank_block(width), BLOCK_K=BLOCK_K, UPCAST=x.dtype == torch.float32 or INTERPRET, num_warps=4,
        **pdl_args())
    return v


def lora_add_triton(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ranks: torch.Tensor,
                    slots: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    t, n = out.shape
    base = out if base is None else base
    v = shrink(x, a, ranks, slots)
    _expand_kernel[(triton.cdiv(t, BLOCK_M), triton.cdiv(n, BLOCK_N))](
        v, b, ranks, slots, base, out, t, n, v.shape[1], v.stride(0), b.stride(0), b.stride(1), base.stride(0),
        out.stride(0), NUM_SLOTS=a.shape[0] - 1, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_R=rank_block(a.shape[1]),
        UPCAST=x.dtype == torch.float32 or INTERPRET, num_warps=4)
    return out
