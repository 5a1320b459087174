"""Prefix caching end to end: requests that share a prompt's start reuse its full pages instead of
prefilling them, and outputs are what they are with the cache off (greedy against transformers,
tie-aware; seeded sampling token for token) — with many requests on one shared prefix at once,
chunk edges inside shared pages, zombies on shared pages, eviction pressure on a small cache,
aborts, and generated pages reused by the next turn; pipelined equals blocking; every page comes
back; Moondream's image prefix is found by the image's content."""
from __future__ import annotations

import random

import pytest

from conftest import settled_stats, tie_aware_equal
from constraints import ForceAt
from slipstream import LLM, SamplingParams
from test_engine import assert_modes_agree, hf_greedy, make_llm, random_workload


def shared_prompts(vocab: int, n: int, prefix_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(vocab) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(n)]


def all_pages_back(llm: LLM) -> dict:
    stats = settled_stats(llm)
    assert stats["kv_pages_free"] == stats["kv_pages_total"], stats
    return stats


@pytest.mark.parametrize("budget", [24, 400])
def test_many_requests_on_one_shared_prefix_equal_transformers_and_hit_the_cache(tiny_llama, budget):
    """Two waves of twelve on a 61-token shared prefix (pages of 4: not page-aligned); a 24-token
    budget puts chunk edges inside pages that later requests share. The second wave finds the
    prefix's 15 full pages."""
    prompts = shared_prompts(tiny_llama.vocab_size, 24, 61, seed=1)
    params = SamplingParams(max_tokens=6)
    with make_llm(tiny_llama, num_pages=400, max_prefill_tokens=budget) as llm:
        first = llm.generate(prompts[:12], params)
        before = llm.stats()["cached_prompt_tokens"]
        second = llm.generate(prompts[12:], params)
        stats = all_pages_back(llm)
    assert stats["cached_prompt_tokens"] - before >= 12 * 60  # (15 pages of 4 each)
    assert stats["kv_pages_cached"] > 0
    for p, o in zip(prompts, first + second):
        assert tie_aware_equal(tiny_llama.hf, p, o.token_ids, hf_greedy(tiny_llama.hf, p, 6, tiny_llama.eos_id))


def test_seeded_sampling_is_the_same_with_the_cache_on_and_off(tiny_llama):
    prompts = shared_prompts(tiny_llama.vocab_size, 10, 37, seed=2)
    params = [SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=i) for i in range(10)]
    outs = {}
    for caching in (True, False):
        with make_llm(tiny_llama, num_pages=400, enable_prefix_caching=caching) as llm:
            outs[caching] = [o.token_ids for o in llm.generate(prompts[:3], params[:3])]
            outs[caching] += [o.token_ids for o in llm.generate(prompts[3:], params[3:])]
            assert (llm.stats()["cached_prompt_tokens"] > 0) == caching
    for p, sp, a, b in zip(prompts, params, outs[True], outs[False]):
        assert tie_aware_equal(tiny_llama.hf, p, a, b, sp.temperature, sp.seed)


def test_zombies_on_shared_pages_and_aborts_leave_the_cache_correct(tiny_llama):
    """Requests that end at a forced stop token (their zombie steps still read the shared pages)
    and requests aborted mid-way share a prefix with requests that run on; then the same prompts
    again, from the cache, give the reference's tokens."""
    eos = tiny_llama.eos_id
    prompts = shared_prompts(tiny_llama.vocab_size, 9, 45, seed=3)
    with make_llm(tiny_llama, num_pages=400, max_num_seqs=6) as llm:
        stopping = [llm.submit(p, SamplingParams(max_tokens=20, constraint=lambda: ForceAt(3, eos)))
                    for p in prompts[:3]]
        aborted = [llm.submit(p, SamplingParams(max_tokens=200, ignore_eos=True)) for p in prompts[3:6]]
        running = [llm.submit(p, SamplingParams(max_tokens=10)) for p in prompts[6:]]
        for rid in aborted:
            llm.abort(rid)
        assert [len(llm.result(r).token_ids) for r in stopping] == [4, 4, 4]
        assert all(llm.result(r).finish_reason == "abort" for r in aborted)
        firsts = [llm.result(r) for r in running]
        again = llm.generate(prompts, SamplingParams(max_tokens=10))
        all_pages_back(llm)
    for p, o in zip(prompts[6:] + prompts, firsts + again):
        assert tie_aware_equal(tiny_llama.hf, p, o.token_ids, hf_greedy(tiny_llama.hf, p, 10, eos))


