"""Triton: RMSNorm as transformers computes it (normalize in fp32, cast to the input dtype, then
scale by the weight in that dtype) in one launch, one program per row. The torch expression
`w * F.rms_norm(x.float()).to(dtype)` costs four kernels; a Qwen-shape decode step runs 49 norms."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, stride_x, stride_o, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    rows, d = x.shape
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device) if out is None else out
    block = triton.next_power_of_2(d)
    _rms_norm_kernel[(rows,)](x, weight, out, d, eps, x.stride(0), out.stride(0), BLOCK_D=block,
                              num_warps=min(8, max(1, block // 256)))
    return out
