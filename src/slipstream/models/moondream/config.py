"""Moondream 2's configuration (2025-06-21 revision): the reference's four groups and their defaults.

The released config.json carries no architecture numbers (`model_type` "moondream1", `config` {}),
so the defaults below are the model; a non-empty `config` dict overrides them under the
reference's own names, nested by group (`{"text": {"dim": 128}, "vision": {...}}`), which is how
small checkpoints in the same layout load."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..config import ModelConfig

IMAGE_TOKENS = 729  # (crop_size / patch)^2 image positions after BOS, whatever the tiling
PREFIX_LEN = 1 + IMAGE_TOKENS  # BOS + image: the bidirectional block of the prefill
ROTARY_DIM = 32  # the reference fixes the rotary part (so the text head_dim is 64)


@dataclass
class TextConfig:
    dim: int = 2048
    ff_dim: int = 8192
    n_layers: int = 24
    vocab_size: int = 51200
    max_context: int = 2048
    n_heads: int = 32
    n_kv_heads: int = 32
    prefix_attn: int = 730
    group_size: int | None = None


@dataclass
class VisionConfig:
    enc_dim: int = 1152
    enc_patch_size: int = 14
    enc_n_layers: int = 27
    enc_ff_dim: int = 4304
    enc_n_heads: int = 16
    proj_out_dim: int = 2048
    crop_size: int = 378
    in_channels: int = 3
    max_crops: int = 12
    overlap_margin: int = 4
    proj_inner_dim: int = 8192

    @property
    def grid(self) -> int:
        """Patches per side of a crop (27): not enc_n_layers, which the reference uses (equal only there)."""
        return self.crop_size // self.enc_patch_size


@dataclass
class RegionConfig:
    dim: int = 2048
    coord_feat_dim: int = 256
    coord_out_dim: int = 1024
    size_feat_dim: int = 512
    size_out_dim: int = 2048
    inner_dim: int = 8192
    group_size: int | None = None


def _default_templates() -> dict[str, Any]:
    return {"caption": {"short": [1, 32708, 2, 12492, 3], "normal": [1, 32708, 2, 6382, 3],
                        "long": [1, 32708, 2, 4059, 3]},
            "query": {"prefix": [1, 15381, 2], "suffix": [3]},
            "detect": {"prefix": [1, 7235, 476, 2], "suffix": [3]},
            "point": {"prefix": [1, 2581, 2], "suffix": [3]}}


@dataclass
class TokenizerConfig:
    bos_id: int = 0
    eos_id: int = 0
    answer_id: int = 3
    thinking_id: int = 4
    coord_id: int = 5
    size_id: int = 6
    start_ground_points_id: int = 7
    end_ground_id: int = 9
    templates: dict[str, Any] = field(default_factory=_default_templates)


@dataclass
class MoondreamConfig:
    text: TextConfig = field(default_factory=TextConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)
    region: RegionConfig = field(default_factory=RegionConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    @classmethod
    def from_overrides(cls, overrides: dict[str, Any] | None, source: str) -> "MoondreamConfig":
        """The defaults with config.json's `config` dict applied; unknown groups or fields are errors."""
        groups = {f.name: f.type for f in dataclasses.fields(cls)}
        cfg = cls()
        for group, values in (overrides or {}).items():
            if group not in groups:
                raise ValueError(f"{source}: unknown Moondream config group {group!r}; expected one of "
                                 f"{', '.join(groups)}")
            if not isinstance(values, dict):
                raise ValueError(f"{source}: config.{group} must be an object, got {type(values).__name__}")
            part = getattr(cfg, group)
            names = {f.name for f in dataclasses.fields(part)}
            for name, value in values.items():
                if name not in names:
                    raise ValueError(f"{source}: unknown field config.{group}.{name}; expected one of "
                                     f"{', '.join(sorted(names))}")
                setattr(part, name, value)
        cfg.validate(source)
        return cfg

    def validate(self, source: str) -> None:
        t, v, r = self.text, self.vision, self.region
        if t.dim % t.n_heads or t.dim // t.n_heads != 64:
            raise ValueError(f"{source}: text.dim / text.n_heads must be 64 (the reference's rotary is fixed at "
                             f"32 of 64 dims), got {t.dim} / {t.n_heads}")
        if v.grid ** 2 != IMAGE_TOKENS or v.crop_size % v.enc_patch_size:
            raise ValueError(f"{source}: vision.crop_size / vision.enc_patch_size must be 27 (729 image "
                             f"positions, which the reference hard-codes), got {v.crop_size} / {v.enc_patch_size}")
        if v.enc_dim % v.enc_n_heads:
            raise ValueError(f"{source}: vision.enc_dim {v.enc_dim} is not a multiple of enc_n_heads {v.enc_n_heads}")
        if v.proj_out_dim != t.dim or r.dim != t.dim:
            raise ValueError(f"{source}: vision.proj_out_dim ({v.proj_out_dim}) and region.dim ({r.dim}) must equal "
                             f"text.dim ({t.dim})")
        if r.coord_out_dim != 1024 or r.size_out_dim != 2048:
            raise ValueError(f"{source}: region.coord_out_dim must be 1024 and size_out_dim 2048 (the bins the "
                             f"skills decode), got {r.coord_out_dim} / {r.size_out_dim}")
        if t.max_context <= PREFIX_LEN:
            raise ValueError(f"{source}: text.max_context {t.max_context} leaves no room after the image prefix")

    def text_model(self) -> ModelConfig:
        """The text decoder as the engine's Phi family runs it: parallel attention + MLP, partial
        rotary (32 of 64 dims, NeoX half split, theta 1e4), biases, GELU-tanh, untied LM head."""
        t = self.text
        return ModelConfig(
            architecture="PhiForCausalLM", vocab_size=t.vocab_size, hidden_size=t.dim, intermediate_size=t.ff_dim,
            num_layers=t.n_layers, num_heads=t.n_heads, num_kv_heads=t.n_kv_heads, head_dim=t.dim // t.n_heads,
            norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=t.max_context,
            partial_rotary_factor=ROTARY_DIM / (t.dim // t.n_heads), qkv_bias=True, o_bias=True, mlp_bias=True,
            hidden_act="gelu_new", eos_token_ids=[self.tokenizer.eos_id], bos_token_id=self.tokenizer.bos_id)