def test_a_request_aborted_mid_prefill_registers_only_the_pages_it_wrote(tiny_llama):
    """A 201-token prompt in chunks of 8, aborted once admitted (a few chunks in): the pages its
    chunks never reached hold no KV and must not be found by the same prompt sent again."""
    import time

    prompt = shared_prompts(tiny_llama.vocab_size, 1, 200, seed=7)[0]
    with make_llm(tiny_llama, num_pages=400, max_num_seqs=8, max_prefill_tokens=8) as llm:
        rid = llm.submit(prompt, SamplingParams(max_tokens=4))
        while llm.stats()["running"] == 0:
            time.sleep(0.0005)
        llm.abort(rid)
        assert llm.result(rid).finish_reason == "abort"
        again = llm.generate(prompt, SamplingParams(max_tokens=4))[0]
        stats = all_pages_back(llm)
    assert stats["cached_prompt_tokens"] < len(prompt) - 8
    assert tie_aware_equal(tiny_llama.hf, prompt, again.token_ids, hf_greedy(tiny_llama.hf, prompt, 4, tiny_llama.eos_id))


def test_under_eviction_pressure_outputs_hold_and_held_pages_are_never_evicted(tiny_llama):
    """A cache of 60 pages of 4 and twenty prompts of 20-70 tokens, some repeated, four at a
    time: admission keeps evicting released pages while others are held and read."""
    rng = random.Random(4)
    base = [[rng.randrange(tiny_llama.vocab_size) for _ in range(rng.randint(20, 70))] for _ in range(8)]
    prompts = [rng.choice(base) + [rng.randrange(tiny_llama.vocab_size)] for _ in range(20)]
    with make_llm(tiny_llama, num_pages=60) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=5))
        stats = all_pages_back(llm)
    assert 0 < stats["cached_prompt_tokens"] and stats["kv_pages_cached"] <= 59
    for p, o in zip(prompts, outs):
        assert tie_aware_equal(tiny_llama.hf, p, o.token_ids, hf_greedy(tiny_llama.hf, p, 5, tiny_llama.eos_id))


def test_the_next_turn_reuses_the_pages_the_last_answer_filled(tiny_llama):
    prompt = shared_prompts(tiny_llama.vocab_size, 1, 30, seed=5)[0]
    with make_llm(tiny_llama, num_pages=400) as llm:
        first = llm.generate(prompt, SamplingParams(max_tokens=20, ignore_eos=True))[0]
        turn = prompt + first.token_ids + [7, 8, 9]
        settled_stats(llm)
        before = llm.stats()["cached_prompt_tokens"]
        second = llm.generate(turn, SamplingParams(max_tokens=6))[0]
        cached = llm.stats()["cached_prompt_tokens"] - before
    assert cached == (len(prompt) + 19) // 4 * 4  # (the last answer token's KV was never written)
    assert tie_aware_equal(tiny_llama.hf, turn, second.token_ids, hf_greedy(tiny_llama.hf, turn, 6,
                                                                            tiny_llama.eos_id))


