"""The tick and the zombie rules, stepped by hand on an EngineCore (no loop thread)."""
from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest

from constraints import ForceAt, Successor
from slipstream.config import EngineConfig
from slipstream.engine import EngineCore
from slipstream.sampling import SamplingParams


def make_core(model, mode: str, finished: list, **options):
    opts = dict(device="cpu", mode=mode, max_num_seqs=4, num_pages=64, page_size=4)
    opts.update(options)
    return EngineCore(EngineConfig(model=str(model.path), **opts), finished.append)


def run_until(core, cond, limit=200):
    for _ in range(limit):
        if cond():
            return
        core.scheduler.tick()
    raise AssertionError("condition not reached")


def test_zombie_appends_nothing_emits_once_and_frees_pages_after_next_commit(tiny_llama):
    finished = []
    core = make_core(tiny_llama, "pipelined", finished)
    sched, pool = core.scheduler, core.pool
    eos = tiny_llama.eos_id
    zombie = core.make_sequence([1, 2, 3], SamplingParams(max_tokens=20, constraint=lambda: ForceAt(3, eos)), None)
    other = core.make_sequence([4, 5], SamplingParams(max_tokens=20), None)
    sched.add(zombie), sched.add(other)
    run_until(core, lambda: zombie.finalized)
    # the EOS committed at step t; step t+1 was launched before that commit and holds the zombie
    assert zombie.output_ids[-1] == eos and len(zombie.output_ids) == 4
    assert zombie.inflight_refs == 1 and zombie.row >= 0 and zombie.pages
    assert finished == [zombie]
    held = pool.num_free
    sched.tick()  # launches t+2 without the zombie, commits t+1: skipped for the zombie
    assert len(zombie.output_ids) == 4 and zombie.inflight_refs == 0
    assert zombie.row == -1 and not zombie.pages and pool.num_free > held
    assert all(zombie not in s.seqs for s in sched.pipeline.inflight)
    run_until(core, lambda: not sched.has_work())
    assert finished == [zombie, other]
    assert pool.num_free == pool.total


def test_blocking_mode_makes_no_zombies(tiny_llama):
    finished = []
    core = make_core(tiny_llama, "blocking", finished)
    seq = core.make_sequence([1, 2, 3], SamplingParams(max_tokens=20, constraint=lambda: ForceAt(2, tiny_llama.eos_id)),
                             None)
    core.scheduler.add(seq)
    run_until(core, lambda: seq.finalized)
    assert seq.inflight_refs == 0 and seq.row == -1
    assert core.pool.num_free == core.pool.total


def test_length_cap_is_planned_not_zombied(tiny_llama):
    """A sequence that will reach max_tokens is left out of the next plan, so it never
    becomes a zombie: pages come back at the commit that finalizes it."""
    core = make_core(tiny_llama, "pipelined", [])
    seq = core.make_sequence([1, 2, 3], SamplingParams(max_tokens=3), None)
    core.scheduler.add(seq)
    run_until(core, lambda: seq.finalized)
    assert seq.finish_reason == "length" and len(seq.output_ids) == 3
    assert seq.inflight_refs == 0 and seq.row == -1
    assert core.scheduler.steps == {"prefill": 1, "decode": 2}


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
def test_zombies_count_toward_max_num_seqs(tiny_llama, mode):
    core = make_core(tiny_llama, mode, [])
    sched = core.scheduler
    seqs = [core.make_sequence([i + 1], SamplingParams(max_tokens=6, constraint=lambda: ForceAt(1, tiny_llama.eos_id)),
                               None) for i in range(10)]
    for s in seqs:
        sched.add(s)
    peak = 0
    while sched.has_work():
        sched.tick()
        peak = max(peak, len(sched.running))
    assert peak == 4
    assert all(s.finalized and len(s.output_ids) == 2 for s in seqs)
    assert core.pool.num_free == core.pool.total


def test_a_failing_callback_on_the_final_text_still_finishes_once(tiny_llama):
    """Text held back for a possible stop string is released at the end; if the consumer raises
    on it, the request carries the error and is finished exactly once."""
    from constraints import ForceSequence

    finished = []
    core = make_core(tiny_llama, "pipelined", finished)
    ids = core.tokenizer.encode("the pipeline")
    seen = []

    def consumer(rid, n, delta):
        seen.append(delta)
        if delta.endswith("line"):
            raise ValueError("consumer gone")

    params = SamplingParams(max_tokens=len(ids), stop=["line!!"], constraint=lambda: ForceSequence(ids))
    seq = core.make_sequence([3], params, consumer)
    core.scheduler.add(seq)
    run_until(core, lambda: not core.scheduler.has_work())
    assert finished == [seq] and isinstance(seq.error, ValueError)
    assert seq.finish_reason == "length" and "".join(seen) == "the pipeline"
    assert core.pool.num_free == core.pool.total


