"""ModelConfig: the architecture facts the engine needs, read from a HF config.json or GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "PhiForCausalLM")


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float = 1.0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    hidden_act: str = "silu"
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], source: str) -> "ModelConfig":
        """Build from a parsed config.json; `source` names the file in error messages."""
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"{source}: unsupported architecture {archs or cfg.get('model_type')!r}; "
                             f"slipstream supports {', '.join(SUPPORTED_ARCHITECTURES)}")
        if arch == "PhiForCausalLM" and cfg.get("qk_layernorm"):
            raise ValueError(f"{source}: Phi with qk_layernorm is not supported")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
            rope_theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
            partial = float(rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            bias = bool(cfg.get("attention_bias", False))
            is_phi = arch == "PhiForCausalLM"
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                norm_eps=float(cfg["layer_norm_eps"] if is_phi else cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=None if rope_type == "default" else rope,
                partial_rotary_factor=partial,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=is_phi or arch == "Qwen2ForCausalLM" or bias,
                o_bias=is_phi or (bias and arch != "Qwen2ForCausalLM"),
                mlp_bias=is_phi or bool(cfg.get("mlp_bias", False)),
                qk_norm=arch == "Qwen3ForCausalLM",
                hidden_act=str(cfg.get("hidden_act", "silu")),
                eos_token_ids=_as_list(cfg.get("eos_token_id")),
                bos_token_id=cfg.get("bos_token_id"),
            )
        except KeyError as e:
            raise ValueError(f"{source}: missing required field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: malformed config: {e}") from None

    def validate(self, source: str) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{source}: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{source}: num_attention_heads ({self.num_heads}) is not a multiple of "
                             f"num_key_value_heads ({self.num_kv_heads})")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"{source}: rotary dimension {self.rotary_dim} must be even and within head_dim "
                             f"{self.head_dim}")
        if self.hidden_act not in ("silu", "gelu_new", "gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"{source}: unsupported hidden_act {self.hidden_act!r}")


def _as_list(v: Any) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]
