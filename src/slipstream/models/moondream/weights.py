"""Moondream 2's checkpoint (spec §2): one model.safetensors under `model.{vision,text,region}.*`.
Every expected tensor is checked by name and shape (an error names the first one missing or
misshapen, and any unexpected one); the text decoder's tensors are then renamed to the Phi family's
(its fused qkv split into q, k, v), so the engine's Phi path and kernels run it unchanged."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .config import MoondreamConfig
from .region import RegionModel
from .vision import VisionEncoder

ORIG_MOD = "._orig_mod"  # left in names by torch.compile exports; the reference deletes it


def text_shapes(cfg: MoondreamConfig) -> dict[str, tuple[int, ...]]:
    t = cfg.text
    qkv = t.dim + 2 * t.n_kv_heads * (t.dim // t.n_heads)
    shapes = {"model.text.wte": (t.vocab_size, t.dim)}
    for i in range(t.n_layers):
        b = f"model.text.blocks.{i}"
        shapes.update({f"{b}.ln.weight": (t.dim,), f"{b}.ln.bias": (t.dim,),
                       f"{b}.attn.qkv.weight": (qkv, t.dim), f"{b}.attn.qkv.bias": (qkv,),
                       f"{b}.attn.proj.weight": (t.dim, t.dim), f"{b}.attn.proj.bias": (t.dim,),
                       f"{b}.mlp.fc1.weight": (t.ff_dim, t.dim), f"{b}.mlp.fc1.bias": (t.ff_dim,),
                       f"{b}.mlp.fc2.weight": (t.dim, t.ff_dim), f"{b}.mlp.fc2.bias": (t.dim,)})
    shapes.update({"model.text.post_ln.weight": (t.dim,), "model.text.post_ln.bias": (t.dim,),
                   "model.text.lm_head.weight": (t.vocab_size, t.dim), "model.text.lm_head.bias": (t.vocab_size,)})
    return shapes


def _module_shapes(module: nn.Module, prefix: str) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{k}": tuple(v.shape) for k, v in module.state_dict().items()}


def expected_shapes(cfg: MoondreamConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        vision, region = VisionEncoder(cfg.vision), RegionModel(cfg.region)
    return {**_module_shapes(vision, "model.vision"), **text_shapes(cfg), **_module_shapes(region, "model.region")}


def check_tensors(tensors: dict[str, torch.Tensor], cfg: MoondreamConfig, source: str) -> None:
    if any(name.startswith("text_model.transformer.") for name in tensors):
        raise ValueError(f"{source}: this is the legacy Moondream name layout (text_model.*, vision_encoder.*); "
                         f"slipstream reads the 2025 `model.*` layout of vikhyatk/moondream2's model.safetensors")
    expected = expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in tensors:
            raise ValueError(f"{source}: tensor {name!r} is missing from the Moondream checkpoint")
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"{source}: tensor {name!r} has shape {tuple(tensors[name].shape)}, but the Moondream "
                             f"config implies {shape}; the checkpoint and its config.json `config` do not match")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise ValueError(f"{source}: unexpected tensors in the Moondream checkpoint: {unexpected[:5]}")


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no model.safetensors")
    tensors = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    tensors[name.replace(ORIG_MOD, "")] = st.get_tensor(name)
        except Exception as e:
            raise ValueError(f"{f}: cannot read safetensors file ({e}); it is corrupt or truncated") from None
    return tensors


def module_state(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix.` with the prefix removed (a module's state dict)."""
    return {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def text_as_phi(tensors: dict[str, torch.Tensor], cfg: MoondreamConfig) -> dict[str, torch.Tensor]:
    """The text decoder's tensors under PhiForCausalLM's names."""
    t = cfg.text
    kv = t.n_kv_heads * (t.dim // t.n_heads)
    out = {"model.embed_tokens.weight": tensors["model.text.wte"],
           "model.final_layernorm.weight": tensors["model.text.post_ln.weight"],
           "model.final_layernorm.bias": tensors["model.text.post_ln.bias"],
           "lm_head.weight": tensors["model.text.lm_head.weight"], "lm_head.bias": tensors["model.text.lm_head.bias"]}
    for i in range(t.n_layers):
        src, dst = f"model.text.blocks.{i}", f"model.layers.{i}"
        for kind in ("weight", "bias"):
            out[f"{dst}.input_layernorm.{kind}"] = tensors[f"{src}.ln.{kind}"]
            q, k, v = tensors[f"{src}.attn.qkv.{kind}"].split([t.dim, kv, kv])
            out[f"{dst}.self_attn.q_proj.{kind}"], out[f"{dst}.self_attn.k_proj.{kind}"] = q, k
            out[f"{dst}.self_attn.v_proj.{kind}"] = v
            out[f"{dst}.self_attn.dense.{kind}"] = tensors[f"{src}.attn.proj.{kind}"]
            out[f"{dst}.mlp.fc1.{kind}"] = tensors[f"{src}.mlp.fc1.{kind}"]
            out[f"{dst}.mlp.fc2.{kind}"] = tensors[f"{src}.mlp.fc2.{kind}"]
    return out
