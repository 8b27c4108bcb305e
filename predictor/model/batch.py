"""Whole per-GPU batches: a global batch split over a fleet's GPUs, with gradient accumulation where needed.

Every candidate fleet has up to K groups of equal GPUs. One optimizer step of ``E`` samples is ``a`` micro-steps
(``accumulate_grad_batches``, the same on every rank: DDP all-reduces once per optimizer step); each micro-step
splits ``E / a`` samples over the GPUs in proportion to their speed, in whole samples (largest remainders get the
leftover ones, every GPU at least one). A GPU of group k then takes ``lo[k]`` samples per micro-step, or
``lo[k] + 1`` for ``plus[k]`` of the group's GPUs, and ``a`` times that per optimizer step. So the per-rank batches
add up exactly to the global batch, and :func:`rank_batches` lists them for the launcher.
"""

from __future__ import annotations

import numpy as np


def split_micro(
    micro_global: np.ndarray, speed: np.ndarray, gpus: np.ndarray, present: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split ``micro_global[i]`` samples over candidate i's GPUs in proportion to ``speed`` (N, K).

    Returns ``(lo, plus, ok)``: (N, K) whole samples per GPU and how many GPUs of the group take one more, and
    (N,) whether every GPU got at least one sample (False: more GPUs than samples; ``lo`` is then 1).
    """
    m = np.asarray(micro_global, dtype=float)
    n_gpus = np.where(present, gpus, 0.0)
    ranks = n_gpus.sum(axis=1)
    weight = np.where(present, speed, 0.0)
    unit = weight / np.maximum((weight * n_gpus).sum(axis=1), 1e-300)[:, None]  # share of one GPU per sample
    share = m[:, None] * unit
    # a slow GPU whose proportional share is below one sample gets one, and the rest is shared in proportion
    short = (present & (share < 1)).any(axis=1) & (m >= ranks)
    share = np.where(short[:, None], 1 + (m - ranks)[:, None] * unit, share)
    lo = np.where(present, np.floor(share + 1e-9), 0.0)
    left = np.round(m - (lo * n_gpus).sum(axis=1))
    frac = np.where(present, share - lo, -1.0)
    order = np.argsort(-frac, axis=1, kind="stable")
    plus = np.zeros_like(lo)
    rows = np.arange(len(m))
    for j in range(lo.shape[1]):
        k = order[:, j]
        give = np.clip(left, 0, n_gpus[rows, k])
        plus[rows, k] = give
        left -= give
    ok = m >= ranks
    lo = np.where(ok[:, None], lo, np.where(present, 1.0, 0.0))
    plus = np.where(ok[:, None], plus, 0.0)
    return lo, plus, ok


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in ascending order (the accumulations that keep every micro-step whole)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def rank_batches(lo: float, plus: float, gpus: int) -> list[int]:
    """The micro-batch of each of a group's ``gpus`` GPUs: ``plus`` of them take ``lo + 1``."""
    return [int(lo) + 1] * int(plus) + [int(lo)] * (gpus - int(plus))
