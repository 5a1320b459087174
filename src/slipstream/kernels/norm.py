"""Triton: RMSNorm and LayerNorm over rows of hidden states, one launch, one program per row.

RMSNorm as transformers computes it (normalize in fp32, cast to the input dtype, then scale by
the weight in that dtype): the torch expression `w * F.rms_norm(x.float()).to(dtype)` costs four
kernels, and a Qwen-shape decode step runs 49 norms. LayerNorm as torch computes it (fp32, one
rounding at the end); its own kernel lets it join the step's chain of PDL launches (see
skinny_gemm)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl_args


@triton.jit
def _norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, D, eps, stride_x, stride_o, RMS: tl.constexpr, BLOCK_D: tl.constexpr,
                 PDL: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    if PDL:  # (see skinny_gemm)
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
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
            out: torch.Tensor | None) -> torch.Tensor:
    rows, d = x.shape
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device) if out is None else out
    block = triton.next_power_of_2(d)
    _norm_kernel[(rows,)](x, weight, weight if bias is None else bias, out, d, eps, x.stride(0), out.stride(0),
                          RMS=rms, BLOCK_D=block, num_warps=min(8, max(1, block // 256)), **pdl_args())
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    return _launch(x, weight, None, eps, True, out)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    return _launch(x, weight, bias, eps, False, out)
