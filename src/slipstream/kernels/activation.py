"""Triton: the activations after the GEMMs cuBLAS runs in prefill steps, each one pass rounded as
torch rounds. SwiGLU over a GEMM's output whose columns interleave gate and up ([g0, u0, g1, u1,
...], linear.interleave_gate_up): in torch the interleaved pairs are strided views, and silu(gate) *
up takes two passes of torch's slow strided kernel (a quarter of a 2048-token Qwen step on the
H200). GELU over the trailing columns of Phi's [qkv; fc1] GEMM into the layer's shared activation
buffer: in torch a bias copy into the strided buffer, the GELU of a strided view and its copy back
(a quarter of an 864-token Phi step)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl_args
from .skinny_gemm import ACTIVATIONS, _gelu

BLOCK = 1024  # output columns per program


@triton.jit
def _swiglu_kernel(y_ptr, out_ptr, N, stride_y, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    pair = (2 * cols)[:, None] + tl.arange(0, 2)[None, :]
    if PDL:
        tl.extra.cuda.gdc_wait()
    gate_up = tl.load(y_ptr + row * stride_y + pair, mask=ok[:, None], other=0.0).to(tl.float32)
    gate, up = tl.split(gate_up)
    dtype = out_ptr.dtype.element_ty
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + row * stride_o + cols, (silu * up).to(dtype), mask=ok)


def swiglu(y: torch.Tensor) -> torch.Tensor:
    """y [rows, 2N] (interleaved gate and up; rows may be strided) -> silu(gate) * up [rows, N]."""
    rows, n2 = y.shape
    out = torch.empty((rows, n2 // 2), dtype=y.dtype, device=y.device)
    _swiglu_kernel[(rows, triton.cdiv(n2 // 2, BLOCK))](y, out, n2 // 2, y.stride(0), out.stride(0), BLOCK=BLOCK,
                                                       num_warps=4, **pdl_args())
    return out


@triton.jit
def _gelu_columns_kernel(y_ptr, out_ptr, N, ACT_FROM, stride_y, stride_o, ACT: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    if PDL:
        tl.extra.cuda.gdc_wait()
    y = tl.load(y_ptr + row * stride_y + cols, mask=ok, other=0.0)
    act = _gelu(y.to(tl.float32), ACT).to(y.dtype)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + row * stride_o + cols, tl.where(cols >= ACT_FROM, act, y).to(out_ptr.dtype.element_ty),
             mask=ok)


def gelu_columns(y: torch.Tensor, act: str, act_from: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """y [rows, N] -> [rows, N] (into `out`, which may be a strided view, when given): the columns
    from `act_from` on through GELU (`act` "gelu" or "gelu_tanh"), the others as they are."""
    rows, n = y.shape
    out = torch.empty_like(y) if out is None else out
    _gelu_columns_kernel[(rows, triton.cdiv(n, BLOCK))](y, out, n, act_from, y.stride(0), out.stride(0),
                                                        ACT=ACTIVATIONS[act], BLOCK=BLOCK, num_warps=4, **pdl_args())
    return out
