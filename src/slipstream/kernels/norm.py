"""Triton: RMSNorm and LayerNorm over rows of hidden states, one launch, one program per row.

RMSNorm as transformers computes it (normalize in fp32, cast to the input dtype, then scale by
the weight in that dtype): the torch expression `w * F.rms_norm(x.float()).to(dtype)` costs four
kernels, and a Qwen-shape decode step runs 49 norms. LayerNorm as torch computes it (fp32, one
rounding at the end); its own kernel lets it join the step's chain of PDL launches (see
skinny_gemm). An RMSNorm may also finish the GEMM before it (`add_rms_norm`, linear.PendingSum):
x = residual + (sum of the split-K partials + bias), rounded as the GEMM's epilogue rounds, is
written out and normalized in the same program; a LayerNorm may finish a residual add the same
way (`add_layer_norm`, the vision tower's blocks), or a bias add (`pending_layer_norm`: Phi's wide
steps leave their output bias to the next norm)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl_args
from .linear import PendingSum


@triton.jit
def _norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, part_bias_ptr, sum_ptr, rows, D, eps, stride_x, stride_o,
                 RMS: tl.constexpr, SPLITS: tl.constexpr, PART_BIAS: tl.constexpr, BLOCK_D: tl.constexpr,
                 PDL: tl.constexpr):
    """SPLITS > 0 or PART_BIAS: x_ptr holds a residual; the norm is of x = residual + (the sum of the
    SPLITS partials at part_ptr + bias), which is also stored at sum_ptr ([rows, D], contiguous)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    if PDL:  # (see skinny_gemm)
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if SPLITS > 0 or PART_BIAS:  # the GEMM epilogue's sum and roundings (skinny_gemm._epilogue)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s in tl.static_range(SPLITS):
            acc += tl.load(part_ptr + (s * rows + row) * D + cols, mask=ok, other=0.0)
        if PART_BIAS:
            acc += tl.load(part_bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        x = (acc.to(x_ptr.dtype.element_ty).to(tl.float32) + x).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * D + cols, x, mask=ok)
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
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
            out: torch.Tensor | None, pending: PendingSum | None = None, total: torch.Tensor | None = None
            ) -> torch.Tensor:
    rows, d = x.shape
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device) if out is None else out
    block = triton.next_power_of_2(d)
    parts, part_bias = (pending.partials, pending.bias) if pending is not None else (None, None)
    _norm_kernel[(rows,)](x, weight, weight if bias is None else bias, out, x if parts is None else parts,
                          weight if part_bias is None else part_bias, out if total is None else total, rows, d, eps,
                          x.stride(0), out.stride(0),
                          RMS=rms, SPLITS=0 if parts is None else parts.shape[0], PART_BIAS=part_bias is not None,
                          BLOCK_D=block, num_warps=min(8, max(1, block // 256)), **pdl_args())
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    return _launch(x, weight, None, eps, True, out)


def add_rms_norm(pending: PendingSum, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, rms_norm(x)) for x = the pending sum, in one launch."""
    residual = pending.residual
    total = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    return total, _launch(residual, weight, None, eps, True, None, pending, total)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    return _launch(x, weight, bias, eps, False, out)


def add_layer_norm(residual: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, layer_norm(x)) for x = residual + delta (rounded as torch adds), in one launch: one read
    of each, where torch's add then norm reads x again. delta [rows, D] contiguous."""
    return pending_layer_norm(PendingSum(delta[None], None, residual), weight, bias, eps)


def pending_layer_norm(pending: PendingSum, weight: torch.Tensor, bias: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, layer_norm(x)) for x = the pending sum (partials None: residual + bias, rounded as torch
    adds), in one launch."""
    residual = pending.residual
    total = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    return total, _launch(residual, weight, bias, eps, False, None, pending, total)
