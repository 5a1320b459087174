"""Each model family over the paged cache computes what transformers computes: prefill logits of
packed prompts and the logits of every decode step (Llama MHA/GQA/MQA, tied and untied, llama3
rope; Qwen2 with q/k/v bias; Qwen3 with q/k norm; Phi with partial rotary and parallel blocks)."""
import random

import pytest
import torch

from conftest import build_tiny, hf_logits
from slipstream.kv_cache import KVCache
from slipstream.kernels.attention import AttentionInputs
from slipstream.models.loader import build_model, load_checkpoint

PAGE = 4


def _slots(pages: list[int], positions: range) -> list[int]:
    return [pages[p // PAGE] * PAGE + p % PAGE for p in positions]


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 10000.0}


@pytest.mark.parametrize("arch,kv_heads,tie,extra", [
    ("llama", 4, False, {}), ("llama", 2, False, {}), ("llama", 4, True, {}), ("llama", 1, True, {}),
    ("llama", 2, False, {"rope_parameters": LLAMA3_ROPE}), ("llama", 2, False, {"attention_bias": True}),
    ("qwen2", 2, False, {}), ("qwen2", 2, True, {}), ("qwen3", 2, False, {}), ("qwen3", 1, True, {}),
    ("phi", 4, False, {}), ("phi", 2, False, {}),
])
def test_prefill_and_decode_logits_match_transformers(tmp_path, tiny_tokenizer, arch, kv_heads, tie, extra):
    tm = build_tiny(tmp_path, tiny_tokenizer, arch, kv_heads=kv_heads, tie=tie, seed=kv_heads, **extra)
    ckpt = load_checkpoint(tmp_path)
    model = build_model(ckpt, torch.float32, torch.device("cpu"), max_len=128)
    cfg = ckpt.config
    kv = KVCache(cfg.num_layers, 64, PAGE, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
    rng = random.Random(1)
    free = list(range(1, 64))
    rng.shuffle(free)  # scattered pages: a sequence's pages are not contiguous
    lens = [7, 13, 1]
    decode_steps = 6
    seqs = []
    for n in lens:
        pages = [free.pop() for _ in range(-(-(n + decode_steps) // PAGE))]
        seqs.append(dict(ids=[rng.randrange(tm.vocab_size) for _ in range(n)], pages=pages))

    ids = torch.tensor([t for s in seqs for t in s["ids"]])
    pos = torch.tensor([p for n in lens for p in range(n)])
    slots = torch.tensor([x for s, n in zip(seqs, lens) for x in _slots(s["pages"], range(n))])
    last = torch.tensor(lens).cumsum(0) - 1
    logits = model(ids, pos, AttentionInputs(True, slots, seq_lens=lens), kv, last)
    for i, s in enumerate(seqs):
        torch.testing.assert_close(logits[i], hf_logits(tm.hf, s["ids"])[-1], rtol=1e-4, atol=1e-4)

    for step in range(decode_steps):
        new = [rng.randrange(tm.vocab_size) for _ in seqs]
        positions = [len(s["ids"]) for s in seqs]
        for s, t in zip(seqs, new):
            s["ids"].append(t)
        width = max(p // PAGE + 1 for p in positions)
        table = torch.tensor([(s["pages"] + [0] * width)[:width] for s in seqs])
        attn = AttentionInputs(False, torch.tensor([_slots(s["pages"], range(p, p + 1))[0]
                                                    for s, p in zip(seqs, positions)]),
                               page_table=table, context_lens=torch.tensor(positions) + 1)
        logits = model(torch.tensor(new), torch.tensor(positions), attn, kv, None)
        for i, s in enumerate(seqs):
            torch.testing.assert_close(logits[i], hf_logits(tm.hf, s["ids"])[-1], rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"decode step {step}, sequence {i}: {m}")
