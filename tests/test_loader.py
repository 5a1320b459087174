"""The loader reads HF directories and GGUF files, and every broken checkpoint gets an error that
names the file (and tensor) to fix."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import build_tiny
from slipstream import LLM
from slipstream.models.loader import build_model, embedded_default_path, load_checkpoint


@pytest.fixture
def ckpt_dir(tmp_path, tiny_llama):
    shutil.copytree(tiny_llama.path, tmp_path / "m")
    return tmp_path / "m"


def test_unknown_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_missing_config(ckpt_dir):
    (ckpt_dir / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_checkpoint(ckpt_dir)


def test_malformed_config(ckpt_dir):
    (ckpt_dir / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: malformed JSON"):
        load_checkpoint(ckpt_dir)


def test_config_missing_field(ckpt_dir):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    del cfg["hidden_size"]
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="missing required field 'hidden_size'"):
        load_checkpoint(ckpt_dir)


def test_unsupported_architecture(ckpt_dir):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture.*MambaForCausalLM"):
        load_checkpoint(ckpt_dir)


def test_shape_mismatch_names_file_and_tensor(ckpt_dir):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    ckpt = load_checkpoint(ckpt_dir)
    with pytest.raises(ValueError, match=r"model.safetensors: tensor 'model.layers.0.mlp.\w+_proj.weight' has shape"):
        build_model(ckpt, torch.float32, torch.device("cpu"), 64)


def test_missing_tensor(ckpt_dir):
    f = ckpt_dir / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.norm.weight"]
    save_file(tensors, f)
    with pytest.raises(ValueError, match="'model.norm.weight' is missing"):
        build_model(load_checkpoint(ckpt_dir), torch.float32, torch.device("cpu"), 64)


def test_corrupt_safetensors(ckpt_dir):
    f = ckpt_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(ValueError, match="model.safetensors: cannot read safetensors"):
        load_checkpoint(ckpt_dir)


def test_missing_tokenizer(ckpt_dir):
    (ckpt_dir / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_checkpoint(ckpt_dir)


def test_dtype_as_string_or_torch_dtype(tiny_llama):
    for dtype in ("bfloat16", torch.float16):
        llm = LLM(str(tiny_llama.path), device="cpu", dtype=dtype, num_pages=16)
        try:
            assert llm.core.runner.model.lm_head.weight.dtype in (torch.bfloat16, torch.float16)
            assert len(llm.generate([[1, 2]])[0].token_ids) == 16
        finally:
            llm.shutdown()
    with pytest.raises(ValueError, match="unknown dtype"):
        LLM(str(tiny_llama.path), device="cpu", dtype="float8")


def test_generation_config_adds_eos_ids(tmp_path, tiny_tokenizer):
    build_tiny(tmp_path, tiny_tokenizer)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert load_checkpoint(tmp_path).config.eos_token_ids == [2, 0]


def test_embedded_default_is_a_llama_gguf():
    try:
        path = embedded_default_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert path.suffix == ".gguf" and path.exists()
