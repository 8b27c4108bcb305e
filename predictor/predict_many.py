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

from predictor._validation import check_choice
from predictor.catalog.catalog import Catalog
from predictor.exceptions import ConfigError
from predictor.perf.basis import Source, TypeBasis, bucket_sizes, grad_bytes, type_basis
from predictor.perf.batch import divisors, split_micro
from predictor.perf.memory import CUDA_CONTEXT_BYTES, estimate_memory
from predictor.perf.network import DEFAULT_NETWORK, NetworkModel, exposed_many
from predictor.perf.scaling import ScalingModel, measured_sigma, scaling_model
from predictor.perf.uncertainty import combined_sd, interval, model_error
from predictor.profile import Profile
from predictor.work import global_batch as global_batch_of

Scaling = Literal["strong", "weak"]
"""strong (the default): keep the profiled global batch (samples per optimizer step), split over the fleet's GPUs,
with gradient accumulation where a GPU cannot hold its share; weak: keep the profiled per-GPU batch, so the global
batch grows with the fleet (a different training: an explicit choice)."""
SCALINGS = ("strong", "weak")


@dataclass(frozen=True)
class ManyPredictions:
    """Arrays aligned with the candidates. Candidate ``i`` has up to K groups: ``counts[i, k]`` instances of
    ``names[type_index[i, k]]`` (a count of 0 leaves the slot empty; homogeneous fleets have K = 1)."""

    names: tuple[str, ...]
    type_index: np.ndarray  # (N, K)
    counts: np.ndarray  # (N, K)
    per_device_batch: np.ndarray  # (N, K) samples per GPU per optimizer step (group mean; speed-proportional in mixes)
    iteration_time_s: np.ndarray  # one optimizer step (accumulation's micro-steps and one all-reduce)
    throughput_samples_s: np.ndarray
    iteration_time_lo_s: np.ndarray
    iteration_time_hi_s: np.ndarray
    compute_s: np.ndarray
    input_s: np.ndarray
    allreduce_s: np.ndarray
    exposed_comm_s: np.ndarray
    dp_loss_s: np.ndarray  # stragglers and communication contention (predictor.perf.scaling)
    global_batch: np.ndarray  # samples per optimizer step
    fits_memory: np.ndarray
    memory_gib: np.ndarray  # the largest need of any group, per GPU
    memory_share: np.ndarray  # the largest need / GPU memory of any group (for headroom constraints)
    model_sd: np.ndarray  # relative sd of the prediction (profile CV and model error)

    group_gpus: np.ndarray  # (N, K) GPUs per group
    slowest_group: np.ndarray  # (N,) the group whose compute + input sets the step
    accumulation: np.ndarray  # (N,) micro-steps per optimizer step (accumulate_grad_batches)
    micro_batch: np.ndarray  # (N, K) the largest micro-batch of a GPU of the group
    micro_low: np.ndarray  # (N, K) the group's GPUs take micro_low samples per micro-step ...
    micro_plus: np.ndarray  # (N, K) ... or one more for micro_plus of them (see predictor.perf.batch)
    splittable: np.ndarray  # (N,) False: more GPUs than samples in the global batch (the fleet cannot train it)

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
    scaling: Scaling = "strong",
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
    scaling: Scaling = "strong",
    network: NetworkModel = DEFAULT_NETWORK,
    calibration: Mapping[str, float] | None = None,
    dp_model: ScalingModel | None = None,
) -> ManyPredictions:
    """Predict fleets of up to K groups: candidate i is ``counts[i, k]`` x ``names[type_index[i, k]]`` (count 0 =
    no group). The same model as :func:`predict` for mixed fleets: the per-GPU batch split in whole samples in
    proportion to predicted speed (:mod:`predictor.perf.batch`), the step waits for the slowest group, the all-reduce
    runs at the slowest link, once per optimizer step.

    ``scaling`` (:data:`Scaling`): "strong" keeps the profiled global batch, with gradient accumulation where a GPU
    cannot hold its share; "weak" keeps the profiled per-GPU batch.

    ``dp_model``: the data-parallel loss constants (default: the fitted ones, :mod:`predictor.perf.scaling`).
    ``calibration`` maps a GPU key to a measured/predicted throughput factor (from observations of this model).
    """
    check_choice("predict_mixes()", "scaling", scaling, SCALINGS)
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
    per_sample = col("per_sample_s")
    speed = 1.0 / per_sample
    # memory is linear in the per-GPU micro-batch: static + activations per sample x micro-batch + CUDA context
    per_type = [estimate_memory(profile, 1.0, basis.gpu_memory_gib) for basis in type_bases]
    static = np.array([m.static_bytes for m in per_type])[tidx]
    act_per_sample = np.array([m.activation_bytes or 0.0 for m in per_type])[tidx]
    usable = np.array([m.capacity_bytes for m in per_type])[tidx]
    capacity = np.array([basis.gpu_memory_gib * 2**30 for basis in type_bases])[tidx]

    def split(micro_global: np.ndarray, rows: np.ndarray | slice = slice(None)):
        lo, plus, ok = split_micro(micro_global, speed[rows], gpus[rows], present[rows])
        micro = lo + (plus > 0)
        need = static[rows] + act_per_sample[rows] * micro + CUDA_CONTEXT_BYTES
        return lo, plus, ok, micro, need, row_all(~present[rows] | (need <= usable[rows]))

    if scaling == "weak":  # the profiled micro-batch on every GPU, the profiled accumulation
        accumulation = np.full(len(cnt), float(profile.batch.accumulate_grad_batches or 1))
        lo, plus, ok, micro, need, fits = split(ranks * src.per_device_batch)
    else:  # the profiled global batch; the least accumulation whose micro-batches fit (a divisor: whole micro-steps)
        total = global_batch_of(profile)
        accumulation = np.ones(len(cnt))
        lo, plus, ok, micro, need, fits = split(np.full(len(cnt), float(total)))
        for a in divisors(total)[1:]:
            rows = np.flatnonzero(ok & ~fits & (total // a >= ranks))
            if not len(rows):
                break
            r_lo, r_plus, _, r_micro, r_need, r_fits = split(np.full(len(rows), float(total // a)), rows)
            take = rows[r_fits]
            lo[take], plus[take], micro[take], need[take] = (
                r_lo[r_fits],
                r_plus[r_fits],
                r_micro[r_fits],
                r_need[r_fits],
            )
            accumulation[take], fits[take] = a, True
    fits &= ok
    b = np.where(present, (lo + plus / np.where(present, gpus, 1.0)) * accumulation[:, None], 0.0)
    global_batch = row_sum(b * gpus)
    compute_g = per_sample * micro * accumulation[:, None]
    input_g = col("input_per_sample_s") * micro * accumulation[:, None]
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
    # DDP all-reduces once per optimizer step, behind the backward of its last micro-step
    fastest_micro = row_min(np.where(present, per_sample * micro, np.inf))
    exposed = exposed_many(allreduce, fastest_micro * src.backward_share, bucket_sizes(profile))
    hidden = np.maximum(0.0, allreduce - exposed)
    dp = dp_model or scaling_model()
    grad_pass = row_max(np.where(present, col("grad_pass_s"), 0.0))
    # stragglers: the jitter of a micro-steps adds up like independent noise (relative sd / sqrt(a))
    dp_loss = dp.loss(
        compute / np.sqrt(accumulation), ranks, hidden, grad_pass, source_ranks=src.world, sigma=measured_sigma(profile)
    )
    step = compute + input_s + exposed + dp_loss
    model_err = row_max(np.where(present, col("model_error"), 0.0))
    model_err = np.where(ranks > 1, np.maximum(model_err, model_error("scaling")), model_err)
    model_err = np.where(allreduce > 0, np.hypot(model_err, 0.1 * exposed / step), model_err)
    sd = combined_sd(profile.timing.step_time_s.cv or 0.0, model_err)
    step_lo, step_hi = interval(step, sd)
    memory = row_max(np.where(present, need, 0.0)) / 2**30
    share = row_max(np.where(present, need / capacity, 0.0))
    return ManyPredictions(
        names=tuple(b.name for b in type_bases),
        type_index=tidx,
        counts=cnt.astype(int),
        per_device_batch=b,
        iteration_time_s=step,
        throughput_samples_s=global_batch / step,
        iteration_time_lo_s=step_lo,
        iteration_time_hi_s=step_hi,
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
        accumulation=accumulation.astype(int),
        micro_batch=micro.astype(int),
        micro_low=lo.astype(int),
        micro_plus=plus.astype(int),
        splittable=ok,
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
