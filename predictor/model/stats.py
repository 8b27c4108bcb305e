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
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total
