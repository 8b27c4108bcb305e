"""``predict_many(profile, types, counts)`` and ``predict_mixes(profile, names, type_index, counts)``: the same model as
:func:`predictor.predict.predict`, vectorised over many fleets for the ranker: homogeneous ones (``count`` instances
of one type) and mixes of up to K types.

Everything that depends only on the instance type (compute per sample, input pipeline, memory under weak scaling,
intra-node all-reduce, the model error) is computed once per type through the scalar path's own helpers; what
depends on the count (inter-node all-reduce, overlap, intervals, batch under strong scaling) is numpy over all
candidates. ``tests/test_predict_many.py`` checks it equals ``predict()`` for every type and count, and for mixes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.catalog.catalog import Catalog
from predictor.catalog.instances import InstanceType
from predictor.exceptions import ConfigError, PredictionError, UnknownNameError
from predictor.perf.memory import CUDA_CONTEXT_BYTES, estimate_memory
from predictor.perf.network import DEFAULT_NETWORK, NetworkModel, allreduce_time, inter_node_link
from predictor.predict import (
    MODEL_ERROR,
    Z80,
    Scaling,
    _bucket_sizes,
    _grad_bytes,
    _link_override,
    _model_error,
    _scaled_per_sample,
    _source_gpu,
    _source_times,
)
from predictor.profile import Profile


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
    global_batch: np.ndarray
    fits_memory: np.ndarray
    memory_gib: np.ndarray  # the largest need of any group, per GPU
    memory_share: np.ndarray  # the largest need / GPU memory of any group (for headroom constraints)
    model_sd: np.ndarray  # relative sd of the prediction (profile CV and model error)

    group_gpus: np.ndarray  # (N, K) GPUs per group

    def group_throughput(self) -> np.ndarray:
        """(N, K) samples/s each group contributes (what an Auto Scaling group's weighted capacity counts)."""
        return self.per_device_batch * self.group_gpus / self.iteration_time_s[:, None]


@dataclass(frozen=True)
class _TypeBasis:
    per_sample_s: float
    input_per_sample_s: float
    intra_coef_s: float  # intra-node all-reduce time (0 for single-GPU types)
    inter_gbps: float  # the profile's measured link when it was measured on this type, else the catalog's
    inter_latency_s: float
    plain_inter_gbps: float  # the catalog's link (mixed fleets never use a measurement of one type)
    plain_inter_latency_s: float
    model_error: float  # largest error of the kinds this type's prediction involves (before "scaling")
    gpus: int
    gpu_memory_gib: float


@dataclass(frozen=True)
class _Source:
    """What the profile says, computed once for all types."""

    gpu: Any
    per_sample_s: float
    data_s: float
    flops: float | None
    achieved_tflops: float | None

    @classmethod
    def of(cls, profile: Profile, catalog: Catalog) -> _Source:
        b_src = profile.batch.per_device
        compute_src, data_src, _, _ = _source_times(profile)
        flops = profile.model.flops.per_sample if profile.model.flops and profile.model.flops.per_sample else None
        achieved = flops * b_src / compute_src / 1e12 if flops else None
        return cls(_source_gpu(profile, catalog), compute_src / b_src, data_src, flops, achieved)


def _type_basis(
    profile: Profile,
    src: _Source,
    it: InstanceType,
    catalog: Catalog,
    network: NetworkModel,
    calibration: Mapping[str, float] | None = None,
) -> _TypeBasis:
    if not it.cuda:
        raise PredictionError(f"{it.name} has {it.accelerator} ({it.accelerator_kind}), not a CUDA GPU.")
    try:
        dst = catalog.gpu(it.gpu or "")
    except UnknownNameError:
        raise PredictionError(
            f"{it.name}'s GPU {it.gpu!r} has no specs in the catalog. Add them with --catalog-extra (docs/catalog.md)."
        ) from None
    kinds: set[str] = set()
    per_sample, _ = _scaled_per_sample(
        src.per_sample_s, src.gpu, dst, profile.model.precision, profile, src.flops, src.achieved_tflops, [], kinds, []
    )
    factor = (calibration or {}).get(dst.key)
    if factor:
        per_sample /= factor
    cpus_src = (profile.hardware.cpu_count or 0) / max(1, profile.hardware.devices)
    cpu_ratio = cpus_src / (it.vcpus / it.gpus) if cpus_src else 1.0
    # one instance: the intra-node ring alone (the inter-node part depends on the count and is vectorised below)
    intra_s = allreduce_time(_grad_bytes(profile), [(it, 1)], catalog.gpus, net=network).seconds
    plain = inter_node_link(it, network)
    link = _link_override(profile, {it.name}, []) or plain
    return _TypeBasis(
        per_sample,
        src.data_s / profile.batch.per_device * cpu_ratio,
        intra_s,
        link.gbps,
        link.latency_s,
        plain.gbps,
        plain.latency_s,
        max((_model_error(k) for k in kinds), default=MODEL_ERROR["same"]),
        it.gpus,
        it.gpu_memory_gib,
    )


@functools.lru_cache(maxsize=32)
def _bases(
    profile: Profile,
    names: tuple[str, ...],
    catalog: Catalog,
    network: NetworkModel,
    calibration: tuple[tuple[str, float], ...],
) -> list[_TypeBasis]:
    """The per-type quantities, cached: a service ranks the same profile against the same catalog again and again
    (profiles and the network model are frozen, hence hashable; a catalog by identity)."""
    src = _Source.of(profile, catalog)
    factors = dict(calibration)
    return [_type_basis(profile, src, catalog.get(name), catalog, network, factors) for name in names]


def predict_many(
    profile: Profile,
    instance_types: Sequence[str],
    counts: Sequence[int] | np.ndarray,
    *,
    catalog: Catalog | None = None,
    scaling: Scaling = "weak",
    network: NetworkModel = DEFAULT_NETWORK,
    calibration: Mapping[str, float] | None = None,
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
) -> ManyPredictions:
    """Predict fleets of up to K groups: candidate i is ``counts[i, k]`` x ``names[type_index[i, k]]`` (count 0 =
    no group). The same model as :func:`predict` for mixed fleets: the per-GPU batch split in proportion to
    predicted speed, the step waits for the slowest group, the all-reduce runs at the slowest link.

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
    key = (profile, tuple(names), catalog, network, tuple(sorted((calibration or {}).items())))
    try:
        bases = _bases(*key)
    except TypeError:  # a profile with mappings inside (phases, dtypes) is not hashable: no cache
        bases = _bases.__wrapped__(*key)
    single = row_sum(cnt > 0) == 1  # one group: the profile's measured link may apply

    def col(attr: str) -> np.ndarray:
        return np.array([getattr(b, attr) for b in bases], dtype=float)[tidx]

    present = cnt > 0
    gpus = col("gpus") * cnt
    ranks = row_sum(gpus)
    nodes = row_sum(cnt)
    b_src = profile.batch.per_device
    src_world = profile.hardware.world_size or profile.hardware.devices * profile.hardware.nodes
    global_batch = (
        ranks * b_src
        if scaling == "weak"
        else np.full_like(ranks, float(profile.batch.global_batch or b_src * src_world))
    )
    per_sample = col("per_sample_s")
    speed = 1.0 / per_sample
    b = global_batch[:, None] * speed / row_sum(speed * gpus)[:, None]
    b = np.where(present, b, 0.0)
    compute_g = per_sample * b
    input_g = col("input_per_sample_s") * b
    total_g = np.where(present, compute_g + input_g, -np.inf)
    compute, input_s, worst = compute_g[:, 0].copy(), input_g[:, 0].copy(), total_g[:, 0].copy()
    for k in range(1, total_g.shape[1]):  # the slowest group's compute and input (the first of equals)
        slower = total_g[:, k] > worst
        compute[slower], input_s[slower], worst[slower] = compute_g[slower, k], input_g[slower, k], total_g[slower, k]
    gb = _grad_bytes(profile) / 1e9
    inter_gbps = np.where(single[:, None], col("inter_gbps"), col("plain_inter_gbps"))
    inter_lat = np.where(single[:, None], col("inter_latency_s"), col("plain_inter_latency_s"))
    slow_gbps = row_min(np.where(present, inter_gbps, np.inf))
    max_lat = row_max(np.where(present, inter_lat, 0.0))
    inter = np.where(nodes > 1, 2 * (nodes - 1) / nodes * gb / slow_gbps + 2 * (nodes - 1) * max_lat, 0.0)
    intra = row_max(np.where(present, col("intra_coef_s"), 0.0))
    allreduce = np.where(ranks > 1, intra + inter, 0.0)
    _, _, bwd_share, _ = _source_times(profile)
    fastest_compute = row_min(np.where(present, compute_g, np.inf))
    exposed = _exposed_many(allreduce, fastest_compute * bwd_share, _bucket_sizes(profile))
    step = compute + input_s + exposed
    model_err = row_max(np.where(present, col("model_error"), 0.0))
    model_err = np.where(ranks > 1, np.maximum(model_err, MODEL_ERROR["scaling"]), model_err)
    model_err = np.where(allreduce > 0, np.hypot(model_err, 0.1 * exposed / step), model_err)
    sd = np.hypot(profile.timing.step_time_s.cv or 0.0, model_err)
    # memory is linear in the per-GPU batch: static + activations per sample x batch + CUDA context
    per_type = [estimate_memory(profile, 1.0, basis.gpu_memory_gib) for basis in bases]
    static = np.array([m.static_bytes for m in per_type])[tidx]
    act_per_sample = np.array([m.activation_bytes or 0.0 for m in per_type])[tidx]
    usable = np.array([m.capacity_bytes for m in per_type])[tidx]
    capacity = np.array([basis.gpu_memory_gib * 2**30 for basis in bases])[tidx]
    need = static + act_per_sample * b + CUDA_CONTEXT_BYTES
    fits = row_all(~present | (need <= usable))
    memory = row_max(np.where(present, need, 0.0)) / 2**30
    share = row_max(np.where(present, need / capacity, 0.0))
    return ManyPredictions(
        names=tuple(names),
        type_index=tidx,
        counts=cnt.astype(int),
        per_device_batch=b,
        iteration_time_s=step,
        throughput_samples_s=global_batch / step,
        iteration_time_lo_s=step * np.exp(-Z80 * sd),
        iteration_time_hi_s=step * np.exp(Z80 * sd),
        compute_s=compute,
        input_s=input_s,
        allreduce_s=allreduce,
        exposed_comm_s=exposed,
        global_batch=global_batch,
        fits_memory=fits,
        memory_gib=memory,
        memory_share=share,
        model_sd=sd,
        group_gpus=gpus,
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


def _exposed_many(allreduce: np.ndarray, backward: np.ndarray, sizes: list[float]) -> np.ndarray:
    """:func:`predictor.perf.network.exposed_time` over arrays of candidates."""
    total = sum(sizes)
    if total <= 0:
        return np.zeros_like(allreduce)
    free = np.zeros_like(allreduce)
    done = 0.0
    for size in sizes:
        done += size
        free = np.maximum(backward * done / total, free) + allreduce * size / total
    return np.where(allreduce > 0, np.maximum(0.0, free - backward), 0.0)
