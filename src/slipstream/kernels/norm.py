"""Triton: RMSNorm and LayerNorm over rows of hidden states, one launch, a program per row (and per 16
rank columns of a LoRA shrink it computes).

RMSNorm as transformers computes it (normalize in fp32, cast to the input dtype, then scale by
the weight in that dtype): the torch expression `w * F.rms_norm(x.float()).to(dtype)` costs four
kernels, and a Qwen-shape decode step runs 49 norms. LayerNorm as torch computes it (fp32, one
rounding at the end); its own kernel lets it join the step's chain of PDL launches (see
skinny_gemm). An RMSNorm may also finish the GEMM before it (`add_rms_norm`, linear.PendingSum):
x = residual + (sum of the split-K partials + bias), rounded as the GEMM's epilogue rounds, is
written out and normalized in the same program; a LayerNorm may finish a residual add the same
way (`add_layer_norm`, the vision tower's blocks), or a bias add (`pending_layer_norm`: Phi's wide
steps leave their output bias to the next norm). In a decode step with adapters an RMSNorm also
takes LoRA's work (kernels.lora): the delta of the GEMM before it, and the shrink of the one after
(`rms_norm_shrink`), so no LoRA kernel of its own launches."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl_args
from .linear import PendingSum
from .lora import LoraDelta, LoraWeights, rank_block


@triton.jit
def _norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, part_bias_ptr, sum_ptr, slot_ptr, sp_ptr, pb_ptr, na_ptr,
                 nrank_ptr, v_ptr, rows, D, SW, PW, NR, eps, stride_x, stride_o, stride_pbs, stride_pbn, stride_nas,
                 stride_nar, stride_v,
                 RMS: tl.constexpr, SPLITS: tl.constexpr, PART_BIAS: tl.constexpr, BLOCK_D: tl.constexpr,
                 PREV_LORA: tl.constexpr, BLOCK_PR: tl.constexpr, NEXT_LORA: tl.constexpr, PDL: tl.constexpr):
    """SPLITS > 0 or PART_BIAS: x_ptr holds a residual; the norm is of x = residual + (the sum of the
    SPLITS partials at part_ptr + bias), which is also stored at sum_ptr ([rows, D], contiguous).
    PREV_LORA: the GEMM that left the partials had an adapter, whose shrink it computed for every
    slot in tiles of its grid (linear.LoraShrunk: [SPLITS, rows, SW] fp32 at sp_ptr, the slots' PW
    rank columns side by side): the row's slot's columns, summed in split order and rounded, times
    the slot's B is the delta that joins the sum before the bias. B is loaded before the wait, beside
    the GEMM's main loop (which triggers this launch right after its own wait, `skinny_gemm`'s
    EARLY_DEPENDENTS).
    NEXT_LORA: the shrink of the projection after the norm, v = out @ A[slot].T (rounded), into
    v_ptr: the GEMM then only expands (kernels.lora.LoraDelta). Program (row, c) computes its 16 rank
    columns from c * 16 on, its A tile loaded before the wait; each program normalizes the row, the
    first stores it (a row's shrink in one program ran its tiles one after another: ~8 µs a norm
    against 1.5 on the H200)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    first = chunk == 0
    if PREV_LORA or NEXT_LORA:
        slot = tl.load(slot_ptr + row)
    if NEXT_LORA:
        nrank = tl.load(nrank_ptr + slot)
        rr = chunk * 16 + tl.arange(0, 16)
        a = tl.load(na_ptr + slot * stride_nas + rr[:, None] * stride_nar + cols[None, :],
                    mask=(rr[:, None] < nrank) & ok[None, :], other=0.0)
    if PREV_LORA:  # (B, a constant of the step: before the wait, while the GEMM before runs)
        pr = tl.arange(0, BLOCK_PR)
        # (all PW rank columns whatever the slot's rank, and slot 0's: the bank keeps what no adapter
        # fills at zero, and masks of constants leave the loads 16 bytes wide; kernels.lora.lora_b)
        pb = tl.load(pb_ptr + slot * stride_pbs + cols[None, :] * stride_pbn + pr[:, None],
                     mask=(pr[:, None] < PW) & ok[None, :], other=0.0)
    if PDL:  # (see skinny_gemm)
        tl.extra.cuda.gdc_wait()
    if PREV_LORA:
        v = tl.zeros([BLOCK_PR], tl.float32)
        for s in tl.static_range(SPLITS):
            v += tl.load(sp_ptr + (s * rows + row) * SW + (slot - 1) * PW + pr, mask=(pr < PW) & (slot > 0),
                         other=0.0)
        v = v.to(x_ptr.dtype.element_ty).to(tl.float32)  # (rounded as kernels.lora's reference rounds it)
        delta = tl.sum(pb.to(tl.float32) * v[:, None], axis=0)
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if SPLITS > 0 or PART_BIAS:  # the GEMM epilogue's sum and roundings (skinny_gemm._epilogue)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s in tl.static_range(SPLITS):
            acc += tl.load(part_ptr + (s * rows + row) * D + cols, mask=ok, other=0.0)
        if PREV_LORA:
            acc += delta
        if PART_BIAS:
            acc += tl.load(part_bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        x = (acc.to(x_ptr.dtype.element_ty).to(tl.float32) + x).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * D + cols, x, mask=ok & first)
        x = x.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if RMS:
        normed = x * tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
        y = w * normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        centered = tl.where(ok, x - tl.sum(x, axis=0) / D, 0.0)
        normed = centered * tl.rsqrt(tl.sum(centered * centered, axis=0) / D + eps)
        y = normed * w + tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    y = y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, y, mask=ok & first)
    if NEXT_LORA:
        v = tl.sum(a.to(tl.float32) * y.to(tl.float32)[None, :], axis=1)
        tl.store(v_ptr + row * stride_v + rr, v.to(v_ptr.dtype.element_ty), mask=rr < NR)


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
            out: torch.Tensor | None, pending: PendingSum | None = None, total: torch.Tensor | None = None,
            shrink: LoraWeights | None = None) -> tuple[torch.Tensor, LoraDelta | None]:
    rows, d = x.shape
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device) if out is None else out
    block = triton.next_power_of_2(d)
    parts, part_bias = (pending.partials, pending.bias) if pending is not None else (None, None)
    prev = pending.lora if pending is not None else None
    sp, pb = (prev.parts, prev.weights.b) if prev is not None else (x, x[None])
    assert prev is None or sp.shape[:2] == parts.shape[:2], "the shrink's partials are its GEMM's"
    slots = prev.weights.slots if prev is not None else shrink.slots if shrink is not None else x
    na, _, nrank, _ = shrink if shrink is not None else (x[None], None, x, None)
    v = torch.empty((rows, na.shape[1]), dtype=x.dtype, device=x.device) if shrink is not None else x
    # (an RMSNorm runs twice the warps, with or without an adapter's tiles, which need the registers:
    # its reductions follow the warps, so a row without an adapter stays the plain norm's bit for bit)
    grid = (rows, triton.cdiv(na.shape[1], 16) if shrink is not None else 1)
    _norm_kernel[grid](x, weight, weight if bias is None else bias, out, x if parts is None else parts,
                       weight if part_bias is None else part_bias, out if total is None else total, slots,
                       sp, pb, na, nrank, v, rows, d, sp.shape[-1], pb.shape[2], na.shape[1], eps, x.stride(0),
                       out.stride(0), pb.stride(0), pb.stride(1), na.stride(0), na.stride(1), v.stride(0),
                       RMS=rms, SPLITS=0 if parts is None else parts.shape[0], PART_BIAS=part_bias is not None,
                       BLOCK_D=block, PREV_LORA=prev is not None,
                       BLOCK_PR=rank_block(pb.shape[2]) if prev is not None else 16, NEXT_LORA=shrink is not None,
                       num_warps=min(8, max(1, block // 256)) * (2 if rms else 1), **pdl_args())
    delta = None if shrink is None else LoraDelta(v, shrink.b, shrink.ranks, shrink.slots[:rows])
    return out, delta


def _launch_pending(pending: PendingSum, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
                    shrink: LoraWeights | None = None) -> tuple[torch.Tensor, torch.Tensor, LoraDelta | None]:
    """(x, norm(x), the shrink's LoraDelta or None) for x = the pending sum, written out by the norm."""
    residual = pending.residual
    total = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    return (total, *_launch(residual, weight, bias, eps, rms, None, pending, total, shrink))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    return _launch(x, weight, None, eps, True, out)[0]


def add_rms_norm(pending: PendingSum, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, rms_norm(x)) for x = the pending sum, in one launch."""
    total, normed, _ = _launch_pending(pending, weight, None, eps, True)
    return total, normed


def rms_norm_shrink(x: torch.Tensor | PendingSum, weight: torch.Tensor, eps: float,
                    shrink: LoraWeights) -> tuple[torch.Tensor, torch.Tensor, LoraDelta]:
    """(x, rms_norm(x), the next projection's LoraDelta) for x a tensor or a pending sum: the norm's
    program also computes each row's v for the adapter after it (kernels.lora's shrink, no launch of
    its own; the GEMM after expands)."""
    if not isinstance(x, PendingSum):
        return (x, *_launch(x, weight, None, eps, True, None, shrink=shrink))
    return _launch_pending(x, weight, None, eps, True, shrink)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    return _launch(x, weight, bias, eps, False, out)[0]


def add_layer_norm(residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, layer_norm(x)) for x = residual + delta (rounded as torch adds), in one launch: one read
    of each, where torch's add then norm reads x again. delta [rows, D] contiguous."""
    return pending_layer_norm(PendingSum(delta[None], None, residual), weight, bias, eps)


def pending_layer_norm(pending: PendingSum, weight: torch.Tensor, bias: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, layer_norm(x)) for x = the pending sum (partials None: residual + bias, rounded as torch
    adds), in one launch."""
    total, normed, _ = _launch_pending(pending, weight, bias, eps, False)
    return total, normed
