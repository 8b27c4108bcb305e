"""The time-cost Pareto front of the feasible candidates."""

from __future__ import annotations

import numpy as np


def pareto(candidates: np.ndarray, time_h: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices not dominated in (time, cost), fastest first.

    A front of a few thousand anchors (the fastest, the cheapest and a strided sample) first rules out every
    candidate one of them dominates (a binary search each), so that the exact sort runs on the few left.
    """
    if len(candidates) > 20_000:
        n = len(candidates)
        anchors = np.unique(
            np.concatenate(
                (
                    np.argpartition(time_h[candidates], 255)[:256],
                    np.argpartition(cost[candidates], 255)[:256],
                    np.arange(0, n, max(1, n // 2048)),
                )
            )
        )
        front = exact_front(candidates[anchors], time_h, cost)
        ft, fc = time_h[front], cost[front]
        t, c = time_h[candidates], cost[candidates]
        j = np.searchsorted(ft, t, side="right") - 1  # the anchor with the largest time <= t (cheapest there)
        jj = np.clip(j, 0, None)
        dominated = (j >= 0) & (fc[jj] <= c) & ((ft[jj] < t) | (fc[jj] < c))
        candidates = candidates[~dominated]
    return exact_front(candidates, time_h, cost)


def exact_front(candidates: np.ndarray, time_h: np.ndarray, cost: np.ndarray) -> np.ndarray:
    if not len(candidates):
        return candidates
    order = candidates[np.lexsort((cost[candidates], time_h[candidates]))]
    c = cost[order]
    best_before = np.concatenate(([np.inf], np.minimum.accumulate(c)[:-1]))
    return order[c < best_before]
