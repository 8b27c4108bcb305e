"""A step recorder that knows nothing of Lightning: marks in, per-step phase times out.

One step (cycle) runs from the end of the previous step to the end of this one, so its phases add up to it:

    prev end ──data──> start ──forward──> before_backward ──backward──> after_backward ──optimizer──> end

``data`` is the wait for the next batch (loader plus framework overhead). Steps whose cycle contains something
that is not training (validation, checkpoint saving, an epoch boundary, the FLOP counter) are left out of the
statistics and counted by reason.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from predictor.documents.profile import PHASES
from predictor.exceptions import ProfileError


class Clock(Protocol):
    name: str

    def mark(self) -> Any: ...

    def resolve(self, marks: list[Any]) -> list[float]: ...


@dataclass
class _Step:
    index: int
    samples: int | None
    prev_end: Any
    start: Any
    before_backward: Any = None
    after_backward: Any = None
    end: Any = None
    backward_calls: int = 0
    excluded: str | None = None


@dataclass
class StepSeries:
    """Resolved measurements of the kept steps, in seconds."""

    indices: list[int] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    samples: list[int | None] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    phase_steps: int = 0
    excluded: dict[str, int] = field(default_factory=dict)
    window_start: float | None = None


class StepRecorder:
    """Collects per-step marks from a clock.

    Call ``anchor()`` at the end of the step before the first measured one, then per step ``begin()``,
    ``before_backward()``, ``after_backward()``, ``end()``; ``interrupt(reason)`` whenever non-training work runs.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._steps: list[_Step] = []
        self._open: _Step | None = None
        self._prev_end: Any = None
        self._pending: str | None = None

    @property
    def steps(self) -> int:
        """Closed steps recorded so far (excluded ones included)."""
        return len(self._steps)

    @property
    def anchored(self) -> bool:
        return self._prev_end is not None

    def anchor(self) -> None:
        """Mark the end of a step that is not itself measured."""
        self._prev_end = self.clock.mark()
        self._pending = None

    def interrupt(self, reason: str) -> None:
        """Non-training work ran: the step in progress, or else the next one, is left out."""
        if self._open is not None:
            self._open.excluded = self._open.excluded or reason
        elif self._prev_end is not None:
            self._pending = self._pending or reason

    def begin(self, index: int, samples: int | None) -> None:
        start = self.clock.mark()
        if self._prev_end is None:  # nothing to measure the data wait from: time the next step instead
            self._prev_end = start
            return
        self._open = _Step(index, samples, self._prev_end, start, excluded=self._pending)
        self._pending = None

    def before_backward(self) -> None:
        if self._open is not None:
            self._open.backward_calls += 1
            if self._open.before_backward is None:
                self._open.before_backward = self.clock.mark()

    def after_backward(self) -> None:
        if self._open is not None:
            self._open.after_backward = self.clock.mark()

    def end(self) -> None:
        now = self.clock.mark()
        if self._open is not None:
            self._open.end = now
            self._steps.append(self._open)
            self._open = None
        self._prev_end = now

    def reset(self) -> None:
        """Forget the recorded steps (keeps the anchor): the window starts now."""
        self._steps.clear()

    def resolve(self) -> StepSeries:
        """Turn the marks into seconds; raise ProfileError if the clock went backwards."""
        kept = [s for s in self._steps if s.excluded is None]
        order = ("prev_end", "start", "before_backward", "after_backward", "end")
        marks: list[Any] = []
        for step in kept:
            marks.extend(getattr(step, name) for name in order if getattr(step, name) is not None)
        seconds = iter(self.clock.resolve(marks))
        out = StepSeries(excluded=dict(Counter(s.excluded for s in self._steps if s.excluded)))
        for step in kept:
            times = {name: next(seconds) for name in order if getattr(step, name) is not None}
            names = list(times)
            for earlier, later in itertools.pairwise(names):
                if times[later] < times[earlier]:
                    raise ProfileError(
                        f"The {self.clock.name} clock went backwards at step {step.index}: {later!r} at "
                        f"{times[later]:.6f} s is earlier than {earlier!r} at {times[earlier]:.6f} s."
                    )
            if out.window_start is None:
                out.window_start = times["prev_end"]
            out.indices.append(step.index)
            out.step_s.append(times["end"] - times["prev_end"])
            out.samples.append(step.samples)
            if step.backward_calls == 1 and step.after_backward is not None:
                out.phase_steps += 1
                out.phases["data"].append(times["start"] - times["prev_end"])
                out.phases["forward"].append(times["before_backward"] - times["start"])
                out.phases["backward"].append(times["after_backward"] - times["before_backward"])
                out.phases["optimizer"].append(times["end"] - times["after_backward"])
        return out
