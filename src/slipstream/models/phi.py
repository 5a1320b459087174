"""Phi-1.5 (PhiForCausalLM), Moondream 2's text decoder: LayerNorm, attention and MLP in parallel
off one normalized input, partial rotary, biases everywhere, an untied LM head with a bias."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.attention import AttentionInputs, Rope
from ..kernels.linear import MAX_ROWS, PendingSum, linear
from ..lora.targets import ALL, LoraTarget, Part
from .config import ModelConfig
from .layers import LayerNorm, frozen_linear, fuse_linears
from .llama import Attention, CausalLM


class PhiMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)


class PhiDecoderLayer(nn.Module):
    """Attention and MLP read the same normalized input and their outputs are summed, so after
    `fuse` a layer is two GEMMs around the attention: `in_proj` = [q; k; v; fc1] (GELU on the fc1
    columns) and `out_proj` = [fc2 | dense] over the concatenated [gelu(fc1) | attention] features
    (biases summed, residual added in its epilogue). They share one activation buffer,
    [qkv | gelu(fc1) | attention], which each kernel writes in place. Steps of more rows than the
    skinny GEMM serves split both GEMMs instead (`_forward_wide`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, out_name="dense")
        self.mlp = PhiMLP(cfg)
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.act = "gelu" if cfg.hidden_act == "gelu" else "gelu_tanh"
        self.qkv_width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.mlp_width = cfg.intermediate_size

    def fuse(self) -> None:
        a, m = self.self_attn, self.mlp
        self.in_proj = fuse_linears(a.q_proj, a.k_proj, a.v_proj, m.fc1)
        self.out_proj = frozen_linear(torch.cat([m.fc2.weight, a.dense.weight], dim=1), m.fc2.bias + a.dense.bias)
        del a.q_proj, a.k_proj, a.v_proj, a.dense, self.mlp

    def lora_targets(self) -> dict[str, LoraTarget]:
        """HF Phi's module names, and Moondream's (`attn.qkv`, `attn.proj`) for the same parts."""
        a, qkv, inter = self.self_attn, self.qkv_width, self.mlp_width
        q, kv, d = a.h * a.d, a.kvh * a.d, self.input_layernorm.weight.shape[0]
        mlp_in, attn_in = Part(slice(0, inter), ALL), Part(slice(inter, inter + q), ALL)
        return {"in": LoraTarget(d, qkv + inter, {
                    "self_attn.q_proj": Part(ALL, slice(0, q)), "self_attn.k_proj": Part(ALL, slice(q, q + kv)),
                    "self_attn.v_proj": Part(ALL, slice(q + kv, qkv)), "attn.qkv": Part(ALL, slice(0, qkv)),
                    "mlp.fc1": Part(ALL, slice(qkv, qkv + inter))}, 4, frozenset({"attn.qkv"})),
                "out": LoraTarget(inter + q, d, {"mlp.fc2": mlp_in, "self_attn.dense": attn_in, "attn.proj": attn_in},
                                  2, frozenset({"attn.proj"}))}

    def forward(self, x: torch.Tensor | PendingSum, rope: Rope, attn: AttentionInputs,
                pages: tuple[torch.Tensor, torch.Tensor], lora=None) -> torch.Tensor | PendingSum:
        if isinstance(x, PendingSum) or (lora is None and self.act == "gelu_tanh" and x.shape[0] > MAX_ROWS):
            return self._forward_wide(x, rope, attn, pages)  # (every layer of a step takes the same form)
        t = x.shape[0]
        split = self.qkv_width + self.mlp_width
        buf = torch.empty(t, split + x.shape[1], dtype=x.dtype, device=x.device)
        h = self.input_layernorm(x)
        linear(h, self.in_proj.weight, self.in_proj.bias, act=self.act, act_from=self.qkv_width, out=buf[:, :split],
               lora=lora and lora["in"])  # (the adapters' deltas go in before the GELU)
        a = self.self_attn
        a.attend(buf[:, : self.qkv_width], rope, attn, pages, out=buf[:, split:].view(t, a.h, a.d))
        return linear(buf[:, self.qkv_width:], self.out_proj.weight, self.out_proj.bias, residual=x,
                      lora=lora and lora["out"])

    def _forward_wide(self, x: torch.Tensor | PendingSum, rope: Rope, attn: AttentionInputs,
                      pages: tuple[torch.Tensor, torch.Tensor]) -> PendingSum:
        """A step of more than MAX_ROWS rows (prefill, mixed, a decode batch over 64), whose GEMMs
        are cuBLAS's rather than the skinny GEMM's: fc1's GEMM apart, on CUDA with its GELU (the
        tanh form) in cuBLASLt's epilogue, and the output projection as two GEMMs accumulating onto
        the residual in place. On CUDA the one [qkv; fc1] GEMM of the narrow form needs a pass of its
        own over its whole output for the GELU columns (470 MB a layer at 8,192 tokens). With the
        faster prompt check of the same run, Phi's prefill went from 0.77x to 0.98x the plain-PyTorch
        anchor (docs/benchmarks.md, run q). The output bias is left to the next norm (a PendingSum
        without partials), which adds it as it reads the row: an add's pass less a layer (3% of the
        prefill workload's kernel time, run s)."""
        q, inter = self.qkv_width, self.mlp_width
        x, h = self.input_layernorm.add(x)
        w, b = self.in_proj.weight, self.in_proj.bias
        qkv = torch.addmm(b[:q], h, w[:q].t())
        if h.is_cuda:
            mlp = torch._addmm_activation(b[q:], h, w[q:].t(), use_gelu=True)
        else:  # (the CPU's use_gelu is erf's GELU)
            mlp = F.gelu(torch.addmm(b[q:], h, w[q:].t()), approximate="tanh")
        o = self.self_attn.attend(qkv, rope, attn, pages).flatten(1)
        w = self.out_proj.weight  # (onto the layer's input in place: nothing reads it after the norm)
        return PendingSum(None, self.out_proj.bias, x.addmm_(mlp, w[:, :inter].t()).addmm_(o, w[:, inter:].t()))


class PhiBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(PhiDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.final_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)


class PhiForCausalLM(CausalLM):
    final_norm = "final_layernorm"

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.model = PhiBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size)
