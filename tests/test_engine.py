"""The engine end to end on tiny random Llama checkpoints: greedy output equals transformers'
(tie-aware), the pipelined loop equals the blocking loop under a randomized workload, every page
comes back, and failures are loud."""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from conftest import settled_stats, tie_aware_equal
from constraints import ForceAt, Successor
from slipstream import LLM, SamplingParams
from slipstream.device import HostLanding


def make_llm(model, mode="pipelined", **kw) -> LLM:
    opts = dict(device="cpu", mode=mode, max_num_seqs=4, num_pages=96, page_size=4)
    opts.update(kw)
    return LLM(str(model.path), **opts)


def hf_greedy(hf, prompt: list[int], max_tokens: int, eos: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            tok = int(hf(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(tok)
            if tok == eos:
                break
    return ids[len(prompt):]


def test_greedy_matches_transformers_with_staggered_arrivals(tiny_llama):
    rng = random.Random(0)
    prompts = [[rng.randrange(tiny_llama.vocab_size) for _ in range(n)] for n in (1, 5, 12, 3, 20, 8)]
    params = SamplingParams(max_tokens=16)
    with make_llm(tiny_llama) as llm:
        late: list[int] = []

        def first_arrives_later(rid, n, delta):  # prompts 2.. arrive while the first one decodes
            if n in (2, 5, 9) and len(late) < 5:
                late.append(llm.submit(prompts[len(late) + 1], params))
                if n == 9:
                    late.extend(llm.submit(p, params) for p in prompts[len(late) + 1:])

        first = llm.submit(prompts[0], params, on_token=first_arrives_later)
        outs = [llm.result(first)] + [llm.result(r) for r in late]
        assert [o.prompt_token_ids for o in outs] == prompts
        full = 0
        for prompt, out in zip(prompts, outs):
            want = hf_greedy(tiny_llama.hf, prompt, 16, tiny_llama.eos_id)
            full += tie_aware_equal(tiny_llama.hf, prompt, out.token_ids, want)
        assert full >= len(prompts) - 1, f"only {full} of {len(prompts)} sequences compared in full"
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]


@dataclass
class Req:
    prompt: list[int]
    params: SamplingParams
    abort_at: int | None = None
    parent: tuple[int, int] | None = None  # (label, token index): arrives when that request reaches it


def random_workload(seed: int, vocab: int, eos: int, n: int = 14) -> list[Req]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        max_tokens = rng.randint(1, 24)
        force = rng.random() < 0.35
        eos_at = rng.randrange(max_tokens)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=rng.choice([0.0, 0.0, 0.8]),
            seed=rng.randrange(1 << 30),
            constraint=(lambda k=eos_at: ForceAt(k, eos)) if force else None)
        reqs.append(Req(prompt=[rng.randrange(vocab) for _ in range(rng.randint(1, 20))], params=params,
                        abort_at=rng.randint(1, max_tokens) if rng.random() < 0.2 else None,
                        parent=(rng.randrange(i), rng.randint(1, 6)) if i >= 5 else None))
    return reqs


def run_workload(llm: LLM, reqs: list[Req]) -> dict[int, tuple[list[int], str]]:
    ids: dict[int, int] = {}
    lock = threading.Lock()

    def submit(label: int) -> None:
        r = reqs[label]

        def on_token(rid: int, n: int, delta: str) -> None:
            if r.abort_at == n:
                llm.abort(rid)
            for child, c in enumerate(reqs):
                if c.parent == (label, n):
                    submit(child)

        with lock:
            if label not in ids:
                ids[label] = llm.submit(r.prompt, r.params, on_token=on_token)

    for label, r in enumerate(reqs):
        if r.parent is None:
            submit(label)
    out: dict[int, tuple[list[int], str]] = {}
    for label in range(len(reqs)):  # parents come first, so a child that was never triggered is
        if label not in ids:  # submitted once its parent has finished
            submit(label)
        res = llm.result(ids[label])
        out[label] = (res.token_ids, res.finish_reason)
    return out


def assert_modes_agree(tm, reqs: list[Req], llm_factory, reference=None) -> set[str]:
    """Run `reqs` in both modes (llm_factory(mode) -> LLM); tie-aware token equality per request
    (against `reference(request)`, the model that decides near-ties: tm.hf by default), equal finish
    reasons where compared in full, every page and LoRA slot back. Returns the finish reasons seen."""
    results = {}
    for mode in ("blocking", "pipelined"):
        with llm_factory(mode) as llm:
            results[mode] = run_workload(llm, reqs)
            stats = settled_stats(llm)
            assert stats["kv_pages_free"] == stats["kv_pages_total"]
            assert stats["running"] == 0 and stats["waiting"] == 0
            bank = llm.core.lora
            assert bank is None or all(bank.held(s) == 0 for s in range(1, bank.max_loras + 1))
    full, reasons = 0, set()
    for label, r in enumerate(reqs):
        (got, why_got), (want, why_want) = results["pipelined"][label], results["blocking"][label]
        model = reference(r) if reference is not None else tm.hf
        same = tie_aware_equal(model, r.prompt, got, want, r.params.temperature, r.params.seed)
        if same:
            assert why_got == why_want, f"request {label}: {why_got} vs {why_want}"
        full += same
        reasons.add(why_want)
        if r.abort_at is not None and why_want == "abort":
            assert len(want) == r.abort_at
        assert len(want) <= r.params.max_tokens
    assert full >= len(reqs) - 1, f"only {full} of {len(reqs)} sequences compared in full"
    return reasons


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipelined_equals_blocking_under_random_workload(tiny_llama, seed):
    reqs = random_workload(seed, tiny_llama.vocab_size, tiny_llama.eos_id)
    reasons = assert_modes_agree(tiny_llama, reqs, lambda mode: make_llm(tiny_llama, mode, max_num_seqs=3))
    assert reasons >= {"stop", "length"}


def test_mask_is_built_from_committed_state(tiny_llama):
    v = tiny_llama.vocab_size
    params = [SamplingParams(max_tokens=12, constraint=lambda: Successor(v)) for _ in range(3)]
    params.append(SamplingParams(max_tokens=12))  # an unconstrained row in the same batches
    with make_llm(tiny_llama) as llm:
        outs = llm.generate([[1, 2, 3], [7], [40, 41], [9, 9]], params)
    for out in outs[:3]:
        toks = out.token_ids
        assert all(b == (a + 1) % v for a, b in zip(toks, toks[1:])), toks


def test_outputs_and_stats(tiny_llama):
    with make_llm(tiny_llama) as llm:
        forced = SamplingParams(max_tokens=10, constraint=lambda: ForceAt(3, tiny_llama.eos_id))
        (stopped, capped) = llm.generate([[5, 6, 7], "the pipeline"], [forced, SamplingParams(max_tokens=5)])
        assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == tiny_llama.eos_id
        assert len(stopped.token_ids) == 4
        assert stopped.text == llm.tokenizer.decode(stopped.token_ids[:-1])
        assert capped.finish_reason == "length" and len(capped.token_ids) == 5
        assert capped.metrics.ttft > 0 and capped.metrics.decode_seconds >= 0
        stats = settled_stats(llm)
        assert stats["steps"] == stats["prefill_steps"] + stats["decode_steps"] > 0
        assert stats["kv_pages_free"] == stats["kv_pages_total"] and stats["running"] == stats["waiting"] == 0


def test_ttft_counts_from_submit_so_a_prompts_tokenization_is_in_it(tiny_llama):
    with make_llm(tiny_llama) as llm:
        encode = llm.tokenizer.encode

        def slow_encode(text: str) -> list[int]:
            time.sleep(0.05)
            return encode(text)

        llm.tokenizer.encode = slow_encode
        (out,) = llm.generate(["the pipeline"], SamplingParams(max_tokens=2))
    assert out.metrics.ttft >= 0.05


def test_on_finish_hands_the_result_over_instead_of_keeping_it(tiny_llama):
    """submit(on_finish=...) (the server's engine process): called once with the output, and the
    result is not kept for result(); pending ones get the error when the engine shuts down."""
    llm = make_llm(tiny_llama, num_pages=1024)
    done = threading.Event()
    got = []
    rid = llm.submit([5, 6, 7], SamplingParams(max_tokens=3), on_finish=lambda out, err: (got.append((out, err)),
                                                                                       done.set()))
    assert done.wait(30)
    ((out, err),) = got
    assert err is None and out.request_id == rid and len(out.token_ids) == 3
    with pytest.raises(KeyError):
        llm.result(rid)
    failed = []
    llm.submit([5, 6, 7], SamplingParams(max_tokens=3000, ignore_eos=True), on_finish=lambda o, e: failed.append(e))
    llm.shutdown()
    assert len(failed) == 1 and isinstance(failed[0], RuntimeError)


def test_stop_token_ids_and_ignore_eos(tiny_llama):
    with make_llm(tiny_llama) as llm:
        base = llm.generate([[3, 4]], SamplingParams(max_tokens=8))[0].token_ids
        stop = base[2]
        out = llm.generate([[3, 4]], SamplingParams(max_tokens=8, stop_token_ids=[stop]))[0]
        assert out.finish_reason == "stop" and out.token_ids == base[: base.index(stop) + 1]
        ignore = SamplingParams(max_tokens=6, ignore_eos=True, constraint=lambda: ForceAt(1, tiny_llama.eos_id))
        out = llm.generate([[3, 4]], ignore)[0]
        assert out.finish_reason == "length" and out.token_ids[1] == tiny_llama.eos_id and len(out.token_ids) == 6


def test_planted_read_before_wait_is_caught(tiny_llama, monkeypatch):
    """A commit that reads the landing buffer without waiting on its copy sees poison, and the
    engine fails every pending request with that error instead of hanging or emitting garbage."""
    monkeypatch.setattr(HostLanding, "wait", lambda self: self.host[: self._n])
    llm = make_llm(tiny_llama)
    with pytest.raises(RuntimeError, match="failed") as err:
        llm.generate([[1, 2], [3]], SamplingParams(max_tokens=4))
    assert "read before its copy completed" in str(err.value.__cause__)
    with pytest.raises(RuntimeError, match="loop died"):
        llm.submit([1])


def test_start_up_objects_are_frozen_out_of_the_collectors_walk(tiny_llama):
    """What the engine builds once (the detokenizer's byte table among it: one object per token id)
    is frozen at start-up, so no collection on the loop thread walks it; building it at the first
    request left it young, and a gen-1 pass over it stalled the loop (run y)."""
    import gc

    with make_llm(tiny_llama) as llm:
        table = llm.tokenizer.token_bytes
        assert table is not None and gc.get_freeze_count() > 0
        assert not any(o is table for o in gc.get_objects())
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3))
        assert llm.tokenizer.token_bytes is table


