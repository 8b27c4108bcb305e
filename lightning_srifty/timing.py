"""Clocks for step timing: host ``perf_counter``, or CUDA events on the device timeline.

A clock hands out cheap opaque marks while training runs and turns them into seconds once, at the end of the
profile window (``resolve``), so that CUDA timing never forces a synchronisation inside a step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


class PerfCounterClock:
    """Host wall-clock marks (``time.perf_counter``), already in seconds."""

    name = "perf_counter"

    def mark(self) -> float:
        return time.perf_counter()

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        return [float(m) for m in marks]


class CudaEventClock:
    """Marks are CUDA events recorded on the current stream; resolved against the first one after one sync.

    Event differences measure the device timeline: when the GPU is the bottleneck they equal the step time, and
    when it starves (slow data loading) the gap between two events holds the idle time.
    """

    name = "cuda_event"

    def __init__(self, device: Any = None) -> None:
        import torch

        self._torch = torch
        self._device = device
        self._origin: Any = None

    def mark(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        if self._origin is None:
            self._origin = event
        return event

    def resolve(self, marks: Sequence[Any]) -> list[float]:
        if not marks:
            return []
        self._torch.cuda.synchronize(self._device)
        return [self._origin.elapsed_time(m) / 1e3 for m in marks]


def clock_for(device: Any) -> PerfCounterClock | CudaEventClock:
    """The right clock for a torch device: CUDA events on CUDA, perf_counter elsewhere."""
    if getattr(device, "type", None) == "cuda":
        return CudaEventClock(device)
    return PerfCounterClock()