def test_arrivals_ride_along_with_the_running_decode_rows(tiny_llama):
    """A request that arrives while others decode is prefilled in the next step, packed beside
    their decode rows: admissions never stall decoding, and decoding never delays an admission."""
    core = make_core(tiny_llama, "pipelined", [])
    sched = core.scheduler
    steps = []
    launch = core.runner.launch_forward
    core.runner.launch_forward = lambda step: steps.append((step.kind, step.num_decode, len(step.chunks))) or launch(step)
    sched.add(core.make_sequence([1, 2], SamplingParams(max_tokens=8), None))
    sched.tick()  # the first prompt
    for i in range(3):
        sched.add(core.make_sequence([3 + i], SamplingParams(max_tokens=8), None))
    sched.tick()  # the first request's decode row and the three prompts, in one step
    sched.tick()
    assert steps == [("prefill", 0, 1), ("prefill", 1, 3), ("decode", 4, 0)]
    run_until(core, lambda: not sched.has_work())
    assert core.pool.num_free == core.pool.total


def test_nothing_to_decode_means_prefill_right_away(tiny_llama):
    core = make_core(tiny_llama, "pipelined", [])
    sched = core.scheduler
    kinds = []
    launch = core.runner.launch_forward
    core.runner.launch_forward = lambda step: kinds.append(step.kind) or launch(step)
    sched.add(core.make_sequence([1], SamplingParams(max_tokens=1), None))
    sched.tick()
    sched.add(core.make_sequence([2], SamplingParams(max_tokens=1), None))
    sched.tick()  # the first request needs no decode step (max_tokens=1): the second prefills now
    assert kinds == ["prefill", "prefill"]
    run_until(core, lambda: not sched.has_work())


class InvariantChecker:
    """Checks the planning invariants (slipstream/scheduler.py) at every launch, with the sequences
    as planned (before their counters advance), and the in-flight references after every tick."""

    def __init__(self, core) -> None:
        self.core, self.sched = core, core.scheduler
        self.admitted: list[int] = []
        self.launches = {"prefill": 0, "decode": 0, "mixed": 0, "chunked": 0, "scaled": 0}
        launch = core.runner.launch_forward
        core.runner.launch_forward = lambda step: self.check_step(step) or launch(step)

    def check_step(self, step) -> None:
        sched = self.sched
        assert step.num_tokens <= sched.max_step_tokens  # 1
        if step.num_decode:
            prompt_tokens = step.num_tokens - step.num_decode
            assert prompt_tokens <= sched.prefill_chunk(step.seqs[:step.num_decode])  # 1
            self.launches["scaled"] += prompt_tokens > sched.max_prefill_chunk
        decodable = {s.request_id for s in sched.running.values()
                     if not s.finalized and not s.prefilling and s.sampled_launched < s.max_tokens}
        rows = step.seqs[:step.num_decode]
        assert {s.request_id for s in rows} == decodable  # 1: every decodable sequence, every step
        assert all(not s.prefilling for s in rows)  # 2: decode rows only after the last chunk
        for s, (start, n) in zip(step.seqs[step.num_decode:], step.chunks):
            assert start == s.kv_len and n >= 1 and start + n <= len(s.prompt_ids)  # 2: in order
            assert (s in step.sampled) == (start + n == len(s.prompt_ids))  # 2: only the last chunk samples
            if s.request_id not in self.admitted:
                self.admitted.append(s.request_id)
                assert start == s.cached_tokens and start % self.core.pool.page_size == 0  # 6: after a cached run
            if n < len(s.prompt_ids):
                self.launches["chunked"] += 1
        assert self.admitted == sorted(self.admitted)  # 3: first come, first served
        kind = "mixed" if step.kind == "prefill" and step.num_decode else step.kind
        self.launches[kind] += 1

    def check_refs(self) -> None:
        """4: each held sequence's references are the in-flight steps that carry it."""
        inflight = list(self.sched.pipeline.inflight)
        for s in self.sched.running.values():
            assert s.inflight_refs == sum(s in step.seqs for step in inflight)
            assert s.row >= 0 and s.pages
            assert all(self.core.pool.held(p) for p in s.pages)  # 6: never evictable while held


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
def test_planning_invariants_hold_at_every_step(tiny_llama, mode):
    """Long prompts (up to ten budgets), short ones, arrivals while others prefill and decode, more
    requests than rows, EOS zombies and aborts mid-prompt, under a budget of 24 tokens, 10 of them
    for prompts while anything decodes."""
    core = make_core(tiny_llama, mode, [], num_pages=400, max_prefill_tokens=24, max_prefill_chunk=10)
    sched = core.scheduler
    sched.weight_kv_tokens = 20  # (weights as light as 20 tokens of KV: rows of longer prompts take larger chunks)
    checker = InvariantChecker(core)
    rng = __import__("random").Random(3)
    seqs = []
    for i in range(14):
        n = rng.choice([1, 5, 23, 24, 25, 60, 240])
        force = (lambda k=rng.randrange(6): ForceAt(k, tiny_llama.eos_id)) if rng.random() < 0.3 else None
        seqs.append(core.make_sequence([rng.randrange(1, 300) for _ in range(n)],
                                       SamplingParams(max_tokens=rng.randint(1, 12), constraint=force), None))
    pending = list(seqs)
    for tick in range(2000):
        if pending and tick % 3 == 0:
            sched.add(pending.pop(0))
        if tick == 20:
            victim = next(s for s in seqs if s.prefilling and s.row >= 0)  # aborted mid-prompt
            sched.abort(victim.request_id)
        if not pending and not sched.has_work():
            break
        sched.tick()
        checker.check_refs()
    assert not pending and not sched.has_work()
    assert all(s.finalized for s in seqs) and core.pool.num_free == core.pool.total
    assert victim.finish_reason == "abort" and victim.output_ids == []
    assert checker.launches["mixed"] and checker.launches["chunked"] and checker.launches["decode"]
    assert checker.launches["scaled"]