def test_loop_blocks_when_idle(tiny_llama):
    with make_llm(tiny_llama) as llm:
        llm.generate([[1]], SamplingParams(max_tokens=2))
        before = os.times()
        time.sleep(0.5)
        after = os.times()
        assert (after.user - before.user) + (after.system - before.system) < 0.1


def test_idle_holds_only_while_the_loop_waits_with_nothing_queued(tiny_llama):
    """What `serve --busy-poll` polls on: the loop thread parked and nothing in its inbox, so no
    thread but the intake's will wake it."""
    def settles_idle(llm) -> bool:
        deadline = time.monotonic() + 10
        while not llm.idle and time.monotonic() < deadline:
            time.sleep(0.001)
        return llm.idle

    with make_llm(tiny_llama) as llm:
        assert settles_idle(llm)
        rid = llm.submit([1, 2, 3], SamplingParams(max_tokens=32, ignore_eos=True))
        assert not llm.idle  # (queued, or taken by the loop, which is no longer parked)
        llm.result(rid)
        assert settles_idle(llm)
        with llm._cv:  # (the loop cannot take what is queued while this thread holds its lock)
            llm._inbox.append(("abort", 10**6))
            assert llm._parked and not llm.idle
            llm._cv.notify()
        assert settles_idle(llm)


