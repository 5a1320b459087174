"""Sampling: greedy is argmax; filters, penalties and logprobs equal straightforward references;
seeded sampling is a pure function of (seed, token index) that follows the filtered softmax;
masks remove tokens; impossible parameters are rejected."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import hf_logits, tie_aware_equal
from slipstream import LLM, SamplingParams
from slipstream.sampling import SamplerInputs, apply_bitmask, apply_filters, apply_penalties, gumbel_noise, sample


def inputs(rows: int, **values) -> SamplerInputs:
    def col(name, default, dtype):
        v = values.get(name, default)
        return torch.as_tensor(v if isinstance(v, list) else [v] * rows, dtype=dtype)

    p = dict(temperature=col("temperature", 0.0, torch.float64), seeds=col("seeds", 0, torch.int64),
             token_index=col("token_index", 0, torch.int64), top_k=col("top_k", 0, torch.int64),
             top_p=col("top_p", 1.0, torch.float64), min_p=col("min_p", 0.0, torch.float64),
             repetition_penalty=col("repetition_penalty", 1.0, torch.float64),
             presence_penalty=col("presence_penalty", 0.0, torch.float64),
             frequency_penalty=col("frequency_penalty", 0.0, torch.float64))
    return SamplerInputs(**p, any_random=bool((p["temperature"] > 0).any()), any_filter=True, any_penalty=True)


def test_greedy_is_argmax():
    logits = torch.randn(5, 50)
    assert sample(logits, inputs(5), None, torch.zeros(5, 50, dtype=torch.int32),
                  torch.zeros(5, 50, dtype=torch.bool)).tolist() == logits.argmax(-1).tolist()


def reference_keep(scores: np.ndarray, top_k: int, top_p: float, min_p: float) -> set[int]:
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    keep, total = [], 0.0
    for rank, tok in enumerate(order):
        if rank > 0 and ((top_k and rank >= top_k) or total >= top_p or probs[tok] < min_p * probs[order[0]]):
            continue
        keep.append(int(tok))
        total += probs[tok]
    return set(keep)


@pytest.mark.parametrize("top_k,top_p,min_p", [(5, 1.0, 0.0), (0, 0.6, 0.0), (0, 1.0, 0.2), (7, 0.8, 0.05),
                                               (1, 1.0, 0.0), (0, 1e-9, 0.0)])
def test_filters_keep_the_reference_set(top_k, top_p, min_p):
    torch.manual_seed(top_k)
    scaled = torch.randn(6, 40) * 2
    p = inputs(6, top_k=top_k, top_p=top_p, min_p=min_p)
    out = apply_filters(scaled, p.top_k, p.top_p, p.min_p)
    for r in range(6):
        kept = set(torch.isfinite(out[r]).nonzero().flatten().tolist())
        assert kept == reference_keep(scaled[r].double().numpy(), top_k, top_p, min_p)
        assert torch.equal(out[r][list(kept)], scaled[r][list(kept)])


def test_penalties_match_reference():
    torch.manual_seed(0)
    logits = torch.randn(3, 20)
    counts = torch.randint(0, 3, (3, 20), dtype=torch.int32)
    prompt = torch.rand(3, 20) < 0.3
    p = inputs(3, repetition_penalty=[1.0, 1.5, 0.7], presence_penalty=[0.5, 0.0, -1.0],
               frequency_penalty=[0.2, 1.0, 0.0])
    out = apply_penalties(logits, counts, prompt, p)
    for r in range(3):
        for v in range(20):
            want = float(logits[r, v])
            if counts[r, v] > 0 or prompt[r, v]:
                rp = float(p.repetition_penalty[r])
                want = want / rp if want > 0 else want * rp
            want -= float(p.frequency_penalty[r]) * int(counts[r, v])
            want -= float(p.presence_penalty[r]) * (int(counts[r, v]) > 0)
            assert abs(float(out[r, v]) - want) < 1e-5


def test_noise_depends_only_on_seed_and_token_index():
    seeds = torch.tensor([7, 7, 8])
    idx = torch.tensor([3, 3, 3])
    g = gumbel_noise(seeds, idx, 100)
    assert torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    alone = gumbel_noise(seeds[2:], idx[2:], 100)  # the same row in another batch gets the same noise
    assert torch.equal(alone[0], g[2])
    assert not torch.equal(gumbel_noise(seeds[:1], torch.tensor([4]), 100)[0], g[0])


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 1.0, 0.0), (2, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.3)])
def test_seeded_sampling_follows_the_filtered_softmax(top_k, top_p, min_p):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    n, t = 20000, 0.7
    out = sample(logits.expand(n, 5), inputs(n, temperature=t, seeds=123, token_index=list(range(n)), top_k=top_k,
                                             top_p=top_p, min_p=min_p), None,
                 torch.zeros(n, 5, dtype=torch.int32), torch.zeros(n, 5, dtype=torch.bool))
    freq = np.bincount(out.numpy(), minlength=5) / n
    scores = (logits / t).double().numpy()
    keep = sorted(reference_keep(scores, top_k, top_p, min_p))
    want = np.zeros(5)
    want[keep] = np.exp(scores[keep] - scores.max())
    np.testing.assert_allclose(freq, want / want.sum(), atol=0.015)


def test_bitmask_removes_tokens():
    logits = torch.zeros(2, 40)
    words = torch.zeros(2, 2, dtype=torch.int32)
    words[0, 1] = 1 << 3  # only token 35
    words[1, 0] = int(np.array([(1 << 2) | (1 << 31)], dtype=np.uint32).view(np.int32)[0])  # tokens 2 and 31
    out = apply_bitmask(logits, words)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [35]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [2, 31]


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(min_p=2.0), "min_p"), (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=3.0), "presence_penalty"), (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(seed=-1), "seed"), (dict(stop_token_ids=[-3]), "stop_token_ids"), (dict(stop=[""]), "stop"),
    (dict(logprobs=21), "logprobs"),
])
def test_impossible_parameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


# ---- through the engine, against transformers ------------------------------------------------

@pytest.fixture(scope="module")
def llm(tiny_llama):
    with LLM(str(tiny_llama.path), device="cpu", max_num_seqs=4, num_pages=96, page_size=4) as engine:
        yield engine


def test_logprobs_match_transformers(llm, tiny_llama):
    prompt = [5, 9, 11, 3]
    out = llm.generate([prompt], SamplingParams(max_tokens=6, logprobs=3))[0]
    assert len(out.logprobs) == len(out.token_ids)
    ref = hf_logits(tiny_llama.hf, prompt + out.token_ids).log_softmax(-1)[len(prompt) - 1:-1]
    for i, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        top = ref[i].topk(3)
        want = {int(t): float(v) for v, t in zip(top.values, top.indices)} | {tok: float(ref[i, tok])}
        assert entry.keys() == want.keys()
        assert all(abs(entry[k] - want[k]) < 1e-4 for k in want)


def test_penalties_match_a_greedy_reference(llm, tiny_llama):
    prompt = [5, 9, 5, 11, 3]
    params = SamplingParams(max_tokens=12, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3)
    outs = llm.generate([prompt, prompt], [params, SamplingParams(max_tokens=12)])
    ids = list(prompt)
    counts: dict[int, int] = {}
    for _ in range(12):
        scores = hf_logits(tiny_llama.hf, ids)[-1]
        for v in range(scores.numel()):
            if counts.get(v) or v in prompt:
                scores[v] = scores[v] / 1.3 if scores[v] > 0 else scores[v] * 1.3
            scores[v] -= 0.3 * counts.get(v, 0) + 0.4 * (counts.get(v, 0) > 0)
        tok = int(scores.argmax())
        ids.append(tok)
        counts[tok] = counts.get(tok, 0) + 1
        if tok == tiny_llama.eos_id:
            break
    assert outs[0].token_ids == ids[len(prompt):]
    assert outs[0].token_ids != outs[1].token_ids  # the penalties changed something


def test_seeded_sampling_is_reproducible_and_seed_dependent(llm):
    p = [SamplingParams(max_tokens=10, temperature=1.0, top_k=20, top_p=0.9, min_p=0.01, seed=s) for s in (1, 1, 2)]
    a, b, c = llm.generate([[4, 5], [4, 5], [4, 5]], p)
    assert a.token_ids == b.token_ids != c.token_ids


def test_max_tokens_one_and_repeated_prompts(llm):
    outs = llm.generate([[7]] * 3, SamplingParams(max_tokens=1))
    assert all(len(o.token_ids) == 1 and o.finish_reason in ("length", "stop") for o in outs)
    assert len({tuple(o.token_ids) for o in outs}) == 1


def test_repetition_penalty_matches_transformers_generate(llm, tiny_llama):
    prompt = [3, 3, 8, 3]
    out = llm.generate([prompt], SamplingParams(max_tokens=10, repetition_penalty=1.5))[0]
    with torch.no_grad():
        ref = tiny_llama.hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, repetition_penalty=1.5,
                                     eos_token_id=tiny_llama.eos_id)[0, len(prompt):].tolist()
    assert tie_aware_equal(tiny_llama.hf, prompt, out.token_ids, ref)
