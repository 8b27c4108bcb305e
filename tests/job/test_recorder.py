"""The framework-free step recorder and all-reduce timer, on deterministic clocks."""

from __future__ import annotations

import pytest
import torch

from lightning_srifty.comm import AllReduceTimer
from lightning_srifty.profiling.recorder import StepRecorder
from predictor.exceptions import ProfileError
from predictor.model.stats import merge_intervals, summarize


class ScriptedClock:
    """Returns the given times in order, like a patched perf_counter."""

    name = "scripted"

    def __init__(self, times: list[float]) -> None:
        self._times = iter(times)

    def mark(self) -> float:
        return next(self._times)

    def resolve(self, marks: list[float]) -> list[float]:
        return list(marks)


def run_step(rec: StepRecorder, index: int, samples: int = 8) -> None:
    rec.begin(index, samples)
    rec.before_backward()
    rec.after_backward()
    rec.end()


def test_phases_add_up_to_the_step_exactly() -> None:
    # anchor 0.0 | step 1: start 0.1, bwd 0.4, after 0.9, end 1.0 | step 2: start 1.2, bwd 1.5, after 2.1, end 2.2
    rec = StepRecorder(ScriptedClock([0.0, 0.1, 0.4, 0.9, 1.0, 1.2, 1.5, 2.1, 2.2]))
    rec.anchor()
    run_step(rec, 1)
    run_step(rec, 2)
    out = rec.resolve()
    assert out.indices == [1, 2]
    assert out.step_s == pytest.approx([1.0, 1.2])
    assert out.phases["data"] == pytest.approx([0.1, 0.2])
    assert out.phases["forward"] == pytest.approx([0.3, 0.3])
    assert out.phases["backward"] == pytest.approx([0.5, 0.6])
    assert out.phases["optimizer"] == pytest.approx([0.1, 0.1])
    assert out.samples == [8, 8]


def test_interrupted_steps_are_excluded_by_reason() -> None:
    rec = StepRecorder(ScriptedClock([float(t) for t in range(20)]))
    rec.anchor()
    rec.interrupt("validation")  # between steps: the next step is left out
    run_step(rec, 1)
    run_step(rec, 2)
    rec.begin(3, 8)
    rec.interrupt("checkpoint")  # inside a step: that step is left out
    rec.before_backward()
    rec.after_backward()
    rec.end()
    out = rec.resolve()
    assert out.indices == [2]
    assert out.excluded == {"validation": 1, "checkpoint": 1}


def test_clock_going_backwards_is_rejected_naming_both_values() -> None:
    rec = StepRecorder(ScriptedClock([0.0, 0.5, 0.4, 0.6, 0.7]))
    rec.anchor()
    run_step(rec, 7)
    with pytest.raises(
        ProfileError,
        match=r"step 7: 'before_backward' at 0\.400000 s is earlier than 'start' at "
        r"0\.500000 s",
    ):
        rec.resolve()


def test_several_backward_calls_keep_the_step_but_not_its_phases() -> None:
    rec = StepRecorder(ScriptedClock([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]))
    rec.anchor()
    rec.begin(1, 4)
    rec.before_backward()
    rec.after_backward()
    rec.before_backward()
    rec.after_backward()
    rec.end()
    out = rec.resolve()
    assert out.step_s == pytest.approx([0.5])  # the second before_backward takes no mark
    assert out.phase_steps == 0
    assert out.phases["forward"] == []


def test_reset_starts_the_window_but_keeps_the_anchor() -> None:
    rec = StepRecorder(ScriptedClock([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]))
    rec.anchor()
    run_step(rec, 1)
    rec.reset()
    run_step(rec, 2)
    out = rec.resolve()
    assert out.indices == [2]
    assert out.step_s == pytest.approx([0.4])  # from the end of step 1 (0.4) to 0.8


def test_begin_without_anchor_times_from_the_next_step() -> None:
    rec = StepRecorder(ScriptedClock([0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]))
    rec.begin(0, 8)  # no anchor yet: this becomes the anchor
    rec.end()
    run_step(rec, 1)
    assert rec.resolve().indices == [1]


def test_summarize_and_interval_union() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0])
    assert (stats.p50, stats.mean, stats.min, stats.max, stats.count) == (2.5, 2.5, 1.0, 4.0, 4)
    assert stats.cv == pytest.approx(stats.std / 2.5)
    assert summarize([]) is None
    assert merge_intervals([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)


class FakeBucket:
    def __init__(self, index: int, numel: int) -> None:
        self._index, self._buffer = index, torch.zeros(numel)

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer


def _completed(value: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def test_timed_hook_passes_the_reduction_through_and_measures_exposure() -> None:
    timer = AllReduceTimer()
    # bucket 0 ready 1.0, done 1.5; bucket 1 (last) ready 2.0, done 2.6 -> busy 1.1, exposed 0.6
    timer.start(ScriptedClock([1.0, 1.5, 2.0, 2.6]))
    state, hook = timer.wrap(lambda s, bucket: _completed(bucket.buffer() + s), 1.0)
    timer.step = 5
    outputs = [hook(state, FakeBucket(i, n)).wait() for i, n in ((0, 4), (1, 2))]
    assert torch.equal(outputs[0], torch.ones(4)) and torch.equal(outputs[1], torch.ones(2))
    series = timer.resolve([5])
    assert series.busy_s == pytest.approx([1.1])
    assert series.exposed_s == pytest.approx([0.6])
    assert series.bytes_per_step == 6 * 4
    assert series.buckets == {0: (16, pytest.approx([0.5])), 1: (8, pytest.approx([0.6]))}


def test_disabled_timer_records_nothing() -> None:
    timer = AllReduceTimer()
    state, hook = timer.wrap(lambda s, bucket: _completed(bucket.buffer()), None)
    hook(state, FakeBucket(0, 3)).wait()
    assert timer.resolve([-1]) is None