def test_callback_error_aborts_only_its_request(tiny_llama):
    def boom(rid, n, delta):
        raise ValueError("consumer failed")

    with make_llm(tiny_llama) as llm:
        bad = llm.submit([1, 2], SamplingParams(max_tokens=5), on_token=boom)
        good = llm.submit([1, 2], SamplingParams(max_tokens=5))
        with pytest.raises(RuntimeError, match="consumer failed"):
            llm.result(bad)
        assert len(llm.result(good).token_ids) == 5
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_abort_of_waiting_and_running_requests(tiny_llama):
    with make_llm(tiny_llama, max_num_seqs=1) as llm:
        gate = threading.Event()
        running = llm.submit([1], SamplingParams(max_tokens=200), on_token=lambda *a: gate.set())
        waiting = llm.submit([2], SamplingParams(max_tokens=5))
        gate.wait(10)
        llm.abort(waiting)
        llm.abort(running)
        assert llm.result(waiting).finish_reason == "abort"
        assert llm.result(running).finish_reason == "abort"
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
def test_after_callbacks_runs_once_each_group_of_callbacks_has(tiny_llama, mode):
    """Every token and every end is followed by `after_callbacks`, so a consumer that batches them
    there leaves nothing behind: an abort with nothing left to commit after it included; a commit's
    tokens (one per running request) are shipped together."""
    batch, shipped = [], []

    def ship():
        if batch:
            shipped.append(list(batch))
            batch.clear()

    def ended(out, _error):
        batch.append((out.request_id, "end"))

    def ends():
        return [r for group in shipped for r, n in group if n == "end"]

    def wait_for(count):
        deadline = time.monotonic() + 10
        while len(ends()) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ends()) == count and not batch

    with make_llm(tiny_llama, mode) as llm:
        llm.after_callbacks = ship
        gate = threading.Event()
        alone = llm.submit([9], SamplingParams(max_tokens=200, ignore_eos=True), on_token=lambda *a: gate.set(),
                           on_finish=ended)
        gate.wait(10)
        llm.abort(alone)
        wait_for(1)
        ids = [llm.submit([1 + i], SamplingParams(max_tokens=6, ignore_eos=True),
                          on_token=lambda rid, n, _d: batch.append((rid, n)), on_finish=ended) for i in range(2)]
        wait_for(3)
        flat = [item for group in shipped for item in group]
        for rid in ids:
            assert [n for r, n in flat if r == rid] == [1, 2, 3, 4, 5, 6, "end"]
        assert any({r for r, _ in group} >= set(ids) for group in shipped)


