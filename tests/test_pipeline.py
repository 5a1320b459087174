"""Each numbered invariant of the steps-in-flight state machine (slipstream/pipeline.py)."""
import random

import pytest

from slipstream.pipeline import Pipeline, Step


def _step(i: int) -> Step:
    return Step(i, "decode", [])


def test_1_at_most_depth_steps_in_flight():
    for depth in (1, 2):
        p = Pipeline(depth)
        for i in range(depth):
            p.launch(_step(i))
        assert not p.can_launch()
        with pytest.raises(AssertionError):
            p.launch(_step(depth))
    with pytest.raises(ValueError):
        Pipeline(3, num_slots=2)


def test_2_each_step_holds_its_own_slot():
    p = Pipeline(2)
    a, b = _step(0), _step(1)
    p.launch(a), p.launch(b)
    assert {a.slot, b.slot} == {0, 1}
    assert p.free_slots == []


def test_3_steps_commit_in_launch_order():
    p = Pipeline(2)
    rng = random.Random(0)
    launched, committed = [], []
    for i in range(200):
        if p.can_launch() and rng.random() < 0.6:
            s = _step(i)
            p.launch(s)
            p.finalize(s)
            launched.append(i)
        elif p.inflight:
            committed.append(p.commit_oldest().index)
    assert committed == launched[: len(committed)]


def test_4_commit_needs_finalize():
    p = Pipeline(2)
    s = _step(0)
    p.launch(s)
    with pytest.raises(AssertionError):
        p.commit_oldest()
    p.finalize(s)
    with pytest.raises(AssertionError):
        p.finalize(s)
    assert p.commit_oldest() is s


def test_5_slot_is_released_only_by_its_commit():
    p = Pipeline(2)
    a, b = _step(0), _step(1)
    p.launch(a), p.launch(b)
    p.finalize(b)  # b's sampling is queued, but it holds its slot until it commits, after a
    assert p.free_slots == []
    p.finalize(a)
    p.commit_oldest()
    assert p.free_slots == [a.slot]
    c = _step(2)
    p.launch(c)
    assert c.slot == a.slot


def test_6_depth_one_commits_before_the_next_launch():
    p = Pipeline(1)
    s = _step(0)
    p.launch(s)
    assert not p.can_launch()
    p.finalize(s)
    p.commit_oldest()
    assert p.can_launch()
