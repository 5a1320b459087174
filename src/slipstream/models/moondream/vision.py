"""The vision tower (spec §1.1-1.2, §3.7-3.10): a SigLIP-like ViT over all crops of a batch of images
in one forward, then per image the stitch of its local tiles, adaptive pooling to 27x27, and the
projection of [global | pooled] features to the text width: 729 embeddings an image, on the device.

Parameter names are the checkpoint's, after `model.vision.`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import LayerNorm
from .config import IMAGE_TOKENS, VisionConfig


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    def __init__(self, dim: int, inner: int, out: int, fuse_gelu: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, inner)
        self.fc2 = nn.Linear(inner, out)
        self.fuse_gelu = fuse_gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, dim]. With fuse_gelu on CUDA the GELU is the GEMM's epilogue (cuBLASLt's, the tanh
        form, on the fp32 accumulator: one rounding fewer than the reference's): the [rows, inner]
        activation is written once, not written, read and written again."""
        if self.fuse_gelu and x.is_cuda:
            h = torch._addmm_activation(self.fc1.bias, x, self.fc1.weight.t(), use_gelu=True)
        else:
            h = gelu_tanh(self.fc1(x))
        return self.fc2(h)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [crops * 729, dim]: attention within each crop."""
        rows, d = x.shape
        q, k, v = self.qkv(x).view(-1, IMAGE_TOKENS, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(rows, d))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.ln1 = LayerNorm(cfg.enc_dim, eps=1e-5)
        self.attn = VisionAttention(cfg.enc_dim, cfg.enc_n_heads)
        self.ln2 = LayerNorm(cfg.enc_dim, eps=1e-5)
        self.mlp = MLP(cfg.enc_dim, cfg.enc_ff_dim, cfg.enc_dim, fuse_gelu=True)

    def forward(self, x: torch.Tensor, normed: torch.Tensor, next_norm: LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, ln1(x)) -> (x', next_norm(x')): each residual add is done by the norm after it, in
        one launch on CUDA (the next block's ln1, or the tower's post_ln)."""
        x, normed = self.ln2.add(x, self.attn(normed))
        return next_norm.add(x, self.mlp(normed))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        patch = cfg.in_channels * cfg.enc_patch_size ** 2
        self.patch_emb = nn.Linear(patch, cfg.enc_dim)
        self.pos_emb = nn.Parameter(torch.zeros(1, IMAGE_TOKENS, cfg.enc_dim))
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.enc_n_layers))
        self.post_ln = LayerNorm(cfg.enc_dim, eps=1e-5)
        self.proj_mlp = MLP(2 * cfg.enc_dim, cfg.proj_inner_dim, cfg.proj_out_dim, fuse_gelu=True)

    def normalize(self, crops: torch.Tensor) -> torch.Tensor:
        """uint8 crops -> (u/255 - 0.5)/0.5, computed in bf16 as the reference does, then the model dtype."""
        x = crops.to(torch.bfloat16) / 255
        return ((x - 0.5) / 0.5).to(self.patch_emb.weight.dtype)

    def encode(self, crops: torch.Tensor) -> torch.Tensor:
        """Normalised crops [n, 3, C, C] -> features [n, 729, enc_dim]. A patch's vector is
        channel-major: index c * p^2 + py * p + px."""
        n, ch, size, _ = crops.shape
        p, g = self.cfg.enc_patch_size, self.cfg.grid
        patches = crops.view(n, ch, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(n, g * g, ch * p * p)
        x = (self.patch_emb(patches) + self.pos_emb).view(n * g * g, -1)
        normed = self.blocks[0].ln1(x)
        for i, block in enumerate(self.blocks):
            x, normed = block(x, normed, self.blocks[i + 1].ln1 if i + 1 < len(self.blocks) else self.post_ln)
        return normed.view(n, g * g, -1)

    def reconstruct(self, features: torch.Tensor, tiling: tuple[int, int]) -> torch.Tensor:
        """One image's crop features [1 + th*tw, 729, E] -> [729, 2E]: the global crop's features beside
        its local tiles stitched (each drops the `overlap_margin` cells it shares with a neighbour) and
        pooled back to 27x27 with adaptive average pooling."""
        th, tw = tiling
        g, m, e = self.cfg.grid, self.cfg.overlap_margin, features.shape[-1]
        window = g - 2 * m
        local = features[1:].view(th, tw, g, g, e)
        grid = features.new_empty(window * th + 2 * m, window * tw + 2 * m, e)
        for i in range(th):
            r0, r1 = (0 if i == 0 else m), (g if i == th - 1 else g - m)
            for j in range(tw):
                c0, c1 = (0 if j == 0 else m), (g if j == tw - 1 else g - m)
                grid[window * i + r0:window * i + r1, window * j + c0:window * j + c1] = local[i, j, r0:r1, c0:c1]
        pooled = F.adaptive_avg_pool2d(grid.permute(2, 0, 1), (g, g)).permute(1, 2, 0).reshape(g * g, e)
        return torch.cat([features[0], pooled], dim=-1)

    def forward(self, crops: torch.Tensor, tilings: list[tuple[int, int]]) -> torch.Tensor:
        """uint8 crops of several images (concatenated, in order) and their tilings -> image
        embeddings [images, 729, text dim]: one encoder forward for all crops."""
        features = self.encode(self.normalize(crops))
        parts, start = [], 0
        for th, tw in tilings:
            parts.append(self.reconstruct(features[start:start + 1 + th * tw], (th, tw)))
            start += 1 + th * tw
        joined = torch.stack(parts)
        return self.proj_mlp(joined.view(-1, joined.shape[-1])).view(len(tilings), IMAGE_TOKENS, -1)
