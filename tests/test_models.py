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


def _slots(pages: list[int], positions: range, page: int) -> list[int]:
    return [pages[p // page] * page + p % page for p in positions]


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 10000.0}


@pytest.mark.parametrize("arch,kv_heads,tie,extra", [
    ("llama", 4, False, {}), ("llama", 2, False, {}), ("llama", 4, True, {}), ("llama", 1, True, {}),
    ("llama", 2, False, {"rope_parameters": LLAMA3_ROPE}), ("llama", 2, False, {"attention_bias": True}),
    ("qwen2", 2, False, {}), ("qwen2", 2, True, {}), ("qwen3", 2, False, {}), ("qwen3", 1, True, {}),
    ("phi", 4, False, {}), ("phi", 2, False, {}),
])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_prefill_and_decode_logits_match_transformers(tmp_path, tiny_tokenizer, arch, kv_heads, tie, extra, device):
    """On CUDA (fp32) decode runs the Triton kernels: fused GEMMs, norms, rotary + KV write, paged
    attention (pages of 16 tokens; the CPU case uses pages of 4)."""
    tm = build_tiny(tmp_path, tiny_tokenizer, arch, kv_heads=kv_heads, tie=tie, seed=kv_heads, **extra)
    ckpt = load_checkpoint(tmp_path)
    dev = torch.device(device)
    page = 16 if device == "cuda" else 4
    model = build_model(ckpt, torch.float32, dev, max_len=128)
    cfg = ckpt.config
    kv = KVCache(cfg.num_layers, 64, page, cfg.num_kv_heads, cfg.head_dim, torch.float32, dev)
    rng = random.Random(1)
    free = list(range(1, 64))
    rng.shuffle(free)  # scattered pages: a sequence's pages are not contiguous
    lens = [7, 13, 1]
    decode_steps = 6
    seqs = []
    for n in lens:
        pages = [free.pop() for _ in range(-(-(n + decode_steps) // page))]
        seqs.append(dict(ids=[rng.randrange(tm.vocab_size) for _ in range(n)], pages=pages))

    def on_dev(x: list) -> torch.Tensor:
        return torch.tensor(x, device=dev)

    ids = on_dev([t for s in seqs for t in s["ids"]])
    pos = on_dev([p for n in lens for p in range(n)])
    slots = on_dev([x for s, n in zip(seqs, lens) for x in _slots(s["pages"], range(n), page)])
    last = on_dev(lens).cumsum(0) - 1
    logits = model(ids, pos, AttentionInputs(True, slots, seq_lens=lens), kv, last).cpu()
    for i, s in enumerate(seqs):
        torch.testing.assert_close(logits[i], hf_logits(tm.hf, s["ids"])[-1], rtol=1e-4, atol=1e-4)

    for step in range(decode_steps):
        new = [rng.randrange(tm.vocab_size) for _ in seqs]
        positions = [len(s["ids"]) for s in seqs]
        for s, t in zip(seqs, new):
            s["ids"].append(t)
        width = max(p // page + 1 for p in positions)
        table = on_dev([(s["pages"] + [0] * width)[:width] for s in seqs])
        attn = AttentionInputs(False, on_dev([_slots(s["pages"], range(p, p + 1), page)[0] for s, p in zip(seqs, positions)]),
                               page_table=table, context_lens=on_dev(positions) + 1)
        logits = model(on_dev(new), on_dev(positions), attn, kv, None).cpu()
        for i, s in enumerate(seqs):
            torch.testing.assert_close(logits[i], hf_logits(tm.hf, s["ids"])[-1], rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"decode step {step}, sequence {i}: {m}")
