"""Whole per-GPU batches: a global batch split over a fleet's GPUs, with gradient accumulation where needed.

Every candidate fleet has up to K groups of equal GPUs. One optimizer step of ``E`` samples is ``a`` micro-steps
(``accumulate_grad_batches``, the same on every rank: DDP all-reduces once per optimizer step); each micro-step
splits ``E / a`` samples over the GPUs in proportion to their speed, in whole samples (largest remainders get the
leftover ones, every GPU at least one). A GPU of group k then takes ``lo[k]`` samples per micro-step, or
``lo[k] + 1`` for ``plus[k]`` of the group's GPUs, and ``a`` times that per optimizer step. So the per-rank batches
add up exactly to the global batch, and :func:`rank_batches` lists them for the launcher: :func:`fleet_batches` is
what ``srifty launch`` hands each fleet's job, the global batch (per optimizer step, always) kept from fleet to fleet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from predictor.exceptions import MigrationError

if TYPE_CHECKING:
    from predictor.documents.plan import PlanEntry


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


def assign_rank_batches(
    groups: Sequence[tuple[str, Sequence[int]]], rank_groups: Sequence[str]
) -> tuple[list[int], bool]:
    """Every rank's micro-batch on a fleet whose rank order is known only once its nodes have joined.

    torchrun numbers a mixed fleet's ranks in the order its nodes join the rendezvous, so the plan's per-rank list
    (group order) cannot be handed out before the job starts; each node knows its own group, and the ranks' groups
    are gathered at set-up (``rank_groups``: each rank's group key, in rank order).

    Args:
        groups: the plan's groups in plan order: (key, the micro-batch of each of the group's GPUs).
        rank_groups: the group key of every rank, in rank order.

    Returns:
        ``(sizes, resplit)``. When every group has as many ranks as the plan gave it, each rank takes the next of its
        group's planned batches (the plan's split exactly, in rank order; ``resplit`` False). Otherwise (the
        capacity was filled with another mix) the plan's samples per micro-step are split again over the ranks
        present in proportion to each group's mean planned batch (:func:`split_micro`, the ranking's own rule):
        the global batch stays the plan's (``resplit`` True).

    Raises:
        ConfigError: a rank's group is not in the plan, or more ranks than samples per micro-step.
    """
    from predictor.exceptions import ConfigError

    planned = {key: [int(b) for b in sizes] for key, sizes in groups}
    unknown = sorted({g for g in rank_groups if g not in planned})
    if unknown:
        raise ConfigError(
            f"rank(s) of the GPU group(s) {unknown} joined, but the plan's groups are {sorted(planned)}: every node "
            "of a srifty fleet names its plan group (its boot script exports it); re-generate the module with "
            "srifty terraform from the plan the fleet was made from.",
            parameter="rank_groups",
            value=unknown[0],
        )
    counts = {key: sum(1 for g in rank_groups if g == key) for key in planned}
    if all(counts[key] == len(sizes) for key, sizes in planned.items()):
        taken = {key: iter(sizes) for key, sizes in planned.items()}
        return [next(taken[g]) for g in rank_groups], False
    total = sum(sum(sizes) for sizes in planned.values())
    if total < len(rank_groups):
        raise ConfigError(
            f"{len(rank_groups)} ranks joined for a plan of {total} samples per micro-step: every rank needs at "
            "least one. The fleet is not the plan's: re-plan it with srifty recommend.",
            parameter="world_size",
            value=len(rank_groups),
        )
    keys = [key for key in planned if counts[key]]
    speed = np.array([[sum(planned[k]) / len(planned[k]) if planned[k] else 1.0 for k in keys]])
    gpus = np.array([[float(counts[k]) for k in keys]])
    lo, plus, _ = split_micro(np.array([float(total)]), speed, gpus, np.ones_like(gpus, dtype=bool))
    taken = {k: iter(rank_batches(lo[0, j], plus[0, j], counts[k])) for j, k in enumerate(keys)}
    return [next(taken[g]) for g in rank_groups], True


def rank_batch_sizes(entry: PlanEntry, micro_total: int | None = None) -> list[int]:
    """Whole per-rank batches per micro-step in group order, in proportion to the plan's per-GPU split, adding up to
    ``micro_total`` samples per micro-step over every rank (default: the plan's own; a global batch is per optimizer
    step, ``micro_total`` times the accumulation): the ranking's own split (:func:`split_micro`, largest remainders
    get the leftover samples), for one fleet."""
    gpus = [g.count * g.gpus_per_instance for g in entry.groups]
    shares = [float(g.per_device_batch) for g in entry.groups]
    a = entry.accumulate_grad_batches
    total = micro_total if micro_total is not None else round(sum(s * n for s, n in zip(shares, gpus)) / a)
    if total < sum(gpus):
        raise MigrationError(
            f"A batch of {total} samples per micro-step cannot be split over the {sum(gpus)} GPUs of "
            f"{entry.fleet}: every rank needs at least one sample."
        )
    lo, plus, _ = split_micro(
        np.array([float(total)]), np.array([shares]), np.array([gpus], dtype=float), np.ones((1, len(gpus)), bool)
    )
    return [b for k, n in enumerate(gpus) for b in rank_batches(lo[0, k], plus[0, k], n)]


def fleet_batches(entry: PlanEntry, global_batch: int | None = None) -> tuple[list[int], int]:
    """(per-rank batches per micro-step, accumulate_grad_batches) for ``entry``: exactly the plan's when it records
    them and they make ``global_batch`` samples per optimizer step (default: whatever they make); else the plan's
    per-GPU shares scaled to ``global_batch`` with the plan's accumulation.

    Raises:
        MigrationError: ``global_batch`` cannot be split into the entry's accumulation and GPUs.
    """
    a = entry.accumulate_grad_batches
    exact = entry.rank_batches()
    if exact is not None and (global_batch is None or sum(exact) * a == global_batch):
        return exact, a
    if global_batch is None:
        return rank_batch_sizes(entry), a
    if global_batch % a:
        raise MigrationError(
            f"The global batch of {global_batch} samples per optimizer step does not split into the "
            f"{a} micro-steps of {entry.fleet}: re-plan with srifty recommend (strong scaling keeps it)."
        )
    return rank_batch_sizes(entry, global_batch // a), a
