"""Layers shared by the model families: RMSNorm and (partial) rotary embeddings."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import triton_rows
from ..kernels.attention import Rope
from ..kernels.linear import MAX_ROWS, PendingSum
from ..kernels.lora import NORM_MAX_FEATURES
from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As transformers computes it: normalize in fp32, cast back, then scale."""
        if triton_rows(x):
            from ..kernels.norm import rms_norm

            return rms_norm(x, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def add(self, x: torch.Tensor | PendingSum, lora=None,
            target: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, norm(x)) for a residual stream that may still be a GEMM's PendingSum (decode steps on
        CUDA), which the norm's kernel then sums first (with the GEMM's adapter delta, if it left
        one). With `lora` (a layer's LayerLora) where the skinny GEMM runs next, the norm's kernel
        also computes the shrink of the `target` projection after it (LayerLora.shrunk)."""
        rows = x.residual if isinstance(x, PendingSum) else x
        if lora is not None and triton_rows(rows) and rows.shape[0] <= MAX_ROWS and rows.shape[1] <= NORM_MAX_FEATURES:
            from ..kernels.norm import rms_norm_shrink

            x, normed, lora.shrunk[target] = rms_norm_shrink(x, self.weight, self.eps, lora[target])
            return x, normed
        if isinstance(x, PendingSum):
            from ..kernels.norm import add_rms_norm

            return add_rms_norm(x, self.weight, self.eps)
        return x, self(x)


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton_rows(x):
            from ..kernels.norm import layer_norm

            return layer_norm(x, self.weight, self.bias, self.eps)
        return super().forward(x)

    def add(self, x: torch.Tensor | PendingSum, delta: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, norm(x + delta)), one launch on CUDA; x may be a PendingSum without partials
        (residual + bias: a Phi layer's wide step, whose output bias is added here)."""
        if isinstance(x, PendingSum):
            assert x.partials is None and delta is None
            if triton_rows(x.residual):
                from ..kernels.norm import pending_layer_norm

                return pending_layer_norm(x, self.weight, self.bias, self.eps)
            x, delta = x.residual, x.bias
        if delta is None:
            return x, self(x)
        if triton_rows(x) and delta.is_contiguous():
            from ..kernels.norm import add_layer_norm

            return add_layer_norm(x, delta, self.weight, self.bias, self.eps)
        x = x + delta
        return x, self(x)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    dim = cfg.rotary_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope scaling type {kind!r}; slipstream supports default, linear, llama3")


class Rotary(nn.Module):
    """cos/sin tables for every position up to max_len, handed to each forward's attention with its
    positions (`table`) and applied to the first `rotary_dim` features of each head (all of them
    unless the model uses partial rotary, like Phi)."""

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.dim = cfg.rotary_dim
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), rope_inv_freq(cfg))
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        return Rope(self.cos, self.sin, positions, dtype)


def frozen_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An inference-only Linear holding the given tensors (the fused projections built after loading)."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def fuse_linears(*linears: nn.Linear) -> nn.Linear:
    """One Linear computing the given ones side by side (one GEMM instead of several)."""
    bias = torch.cat([m.bias for m in linears]) if linears[0].bias is not None else None
    return frozen_linear(torch.cat([m.weight for m in linears]), bias)
