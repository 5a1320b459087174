"""The models' linear layer with its neighbours fused: `act(glu(x) @ W.T + bias) + residual`.

Decode steps on CUDA (at most MAX_ROWS rows) run the Triton skinny GEMM, one launch
with the prologue and epilogue inside; everything else (prefill, the CPU) runs the torch reference,
whose roundings the kernel reproduces."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import HAS_TRITON

MAX_ROWS = 64  # decode batches up to this size run the skinny GEMM


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None,
                     residual: torch.Tensor | None = None, glu: bool = False, out_dtype: torch.dtype | None = None,
                     act_from: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
    if glu:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    y = F.linear(x, weight, bias)
    if act is not None:
        gelu = F.gelu(y[:, act_from:], approximate="tanh" if act == "gelu_tanh" else "none")
        y = torch.cat([y[:, :act_from], gelu], dim=1) if act_from else gelu
    if residual is not None:
        y = y + residual
    if out is not None:
        return out.copy_(y)
    return y if out_dtype is None else y.to(out_dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None,
           residual: torch.Tensor | None = None, glu: bool = False, out_dtype: torch.dtype | None = None,
           act_from: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, K] (or [rows, 2K] with `glu`: silu of the first half times the second) -> [rows, N].
    `act` (None, "gelu_tanh" or "gelu") applies to the output columns from `act_from` on;
    `residual` [rows, N] is added last; `out` (a view, e.g. columns of a wider buffer) receives it."""
    if HAS_TRITON and x.is_cuda and x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.stride(-1) == 1:
        from .skinny_gemm import skinny_linear

        return skinny_linear(x, weight, bias, act, residual, glu, out_dtype, act_from, out)
    return linear_reference(x, weight, bias, act, residual, glu, out_dtype, act_from, out)

