"""Summary statistics of measured series (numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from predictor.documents.profile import Stats


def summarize(values: Sequence[float]) -> Stats | None:
    """Mean, percentiles, spread and CV of ``values``; ``None`` for an empty series."""
    if len(values) == 0:
        return None
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean())
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    p50, p90, p99 = (float(x) for x in np.percentile(arr, [50, 90, 99]))
    return Stats(
        p50=p50,
        mean=mean,
        p90=p90,
        p99=p99,
        min=float(arr.min()),
        max=float(arr.max()),
        std=std,
        cv=std / mean if mean > 0 else 0.0,
        count=int(arr.size),
    )


def merge_intervals(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the union of ``[start, end]`` intervals."""
    total = 0.0
    current: tuple[float, float] | None = None  # the union's interval being extended
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = (start, end)
        else:
            current = (current[0], max(current[1], end))
    if current is not None:
        total += current[1] - current[0]
    return total
