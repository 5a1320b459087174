"""Phi-1.5 (PhiForCausalLM), Moondream 2's text decoder: LayerNorm, attention and MLP in parallel
off one normalized input, partial rotary, biases everywhere, an untied LM head with a bias."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.attention import AttentionInputs
from .config import ModelConfig
from .llama import Attention, CausalLM


class PhiMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.approximate = "none" if cfg.hidden_act == "gelu" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class PhiDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, out_name="dense")
        self.mlp = PhiMLP(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attn: AttentionInputs,
                pages: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h = self.input_layernorm(x)
        return x + self.self_attn(h, rope, attn, pages) + self.mlp(h)


class PhiBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(PhiDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.final_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)


class PhiForCausalLM(CausalLM):
    final_norm = "final_layernorm"

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.model = PhiBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size)
