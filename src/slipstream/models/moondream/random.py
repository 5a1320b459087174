"""Random-weight Moondream 2 checkpoints in the release's on-disk layout: config.json
(`model_type` moondream1, the `config` overrides), model.safetensors under the spec's names, and a
byte-level BPE tokenizer.json whose ids 0-9 are the spec's special tokens (the release ships no
tokenizer; the real one is moondream/starmie-v1)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..random_checkpoint import build_tokenizer
from .config import MoondreamConfig
from .weights import expected_shapes

# ids 0-9 (spec §1.5): 0 BOS/EOS, 1/2 instruction delimiters, 3 answer, 4 thinking, 5 coord, 6 size,
# 7 start of grounded points, 8 unused, 9 end of grounding
SPECIAL_TOKENS = ["<|endoftext|>", "<|instruction|>", "<|/instruction|>", "<|answer|>", "<|thinking|>",
                  "<|coord|>", "<|size|>", "<|ground|>", "<|unused8|>", "<|/ground|>"]

_TINY_TEMPLATES = {"caption": {"short": [1, 300, 2, 301, 3], "normal": [1, 300, 2, 302, 3],
                               "long": [1, 300, 2, 303, 3]},
                   "query": {"prefix": [1, 304, 2], "suffix": [3]},
                   "detect": {"prefix": [1, 305, 306, 2], "suffix": [3]},
                   "point": {"prefix": [1, 307, 2], "suffix": [3]}}

MOONDREAM_PRESETS: dict[str, dict[str, Any]] = {  # config.json `config` overrides
    "moondream2": {},  # the release: the spec's defaults, 1.93B parameters
    "tiny-moondream": {
        "text": {"dim": 128, "ff_dim": 256, "n_layers": 2, "vocab_size": 1024, "n_heads": 2, "n_kv_heads": 2},
        "vision": {"enc_dim": 64, "enc_n_layers": 2, "enc_ff_dim": 128, "enc_n_heads": 2, "proj_out_dim": 128,
                   "proj_inner_dim": 256},
        "region": {"dim": 128, "coord_feat_dim": 32, "size_feat_dim": 64, "inner_dim": 256},
        "tokenizer": {"templates": _TINY_TEMPLATES},
    },
}


INIT_STD = {"moondream2": 0.02, "tiny-moondream": 0.15}  # (larger in the tiny model, so that its
# hidden states, not its biases, decide tokens and coordinates)


def random_tensors(cfg: MoondreamConfig, seed: int, dtype: torch.dtype, std: float) -> dict[str, torch.Tensor]:
    """normal(0, std) matrices (the Fourier matrices normal(0, 1), so coordinates encode apart), unit
    norm weights, small biases."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("_features"):
            t = torch.randn(shape, generator=gen)
        elif name.endswith("ln.weight") or name.endswith("ln1.weight") or name.endswith("ln2.weight"):
            t = torch.ones(shape)
        elif name.endswith("bias"):
            t = torch.randn(shape, generator=gen) * (std / 2)
        else:
            t = torch.randn(shape, generator=gen) * std
        out[name] = t.to(dtype)
    return out


def write_moondream(preset: str, out: Path, seed: int = 0) -> Path:
    overrides = MOONDREAM_PRESETS[preset]
    cfg = MoondreamConfig.from_overrides(overrides, f"preset {preset}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"architectures": ["HfMoondream"], "model_type": "moondream1",
                                                 "config": overrides, "torch_dtype": "bfloat16"}, indent=1))
    build_tokenizer(cfg.text.vocab_size, seed, SPECIAL_TOKENS).save(str(out / "tokenizer.json"))
    save_file(random_tensors(cfg, seed, torch.bfloat16, INIT_STD[preset]), str(out / "model.safetensors"))
    return out
