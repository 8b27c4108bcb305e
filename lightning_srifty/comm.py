"""Timing every DDP gradient bucket's all-reduce through a communication hook (gloo and NCCL).

The hook wraps the real one (DDP's own mean, :func:`mean_allreduce_hook`, or the user's, e.g. fp16 compression),
so gradients are exactly what they would be without it. Per bucket it keeps a mark when the bucket is ready (its
gradients are computed) and one when its all-reduce completes; per step that gives the time the network was busy
and the part of it not hidden behind backward (exposed = completion of the last all-reduce - readiness of the last
bucket, which is when backward compute ends).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_srifty.timing import PerfCounterClock
from predictor.model.stats import merge_intervals


@dataclass
class _BucketRecord:
    step: int
    index: int
    nbytes: int
    ready: Any
    done: Any = None


@dataclass
class CommSeries:
    """Resolved all-reduce timings of the profiled steps, in seconds."""

    busy_s: list[float]
    exposed_s: list[float]
    bytes_per_step: int
    buckets: dict[int, tuple[int, list[float]]]  # index -> (bytes, durations)


class AllReduceTimer:
    """Records bucket all-reduce timings while ``enabled``; otherwise adds one attribute check per bucket."""

    def __init__(self) -> None:
        self.clock: Any = PerfCounterClock()
        self.enabled = False
        self.step = -1
        self._records: list[_BucketRecord] = []
        self.backend: str | None = None

    def start(self, clock: Any) -> None:
        self.clock = clock
        self._records.clear()
        self.enabled = True

    def stop(self) -> None:
        self.enabled = False

    def reset(self) -> None:
        self._records.clear()

    def wrap(self, inner_hook: Callable, inner_state: Any) -> tuple[Any, Callable]:
        """(state, hook) to pass to ``DistributedDataParallel.register_comm_hook``."""
        return _TimedState(self, inner_hook, inner_state), timed_comm_hook

    def record(self, bucket: Any) -> _BucketRecord | None:
        if not self.enabled:
            return None
        buffer = bucket.buffer()
        rec = _BucketRecord(self.step, bucket.index(), buffer.numel() * buffer.element_size(), self.clock.mark())
        self._records.append(rec)
        return rec

    def resolve(self, steps: list[int]) -> CommSeries | None:
        """Per-step busy and exposed time for the given step indices (those kept by the recorder)."""
        wanted = set(steps)
        records = [r for r in self._records if r.step in wanted and r.done is not None]
        if not records:
            return None
        times = self.clock.resolve([m for r in records for m in (r.ready, r.done)])
        by_step: dict[int, list[tuple[float, float, _BucketRecord]]] = defaultdict(list)
        for i, rec in enumerate(records):
            by_step[rec.step].append((times[2 * i], times[2 * i + 1], rec))
        busy, exposed, per_step_bytes = [], [], []
        buckets: dict[int, tuple[int, list[float]]] = {}
        for step in steps:
            items = by_step.get(step)
            if not items:
                continue
            busy.append(merge_intervals([(ready, done) for ready, done, _ in items]))
            last_ready = max(ready for ready, _, _ in items)
            exposed.append(max(0.0, max(done for _, done, _ in items) - last_ready))
            per_step_bytes.append(sum(rec.nbytes for _, _, rec in items))
            for ready, done, rec in items:
                buckets.setdefault(rec.index, (rec.nbytes, []))[1].append(done - ready)
        return CommSeries(busy, exposed, max(per_step_bytes), dict(sorted(buckets.items())))


@dataclass
class _TimedState:
    timer: AllReduceTimer
    inner_hook: Callable
    inner_state: Any

    def __getstate__(self) -> dict:  # DDP may pickle hook state (e.g. for model averaging); drop the timer
        return {"timer": None, "inner_hook": self.inner_hook, "inner_state": self.inner_state}


def mean_allreduce_hook(process_group: Any, bucket: Any) -> Any:
    """The gradient mean DDP computes with no hook, as a hook: the bucket scaled by ``1 / world`` (a multiplication,
    as DDP's reducer does while it copies gradients into the bucket; torch's ``default_hooks.allreduce_hook`` divides,
    which differs in the last bit where the world size is not a power of two), then summed over the ranks. What the
    timing hook wraps when the run gave no hook of its own: its gradients are bit for bit those of plain DDP."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def timed_comm_hook(state: _TimedState, bucket):
    """DDP communication hook: run the wrapped hook, recording when the bucket is ready and when it is reduced."""
    timer = state.timer
    rec = timer.record(bucket) if timer is not None else None
    future = state.inner_hook(state.inner_state, bucket)
    if rec is None:
        return future

    def _done(fut):
        rec.done = timer.clock.mark()
        return fut.value()

    return future.then(_done)
