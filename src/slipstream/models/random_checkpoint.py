"""Random-weight checkpoints in the real on-disk layout (config.json + model.safetensors +
tokenizer.json + tokenizer_config.json), for tests and benchmarks without downloads.

The tokenizer is a byte-level BPE whose vocabulary is exactly the model's: three ChatML special
tokens, the 256 byte symbols, merges that spell common English words, then seeded random merges
of ASCII pieces until the vocabulary is full. Every id decodes to text, so stop strings, streaming
and grammars mean something on a random model. Punctuation is as rare in its pieces as in a real
vocabulary (a grammar's mask costs most on the tokens holding a quote or bracket: see
`build_tokenizer`)."""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                   "{% endif %}")
WORDS = ("the of and to in is was for that on as with by he at from his it an were are which this be or has had not "
         "first one their its new after who they have her she two been other when there all during into school time "
         "may years more most only over city some world would where later up such used many can state about national "
         "out known university united then made pipeline token stream graph kernel batch memory decode commit slot "
         "zombie page point detect model json true false null name value yes no red green blue").split()
PUNCTUATION = ".,:;!?'\"()[]{}-_/"
PIECE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789Ġ" + PUNCTUATION
PUNCTUATION_KEPT = 0.25  # the share of drawn merges holding punctuation that are kept (see build_tokenizer)
LAYOUT = "v2"  # the cache's folder for this layout: a cached checkpoint of an older layout is not reused


@dataclass(frozen=True)
class Preset:
    """A model shape, as the config.json fields that differ from the family's defaults."""

    architecture: str
    shape: dict[str, Any]
    init_std: float = 0.02
    dtype: str = "bfloat16"


def _shape(vocab: int, hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, **extra: Any) -> dict[str, Any]:
    return {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, **extra}


PRESETS: dict[str, Preset] = {
    "tiny-llama": Preset("LlamaForCausalLM", _shape(512, 64, 128, 2, 4, 2), 0.15, "float32"),
    "tiny-qwen3": Preset("Qwen3ForCausalLM", _shape(512, 64, 128, 2, 4, 2, head_dim=32), 0.15, "float32"),
    "tiny-phi": Preset("PhiForCausalLM", _shape(512, 64, 256, 2, 4, 4, partial_rotary_factor=0.5), 0.15, "float32"),
    "phi-1.5": Preset("PhiForCausalLM", _shape(51200, 2048, 8192, 24, 32, 32, partial_rotary_factor=0.5)),
    "qwen2.5-0.5b": Preset("Qwen2ForCausalLM", _shape(151936, 896, 4864, 24, 14, 2, rope_theta=1000000.0,
                                                      tie_word_embeddings=True, rms_norm_eps=1e-6)),
}


def build_tokenizer(vocab_size: int, seed: int = 0, specials: list[str] = SPECIAL_TOKENS) -> Tokenizer:
    """`specials` take the first ids, in order. A drawn merge that holds punctuation is kept one time in
    four, so 0.37% of the 151,936 pieces hold a quote (SmolLM2's real vocabulary: 0.33%; uniform draws
    gave 3.0%, and made XGrammar's mask inside a JSON string cost ~4x what it costs now)."""
    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(specials + byte_symbols)}
    if vocab_size < len(vocab):
        raise ValueError(f"a byte-level vocabulary needs at least {len(vocab)} tokens, got {vocab_size}")
    merges: list[tuple[str, str]] = []

    def merge(a: str, b: str) -> None:
        if a + b not in vocab and len(vocab) < vocab_size:
            vocab[a + b] = len(vocab)
            merges.append((a, b))

    for word in WORDS:  # spell each word (and its space-prefixed form) left to right
        for spelled in (word, "Ġ" + word):
            for i in range(1, len(spelled)):
                merge(spelled[:i], spelled[i])
    rng = random.Random(seed)
    pieces = [t for t in vocab if t not in specials and all(c in PIECE_CHARS for c in t)]
    while len(vocab) < vocab_size:
        a, b = rng.choice(pieces), rng.choice(pieces[:200])
        if len(a) + len(b) <= 12 and "Ġ" not in b and a + b not in vocab:
            if any(c in PUNCTUATION for c in a + b) and rng.random() >= PUNCTUATION_KEPT:
                continue
            merge(a, b)
            pieces.append(a + b)
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def hf_config(p: Preset) -> dict[str, Any]:
    cfg = {"architectures": [p.architecture], "max_position_embeddings": 4096, "bos_token_id": 0,
           "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"), "tie_word_embeddings": False, "torch_dtype": p.dtype}
    if p.architecture == "PhiForCausalLM":
        cfg.update(model_type="phi", hidden_act="gelu_new", layer_norm_eps=1e-5, max_position_embeddings=2048)
    else:
        cfg.update(model_type={"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                               "Qwen3ForCausalLM": "qwen3"}[p.architecture], hidden_act="silu", rms_norm_eps=1e-5)
    cfg.update(p.shape)
    return cfg


def random_weights(cfg_dict: dict[str, Any], std: float, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Weights for every tensor the model declares: normal(0, std) matrices, unit norms, small biases."""
    from . import MODEL_CLASSES
    from .config import ModelConfig

    cfg = ModelConfig.from_hf(cfg_dict, "preset")
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in MODEL_CLASSES[cfg.architecture](cfg, max_len=1).state_dict().items()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 2:
            t = torch.randn(shape, generator=gen) * std
        elif name.endswith("bias"):
            t = torch.randn(shape, generator=gen) * (std / 2)
        else:
            t = torch.ones(shape)
        out[name] = t.to(dtype)
    return out


def preset_names() -> list[str]:
    from .moondream.random import MOONDREAM_PRESETS

    return [*PRESETS, *MOONDREAM_PRESETS]


def write_checkpoint(preset: str, out: Path, seed: int = 0) -> Path:
    from .moondream.random import MOONDREAM_PRESETS, write_moondream

    if preset in MOONDREAM_PRESETS:
        return write_moondream(preset, out, seed)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(preset_names())}")
    p = PRESETS[preset]
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(p)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    build_tokenizer(cfg["vocab_size"], seed).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"}, indent=1))
    save_file(random_weights(cfg, p.init_std, getattr(torch, p.dtype), seed), str(out / "model.safetensors"))
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("SLIPSTREAM_CACHE", Path.home() / ".cache" / "slipstream"))


def cached_checkpoint(preset: str) -> Path:
    """The checkpoint for `random:PRESET`, built into the cache folder the first time it is asked for."""
    if preset not in preset_names():
        raise ValueError(f"unknown preset 'random:{preset}'; choose one of {', '.join(preset_names())}")
    final = cache_dir() / "random" / LAYOUT / preset
    if not (final / "model.safetensors").exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{preset}-"))
        try:
            write_checkpoint(preset, tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
