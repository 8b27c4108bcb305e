"""The fleet model, vectorised: ``predict_mixes(profile, names, type_index, counts)`` predicts any number of fleets of
up to K groups at once; ``predict_many(profile, types, counts)`` is its homogeneous case, and
:func:`predictor.predict.predict` is a one-row view of it with the words that explain the numbers. There is no
other copy of the model.

Everything that depends only on the instance type (compute per sample, input pipeline, intra-node all-reduce, the
model error) is computed once per type (:mod:`predictor.perf.basis`, operator sums included); what depends on the
fleet (batch split, inter-node all-reduce, overlap, data-parallel losses, memory, intervals) is numpy over all
candidates.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from predictor.catalog.catalog import Catalog
from predictor.exceptions import ConfigError, PredictionError
from predictor.perf.basis import Source, TypeBasis, bucket_sizes, grad_bytes, type_basis
from predictor.perf.memory import CUDA_CONTEXT_BYTES, estimate_memory
from predictor.perf.network import DEFAULT_NETWORK, NetworkModel, exposed_many
from predictor.perf.scaling import ScalingModel, measured_sigma, scaling_model
from predictor.perf.uncertainty import combined_sd, interval, model_error
from predictor.profile import Profile

Scaling = Literal["weak", "strong"]


@dataclass(frozen=True)
class ManyPredictions:
    """Arrays aligned with the candidates. Candidate ``i`` has up to K groups: ``counts[i, k]`` instances of
    ``names[type_index[i, k]]`` (a count of 0 leaves the slot empty; homogeneous fleets have K = 1)."""

    names: tuple[str, ...]
    type_index: np.ndarray  # (N, K)
    counts: np.ndarray  # (N, K)
    per_device_batch: np.ndarray  # (N, K): the speed-proportional split of mixed fleets
    iteration_time_s: np.ndarray
    throughput_samples_s: np.ndarray
    iteration_time_lo_s: np.ndarray
    iteration_time_hi_s: np.ndarray
    compute_s: np.ndarray
    input_s: np.ndarray
    allreduce_s: np.ndarray
    exposed_comm_s: np.ndarray
    dp_loss_s: np.ndarray  # stragglers and communication contention (predictor.perf.scaling)
    global_batch: np.ndarray
    fits_memory: np.ndarray
    memory_gib: np.ndarray  # the largest need of any group, per GPU
    memory_share: np.ndarray  # the largest need / GPU memory of any group (for headroom constraints)
    model_sd: np.ndarray  # relative sd of the prediction (profile CV and model error)

    group_gpus: np.ndarray  # (N, K) GPUs per group
    slowest_group: np.ndarray  # (N,) the group whose compute + input sets the step

    def group_throughput(self) -> np.ndarray:
        """(N, K) samples/s each group contributes (what an Auto Scaling group's weighted capacity counts)."""
        return self.per_device_batch * self.group_gpus / self.iteration_time_s[:, None]


@functools.lru_cache(maxsize=32)
def _bases(
    profile: Profile,
    names: tuple[str, ...],
    catalog: Catalog,
    network: NetworkModel,
    calibration: tuple[tuple[str, float], ...],
) -> tuple[Source, list[TypeBasis]]:
    """The per-type quantities, cached: a service ranks the same profile against the same catalog again and again
    (profiles and the network model are frozen, hence hashable; a catalog by identity)."""
    src = Source.of(profile, catalog)
    factors = dict(calibration)
    return src, [type_basis(profile, src, catalog.get(name), catalog, network, factors) for name in names]


def bases(
    profile: Profile,
    names: Sequence[str],
    catalog: Catalog,
    network: NetworkModel = DEFAULT_NETWORK,
    calibration: Mapping[str, float] | None = None,
    dp_model: ScalingModel | None = None,
) -> tuple[Source, list[TypeBasis]]:
    """The source step and the per-type quantities of ``names`` (cached when the profile is hashable)."""
    key = (profile, tuple(names), catalog, network, tuple(sorted((calibration or {}).items())))
    try:
        return _bases(*key)
    except TypeError:  # a profile with mappings inside (phases, dtypes) is not hashable: no cache
        return _bases.__wrapped__(*key)


def predict_many(
    profile: Profile,
    instance_types: Sequence[str],
    counts: Sequence[int] | np.ndarray,
    *,
    catalog: Catalog | None = None,
    scaling: Scaling = "weak",
    network: NetworkModel = DEFAULT_NETWORK,
    calibration: Mapping[str, float] | None = None,
    dp_model: ScalingModel | None = None,
) -> ManyPredictions:
    """Predict ``counts[i]`` instances of ``instance_types[i]`` for every i (homogeneous fleets).

    Raises:
        PredictionError / UnknownNameError: as :func:`predict` does for the first bad type.
        ConfigError: a count below 1, or the sequences differ in length.
    """
    n = np.asarray(counts)
    if len(instance_types) != len(n):
        raise ConfigError(
            f"predict_many() needs one count per instance type: got {len(instance_types)} types and {len(n)} counts.",
            parameter="counts",
            value=len(n),
        )
    if len(n) and n.min() < 1:
        raise ConfigError(f"Every count must be >= 1. Got {int(n.min())}.", parameter="counts", value=int(n.min()))
    names = sorted(set(instance_types))
    position = {name: i for i, name in enumerate(names)}
    idx = np.fromiter((position[t] for t in instance_types), dtype=int, count=len(n))
    return predict_mixes(
        profile,
        names,
        idx[:, None],
        n.reshape(-1, 1),
        catalog=catalog,
        scaling=scaling,
        network=network,
        calibration=calibration,
        dp_model=dp_model,
    )


def predict_mixes(
    profile: Profile,
    names: Sequence[str],
    type_index: np.ndarray,
    counts: np.ndarray,
    *,
    catalog: Catalog | None = None,
    scaling: Scaling = "weak",
    network: NetworkModel = DEFAULT_NETWORK,
    calibration: Mapping[str, float] | None = None,
    dp_model: ScalingModel | None = None,
) -> ManyPredictions:
    """Predict fleets of up to K groups: candidate i is ``counts[i, k]`` x ``names[type_index[i, k]]`` (count 0 =
    no group). The same model as :func:`predict` for mixed fleets: the per-GPU batch split in proportion to
    predicted speed, the step waits for the slowest group, the all-reduce runs at the slowest link.

    ``dp_model``: the data-parallel loss constants (default: the fitted ones, :mod:`predictor.perf.scaling`).
    ``calibration`` maps a GPU key to a measured/predicted throughput factor (from observations of this model).
    """
    if scaling not in ("weak", "strong"):
        raise PredictionError(
            f"The 'scaling' parameter of predict_many() must be one of {{'weak', 'strong'}}. Got {scaling!r}."
        )
    catalog = catalog or Catalog.load()
    tidx = np.asarray(type_index, dtype=int)
    cnt = np.asarray(counts, dtype=float)
    if tidx.shape != cnt.shape or tidx.ndim != 2:
        raise ConfigError(
            f"type_index and counts must be (candidates, groups) arrays of one shape; got {tidx.shape} and "
            f"{cnt.shape}.",
            parameter="counts",
            value=cnt.shape,
        )
    if cnt.size and (cnt.min() < 0 or (row_sum(cnt) < 1).any()):
        raise ConfigError("Every fleet needs at least one instance.", parameter="counts", value=float(cnt.min()))
    src, type_bases = bases(profile, names, catalog, network, calibration)
    return combine(profile, src, type_bases, tidx, cnt, scaling, dp_model)


def combine(
    profile: Profile,
    src: Source,
    type_bases: list[TypeBasis],
    tidx: np.ndarray,
    cnt: np.ndarray,
    scaling: Scaling,
    dp_model: ScalingModel | None = None,
) -> ManyPredictions:
    """The fleet model over every candidate: per-type quantities gathered by ``tidx``, combined with numpy."""

    def col(attr: str) -> np.ndarray:
        return np.array([getattr(b, attr) for b in type_bases], dtype=float)[tidx]

    def link_col(attr: str, plain: bool) -> np.ndarray:
        return np.array([getattr(b.plain_inter if plain else b.inter, attr) for b in type_bases], dtype=float)[tidx]

    present = cnt > 0
    single = present.sum(axis=1) == 1  # one group: the profile's measured link may apply
    gpus = col("gpus") * cnt
    ranks = row_sum(gpus)
    nodes = row_sum(cnt)
    b_src = src.per_device_batch
    global_batch = (
        ranks * b_src
        if scaling == "weak"
        else np.full_like(ranks, float(profile.batch.global_batch or b_src * src.world))
    )
    per_sample = col("per_sample_s")
    speed = 1.0 / per_sample
    b = global_batch[:, None] * speed / row_sum(np.where(present, speed * gpus, 0.0))[:, None]
    b = np.where(present, b, 0.0)
    compute_g = per_sample * b
    input_g = col("input_per_sample_s") * b
    total_g = np.where(present, compute_g + input_g, -np.inf)
    compute, input_s, worst = compute_g[:, 0].copy(), input_g[:, 0].copy(), total_g[:, 0].copy()
    slowest = np.zeros(len(cnt), dtype=int)
    for k in range(1, total_g.shape[1]):  # the slowest group's compute and input (the first of equals)
        slower = total_g[:, k] > worst
        compute[slower], input_s[slower], worst[slower] = compute_g[slower, k], input_g[slower, k], total_g[slower, k]
        slowest[slower] = k
    gb = grad_bytes(profile) / 1e9
    inter_gbps = np.where(single[:, None], link_col("gbps", False), link_col("gbps", True))
    inter_lat = np.where(single[:, None], link_col("latency_s", False), link_col("latency_s", True))
    slow_gbps = row_min(np.where(present, inter_gbps, np.inf))
    max_lat = row_max(np.where(present, inter_lat, 0.0))
    safe_nodes = np.maximum(nodes, 1)
    inter = np.where(nodes > 1, 2 * (nodes - 1) / safe_nodes * gb / slow_gbps + 2 * (nodes - 1) * max_lat, 0.0)
    intra = row_max(np.where(present, col("intra_s"), 0.0))
    allreduce = np.where(ranks > 1, intra + inter, 0.0)
    fastest_compute = row_min(np.where(present, compute_g, np.inf))
    exposed = _exposed_many(allreduce, fastest_compute * src.backward_share, bucket_sizes(profile))
    hidden = np.maximum(0.0, allreduce - exposed)
    dp = dp_model or scaling_model()
    grad_pass = row_max(np.where(present, col("grad_pass_s"), 0.0))
    dp_loss = dp.loss(compute, ranks, hidden, grad_pass, source_ranks=src.world, sigma=measured_sigma(profile))
    step = compute + input_s + exposed + dp_loss
    model_err = row_max(np.where(present, col("model_error"), 0.0))
    model_err = np.where(ranks > 1, np.maximum(model_err, model_error("scaling")), model_err)
    model_err = np.where(allreduce > 0, np.hypot(model_err, 0.1 * exposed / step), model_err)
    sd = combined_sd(profile.timing.step_time_s.cv or 0.0, model_err)
    lo, hi = interval(step, sd)
    # memory is linear in the per-GPU batch: static + activations per sample x batch + CUDA context
    per_type = [estimate_memory(profile, 1.0, basis.gpu_memory_gib) for basis in type_bases]
    static = np.array([m.static_bytes for m in per_type])[tidx]
    act_per_sample = np.array([m.activation_bytes or 0.0 for m in per_type])[tidx]
    usable = np.array([m.capacity_bytes for m in per_type])[tidx]
    capacity = np.array([basis.gpu_memory_gib * 2**30 for basis in type_bases])[tidx]
    need = static + act_per_sample * b + CUDA_CONTEXT_BYTES
    fits = row_all(~present | (need <= usable))
    memory = row_max(np.where(present, need, 0.0)) / 2**30
    share = row_max(np.where(present, need / capacity, 0.0))
    return ManyPredictions(
        names=tuple(b.name for b in type_bases),
        type_index=tidx,
        counts=cnt.astype(int),
        per_device_batch=b,
        iteration_time_s=step,
        throughput_samples_s=global_batch / step,
        iteration_time_lo_s=lo,
        iteration_time_hi_s=hi,
        compute_s=compute,
        input_s=input_s,
        allreduce_s=allreduce,
        exposed_comm_s=exposed,
        dp_loss_s=dp_loss,
        global_batch=global_batch,
        fits_memory=fits,
        memory_gib=memory,
        memory_share=share,
        model_sd=sd,
        group_gpus=gpus,
        slowest_group=slowest,
    )


# reductions over the few groups of each candidate: a loop over the K columns is ~10x faster than numpy's reduce
# along a short last axis
def row_sum(a: np.ndarray) -> np.ndarray:
    return functools.reduce(np.add, (a[:, k] for k in range(a.shape[1])))


def row_min(a: np.ndarray) -> np.ndarray:
    return functools.reduce(np.minimum, (a[:, k] for k in range(a.shape[1])))


def row_max(a: np.ndarray) -> np.ndarray:
    return functools.reduce(np.maximum, (a[:, k] for k in range(a.shape[1])))


def row_all(a: np.ndarray) -> np.ndarray:
    return functools.reduce(np.logical_and, (a[:, k] for k in range(a.shape[1])))


_exposed_many = exposed_many  # one formula: predictor.perf.network
