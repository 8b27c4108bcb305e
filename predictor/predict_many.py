"""``predict_many(profile, types, counts)``: the same model as :func:`predictor.predict.predict`, vectorised over many
homogeneous fleets (``count`` instances of one type) for the ranker.

Everything that depends only on the instance type (compute per sample, input pipeline, memory under weak scaling,
intra-node all-reduce, the model error) is computed once per type through the scalar path's own helpers; what
depends on the count (inter-node all-reduce, overlap, intervals, batch under strong scaling) is numpy over all
candidates. ``tests/test_predict_many.py`` checks it equals ``predict()`` for every type and count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.catalog.catalog import Catalog
from predictor.catalog.instances import InstanceType
from predictor.exceptions import PredictionError, UnknownNameError
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
    """Arrays aligned with the candidates (``instance_types[i]`` x ``counts[i]``)."""

    instance_types: tuple[str, ...]
    counts: np.ndarray
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
    memory_gib: np.ndarray


@dataclass(frozen=True)
class _TypeBasis:
    per_sample_s: float
    input_per_sample_s: float
    intra_coef_s: float  # intra-node all-reduce time (0 for single-GPU types)
    inter_gbps: float
    inter_latency_s: float
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
    profile: Profile, src: _Source, it: InstanceType, catalog: Catalog, network: NetworkModel
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
    cpus_src = (profile.hardware.cpu_count or 0) / max(1, profile.hardware.devices)
    cpu_ratio = cpus_src / (it.vcpus / it.gpus) if cpus_src else 1.0
    # one instance: the intra-node ring alone (the inter-node part depends on the count and is vectorised below)
    intra_s = allreduce_time(_grad_bytes(profile), [(it, 1)], catalog.gpus, net=network).seconds
    link = _link_override(profile, {it.name}, []) or inter_node_link(it, network)
    return _TypeBasis(
        per_sample,
        src.data_s / profile.batch.per_device * cpu_ratio,
        intra_s,
        link.gbps,
        link.latency_s,
        max((_model_error(k) for k in kinds), default=MODEL_ERROR["same"]),
        it.gpus,
        it.gpu_memory_gib,
    )


def predict_many(
    profile: Profile,
    instance_types: Sequence[str],
    counts: Sequence[int] | np.ndarray,
    *,
    catalog: Catalog | None = None,
    scaling: Scaling = "weak",
    network: NetworkModel = DEFAULT_NETWORK,
) -> ManyPredictions:
    """Predict ``counts[i]`` instances of ``instance_types[i]`` for every i (homogeneous fleets).

    Raises:
        PredictionError / UnknownNameError: as :func:`predict` does for the first bad type.
        ConfigError: a count below 1, or the sequences differ in length.
    """
    from predictor.exceptions import ConfigError

    catalog = catalog or Catalog.load()
    n = np.asarray(counts, dtype=float)
    if len(instance_types) != len(n):
        raise ConfigError(
            f"predict_many() needs one count per instance type: got {len(instance_types)} types and {len(n)} counts.",
            parameter="counts",
            value=len(n),
        )
    if len(n) and n.min() < 1:
        raise ConfigError(f"Every count must be >= 1. Got {int(n.min())}.", parameter="counts", value=int(n.min()))
    names = sorted(set(instance_types))
    src = _Source.of(profile, catalog)
    bases = {name: _type_basis(profile, src, catalog.get(name), catalog, network) for name in names}
    position = {name: i for i, name in enumerate(names)}
    idx = np.fromiter((position[t] for t in instance_types), dtype=int, count=len(n))

    def col(attr: str) -> np.ndarray:
        return np.array([getattr(bases[name], attr) for name in names], dtype=float)[idx]

    gpus = col("gpus")
    ranks = gpus * n
    b_src = profile.batch.per_device
    src_world = profile.hardware.world_size or profile.hardware.devices * profile.hardware.nodes
    if scaling == "weak":
        b = np.full_like(n, float(b_src))
    elif scaling == "strong":
        b = float(profile.batch.global_batch or b_src * src_world) / ranks
    else:
        raise PredictionError(
            f"The 'scaling' parameter of predict_many() must be one of {{'weak', 'strong'}}. Got {scaling!r}."
        )
    compute = col("per_sample_s") * b
    input_s = col("input_per_sample_s") * b
    gb = _grad_bytes(profile) / 1e9
    multi = n > 1
    inter = np.where(multi, 2 * (n - 1) / n * gb / col("inter_gbps") + 2 * (n - 1) * col("inter_latency_s"), 0.0)
    allreduce = np.where(ranks > 1, col("intra_coef_s") + inter, 0.0)
    _, _, bwd_share, _ = _source_times(profile)
    exposed = _exposed_many(allreduce, compute * bwd_share, _bucket_sizes(profile))
    step = compute + input_s + exposed
    model_err = np.where(ranks > 1, np.maximum(col("model_error"), MODEL_ERROR["scaling"]), col("model_error"))
    model_err = np.where(allreduce > 0, np.hypot(model_err, 0.1 * exposed / step), model_err)
    sd = np.hypot(profile.timing.step_time_s.cv or 0.0, model_err)
    # memory is linear in the per-GPU batch: static + activations per sample x batch + CUDA context
    per_type = [estimate_memory(profile, 1.0, bases[name].gpu_memory_gib) for name in names]
    static = np.array([m.static_bytes for m in per_type])[idx]
    act_per_sample = np.array([m.activation_bytes or 0.0 for m in per_type])[idx]
    usable = np.array([m.capacity_bytes for m in per_type])[idx]
    need = static + act_per_sample * b + CUDA_CONTEXT_BYTES
    memory, fits = need / 2**30, need <= usable
    global_batch = b * ranks
    return ManyPredictions(
        tuple(instance_types),
        n.astype(int),
        step,
        global_batch / step,
        step * np.exp(-Z80 * sd),
        step * np.exp(Z80 * sd),
        compute,
        input_s,
        allreduce,
        exposed,
        global_batch,
        fits,
        memory,
    )


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
