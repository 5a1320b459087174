"""Each model family over the paged cache computes what transformers computes: prefill logits of
packed prompts, of prompts prefilled chunk by chunk beside decode rows, and the logits of every
decode step (Llama MHA/GQA/MQA, tied and untied, llama3
rope; Qwen2 with q/k/v bias; Qwen3 with q/k norm; Phi with partial rotary and parallel blocks)."""
import random

import numpy as np
import pytest
import torch

from conftest import build_tiny, hf_logits
from slipstream.kv_cache import KVCache
from slipstream.kernels.attention import AttentionInputs, program_list
from slipstream.models.loader import build_model, load_checkpoint


def _slots(pages: list[int], positions: range, page: int) -> list[int]:
    return [pages[p // page] * page + p % page for p in positions]


def model_over_pages(root, tokenizer, arch: str, device: str, num_pages: int, shuffle: int, **build):
    """A tiny checkpoint (and its transformers reference) loaded fp32 through the real loader, a KV
    cache of `num_pages` pages (16 tokens on CUDA, 4 on the CPU), and its pages in scattered order
    (a sequence's pages are not contiguous)."""
    tm = build_tiny(root, tokenizer, arch, **build)
    ckpt = load_checkpoint(root)
    dev = torch.device(device)
    cfg = ckpt.config
    kv = KVCache(cfg.num_layers, num_pages, 16 if device == "cuda" else 4, cfg.num_kv_heads, cfg.head_dim,
                 torch.float32, dev)
    free = list(range(1, num_pages))
    random.Random(shuffle).shuffle(free)
    return tm, build_model(ckpt, torch.float32, dev, max_len=128), kv, free


def packed_inputs(seqs: list[dict], spans: list[tuple[int, int]], page: int, slots: torch.Tensor, cfg,
                  dev: torch.device) -> AttentionInputs:
    """A packed step's attention inputs: sequence i's tokens [start, start + n) for spans[i]."""
    lens = np.array([n for _, n in spans])
    width = max(-(-(a + n) // page) for a, n in spans)
    table = torch.tensor([(s["pages"] + [0] * width)[:width] for s in seqs], device=dev)
    ends = np.array([a + n for a, n in spans])
    decode = int(np.argmin(lens == 1)) if (lens > 1).any() else len(lens)  # leading one-token chunks: decode rows
    programs = program_list(lens[decode:], ends[decode:], int(lens.sum()), cfg.num_heads, cfg.num_kv_heads, 1 << 20,
                            decode)  # (long tiles split)
    return AttentionInputs(slots, table, torch.tensor(ends, device=dev),
                           torch.tensor(np.concatenate([[0], np.cumsum(lens)]), device=dev),
                           torch.tensor(programs, device=dev), torch.tensor(ends[:decode], device=dev),
                           [(n, a + n) for a, n in spans])


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
    attention (pages of 16 tokens; the CPU case uses pages of 4); the prefill step, longer than the
    skinny GEMM's rows, runs cuBLAS with the activations after it or in its epilogue (Phi's)."""
    tm, model, kv, free = model_over_pages(tmp_path, tiny_tokenizer, arch, device, 64, 1, kv_heads=kv_heads, tie=tie,
                                           seed=kv_heads, **extra)
    cfg, dev, page, rng = model.config, kv.data.device, kv.page_size, random.Random(1)
    lens = [7, 13, 1, 60]
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
    logits = model(ids, pos, packed_inputs(seqs, [(0, n) for n in lens], page, slots, cfg, dev), kv, last).cpu()
    for i, s in enumerate(seqs):
        torch.testing.assert_close(logits[i], hf_logits(tm.hf, s["ids"])[-1], rtol=1e-4, atol=1e-4)

    for step in range(decode_steps):
        new = [rng.randrange(tm.vocab_size) for _ in seqs]
        positions = [len(s["ids"]) for s in seqs]
        for s, t in zip(seqs, new):
            s["ids"].append(t)
        width = max(p // page + 1 for p in positions)
        table = on_dev([(s["pages"] + [0] * width)[:width] for s in seqs])
        attn = AttentionInputs(on_dev([_slots(s["pages"], range(p, p + 1), page)[0] for s, p in zip(seqs, positions)]),
                               table, on_dev(positions) + 1)
        logits = model(on_dev(new), on_dev(positions), attn, kv, None).cpu()
        for i, s in enumerate(seqs):
            torch.testing.assert_close(logits[i], hf_logits(tm.hf, s["ids"])[-1], rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"decode step {step}, sequence {i}: {m}")


@pytest.mark.parametrize("arch,kv_heads", [("llama", 2), ("qwen3", 1), ("phi", 4)])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_chunked_prefill_beside_decode_rows_matches_transformers(tmp_path, tiny_tokenizer, arch, kv_heads, device):
    """Three prompts prefilled in chunks of uneven sizes, packed into one step with one another and
    with decode rows (chunks of one token; leading ones run the decode kernel on CUDA, later ones
    packed tiles): the logits at each chunk's last token equal transformers' over the whole prefix,
    whatever the chunk edges (on, before and after page boundaries)."""
    tm, model, kv, free = model_over_pages(tmp_path, tiny_tokenizer, arch, device, 80, 2, kv_heads=kv_heads, seed=9)
    cfg, dev, page, rng = model.config, kv.data.device, kv.page_size, random.Random(2)
    total = [40, 25, 34]
    seqs = [dict(ids=[rng.randrange(tm.vocab_size) for _ in range(n)], pages=[free.pop() for _ in range(-(-n // page))])
            for n in total]
    # per step, the tokens each sequence adds: a whole chunk, or 1 (a decode row, once its prompt is in)
    schedule = [[16, 7, 0], [1, 16, 15], [1, 1, 18], [22, 1, 1]]
    done = [0, 0, 0]
    for step in schedule:
        spans = [(done[i], n) for i, n in enumerate(step) if n]
        active = [seqs[i] for i, n in enumerate(step) if n]
        ids = torch.tensor([t for s, (a, n) in zip(active, spans) for t in s["ids"][a:a + n]], device=dev)
        pos = torch.tensor([p for a, n in spans for p in range(a, a + n)], device=dev)
        slots = torch.tensor([x for s, (a, n) in zip(active, spans) for x in _slots(s["pages"], range(a, a + n), page)],
                             device=dev)
        last = torch.tensor(np.cumsum([n for _, n in spans]) - 1, device=dev)
        logits = model(ids, pos, packed_inputs(active, spans, page, slots, cfg, dev), kv, last).cpu()
        for j, (s, (a, n)) in enumerate(zip(active, spans)):
            torch.testing.assert_close(logits[j], hf_logits(tm.hf, s["ids"][: a + n])[-1], rtol=1e-4, atol=1e-4,
                                       msg=lambda m: f"{step}, sequence {j}: {m}")
        for i, n in enumerate(step):
            done[i] += n
    assert done == total
