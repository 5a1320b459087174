"""Triton: LayerNorm over rows of hidden states, as torch computes it (fp32, one rounding at the
end), one program per row. torch's own kernel does the same work; this one exists so Phi's norms
join the step's chain of PDL launches (see skinny_gemm). RMSNorm needs no kernel of its own: it
runs inside the next GEMM."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl_args


@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, D, eps, stride_x, stride_o, BLOCK_D: tl.constexpr,
                       PDL: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    if PDL:  # (see skinny_gemm)
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    centered = tl.where(ok, x - tl.sum(x, axis=0) / D, 0.0)
    normed = centered * tl.rsqrt(tl.sum(centered * centered, axis=0) / D + eps)
    y = normed * tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32) + tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, D] (rows may be strided, features contiguous) -> [rows, D] in x's dtype."""
    rows, d = x.shape
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device) if out is None else out
    block = triton.next_power_of_2(d)
    _layer_norm_kernel[(rows,)](x, weight, bias, out, d, eps, x.stride(0), out.stride(0), BLOCK_D=block,
                                num_warps=min(8, max(1, block // 256)), **pdl_args())
    return out