def test_other_architectures_greedy_and_pipelined_equal_blocking(tiny_other_arch):
    tm = tiny_other_arch
    rng = random.Random(4)
    prompts = [[rng.randrange(tm.vocab_size) for _ in range(n)] for n in (2, 9, 17)]
    outs = {}
    for mode in ("blocking", "pipelined"):
        with make_llm(tm, mode) as llm:
            outs[mode] = llm.generate(prompts, SamplingParams(max_tokens=12))
    for i, p in enumerate(prompts):
        want = hf_greedy(tm.hf, p, 12, tm.eos_id)
        assert tie_aware_equal(tm.hf, p, outs["blocking"][i].token_ids, want)
        assert tie_aware_equal(tm.hf, p, outs["pipelined"][i].token_ids, outs["blocking"][i].token_ids)
    reqs = random_workload(7, tm.vocab_size, tm.eos_id, n=10)
    assert_modes_agree(tm, reqs, lambda mode: make_llm(tm, mode, max_num_seqs=3))


def test_bad_input_never_reaches_the_loop(tiny_llama):
    with make_llm(tiny_llama, max_model_len=64) as llm:
        running = llm.submit([1, 2, 3], SamplingParams(max_tokens=30))
        bad = [("", ValueError, "prompt is empty"), ([], ValueError, "prompt is empty"),
               ([1, tiny_llama.vocab_size], ValueError, "outside the vocabulary"), ([-1], ValueError, "outside"),
               ([1] * 64, ValueError, "max_model_len is 64"), (3.5, TypeError, "string or a list of token ids"),
               ([1, "a"], TypeError, "token ids are integers, got 'a'"),
               ([1, True], TypeError, "token ids are integers, got True"), ([1, 2.0], TypeError, "got 2.0 \\(float\\)"),
               ([1, 2**70], ValueError, "in the vocabulary"), (np.array([1.0]), TypeError, "string or a list")]
        for prompt, kind, match in bad:
            with pytest.raises(kind, match=match):
                llm.submit(prompt)
        with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
            llm.generate([[1]], [SamplingParams(), SamplingParams()])
        numpy_ids = llm.generate([[np.int64(1), np.int32(2)]], SamplingParams(max_tokens=2))[0]
        assert numpy_ids.prompt_token_ids == [1, 2] and type(numpy_ids.prompt_token_ids[0]) is int
        array = llm.generate([np.array([1, 2], dtype=np.int32)], SamplingParams(max_tokens=2))[0]
        assert array.prompt_token_ids == [1, 2] and array.token_ids == numpy_ids.token_ids
        out = llm.result(running)
        assert out.finish_reason in ("stop", "length") and len(out.token_ids) <= 30
        long = llm.generate([[1] * 60], SamplingParams(max_tokens=50))[0]  # capped by the model length
        assert long.finish_reason in ("stop", "length") and len(long.token_ids) <= 4
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]
    with make_llm(tiny_llama, num_pages=4) as small, pytest.raises(ValueError, match="needs 16 KV pages"):
        small.submit([1], SamplingParams(max_tokens=60))


def test_shutdown_fails_pending_requests_instead_of_hanging(tiny_llama):
    llm = make_llm(tiny_llama)
    started = threading.Event()

    def slow_consumer(rid, n, delta):
        started.set()
        time.sleep(0.02)  # 200 tokens take 4 s: the shutdown comes first

    rid = llm.submit([1, 2], SamplingParams(max_tokens=200, ignore_eos=True), on_token=slow_consumer)
    started.wait(10)
    llm.shutdown()
    with pytest.raises(RuntimeError, match="shut down before this request finished"):
        llm.result(rid, timeout=5)
    with pytest.raises(RuntimeError, match="shut down"):
        llm.submit([1])