def test_1_the_prompt_share_beside_decode_rows_grows_with_their_kv_once_it_outweighs_the_weights(tiny_llama):
    """A decode step costs about the same until its rows read more KV bytes than the weights, then
    grows with their KV: rows reading twice the weights' bytes carry twice `max_prefill_chunk`."""
    core = make_core(tiny_llama, "pipelined", [], max_prefill_chunk=10)
    sched, cfg = core.scheduler, tiny_llama.hf.config
    weights = sum(p.numel() for name, p in tiny_llama.hf.named_parameters() if name != "model.embed_tokens.weight")
    kv_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads
    assert sched.weight_kv_tokens == pytest.approx(weights / kv_token)
    rows = lambda *lengths: [SimpleNamespace(kv_len=n) for n in lengths]
    weights_worth = math.ceil(sched.weight_kv_tokens)  # (KV tokens of as many bytes as the weights, rounded up)
    assert sched.prefill_chunk([]) == sched.prefill_chunk(rows(0, 0)) == 10
    assert sched.prefill_chunk(rows(weights_worth // 2, weights_worth - weights_worth // 2)) == 10
    assert sched.prefill_chunk(rows(weights_worth, weights_worth)) == 20
    assert sched.prefill_chunk(rows(*[weights_worth] * 3)) == 30


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
def test_6_cached_pages_are_held_while_steps_read_them_and_runs_start_the_prefill(tiny_llama, mode):
    """Prompts on four shared starts (some repeated whole), a cache small enough that admission
    keeps evicting, arrivals while others run, EOS zombies on shared pages, under a 24-token budget."""
    core = make_core(tiny_llama, mode, [], num_pages=70, max_prefill_tokens=24, max_prefill_chunk=10)
    sched = core.scheduler
    checker = InvariantChecker(core)
    rng = __import__("random").Random(6)
    stems = [[rng.randrange(1, 300) for _ in range(rng.choice([8, 30, 41, 77]))] for _ in range(4)]
    seqs = []
    for i in range(24):
        tail = [rng.randrange(1, 300) for _ in range(rng.choice([0, 1, 9]))]
        force = (lambda k=rng.randrange(4): ForceAt(k, tiny_llama.eos_id)) if rng.random() < 0.3 else None
        seqs.append(core.make_sequence(rng.choice(stems) + tail, SamplingParams(max_tokens=rng.randint(1, 8),
                                                                                constraint=force), None))
    pending = list(seqs)
    for tick in range(3000):
        if pending and tick % 4 == 0:
            sched.add(pending.pop(0))
        if not pending and not sched.has_work():
            break
        sched.tick()
        checker.check_refs()
    assert not pending and all(s.finalized for s in seqs) and core.pool.num_free == core.pool.total
    assert sum(s.cached_tokens > 0 for s in seqs) >= 8 and sched.cached_tokens == sum(s.cached_tokens for s in seqs)


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
def test_6_a_chunks_pages_are_registered_after_the_ticks_commit_and_before_the_next_plan(tiny_llama, mode):
    """Hashing a long chunk's pages does not hold back the tokens the same tick commits: pipelined,
    the step launched in the tick is still unregistered while the previous step's callbacks run;
    blocking, its own commit (which may release its sequences) comes after. No plan ever runs
    before the last launched step's pages are registered, and a repeat of the prompt finds them."""
    core = make_core(tiny_llama, mode, [], num_pages=200, max_prefill_tokens=40)
    sched = core.scheduler
    at_commit, plans = [], []
    plan = sched._plan
    sched._plan = lambda: (plans.append(sched._unregistered), plan())[1]
    decoding = core.make_sequence([5, 6], SamplingParams(max_tokens=30, ignore_eos=True),
                                  lambda *a: at_commit.append(sched._unregistered))
    sched.add(decoding)
    run_until(core, lambda: len(decoding.output_ids) == 2)
    prompt = list(range(1, 130))
    sched.add(core.make_sequence(prompt, SamplingParams(max_tokens=2), None))
    run_until(core, lambda: not sched.has_work())
    repeat = core.make_sequence(prompt, SamplingParams(max_tokens=2), None)
    sched.add(repeat)
    run_until(core, lambda: not sched.has_work())
    assert plans and all(step is None for step in plans)
    chunked = [step for step in at_commit if step is not None and step.chunks]
    assert len(chunked) == (4 if mode == "pipelined" else 0)  # (129 tokens in chunks of 39: four steps)
    assert repeat.cached_tokens == 128


@pytest.mark.parametrize("mode", ["pipelined", "blocking"])
def test_5_a_commits_rest_runs_while_the_matcher_process_fills_and_ends_with_the_tick(tiny_llama, mode):
    """A constrained step's fill is posted to the matcher process at its launch; pipelined, the text
    and callbacks of the commit before run after that post and before the wait for the fill (so
    beside it), and are done when the tick returns; each request's callbacks come in token order,
    never two at once, and the consumer's batch is shipped as the rest ends, before the wait.
    Blocking, the commit comes after the step's sampling: nothing runs before a wait."""
    core = make_core(tiny_llama, mode, [])
    sched = core.scheduler
    log, calls, busy = [], {}, []

    def on_token(seq, delta):
        busy.append(1)
        assert len(busy) == 1, "two callbacks at once"
        calls.setdefault(seq.request_id, []).append(len(seq.output_ids))
        log.append("callback")
        busy.pop()

    seqs = [core.make_sequence([i + 1, i + 2], SamplingParams(max_tokens=12, ignore_eos=True, regex="[a-z]+"), None)
            for i in range(2)]
    seqs.append(core.make_sequence([9], SamplingParams(max_tokens=12, ignore_eos=True), None))
    process = seqs[0].constraint.process
    post_fill, wait_filled = process.post_fill, process.wait_filled
    process.post_fill = lambda *a: log.append("post") or post_fill(*a)
    process.wait_filled = lambda job: log.append("wait") or wait_filled(job)
    for s in seqs:
        s.on_token = on_token
        sched.add(s)
    sched.after_rest = lambda: log.append("ship")
    try:
        while sched.has_work():
            sched.tick()
            for s in sched.running.values():  # the rest of every commit is done: references dropped
                assert s.inflight_refs == sum(s in step.seqs for step in sched.pipeline.inflight)
    finally:
        core.close()
    assert all(calls[s.request_id] == list(range(1, 13)) for s in seqs)
    assert all(s.text.text.isalpha() for s in seqs[:2])  # (the regex held)
    waits = [i for i, e in enumerate(log) if e == "wait"]
    assert len(waits) >= 11
    between = [log[max(i for i in range(w) if log[i] == "post"):w] for w in waits]  # (from the post before each)
    if mode == "pipelined":  # (the previous commit's callbacks and ship between a fill's post and its wait)
        assert sum("callback" in b and "ship" in b for b in between) >= 10
    else:
        assert not any("callback" in b for b in between)
