"""Shared fixtures: tiny random-weight Llama checkpoints in the real on-disk layout (config.json +
model.safetensors + tokenizer.json, written by transformers and tokenizers), their transformers
reference models, and the tie-aware comparison of DESIGN.md §4."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run in the interpreter on the CPU (set before they are imported)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from slipstream.sampling import gumbel_noise

TIE_MARGIN = 1e-3
TIE_RESULTS: list[bool] = []  # per tie-aware comparison: compared in full (True) or accepted at a near-tie


def pytest_terminal_summary(terminalreporter):
    if TIE_RESULTS:
        terminalreporter.write_line(f"tie-aware comparisons (DESIGN §4): {sum(TIE_RESULTS)} of {len(TIE_RESULTS)} "
                                    f"sequences compared in full, {len(TIE_RESULTS) - sum(TIE_RESULTS)} accepted at a "
                                    f"near-tie")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS_WORDS = ["pipeline", "decode", "token", "graph", "stream", "event", "slot", "commit", "the", "a", "of",
                "zombie", "page", "batch", "memory", "kernel", "bubble", "é", "ü", "日本", "語", "🙂", "42", "\n"]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="GPU test: no CUDA device here (run through the device tool)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _train_tokenizer(vocab_size: int):
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    text = [" ".join(rng.choice(CORPUS_WORDS) for _ in range(30)) for _ in range(300)]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


@dataclasses.dataclass
class TinyModel:
    path: Path
    hf: torch.nn.Module  # the transformers reference, fp32, eval mode
    eos_id: int
    vocab_size: int


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return _train_tokenizer(400)


def build_tiny(root: Path, tokenizer, arch: str = "llama", *, kv_heads: int = 2, tie: bool = False, seed: int = 0,
               **overrides) -> TinyModel:
    """A random-weight checkpoint written by transformers: arch is llama, qwen2, qwen3 or phi."""
    import transformers

    vocab = tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id("<|im_end|>")
    cfg = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=kv_heads, max_position_embeddings=512, tie_word_embeddings=tie,
               bos_token_id=tokenizer.token_to_id("<|endoftext|>"), eos_token_id=eos)
    if arch == "phi":
        cfg.update(partial_rotary_factor=0.5)
    else:
        cfg.update(rms_norm_eps=1e-5)
    if arch == "qwen3":
        cfg.update(head_dim=32)
    cfg.update(overrides)
    config_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                             "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "phi": ("PhiConfig", "PhiForCausalLM")}[arch]
    torch.manual_seed(seed)
    hf = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg))
    with torch.no_grad():  # larger-than-default weights give peaked, varied distributions
        for name, p in hf.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    hf.save_pretrained(root)
    tokenizer.save(str(root / "tokenizer.json"))
    return TinyModel(root, hf.eval(), eos, vocab)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory, tiny_tokenizer) -> TinyModel:
    """GQA (4 query heads, 2 KV heads), untied embeddings."""
    return build_tiny(tmp_path_factory.mktemp("tiny_llama"), tiny_tokenizer)


@torch.no_grad()
def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Reference logits [len(ids), vocab] of a causal forward over `ids`."""
    return hf(torch.tensor([ids])).logits[0].float()


def tie_aware_equal(hf: torch.nn.Module, prompt: list[int], got: list[int], want: list[int],
                    temperature: float = 0.0, seed: int = 0) -> bool:
    """DESIGN §4: tokens must be identical, except that a divergence is accepted where the reference's
    top-two scores at that position are within TIE_MARGIN (the rest is then not compared). Returns
    True when compared in full, False when accepted at a near-tie; fails otherwise."""
    n = min(len(got), len(want))
    for i in range(n):
        if got[i] == want[i]:
            continue
        scores = hf_logits(hf, prompt + want[:i])[-1]
        if temperature > 0:
            scores = scores / temperature + gumbel_noise(torch.tensor([seed]), torch.tensor([i]), scores.numel())[0]
        top2 = scores.topk(2).values
        assert top2[0] - top2[1] < TIE_MARGIN, (
            f"diverged at output index {i}: {got[i]} vs {want[i]}, reference margin {float(top2[0] - top2[1]):.4g}")
        TIE_RESULTS.append(False)
        return False
    assert len(got) == len(want), f"lengths differ without a divergence: {len(got)} vs {len(want)}"
    TIE_RESULTS.append(True)
    return True


@pytest.fixture(scope="session", params=["qwen2", "qwen3", "phi"])
def tiny_other_arch(request, tmp_path_factory, tiny_tokenizer) -> TinyModel:
    """The non-Llama families, one at a time."""
    return build_tiny(tmp_path_factory.mktemp(request.param), tiny_tokenizer, request.param, seed=3)


def settled_stats(llm, timeout: float = 10.0) -> dict[str, int]:
    """Stats once the loop has released everything: a finished request's result is delivered at
    its finalizing commit, while a zombie's pages come back at the commit after it."""
    deadline = time.monotonic() + timeout
    while True:
        stats = llm.stats()
        if (stats["running"] == stats["waiting"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.01)
