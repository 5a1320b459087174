"""The models' linear layer with its neighbours fused: `act(x @ W.T + bias) + residual`.

Decode steps on CUDA (at most MAX_ROWS rows) run the Triton skinny GEMM, one launch with the
epilogue inside; everything else (longer prefill steps, the CPU) runs the torch reference, whose
roundings the kernel reproduces (on CUDA with the activation in a kernel of its own after cuBLAS,
kernels.activation)."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import triton_rows
from .lora import NORM_MAX_FEATURES, LoraDelta, LoraWeights

MAX_ROWS = 64  # decode batches up to this size run the skinny GEMM


class LoraShrunk(NamedTuple):
    """A deferred GEMM's adapters, whose shrink that GEMM's grid computed for every slot
    (`skinny_linear`'s `shrink`; `parts` [splits, rows, slots * width] fp32): the RMSNorm finishing
    its sum sums each row's slot's columns, rounds v and adds the delta."""

    parts: torch.Tensor
    weights: LoraWeights


class PendingSum(NamedTuple):
    """`residual + (x @ W.T + bias)` whose GEMM left its split-K partials unsummed: the next kernel,
    an RMSNorm that reads whole rows anyway, sums them in split order (as the GEMM's own fix-up
    would, so the bits are the same) and writes the residual stream beside the norm. The GEMM then
    ends at its main loop: no arrival counter, no reload of the partials, no residual read. Without
    partials, `residual + bias`: Phi's wide steps leave their output bias to the next LayerNorm,
    which saves a pass over the residual stream a layer (models/phi.py)."""

    partials: torch.Tensor | None  # [splits, rows, N] fp32
    bias: torch.Tensor | None
    residual: torch.Tensor
    lora: LoraShrunk | None = None  # the GEMM's adapter, whose delta is to be added too


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None,
                     residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, act_from: int = 0,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    if out is not None and act != "swiglu" and out.dtype == x.dtype:  # the GEMM writes `out` (a view) itself
        y = torch.addmm(bias, x, weight.t(), out=out) if bias is not None else torch.mm(x, weight.t(), out=out)
    else:
        y = F.linear(x, weight, bias)
    if act is not None:
        y = _activate_reference(y, act, act_from)
    if residual is not None:
        y = y.add_(residual) if y.dtype == residual.dtype else y + residual
    if out is not None:
        return y if y is out else out.copy_(y)
    return y if out_dtype is None else y.to(out_dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None,
           residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, act_from: int = 0,
           out: torch.Tensor | None = None, defer: bool = False,
           lora: LoraWeights | LoraDelta | None = None, lora_in_norm: bool = False) -> torch.Tensor | PendingSum:
    """x [rows, K] -> [rows, N]. `act`: None; "gelu_tanh" or "gelu", applied to the output columns
    from `act_from` on; or "swiglu", for weight rows interleaving gate and up (see
    `interleave_gate_up`), giving [rows, N / 2]. `residual` is added last; `out` (a view, e.g.
    columns of a wider buffer) receives the result. `defer` (with a residual, which the caller
    then gives up): where the skinny GEMM runs, a PendingSum for the next RMSNorm to finish; on a
    wider CUDA step without a bias, cuBLAS accumulates onto the residual in place (beta = 1), which
    saves an add's pass over the output (two a layer: 0.08 ms of a 544-token Qwen2.5-0.5B step).
    `lora`: each row's adapter delta goes in before the activation (and the residual); a LoraDelta
    (v already computed by the norm before: kernels.norm.rms_norm_shrink) only where the skinny GEMM
    runs. `lora_in_norm` (with `defer`, where the skinny GEMM runs): the GEMM computes the shrink
    in column tiles of its own grid and leaves the delta to the RMSNorm that finishes the sum (an
    output row must fit that norm's program: LoraShrunk)."""
    if triton_rows(x) and x.shape[0] <= MAX_ROWS:
        from .skinny_gemm import grid_can_shrink, skinny_linear

        if (defer and lora_in_norm and isinstance(lora, LoraWeights) and weight.shape[0] <= NORM_MAX_FEATURES
                and grid_can_shrink(weight, lora)):
            partials, parts = skinny_linear(x, weight, defer=True, early_dependents=True, shrink=lora)
            return PendingSum(partials, bias, residual,
                              LoraShrunk(parts, lora._replace(slots=lora.slots[: x.shape[0]])))
        delta = lora
        if isinstance(lora, LoraWeights):  # (the shrink's own launch; the expand inside the GEMM's epilogue)
            from .lora import shrink

            slots = lora.slots[: x.shape[0]]
            delta = LoraDelta(shrink(x, lora.a, lora.ranks, slots), lora.b, lora.ranks, slots)
        if defer:
            assert residual is not None and act is None and out is None and out_dtype is None
            return PendingSum(skinny_linear(x, weight, defer=True, lora=delta), bias, residual)
        return skinny_linear(x, weight, bias, act, residual, out_dtype, act_from, out, lora=delta)
    assert not isinstance(lora, LoraDelta), "a LoraDelta is only for the skinny GEMM's rows"
    if lora is not None:
        return _linear_with_lora(x, weight, bias, act, residual, out_dtype, act_from, out, defer, lora)
    if defer and triton_rows(x) and bias is None and residual.is_contiguous():
        return residual.addmm_(x, weight.t())
    if act == "swiglu" and triton_rows(x):  # a prefill step on CUDA: cuBLAS, then SwiGLU in one pass
        from .activation import swiglu

        assert residual is None and out is None and out_dtype is None
        return swiglu(F.linear(x, weight, bias))
    if act in ("gelu", "gelu_tanh") and triton_rows(x) and residual is None and out_dtype is None:
        from .activation import gelu_columns  # (Phi's [qkv; fc1] GEMM into its layer's shared buffer)

        return gelu_columns(F.linear(x, weight, bias), act, act_from, out)
    return linear_reference(x, weight, bias, act, residual, out_dtype, act_from, out)


def _linear_with_lora(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None,
                      residual: torch.Tensor | None, out_dtype: torch.dtype | None, act_from: int,
                      out: torch.Tensor | None, defer: bool, lora: LoraWeights) -> torch.Tensor | PendingSum:
    """`linear` with adapters where the skinny GEMM does not run (prefill steps, the CPU): the
    GEMM, then the LoRA kernels (or their reference), then the activation apart; with a residual,
    the delta goes onto the residual first."""
    from .lora import lora_add

    slots = lora.slots[: x.shape[0]]
    if residual is not None:
        assert act is None, "an adapted projection with a residual has no activation"
        residual = lora_add(torch.empty_like(residual), x, lora.a, lora.b, lora.ranks, slots, base=residual)
        return linear(x, weight, bias, None, residual, out_dtype, act_from, out, defer)
    y = linear(x, weight, bias, out_dtype=out_dtype, out=out)
    lora_add(y, x, lora.a, lora.b, lora.ranks, slots)
    return activate(y, act, act_from) if act is not None else y


def activate(y: torch.Tensor, act: str, act_from: int = 0) -> torch.Tensor:
    """The activation `linear` fuses, on its own, after something was added to the GEMM's output
    (a LoRA delta): "swiglu" gives a new [rows, N / 2]; GELU runs in place on the columns from
    `act_from` on and returns y."""
    if triton_rows(y):
        from .activation import gelu_columns, swiglu

        return swiglu(y) if act == "swiglu" else gelu_columns(y, act, act_from, out=y)
    return _activate_reference(y, act, act_from)


def _activate_reference(y: torch.Tensor, act: str, act_from: int) -> torch.Tensor:
    if act == "swiglu":
        gate, up = y.unflatten(-1, (-1, 2)).unbind(-1)
        return F.silu(gate) * up
    tail = y[:, act_from:]  # (in place on the GEMM's output: no copy of the columns before act_from)
    tail.copy_(F.gelu(tail, approximate="tanh" if act == "gelu_tanh" else "none"))
    return y


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows [g0, u0, g1, u1, ...]: every output tile of the GEMM then holds matching gate and up
    features, so SwiGLU runs in its epilogue."""
    return torch.stack([gate, up], dim=1).flatten(0, 1)
