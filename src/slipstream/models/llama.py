"""Llama-family decoders over the paged KV cache: Llama (RMSNorm, rotary, GQA, SwiGLU), Qwen2
(+ q/k/v bias) and Qwen3 (+ per-head RMSNorm of q and k). Parameter names mirror Hugging Face's,
so a HF state dict loads as it is."""
from __future__ import annotations

import torch
from torch import nn

from ..kernels.attention import AttentionInputs, Rope, rotary_paged_attention
from ..kernels.linear import PendingSum, interleave_gate_up, linear
from ..kv_cache import KVCache
from ..lora.targets import ALL, LoraTarget, Part
from .config import ModelConfig
from .layers import RMSNorm, Rotary, frozen_linear, fuse_linears


class Attention(nn.Module):
    """q/k/v projections, optional per-head q/k RMSNorm (Qwen3), rotary, paged attention and the
    output projection, which HF calls `o_proj` (Llama, Qwen) or `dense` (Phi)."""

    def __init__(self, cfg: ModelConfig, out_name: str = "o_proj") -> None:
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=cfg.qkv_bias)
        self.out_name = out_name
        setattr(self, out_name, nn.Linear(self.h * self.d, cfg.hidden_size, bias=cfg.o_bias))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.norm_eps)
            self.k_norm = RMSNorm(self.d, cfg.norm_eps)
        self.qk_norm = cfg.qk_norm
        self.scale = self.d ** -0.5

    def fuse(self) -> None:
        """Replace q/k/v projections (loaded under HF names) by one GEMM."""
        self.qkv_proj = fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, rope: Rope, attn: AttentionInputs, pages: tuple[torch.Tensor, torch.Tensor],
                residual: torch.Tensor, lora=None) -> torch.Tensor | PendingSum:
        """`residual` + attention of `x` (the sum left to the next norm where the skinny GEMM runs);
        `lora` (a layer's LayerLora): each row's adapter added to both projections."""
        qkv = linear(x, self.qkv_proj.weight, self.qkv_proj.bias, lora=lora and lora["qkv"])
        o = self.attend(qkv, rope, attn, pages).flatten(1)
        out = getattr(self, self.out_name)
        return linear(o, out.weight, out.bias, residual=residual, defer=True, lora=lora and lora["o"],
                      lora_in_norm=True)

    def attend(self, qkv: torch.Tensor, rope: Rope, attn: AttentionInputs,
               pages: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """Projected q/k/v [tokens, (H + 2 KVH) * D] (rows may be strided) -> attention [tokens, H, D]."""
        q, k, v = qkv.view(qkv.shape[0], self.h + 2 * self.kvh, self.d).split([self.h, self.kvh, self.kvh], dim=1)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotary_paged_attention(q, k, v, rope, attn, pages, self.scale, out)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def fuse(self) -> None:
        """One [gate; up] GEMM with interleaved rows and SwiGLU in its epilogue."""
        g, u = self.gate_proj, self.up_proj
        bias = interleave_gate_up(g.bias, u.bias) if g.bias is not None else None
        self.gate_up_proj = frozen_linear(interleave_gate_up(g.weight, u.weight), bias)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor, residual: torch.Tensor, lora=None) -> torch.Tensor | PendingSum:
        """`residual` + down(silu(gate) * up) (the sum left to the next norm where the skinny GEMM
        runs); with `lora`, the adapters' deltas go in before the SwiGLU."""
        hidden = linear(x, self.gate_up_proj.weight, self.gate_up_proj.bias, act="swiglu",
                        lora=lora and lora["gate_up"])
        return linear(hidden, self.down_proj.weight, self.down_proj.bias, residual=residual, defer=True,
                      lora=lora and lora["down"], lora_in_norm=True)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def lora_targets(self) -> dict[str, LoraTarget]:
        a, mlp = self.self_attn, self.mlp
        q, kv, d = a.h * a.d, a.kvh * a.d, self.input_layernorm.weight.shape[0]
        inter = mlp.down_proj.weight.shape[1]
        return {"qkv": LoraTarget(d, q + 2 * kv, {"self_attn.q_proj": Part(ALL, slice(0, q)),
                                                  "self_attn.k_proj": Part(ALL, slice(q, q + kv)),
                                                  "self_attn.v_proj": Part(ALL, slice(q + kv, q + 2 * kv))}, 3),
                "o": LoraTarget(q, d, {f"self_attn.{a.out_name}": Part()}),
                "gate_up": LoraTarget(d, 2 * inter, {"mlp.gate_proj": Part(ALL, slice(0, 2 * inter, 2)),
                                                     "mlp.up_proj": Part(ALL, slice(1, 2 * inter, 2))}, 2),
                "down": LoraTarget(inter, d, {"mlp.down_proj": Part()})}

    def forward(self, x: torch.Tensor | PendingSum, rope: Rope, attn: AttentionInputs,
                pages: tuple[torch.Tensor, torch.Tensor], lora=None) -> torch.Tensor | PendingSum:
        """The residual stream in and out; each norm finishes the sum the GEMM before it left pending."""
        x, h = self.input_layernorm.add(x, lora, "qkv")
        x, h = self.post_attention_layernorm.add(self.self_attn(h, rope, attn, pages, residual=x, lora=lora), lora,
                                                 "gate_up")
        return self.mlp(h, residual=x, lora=lora)


class LlamaBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)


class CausalLM(nn.Module):
    """The shared outer loop: embed, run the layers over the paged cache, norm, LM head at the
    requested rows. Subclasses build `self.model` (embed_tokens, layers, a final norm) and lm_head."""

    final_norm = "norm"

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.config = cfg
        self.rotary = Rotary(cfg, max_len)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse(self) -> None:
        """After loading (under HF's names): merge projections into fewer, larger GEMMs."""
        for layer in self.model.layers:
            layer.fuse()

    def decode_weight_bytes(self) -> int:
        """The weight bytes a decode step reads: every parameter but the input embedding table, of
        which it gathers only its rows (unless the table is the LM head's too)."""
        embed = self.model.embed_tokens.weight
        return sum(p.nbytes for p in self.parameters() if p is not embed or p is self.lm_head.weight)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs, kv: KVCache,
                logits_index: torch.Tensor | None, logits_out: torch.Tensor | None = None,
                hidden_out: torch.Tensor | None = None, lora=None,
                normed_out: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [rows, vocab] (fp32) for the tokens at `logits_index` (all tokens when None), into
        the first rows of `logits_out` when given; those rows' hidden states before the final norm
        into `hidden_out` when given (Moondream's region heads read them). `lora`: the step's
        LoraRows (each token's adapter slot), None where the engine has no LoRA slots. With
        `normed_out`, the rows after the final norm go there instead and the LM head is left to
        `logits` (a prefill step's head runs apart, over its sampled rows alone)."""
        x = self.model.embed_tokens(ids)
        rope = self.rotary.table(positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, attn, kv.layer(i), None if lora is None else lora.layer(i))
        norm = getattr(self.model, self.final_norm)
        normed = None
        if isinstance(x, PendingSum):  # (a decode-sized step on CUDA: the norm finishes the last layer's sum)
            x, normed = norm.add(x)
        if logits_index is not None:
            x = x[logits_index]
            normed = None if normed is None else normed[logits_index]
        if hidden_out is not None:
            hidden_out[: x.shape[0]].copy_(x)
        x = norm(x) if normed is None else normed
        if normed_out is not None:
            return normed_out[: x.shape[0]].copy_(x)
        return self.logits(x, logits_out)

    def logits(self, normed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The LM head over final-normed rows: fp32 logits, into the first rows of `out` when given."""
        if out is not None:
            return linear(normed, self.lm_head.weight, self.lm_head.bias, out=out[: normed.shape[0]])
        return linear(normed, self.lm_head.weight, self.lm_head.bias, out_dtype=torch.float32)


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.model = LlamaBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
