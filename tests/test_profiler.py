"""The StepClock behind /metrics' GPU time: busy time is each step's first to last kernel, idle time
the gap before a step after the one before it, counted only while the loop had work all along,
and on the CPU stand-in both are host times; an engine with step timing counts every step. The
bench's StepProfiler splits decode steps from prefill steps, and its table shows both."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from slipstream import LLM, SamplingParams
from slipstream.device import DeviceLayer
from slipstream.bench.decode import format_profile
from slipstream.profiler import HOST_PHASES, IDLE_BUCKETS, StepClock, StepProfiler


def run_step(clock: StepClock, index: int, busy: float, idle_before: float = 0.0) -> None:
    step = SimpleNamespace(index=index)
    time.sleep(idle_before)
    clock.started(step)
    time.sleep(busy)
    clock.ended(step)
    clock.committed(step)


def test_busy_and_idle_come_from_the_stamps_and_a_pause_is_not_idle():
    clock = StepClock(DeviceLayer(torch.device("cpu")))
    run_step(clock, 0, busy=0.02)
    run_step(clock, 1, busy=0.01, idle_before=0.03)
    clock.pause()  # (the loop waited for requests)
    run_step(clock, 2, busy=0.01, idle_before=0.05)
    assert clock.steps == 3
    assert clock.busy_seconds == pytest.approx(0.04, abs=0.01)
    assert clock.idle_seconds == pytest.approx(0.03, abs=0.01)  # the gap before step 1 only
    assert sum(clock.idle_counts) == 1
    assert clock.idle_counts[next(i for i, b in enumerate(IDLE_BUCKETS) if b >= 0.03)] == 1


def test_a_step_not_right_after_the_last_committed_one_counts_no_idle():
    clock = StepClock(DeviceLayer(torch.device("cpu")))
    run_step(clock, 4, busy=0.0)
    run_step(clock, 6, busy=0.0, idle_before=0.01)
    assert sum(clock.idle_counts) == 0 and clock.steps == 2


def test_an_engine_with_step_timing_counts_every_step_in_its_stats():
    with LLM("random:tiny-llama", device="cpu", max_num_seqs=4, step_timing=True) as llm:
        llm.generate(["a b c", [5, 6, 7, 8]], SamplingParams(max_tokens=6, ignore_eos=True))
        stats = llm.stats()
    assert stats["timed_steps"] == stats["steps"] > 0
    assert stats["gpu_busy_seconds"] > 0 and 0 < sum(stats["gpu_idle_counts"]) < stats["steps"]
    with LLM("random:tiny-llama", device="cpu", max_num_seqs=4) as llm:
        assert "timed_steps" not in llm.stats()


class RecordedProfiler(StepProfiler):
    """A StepProfiler whose GPU timestamps are given (no CUDA events)."""

    def __init__(self, steps: list[dict[str, float]], ticks: list[tuple[float, float, float]]) -> None:
        self._steps, self.ticks = steps, ticks
        self.host = {name: [0.0001] * len(ticks) for name in HOST_PHASES}

    def steps(self) -> list[dict[str, float]]:
        return self._steps


def test_the_summary_splits_decode_steps_and_the_bench_prints_it_with_prefill_steps():
    steps = [{"kind": "prefill", "tokens": 900, "start": 0.0, "forward_end": 5.0, "end": 5.5},
             {"kind": "decode", "tokens": 4, "start": 6.0, "forward_end": 6.8, "end": 7.0},
             {"kind": "decode", "tokens": 4, "start": 7.1, "forward_end": 7.9, "end": 8.0}]
    summary = RecordedProfiler(steps, [(0.0, 0.0004, 0.0)] * 3).summary()
    assert summary["forward_median_ms"] == pytest.approx(0.8) and summary["gpu_idle_median_ms"] == pytest.approx(0.1)
    assert summary["step_median_ms"] == pytest.approx(1.1) and summary["prefill_gpu_median_ms"] == 5.5
    assert (summary["decode_steps"], summary["prefill_steps"]) == (2, 1)
    assert summary["gpu_busy_fraction"] == pytest.approx((5.5 + 1.0 + 0.9) / 8.0)
    table = format_profile({"pipelined md2-query x1": summary}).splitlines()
    assert len(table) == 2 and "prefill_gpu" in table[0] and "GPU busy" in table[0]
    assert table[1].split()[:2] == ["pipelined", "md2-query"] and "2/1" in table[1] and "92.5%" in table[1]
