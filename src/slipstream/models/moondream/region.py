"""The region module (spec §1.4, §6): decoders from a step's hidden state (before the final norm)
to coordinate and size bins, and encoders from a value to the next step's input embedding.

Everything runs in the model's dtype, as the reference does: a coordinate is bin/1024, cast to the
dtype before it is re-encoded; a size is 2^(10*bin/1023 - 10), computed in fp32, then cast."""
from __future__ import annotations

import math

import torch
from torch import nn

from .config import RegionConfig
from .vision import MLP

COORD_BINS = 1024


def fourier(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    f = 2 * math.pi * x @ freqs
    return torch.cat([f.cos(), f.sin()], dim=-1)


def coord_value(bins: torch.Tensor) -> torch.Tensor:
    return bins.float() / COORD_BINS


def size_value(bins: torch.Tensor) -> torch.Tensor:
    return torch.pow(2.0, 10 * bins.float() / (COORD_BINS - 1) - 10)


class RegionModel(nn.Module):
    def __init__(self, cfg: RegionConfig) -> None:
        super().__init__()
        self.coord_features = nn.Parameter(torch.zeros(1, cfg.coord_feat_dim // 2))
        self.coord_encoder = nn.Linear(cfg.coord_feat_dim, cfg.dim)
        self.coord_decoder = MLP(cfg.dim, cfg.inner_dim, cfg.coord_out_dim)
        self.size_features = nn.Parameter(torch.zeros(2, cfg.size_feat_dim // 2))
        self.size_encoder = nn.Linear(cfg.size_feat_dim, cfg.dim)
        self.size_decoder = MLP(cfg.dim, cfg.inner_dim, cfg.size_out_dim)

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [n, dim] -> bins [n, 3]: the coordinate's, then the width's and the height's."""
        coord = self.coord_decoder(hidden).argmax(dim=-1)
        size = self.size_decoder(hidden).view(-1, 2, COORD_BINS).argmax(dim=-1)
        return torch.cat([coord[:, None], size], dim=1)

    def encode_coord(self, bins: torch.Tensor) -> torch.Tensor:
        dtype = self.coord_encoder.weight.dtype
        return self.coord_encoder(fourier(coord_value(bins).to(dtype)[:, None], self.coord_features))

    def encode_size(self, bins: torch.Tensor) -> torch.Tensor:
        dtype = self.size_encoder.weight.dtype
        return self.size_encoder(fourier(size_value(bins).to(dtype), self.size_features))
