"""Random-weight presets are real checkpoints: transformers loads them and agrees with us, the
tokenizer's vocabulary is exactly the model's, and `random:PRESET` builds once into the cache."""
import pytest
import torch

from slipstream import LLM, SamplingParams
from slipstream.models import MODEL_CLASSES
from slipstream.models.config import ModelConfig
from slipstream.models.random_checkpoint import LAYOUT, PRESETS, build_tokenizer, hf_config, write_checkpoint
from slipstream.tokenizer import Tokenizer


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-phi"])
def test_tiny_presets_load_in_transformers_and_match(tmp_path, preset):
    from transformers import AutoModelForCausalLM

    write_checkpoint(preset, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.vocab_size == hf.config.vocab_size == PRESETS[preset].shape["vocab_size"]
    with LLM(str(tmp_path), device="cpu", num_pages=64) as llm:
        prompt = tok.encode("the pipeline and the kernel")
        out = llm.generate([prompt], SamplingParams(max_tokens=8))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=2)[0, len(prompt):]
    assert out.token_ids == ref.tolist()


@pytest.mark.parametrize("preset,params", [("phi-1.5", 1.418e9), ("qwen2.5-0.5b", 0.494e9)])
def test_large_presets_have_the_published_shapes(preset, params):
    cfg = ModelConfig.from_hf(hf_config(PRESETS[preset]), preset)
    with torch.device("meta"):
        model = MODEL_CLASSES[cfg.architecture](cfg, max_len=1)
    model.tie_weights()
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - params) / params < 0.01, n


def test_tokenizer_covers_the_vocabulary_and_round_trips():
    tok = build_tokenizer(2000)
    assert tok.get_vocab_size() == 2000
    text = "the model decodes 42 tokens: 日本語 🙂"
    assert tok.decode(tok.encode(text).ids) == text
    assert all(tok.id_to_token(i) is not None for i in range(2000))


def test_punctuation_is_as_rare_in_the_pieces_as_in_a_real_vocabulary():
    """A grammar's mask inside a JSON string costs most on the pieces that could close it: a random
    vocabulary with ten times a real one's quotes would make constrained benchmarks measure that."""
    vocab = build_tokenizer(151936).get_vocab()
    for ch in '"{,.':
        share = sum(ch in piece for piece in vocab) / len(vocab)
        assert 0.002 < share < 0.006, (ch, share)  # SmolLM2's real vocabulary: 0.10-0.33%


def test_random_prefix_builds_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIPSTREAM_CACHE", str(tmp_path))
    with LLM("random:tiny-llama", device="cpu", num_pages=32) as llm:
        assert llm.generate(["the"], SamplingParams(max_tokens=3))[0].finish_reason in ("stop", "length")
    weights = tmp_path / "random" / LAYOUT / "tiny-llama" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    with LLM("random:tiny-llama", device="cpu", num_pages=32):
        pass
    assert weights.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="unknown preset 'random:nope'"):
        LLM("random:nope", device="cpu")
