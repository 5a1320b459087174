"""The tick and the zombie rules, stepped by hand on an EngineCore (no loop thread)."""
from __future__ import annotations

import pytest

from constraints import ForceAt
from slipstream.config import EngineConfig
from slipstream.engine import EngineCore
from slipstream.sampling import SamplingParams


def make_core(model, mode: str, finished: list):
    cfg = EngineConfig(model=str(model.path), device="cpu", mode=mode, max_num_seqs=4, num_pages=64, page_size=4)
    return EngineCore(cfg, finished.append)


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


def test_prefill_in_flight_lets_new_arrivals_wait_for_one_decode_step(tiny_llama):
    """Each prefill step costs a fixed launch overhead, so with a prefill in flight the next step
    decodes the running sequences and arrivals gather for one larger prefill after it."""
    core = make_core(tiny_llama, "pipelined", [])
    sched = core.scheduler
    kinds = []
    launch = core.runner.launch_forward
    core.runner.launch_forward = lambda step: kinds.append((step.kind, len(step.seqs))) or launch(step)
    sched.add(core.make_sequence([1, 2], SamplingParams(max_tokens=8), None))
    sched.tick()  # prefill of the first request, in flight
    for i in range(3):
        sched.add(core.make_sequence([3 + i], SamplingParams(max_tokens=8), None))
    sched.tick()  # decode of the first request; the three arrivals wait
    sched.tick()  # one prefill for all three
    assert kinds == [("prefill", 1), ("decode", 1), ("prefill", 3)]
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
