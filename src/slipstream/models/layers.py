"""Layers shared by the model families: RMSNorm and (partial) rotary embeddings."""
from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


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
    """cos/sin tables for every position up to max_len. Rotates the first `rotary_dim` features of
    each head (all of them unless the model uses partial rotary, like Phi)."""

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.dim = cfg.rotary_dim
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), rope_inv_freq(cfg))
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions][:, None, :].to(x.dtype)
        sin = self.sin[positions][:, None, :].to(x.dtype)
        rot, rest = x[..., : self.dim], x[..., self.dim:]
        x1, x2 = rot.chunk(2, dim=-1)
        rot = rot * cos + torch.cat([-x2, x1], dim=-1) * sin
        return torch.cat([rot, rest], dim=-1) if rest.shape[-1] else rot
