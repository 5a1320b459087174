"""The matcher process's invariants (constrain/matcher_process.py), against the shared memory the
runner gives it, with no model: masks only after every earlier accept, accepts only once tokens have
landed, no matcher outliving its request, and a failed or dead helper raising at the loop's next wait."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch

from slipstream.constrain.grammar import GrammarBackend
from slipstream.constrain.matcher_process import FILLED
from slipstream.device import DeviceLayer, SharedHost
from slipstream.runner import SIGNAL_WORDS
from slipstream.slot import DecodeSlot

pytest.importorskip("xgrammar")

VOCAB = ["</s>", "a", "b", "c", "1", "2"]  # token 0 ends a grammar
ROWS = 4


class Runner:
    """What GrammarBackend takes from the runner: the shared memory and where the slots' parts are."""

    def __init__(self) -> None:
        self.max_rows = ROWS
        self.shared = SharedHost(DeviceLayer(torch.device("cpu")), SharedHost.size(
            [((SIGNAL_WORDS,), torch.int64)] + 2 * DecodeSlot.shared_parts(ROWS, len(VOCAB))))
        self.signals = self.shared.take(SIGNAL_WORDS, torch.int64).numpy()
        self.tokens = [self.shared.take(ROWS, torch.int64).numpy() for _ in range(2)]
        self.masks = [self.shared.take((ROWS, 1), torch.int32).numpy() for _ in range(2)]
        self.slots = [type("Slot", (), {"mask_host": m})() for m in self.masks]

    def shared_layout(self):
        return (self.shared.offset(self.signals),
                [(self.shared.offset(t), self.shared.offset(m)) for t, m in zip(self.tokens, self.masks)])

    def allowed(self, slot: int, row: int) -> list[str]:
        bits = int(self.masks[slot][row, 0]) & 0xFFFFFFFF
        return [VOCAB[i] for i in range(len(VOCAB)) if bits >> i & 1]


class Tokenizer:
    class fast:
        @staticmethod
        def get_vocab(with_added_tokens: bool = True) -> dict[str, int]:
            return {t: i for i, t in enumerate(VOCAB)}


@pytest.fixture
def helper():
    runner = Runner()
    backend = GrammarBackend(Tokenizer(), len(VOCAB), [0], runner)
    yield runner, backend
    backend.close()


def land(runner: Runner, slot: int, tokens: list[int]) -> None:
    runner.tokens[slot][: len(tokens)] = tokens


def test_1_masks_follow_every_earlier_accept(helper):
    """Row 0 under "ab", row 1 under "[12]+": each step's mask is the one after the tokens before."""
    runner, backend = helper
    process = backend.process
    for row, (option, value) in enumerate([("choice", ["ab"]), ("regex", "[12]+")]):
        backend.constraint(option, value).bind(row)
    runner.tokens[0][:] = -1
    process.wait_filled(process.post_fill(0, [0, 1], [0, 1]))
    assert runner.allowed(0, 0) == ["a"] and runner.allowed(0, 1) == ["1", "2"]
    process.post_accept(0, [0, 1], [0, 1])
    land(runner, 0, [1, 5])  # a, 2
    process.wait_filled(process.post_fill(1, [0, 1], [0, 1]))
    assert runner.allowed(1, 0) == ["b"] and runner.allowed(1, 1) == ["</s>", "1", "2"]
    runner.tokens[1][:] = -1
    process.post_accept(1, [0, 1], [0, 1])
    land(runner, 1, [2, 0])  # b, </s>: row 1 has ended, so its row allows anything (a zombie's)
    process.wait_filled(process.post_fill(0, [0, 1], [0, 1]))
    assert runner.allowed(0, 0) == ["</s>"] and runner.allowed(0, 1) == VOCAB


def test_2_an_accept_waits_for_its_tokens_to_land_and_says_when_it_has_read_them(helper):
    runner, backend = helper
    process = backend.process
    backend.constraint("regex", "[abc]+").bind(2)
    runner.tokens[1][:] = -1
    read = process.post_accept(1, [3], [2])
    job = process.post_fill(0, [0], [2])
    time.sleep(0.2)
    assert runner.signals[FILLED] < job and runner.signals[1] < read  # (nothing has landed yet)
    land(runner, 1, [0, 0, 0, 3])  # c, at index 3
    process.wait_read(read)
    process.wait_filled(job)
    assert runner.allowed(0, 0) == ["</s>", "a", "b", "c"]


def test_3_no_matcher_outlives_its_request(helper):
    """Bound matchers go with their row's free; one never bound goes when its constraint is collected."""
    runner, backend = helper
    process = backend.process
    kept = [backend.constraint("regex", "a+") for _ in range(3)]
    kept[0].bind(0), kept[1].bind(1)
    assert settled(process, bound=[0, 1], pending=1)
    kept[0].free()
    del kept[2]
    gc.collect()
    assert settled(process, bound=[1], pending=0)


def settled(process, **want) -> bool:
    """The helper's matchers reach `want` once it has taken the jobs posted (another channel than stats')."""
    for _ in range(200):
        stats = process.stats()
        if all(stats[k] == v for k, v in want.items()):
            return True
        time.sleep(0.01)
    return False


def test_4_a_token_against_the_mask_raises_at_the_next_wait_and_every_one_after(helper):
    runner, backend = helper
    process = backend.process
    backend.constraint("regex", "a+").bind(0)
    runner.tokens[0][:] = -1
    process.post_accept(0, [0], [0])
    land(runner, 0, [2])  # b: never allowed
    job = process.post_fill(1, [0], [0])
    for _ in range(2):
        with pytest.raises(RuntimeError, match="token 2 of row 0 was sampled against its grammar mask"):
            process.wait_filled(job)


def test_4_a_dead_helper_raises_at_the_next_wait(helper):
    runner, backend = helper
    process = backend.process
    backend.constraint("regex", "a+").bind(0)
    runner.tokens[0][:] = -1
    process.post_accept(0, [0], [0])  # (its tokens never land)
    job = process.post_fill(1, [0], [0])
    process.proc.kill()
    with pytest.raises(RuntimeError, match="the matcher process exited"):
        process.wait_filled(job)
    with pytest.raises(RuntimeError, match="the matcher process exited"):
        backend.constraint("regex", "b+")


def test_a_bad_grammar_is_a_value_error_naming_the_option(helper):
    _, backend = helper
    with pytest.raises(ValueError, match="invalid regex"):
        backend.constraint("regex", "(a")
    assert backend.constraint("regex", "a").stop_ids == frozenset({0})