def staggered(llm: LLM, prompts: list[list[int]], params: list[SamplingParams], first: int = 2) -> list:
    """Submit the first `first` prompts, then each next one when an earlier request commits a token."""
    ids: list[int] = []
    lock = threading.Lock()

    def next_arrives(rid, n, delta):
        with lock:
            if len(ids) < len(prompts) and n == 2:
                i = len(ids)
                ids.append(llm.submit(prompts[i], params[i], on_token=next_arrives))

    with lock:
        for i in range(first):
            ids.append(llm.submit(prompts[i], params[i], on_token=next_arrives))
    outs, i = [], 0
    while i < len(prompts):
        if i < len(ids):
            outs.append(llm.result(ids[i]))
            i += 1
        else:  # every request so far ended before its second token: submit the next one now
            with lock:
                ids.append(llm.submit(prompts[len(ids)], params[len(ids)], on_token=next_arrives))
    return outs


CHUNKED_LENS = [240, 3, 97, 24, 25, 150, 1, 48, 61, 33]  # up to ten budgets of 24 tokens; pages of 4


def test_chunked_prefill_matches_transformers_with_staggered_arrivals(tiny_llama):
    """Prompts up to ten times the step budget, prefilled in chunks beside other requests' decode
    rows (chunk edges on and off page boundaries), arriving while others prefill and decode, more
    requests than max_num_seqs: greedy equals transformers, and every page comes back."""
    rng = random.Random(8)
    prompts = [[rng.randrange(tiny_llama.vocab_size) for _ in range(n)] for n in CHUNKED_LENS]
    params = [SamplingParams(max_tokens=rng.randint(2, 10)) for _ in prompts]
    with make_llm(tiny_llama, max_num_seqs=3, max_prefill_tokens=24, num_pages=400) as llm:
        outs = staggered(llm, prompts, params)
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]
        assert stats["prefill_steps"] >= sum(CHUNKED_LENS) // 24
    full = sum(tie_aware_equal(tiny_llama.hf, p, o.token_ids,
                               hf_greedy(tiny_llama.hf, p, sp.max_tokens, tiny_llama.eos_id))
               for p, o, sp in zip(prompts, outs, params))
    assert full >= len(prompts) - 1, f"only {full} of {len(prompts)} sequences compared in full"


@pytest.mark.parametrize("seed", [3, 4])
def test_chunked_pipelined_equals_blocking_under_random_workload(tiny_llama, seed):
    """The randomized workload (aborts, EOS zombies, sampled rows, arrivals tied to token indices)
    with long prompts under a 24-token budget."""
    reqs = random_workload(seed, tiny_llama.vocab_size, tiny_llama.eos_id)
    rng = random.Random(seed)
    for r in reqs[::2]:
        r.prompt = [rng.randrange(tiny_llama.vocab_size) for _ in range(rng.choice([30, 64, 130, 240]))]
    assert_modes_agree(tiny_llama, reqs, lambda mode: make_llm(tiny_llama, mode, max_num_seqs=3, num_pages=400,
                                                              max_prefill_tokens=24))


def test_seeded_sampling_is_the_same_whatever_the_chunking(tiny_llama):
    rng = random.Random(6)
    prompts = [[rng.randrange(tiny_llama.vocab_size) for _ in range(n)] for n in (70, 5, 130)]
    params = [SamplingParams(max_tokens=8, temperature=0.8, top_p=0.95, seed=i) for i in range(3)]
    outs = {}
    for budget in (24, 400):
        with make_llm(tiny_llama, num_pages=400, max_prefill_tokens=budget) as llm:
            outs[budget] = llm.generate(prompts, params)
    for p, sp, a, b in zip(prompts, params, outs[24], outs[400]):
        assert tie_aware_equal(tiny_llama.hf, p, a.token_ids, b.token_ids, sp.temperature, sp.seed)


def test_a_prompt_longer_than_the_budget_is_accepted_and_the_budget_must_hold_every_row(tiny_llama):
    with make_llm(tiny_llama, max_model_len=128, max_prefill_tokens=16) as llm:
        out = llm.generate([[3] * 120], SamplingParams(max_tokens=4))[0]  # one prompt of most of the context
        assert len(out.token_ids) == 4
    with pytest.raises(ValueError, match="max_prefill_tokens .* must be >= max_num_seqs \\(4\\)"):
        make_llm(tiny_llama, max_prefill_tokens=3)