@pytest.mark.parametrize("seed", [5, 6])
def test_pipelined_equals_blocking_with_the_cache(tiny_llama, seed):
    """The randomized workload (aborts, EOS zombies, sampled rows) on prompts that share starts."""
    reqs = random_workload(seed, tiny_llama.vocab_size, tiny_llama.eos_id)
    rng = random.Random(seed)
    stem = [rng.randrange(tiny_llama.vocab_size) for _ in range(33)]
    for r in reqs[::2]:
        r.prompt = stem + r.prompt
    assert_modes_agree(tiny_llama, reqs, lambda mode: make_llm(tiny_llama, mode, max_num_seqs=3, num_pages=400,
                                                              max_prefill_tokens=24))


def test_penalized_requests_prefill_their_whole_prompt(tiny_llama):
    prompt = shared_prompts(tiny_llama.vocab_size, 1, 40, seed=7)[0]
    with make_llm(tiny_llama, num_pages=400) as llm:
        llm.generate(prompt, SamplingParams(max_tokens=2))
        before = llm.stats()["cached_prompt_tokens"]
        llm.generate(prompt, SamplingParams(max_tokens=2, repetition_penalty=1.3))
        assert llm.stats()["cached_prompt_tokens"] == before


def test_with_caching_off_nothing_is_kept(tiny_llama):
    prompt = shared_prompts(tiny_llama.vocab_size, 1, 40, seed=8)[0]
    with make_llm(tiny_llama, num_pages=400, enable_prefix_caching=False) as llm:
        llm.generate([prompt, prompt], SamplingParams(max_tokens=3))
        llm.generate(prompt, SamplingParams(max_tokens=3))
        stats = all_pages_back(llm)
    assert stats["kv_pages_cached"] == 0 and stats["cached_prompt_tokens"] == 0


def test_an_images_prefix_is_found_by_its_content(monkeypatch, tmp_path):
    """A caption and queries on one image, as separate requests (a new decode of the same bytes
    each): the encoder runs once with the cache on, once a request with it off, and the answers agree."""
    import numpy as np
    from PIL import Image

    from test_moondream import count_encodes

    rng = np.random.default_rng(9)
    img = Image.fromarray(rng.integers(0, 255, (15, 20, 3), dtype=np.uint8)).resize((800, 600))
    settings = {"temperature": 0.0, "max_tokens": 6}
    answers, encodes = {}, {}
    for caching in (True, False):
        with LLM("random:tiny-moondream", device="cpu", max_num_seqs=4, enable_prefix_caching=caching) as llm:
            encodes[caching] = count_encodes(llm, monkeypatch)
            answers[caching] = [llm.caption(img.copy(), settings=settings)["caption"]]
            answers[caching] += [llm.query(img.copy(), q, settings=settings)["answer"] for q in ("Why?", "Who?")]
            answers[caching].append(llm.point(img.copy(), "cat", settings={"max_objects": 2})["points"])
            all_pages_back(llm)
    assert answers[True] == answers[False]
    assert encodes == {True: [1], False: [1, 1, 1, 1]}


def test_requests_on_one_image_sent_together_encode_it_once(monkeypatch):
    """Admitted into the same step, the second finds the first's prefix registered at admission:
    the step's image work writes it before either prompt reads it."""
    import numpy as np
    from PIL import Image

    from test_moondream import count_encodes

    rng = np.random.default_rng(10)
    img = Image.fromarray(rng.integers(0, 255, (15, 20, 3), dtype=np.uint8)).resize((500, 375))
    settings = {"temperature": 0.0, "max_tokens": 5}
    with LLM("random:tiny-moondream", device="cpu", max_num_seqs=6) as llm:
        encodes = count_encodes(llm, monkeypatch)
        questions = ("Why?", "Who?", "Where?", "When?")
        seqs = [llm.skill_sequence(img, "caption", "normal", settings)]
        seqs += [llm.skill_sequence(img, "query", q, settings) for q in questions]
        together = [llm.result(i).text for i in llm.enqueue_many(seqs)]
        alone = [llm.caption(img, settings=settings)["caption"]]
        alone += [llm.query(img, q, settings=settings)["answer"] for q in questions]
        all_pages_back(llm)
    assert encodes == [1] and together == alone
