"""The fleet model, vectorised: ``predict_mixes(profile, names, type_index, counts)`` predicts any number of fleets of
up to K groups at once; ``predict_many(profile, types, counts)`` is its homogeneous case, and
:func:`predictor.model.predict.predict` is a one-row view of it with the words that explain the numbers. There is no
other copy of the model.

Everything that depends only on the instance type (compute per sample, input pipeline, intra-node all-reduce, the
model error) is computed once per type (:mod:`predictor.model.basis`, operator sums included); what depends on the
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
from predictor.documents.checks import check_choice
from predictor.documents.profile import Profile
from predictor.documents.work import global_batch as global_batch_of
from predictor.exceptions import ConfigError
from predictor.model.basis import Source, TypeBasis, bucket_sizes, grad_bytes, type_basis
from predictor.model.batch import divisors, split_micro
from predictor.model.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    allreduce_latency,
    hierarchical_s,
    network_phase_s,
    phase_s,
)
from predictor.model.layout import DDP, Layout, parse
from predictor.model.memory import USABLE_SHARE, activations_known, memory_parts, profile_sizes
from predictor.model.network import DEFAULT_NETWORK, NetworkModel, exposed_many
from predictor.model.scaling import (
    DDP_GRAD_PASSES,
    FSDP_GRAD_PASSES,
    ScalingModel,
    measured_sigma,
    scaling_model,
)
from predictor.model.uncertainty import combined_sd, interval, model_error

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
    dp_loss_s: np.ndarray  # stragglers and communication contention (predictor.model.scaling)
    # the step's wait for an "up to" network's burst credits: what its nodes send a step over the baseline rate the
    # credits refill at, beyond the step at the burst's rate (included in exposed_comm_s and allreduce_s)
    baseline_wait_s: np.ndarray
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
    micro_plus: np.ndarray  # (N, K) ... or one more for micro_plus of them (see predictor.model.batch)
    splittable: np.ndarray  # (N,) False: more GPUs than samples in the global batch (the fleet cannot train it)
    layout_index: np.ndarray  # (N,) the layout of each candidate: layout_names[layout_index[i]]
    layout_names: tuple[str, ...]  # predictor.model.layout names ("pipeline": one stage per node, see stages)
    stages: np.ndarray  # (N,) pipeline stages (1: no pipeline)

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
    layouts: Sequence[Layout | str] | None = None,
) -> ManyPredictions:
    """Predict fleets of up to K groups: candidate i is ``counts[i, k]`` x ``names[type_index[i, k]]`` (count 0 =
    no group). The same model as :func:`predict` for mixed fleets: the per-GPU batch split in whole samples in
    proportion to predicted speed (:mod:`predictor.model.batch`), the step waits for the slowest group, the all-reduce
    runs at the slowest link, once per optimizer step.

    ``scaling`` (:data:`Scaling`): "strong" keeps the profiled global batch, with gradient accumulation where a GPU
    cannot hold its share; "weak" keeps the profiled per-GPU batch.

    ``dp_model``: the data-parallel loss constants (default: the fitted ones, :mod:`predictor.model.scaling`).
    ``calibration`` maps a GPU key to a measured/predicted throughput factor (from observations of this model).
    ``layouts``: the parallel layouts each fleet may use (default: ddp only); each fleet gets the best of those that
    apply to it (:func:`choose_layouts`), its index in ``layout_index``.
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
    if not layouts:
        return combine(profile, src, type_bases, tidx, cnt, scaling, dp_model)
    return choose_layouts(profile, src, type_bases, tidx, cnt, scaling, dp_model, layouts)


PREFER_SIMPLER = 0.05  # a more complex layout must be this much faster than a simpler one that fits to be chosen
# simplest first: plain data parallel, then sharding gradients/optimizer state, then parameters too, then hybrid; each
# without activation checkpointing before with it
SIMPLICITY = ("ddp", "fsdp:shard_grad_op", "fsdp:full_shard", "fsdp:hybrid_shard")


def simplicity(layout: Layout) -> tuple[int, int, int]:
    """The order in which layouts are preferred (lower first)."""
    base = layout.name.removesuffix("+ac")
    known = SIMPLICITY.index(base) if base in SIMPLICITY else len(SIMPLICITY)
    return int(layout.activation_checkpointing), known, layout.pipeline_stages


def applies(profile: Profile, layout: Layout, cnt: np.ndarray, per_node: np.ndarray) -> np.ndarray:
    """Which candidates ``layout`` makes sense for: sharding needs two GPUs, hybrid sharding several multi-GPU
    nodes of one type, a pipeline a homogeneous fleet of two nodes or more (one stage each); activation
    checkpointing and pipelines need the model's block (``model.structure``)."""
    present = cnt > 0
    nodes = row_sum(cnt)
    ranks = row_sum(per_node * cnt)
    single = present.sum(axis=1) == 1
    st = profile.model.structure
    if (layout.activation_checkpointing or layout.strategy == "pipeline") and not (
        st is not None and st.blocks and st.block and st.saved_bytes_per_sample is not None
    ):
        return np.zeros(len(cnt), dtype=bool)
    if layout.strategy == "pipeline":
        return single & (nodes >= 2)
    if layout.sharding == "hybrid_shard":
        return single & (nodes >= 2) & (row_min(np.where(present, per_node, np.inf)) >= 2)
    if layout.sharded:
        return ranks >= 2
    return np.ones(len(cnt), dtype=bool)


def choose_layouts(
    profile: Profile,
    src: Source,
    type_bases: list[TypeBasis],
    tidx: np.ndarray,
    cnt: np.ndarray,
    scaling: Scaling,
    dp_model: ScalingModel | None,
    layouts: Sequence[Layout | str],
) -> ManyPredictions:
    """Every candidate under the best of ``layouts`` that applies to it (:func:`applies`).

    The simplest layout (:func:`simplicity`) that fits is kept unless a more complex one is faster by more than
    :data:`PREFER_SIMPLER` (a step of both layouts on one fleet shares most of the prediction's error, so the
    difference is known better than either). Pipelines are chosen only when ``layouts`` has nothing launchable.
    Other layouts are evaluated only for the fleets where the simplest one does not fit or needs gradient
    accumulation (a sharded layout can hold a larger micro-batch).
    """
    parsed = sorted({parse(x) if isinstance(x, str) else x for x in layouts}, key=simplicity)
    runnable = [x for x in parsed if x.launchable] or parsed
    per_node = np.array([b.gpus for b in type_bases], dtype=float)[tidx]
    first = runnable[0]
    base = combine(profile, src, type_bases, tidx, cnt, scaling, dp_model, first)
    base_ok = applies(profile, first, cnt, per_node) if first != DDP else True
    fields = {f: getattr(base, f) for f in ManyPredictions.__dataclass_fields__}
    names = [fields["layout_names"][0]]
    ok = base.fits_memory & base.splittable & base_ok
    fields["fits_memory"] = ok
    step = np.where(ok, base.iteration_time_s, np.inf)
    # a fleet the simplest layout runs without accumulation keeps it: a layout that only moves fewer bytes (FSDP's
    # 16-bit collectives against DDP's fp32 gradients) is not switched to until FSDP's overheads are validated on
    # GPUs (the network lab validated the gloo path only)
    open_rows = ~ok | (base.accumulation > 1)
    candidates = np.flatnonzero(open_rows)
    for layout in runnable[1:] if len(candidates) else ():
        rows = candidates[applies(profile, layout, cnt[candidates], per_node[candidates])]
        if not len(rows):
            continue
        m = combine(profile, src, type_bases, tidx[rows], cnt[rows], scaling, dp_model, layout)
        good = m.fits_memory & m.splittable
        better = good & (m.iteration_time_s < step[rows] * (1 - PREFER_SIMPLER))
        take, sub = rows[better], np.flatnonzero(better)
        if not len(take):
            continue
        for name, value in fields.items():
            if isinstance(value, np.ndarray) and name not in ("type_index", "counts", "layout_index"):
                value[take] = getattr(m, name)[sub]
        fields["layout_index"][take] = len(names)
        names.append(m.layout_names[0])
        step[take] = m.iteration_time_s[sub]
    fields["layout_names"] = tuple(names)
    return ManyPredictions(**fields)


def combine(
    profile: Profile,
    src: Source,
    type_bases: list[TypeBasis],
    tidx: np.ndarray,
    cnt: np.ndarray,
    scaling: Scaling,
    dp_model: ScalingModel | None = None,
    layout: Layout | str = DDP,
) -> ManyPredictions:
    """The fleet model over every candidate under one ``layout``: per-type quantities gathered by ``tidx``, combined
    with numpy. A pipeline layout has one stage per node (its ``pipeline_stages`` is taken from each fleet); it
    needs a homogeneous fleet of at least two nodes (other rows do not fit).

    The steps: the fleets' shape (:class:`_Fleets`), the batch split and its memory (:func:`_split_batch`), the
    slowest group's compute (:func:`_slowest_group`), the communication (:func:`_communication`), the data-parallel
    losses (:func:`_dp_loss`), an "up to" network's wait (:func:`baseline_wait`), the sd (:func:`_model_sd`)."""
    layout = parse(layout) if isinstance(layout, str) else layout
    fleets = _Fleets.of(layout, type_bases, tidx, cnt)
    batch = _split_batch(profile, src, fleets, scaling)
    # activation checkpointing recomputes the blocks' forward in backward
    recompute = recompute_factor(profile, src, layout)
    compute, input_s, slowest = _slowest_group(fleets, batch, recompute)
    comm, exposed, sustained_s = _communication(profile, src, fleets, batch, recompute)
    dp_loss = _dp_loss(profile, src, fleets, batch, compute, np.maximum(0.0, comm - exposed), dp_model)
    wait = baseline_wait(compute + input_s + exposed + dp_loss, sustained_s)
    comm, exposed, step = comm + wait, exposed + wait, compute + input_s + exposed + dp_loss + wait
    step_lo, step_hi = interval(step, sd := _model_sd(profile, fleets, comm, exposed, step))
    present = fleets.present
    return ManyPredictions(
        names=tuple(b.name for b in type_bases),
        type_index=tidx,
        counts=cnt.astype(int),
        per_device_batch=batch.per_device,
        iteration_time_s=step,
        throughput_samples_s=batch.global_batch / step,
        iteration_time_lo_s=step_lo,
        iteration_time_hi_s=step_hi,
        compute_s=compute,
        input_s=input_s,
        allreduce_s=comm,
        exposed_comm_s=exposed,
        dp_loss_s=dp_loss,
        baseline_wait_s=wait,
        global_batch=batch.global_batch,
        fits_memory=batch.fits,
        memory_gib=row_max(np.where(present, batch.need, 0.0)) / 2**30,
        memory_share=row_max(np.where(present, batch.need / fleets.capacity, 0.0)),
        model_sd=sd,
        group_gpus=fleets.gpus,
        slowest_group=slowest,
        accumulation=batch.accumulation.astype(int),
        micro_batch=batch.micro.astype(int),
        micro_low=batch.lo.astype(int),
        micro_plus=batch.plus.astype(int),
        splittable=batch.ok,
        layout_index=np.zeros(len(cnt), dtype=int),
        layout_names=(layout.name,) if not fleets.pipeline else ("pipeline",),
        stages=fleets.stages.astype(int),
    )


def baseline_wait(step: np.ndarray, sustained_s: np.ndarray) -> np.ndarray:
    """What a step waits for an "up to" network's burst credits: once they are spent the network carries no more a
    step than its baseline refills in one (``sustained_s``: the step's traffic over the sustained rate,
    ``network.Link.sustained_gbps``), however fast each burst. A token bucket refilled at the baseline: the bursts
    spend what the compute's time refilled, so the step is the longer of its own and ``sustained_s``."""
    return np.maximum(0.0, sustained_s - step)


@dataclass(frozen=True)
class _Fleets:
    """The shape of every candidate fleet under one layout, (N,) per fleet or (N, K) per group: what the steps of
    :func:`combine` share. Built by :meth:`of`; ``col`` gathers a per-type quantity of :class:`TypeBasis`."""

    layout: Layout
    type_bases: list[TypeBasis]
    tidx: np.ndarray
    present: np.ndarray  # (N, K) the group exists (count > 0)
    single: np.ndarray  # (N,) one group: the profile's measured link may apply
    gpus: np.ndarray  # (N, K) GPUs per group
    ranks: np.ndarray  # (N,) GPUs of the fleet
    nodes: np.ndarray  # (N,) instances of the fleet
    node_gpus: np.ndarray  # (N,) GPUs of the smallest node (hybrid's shard group)
    pipeline: bool
    stages: np.ndarray  # (N,) pipeline stages (1: no pipeline)
    valid: np.ndarray  # (N,) the layout can run the fleet at all (a pipeline: homogeneous, two nodes or more)
    shard: np.ndarray  # (N,) the ranks a sharded layout shards over (1: not sharded)
    replicas: np.ndarray  # (N, K) data-parallel ranks per group (a pipeline's stages share a sample)
    per_sample: np.ndarray  # (N, K) compute seconds per sample on the group's GPU
    usable: np.ndarray  # (N, K) bytes of GPU memory training may use
    capacity: np.ndarray  # (N, K) bytes of GPU memory

    @classmethod
    def of(cls, layout: Layout, type_bases: list[TypeBasis], tidx: np.ndarray, cnt: np.ndarray) -> _Fleets:
        """The shape of the fleets ``counts[i, k]`` x ``type_bases[tidx[i, k]]`` under ``layout``."""

        def col(attr: str) -> np.ndarray:
            return np.array([getattr(b, attr) for b in type_bases], dtype=float)[tidx]

        present = cnt > 0
        per_node = col("gpus")
        gpus = per_node * cnt
        ranks = row_sum(gpus)
        nodes = row_sum(cnt)
        node_gpus = row_min(np.where(present, per_node, np.inf))
        pipeline = layout.strategy == "pipeline"
        stages = np.where(pipeline, nodes, 1.0)
        single = present.sum(axis=1) == 1
        shard = np.where(layout.sharding == "hybrid_shard", node_gpus, ranks) if layout.sharded else np.ones(len(cnt))
        return cls(
            layout=layout,
            type_bases=type_bases,
            tidx=tidx,
            present=present,
            single=single,
            gpus=gpus,
            ranks=ranks,
            nodes=nodes,
            node_gpus=node_gpus,
            pipeline=pipeline,
            stages=stages,
            valid=(single & (nodes >= 2)) if pipeline else np.ones(len(cnt), dtype=bool),
            shard=shard,
            replicas=gpus / stages[:, None],
            per_sample=col("per_sample_s"),
            usable=np.array([b.gpu_memory_gib * 2**30 * USABLE_SHARE for b in type_bases])[tidx],
            capacity=np.array([basis.gpu_memory_gib * 2**30 for basis in type_bases])[tidx],
        )

    def col(self, attr: str) -> np.ndarray:
        """(N, K) the per-type quantity ``attr`` of each group's instance type."""
        return np.array([getattr(b, attr) for b in self.type_bases], dtype=float)[self.tidx]

    def host_staged(self) -> np.ndarray:
        """(N,) 1.0 where a group of the fleet reaches other nodes through host memory (NCCL's sockets, or EFA without
        GPUDirect RDMA: ``network.gpudirect_rdma``): its prediction carries the host-staged regime's width
        (``_model_sd``)."""
        return self.link_max("host_staged") * (self.nodes > 1)

    def crossing(self) -> np.ndarray:
        """(N,) how each fleet's collectives cross nodes (``collectives.HIERARCHICAL`` < ``RING`` < ``SOCKETS``): its
        groups' largest code, the one whose node network carries the most (a p5 group with a p4d runs NCCL's ring)."""
        return self.link_max("crossing")

    def link_max(self, attr: str) -> np.ndarray:
        """(N,) the largest ``attr`` over each fleet's groups' inter-node links (a one-type fleet's measured link, a
        mix's catalog links)."""
        col = np.where(self.single[:, None], self.link_col(attr, False), self.link_col(attr, True))
        return row_max(np.where(self.present, col, 0.0))

    def link_col(self, attr: str, plain: bool) -> np.ndarray:
        """(N, K) ``attr`` of each group's inter-node link (``plain``: the catalog's, not the profile's measured)."""
        links = [b.plain_inter if plain else b.inter for b in self.type_bases]
        return np.array([getattr(link, attr) for link in links], dtype=float)[self.tidx]


@dataclass(frozen=True)
class _Batch:
    """How each fleet splits its batch (:func:`_split_batch`): the micro-batches of every group's GPUs, the
    accumulation, the memory they need, and the samples per GPU and per optimizer step that follow."""

    lo: np.ndarray  # (N, K) a group's GPUs take lo samples per micro-step ...
    plus: np.ndarray  # (N, K) ... or one more for plus of them
    ok: np.ndarray  # (N,) splittable: no more GPUs than samples
    micro: np.ndarray  # (N, K) the largest micro-batch of a GPU of the group
    need: np.ndarray  # (N, K) bytes of GPU memory a GPU of the group needs
    fits: np.ndarray  # (N,) every group fits, the batch splits and the layout applies
    accumulation: np.ndarray  # (N,) micro-steps per optimizer step
    per_device: np.ndarray  # (N, K) samples per GPU per optimizer step (group mean)
    global_batch: np.ndarray  # (N,) samples per optimizer step


def _split(
    profile: Profile,
    fleets: _Fleets,
    micro_global: np.ndarray,
    steps: np.ndarray | float,
    rows: np.ndarray | slice = slice(None),
) -> tuple[np.ndarray, ...]:
    """One micro-step's samples ``micro_global`` split over the ``rows`` fleets in proportion to speed, with the
    memory it needs over ``steps`` micro-steps: (lo, plus, splittable, micro, need, fits in memory). Where the profile
    does not say what its activations take (:func:`~predictor.model.memory.activations_known`), the memory is a floor
    and a micro-batch above the profiled one (:func:`known_micro_batch`) is not known to fit: it does not."""
    present = fleets.present[rows]
    # each group's speed weighs its share; a step without GPU work (per_sample 0) splits as the fastest can
    speed = 1.0 / np.maximum(fleets.per_sample[rows], 1e-15)
    lo, plus, ok = split_micro(micro_global, speed, fleets.replicas[rows], present)
    micro = lo + (plus > 0)
    cap = known_micro_batch(profile)
    parts = memory_parts(
        profile,
        fleets.layout,
        micro,
        shard=fleets.shard[rows, None],
        stages=fleets.stages[rows, None],
        micro_steps=np.reshape(steps, (-1, 1)),
        ranks=fleets.ranks[rows, None],
    )
    need = functools.reduce(np.add, parts.values())
    return lo, plus, ok, micro, need, row_all(~present | ((need <= fleets.usable[rows]) & (micro <= cap)))


def known_micro_batch(profile: Profile) -> float:
    """The largest micro-batch a GPU is known to hold: unbounded where the profile says what its activations take
    (the memory model decides), else the profiled micro-batch a device (it ran). Without it a profile of
    ``accumulate_grad_batches`` 4 at 64 a device was ranked on one GPU at 256 without accumulation, the memory
    estimate being weights and optimizer state alone (a new user's trial, 2026-12-01)."""
    return np.inf if activations_known(profile) else float(profile.batch.per_device)


def _split_batch(profile: Profile, src: Source, fleets: _Fleets, scaling: Scaling) -> _Batch:
    """The batch each fleet trains and how it splits: weak scaling keeps the profiled micro-batch on every GPU and
    the profiled accumulation; a pipeline takes as many micro-batches as the global batch has samples per replica
    (the smallest bubble); otherwise the profiled global batch with the least accumulation whose micro-batches fit
    (:func:`_least_accumulation`)."""
    n = len(fleets.nodes)
    if scaling == "weak":
        accumulation = np.full(n, float(profile.batch.accumulate_grad_batches or 1))
        lo, plus, ok, micro, need, fits = _split(
            profile, fleets, row_sum(fleets.replicas) * src.per_device_batch, accumulation
        )
    elif fleets.pipeline:
        total = global_batch_of(profile)
        dp_ranks = row_sum(fleets.replicas)
        accumulation = np.ones(n)
        for a in divisors(total)[1:]:
            accumulation[total // a >= dp_ranks] = a
        lo, plus, ok, micro, need, fits = _split(profile, fleets, total / accumulation, accumulation)
    else:
        accumulation, (lo, plus, ok, micro, need, fits) = _least_accumulation(profile, fleets)
    fits &= ok & fleets.valid
    present, replicas = fleets.present, fleets.replicas
    b = np.where(present, (lo + plus / np.where(present, replicas, 1.0)) * accumulation[:, None], 0.0)
    return _Batch(lo, plus, ok, micro, need, fits, accumulation, b, row_sum(b * replicas))


def _least_accumulation(profile: Profile, fleets: _Fleets) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Strong scaling: the profiled global batch, split without accumulation where it fits, else with the least
    accumulation (a divisor of the global batch: whole micro-steps) whose micro-batches fit; none for a module that
    steps its own optimizers (``batch.manual_optimization``: Lightning refuses accumulate_grad_batches for it, and
    the plan's would have been ignored, the training changed). Returns the accumulation and :func:`_split`'s arrays,
    row by row those of the accumulation chosen."""
    n = len(fleets.nodes)
    total = global_batch_of(profile)
    accumulation = np.ones(n)
    lo, plus, ok, micro, need, fits = _split(profile, fleets, np.full(n, float(total)), accumulation)
    dp_ranks = row_sum(fleets.replicas)
    for a in divisors(total)[1:] if not profile.batch.manual_optimization else ():
        rows = np.flatnonzero(ok & ~fits & (total // a >= dp_ranks))
        if not len(rows):
            break
        r_lo, r_plus, _, r_micro, r_need, r_fits = _split(
            profile, fleets, np.full(len(rows), float(total // a)), float(a), rows
        )
        take = rows[r_fits]
        lo[take], plus[take], micro[take], need[take] = r_lo[r_fits], r_plus[r_fits], r_micro[r_fits], r_need[r_fits]
        accumulation[take], fits[take] = a, True
    return accumulation, (lo, plus, ok, micro, need, fits)


def _slowest_group(fleets: _Fleets, batch: _Batch, recompute: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, input, index) of the group whose compute + input sets the step (the first of equals), per
    optimizer step.

    A micro-step is never faster than the host can run it (framework + kernel launches: ``step_floor_s``); a
    pipeline stage computes 1/p of the model per micro-batch over the m + p - 1 slots of 1F1B (the bubble); the
    optimizer step runs once per optimizer step, over the rank's shard of the parameters (a stage's for pipelines).
    """
    layout, accumulation, stages = fleets.layout, batch.accumulation, fleets.stages
    slots = (accumulation + stages - 1) / stages if fleets.pipeline else accumulation
    owners = fleets.shard if layout.sharded else stages
    compute_g = np.maximum(fleets.per_sample * recompute * batch.micro, fleets.col("step_floor_s")) * slots[:, None]
    compute_g = compute_g + fleets.col("optimizer_s") / owners[:, None]
    input_g = fleets.col("input_per_sample_s") * batch.micro * accumulation[:, None]
    total_g = np.where(fleets.present, compute_g + input_g, -np.inf)
    compute, input_s, worst = compute_g[:, 0].copy(), input_g[:, 0].copy(), total_g[:, 0].copy()
    slowest = np.zeros(len(stages), dtype=int)
    for k in range(1, total_g.shape[1]):
        slower = total_g[:, k] > worst
        compute[slower], input_s[slower], worst[slower] = compute_g[slower, k], input_g[slower, k], total_g[slower, k]
        slowest[slower] = k
    return compute, input_s, slowest


def _communication(
    profile: Profile, src: Source, fleets: _Fleets, batch: _Batch, recompute: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(communication, exposed communication, the least step the networks sustain) per optimizer step: FSDP's
    collectives (:func:`_fsdp_comm`) or DDP's all-reduce (:func:`_ddp_comm`), over the slowest inter-node link of the
    fleet; the exposed part is what the backward of the fastest group's micro-step (recomputation included) does not
    hide; the least step is the GB each node sends a step over the slowest rate a group's network sustains
    (``Link.sustained_gbps``: an "up to" network's baseline; 0 where every network sustains its rate)."""
    present = fleets.present
    single = fleets.single[:, None]
    inter_gbps = np.where(single, fleets.link_col("gbps", False), fleets.link_col("gbps", True))
    sustained = np.where(single, fleets.link_col("sustained_gbps", False), fleets.link_col("sustained_gbps", True))
    slow_sustained = row_min(np.where(present, sustained, np.inf))
    inter_lat = np.where(single, fleets.link_col("latency_s", False), fleets.link_col("latency_s", True))
    slow_gbps = row_min(np.where(present, inter_gbps, np.inf))
    max_lat = row_max(np.where(present, inter_lat, 0.0))
    crossing = fleets.crossing()  # how NCCL's collectives cross nodes (NVLS, ring / tree, sockets)
    fastest_micro = row_min(np.where(present, fleets.per_sample * batch.micro, np.inf))
    backward = fastest_micro * (src.backward_share + (recompute - 1.0))
    if fleets.layout.sharded:
        comm, exposed, sent_gb = _fsdp_comm(
            profile,
            fleets.layout,
            fleets.type_bases,
            fleets.tidx,
            present,
            fleets.nodes,
            fleets.node_gpus,
            fleets.ranks,
            batch.accumulation,
            fastest_micro * (1 - src.backward_share),
            backward,
            slow_gbps,
            max_lat,
            crossing,
        )
    else:
        comm, exposed, sent_gb = _ddp_comm(profile, fleets, batch, backward, slow_gbps, max_lat, crossing)
    return comm, exposed, sent_gb / slow_sustained


def _ddp_comm(
    profile: Profile,
    fleets: _Fleets,
    batch: _Batch,
    backward: np.ndarray,
    slow_gbps: np.ndarray,
    max_lat: np.ndarray,
    crossing: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(communication, exposed communication, GB each node sends) per optimizer step of DDP: an all-reduce of the
    gradients crossing
    nodes as NCCL's algorithms do on the fleet's nodes (``crossing``: ``collectives.network_phase_s``; a pipeline
    stage's share, inside its node), the intra-node and network phases pipelined chunk by
    chunk (:mod:`predictor.model.network`: the slower one sets the pace), one call per bucket, each paying the
    latency of NCCL's ring or tree (``allreduce_latency``), behind the backward of the last micro-step;
    a pipeline adds the activations and their gradients across each stage boundary, every slot."""
    present, nodes, stages = fleets.present, fleets.nodes, fleets.stages
    gb = grad_bytes(profile) / 1e9 / stages
    across = (nodes > 1) & ~fleets.pipeline
    sent_gb = np.where(across, network_phase_s(gb, nodes, fleets.ranks / stages, 1.0, crossing), 0.0)
    inter_bw = sent_gb / slow_gbps
    intra_bw = row_max(np.where(present, fleets.col("intra_s") - fleets.col("intra_lat_s"), 0.0)) / stages
    # one all-reduce call per bucket (a stage's share of them), each paying NCCL's ring or tree latency
    buckets = bucket_sizes(profile)
    calls = np.ceil(sum(n for _, n in buckets) / stages)
    hop_intra = row_max(np.where(present, fleets.col("intra_latency_s"), 0.0))
    g = row_max(np.where(present, fleets.col("gpus"), 1.0))
    latency = calls * allreduce_latency(np.where(across, nodes, 1.0), g, hop_intra, max_lat)
    comm = np.where(fleets.ranks > 1, np.maximum(intra_bw, inter_bw) + latency, 0.0)
    exposed = exposed_many(comm, backward, buckets)
    if fleets.pipeline:
        hop = structure_bytes(profile, "block_input_bytes_per_sample")
        boundary = hop * row_max(np.where(present, batch.micro, 0.0)) / 1e9
        node_share = slow_gbps / fleets.node_gpus  # the node's GPUs (one replica each) share its network
        hops = 2 * (batch.accumulation + stages - 1) * (boundary / node_share + max_lat)
        comm, exposed = comm + hops, exposed + hops
        # each micro-batch's activations forward and their gradients back, every GPU of the node's: an inner stage
        # sends both, an end stage one (AWS limits what a node sends and what it receives apart)
        sent_gb = np.where(nodes > 1, np.minimum(2, stages - 1) * batch.accumulation * boundary * fleets.node_gpus, 0)
    return comm, exposed, sent_gb


def _dp_loss(
    profile: Profile,
    src: Source,
    fleets: _Fleets,
    batch: _Batch,
    compute: np.ndarray,
    hidden: np.ndarray,
    dp_model: ScalingModel | None,
) -> np.ndarray:
    """The data-parallel losses per optimizer step (:mod:`predictor.model.scaling`): stragglers (the jitter of a
    micro-steps adds up like independent noise: relative sd / sqrt(a)) and the contention of the ``hidden``
    communication and the gradient copies with compute. The copies: FSDP's pre-divide of each unit's unsharded
    gradient every micro-step, or DDP's bucket copies once per optimizer step (a pipeline stage holds 1/p)."""
    dp = dp_model or scaling_model()
    present, accumulation = fleets.present, batch.accumulation
    s_per_byte = row_max(np.where(present, fleets.col("s_per_byte"), 0.0))
    if fleets.layout.sharded:
        sizes = profile_sizes(profile)
        copies = FSDP_GRAD_PASSES * sizes.parameters * sizes.compute * s_per_byte * accumulation
    else:
        copies = DDP_GRAD_PASSES * grad_bytes(profile) / fleets.stages * s_per_byte
    return dp.loss(
        compute / np.sqrt(accumulation),
        fleets.ranks,
        hidden,
        copies,
        contention_bound=row_min(np.where(present, fleets.col("contention_bound"), np.inf)),
        source_ranks=src.world,
        sigma=measured_sigma(profile),
    )


def _model_sd(profile: Profile, fleets: _Fleets, comm: np.ndarray, exposed: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The relative sd of each step prediction: the worst group's model error, at least the scaling model's on
    more than one GPU, with the exposed communication's share of the step times its network's width (a tenth; where
    the nodes meet through host memory, sockets or EFA without GPUDirect RDMA, the ``net-host-staged`` width) added
    in quadrature, combined
    with the profile's run-to-run CV. Under a sharded layout, a kind calibrated on whole sharded multi-GPU steps
    (``uncertainty.SHARDED_KINDS``) takes that width instead, without the DDP-calibrated scaling floor."""
    model_err = row_max(np.where(fleets.present, fleets.col("model_error"), 0.0))
    model_err = np.where(fleets.ranks > 1, np.maximum(model_err, model_error("scaling")), model_err)
    if fleets.layout.sharded:
        sharded = fleets.col("sharded_error")
        calibrated = row_all(~fleets.present | ~np.isnan(sharded))
        model_err = np.where(calibrated, row_max(np.where(fleets.present, np.nan_to_num(sharded), 0.0)), model_err)
    # the exposed communication's share of the step, at the network's own width: a tenth where the link is calibrated
    # (EFA with GPUDirect RDMA on p5, held out on p4d; NVLink; PCIe), the host-staged regime's where the nodes meet
    # through host memory (calibrated on sockets, scored on EFA without GPUDirect RDMA: bench/tcp_sockets.py)
    comm_sd = np.where(fleets.host_staged() > 0, model_error("net-host-staged"), 0.1)
    model_err = np.where(comm > 0, np.hypot(model_err, comm_sd * exposed / step), model_err)
    return combined_sd(profile.timing.step_time_s.cv or 0.0, model_err)


def structure_bytes(profile: Profile, name: str) -> float:
    """A byte count of ``model.structure`` (0 when absent)."""
    st = profile.model.structure
    return float(getattr(st, name) or 0.0) if st is not None else 0.0


def recompute_factor(profile: Profile, src: Source, layout: Layout) -> float:
    """How much longer a step's compute is under ``layout``: 1 + :func:`recompute_share` with activation
    checkpointing, else 1."""
    return 1.0 + recompute_share(profile, src) if layout.activation_checkpointing else 1.0


def recompute_share(profile: Profile, src: Source) -> float:
    """Activation checkpointing's extra compute, as a share of one step's compute: one more forward of the blocks
    (the forward share of the step, times the blocks' share of the parameters)."""
    st = profile.model.structure
    blocks = 1.0
    if st is not None and st.blocks and st.block_parameters:
        blocks = min(1.0, st.blocks * st.block_parameters / profile.model.parameters)
    return (1.0 - src.backward_share) * blocks


def _fsdp_comm(
    profile: Profile,
    layout: Layout,
    type_bases: list[TypeBasis],
    tidx: np.ndarray,
    present: np.ndarray,
    nodes: np.ndarray,
    node_gpus: np.ndarray,
    ranks: np.ndarray,
    accumulation: np.ndarray,
    forward: np.ndarray,
    backward: np.ndarray,
    slow_gbps: np.ndarray,
    max_lat: np.ndarray,
    crossing: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(communication, exposed communication, GB each node sends) per optimizer step of FSDP.

    Per micro-step (Lightning's FSDPStrategy has no no_sync under gradient accumulation: every micro-step
    reduce-scatters): full_shard and hybrid_shard all-gather the compute-dtype parameters for forward and again for
    backward, shard_grad_op once; gradients are reduce-scattered. Each collective moves (n-1)/n of the bytes per GPU:
    inside a node on the intra link, across nodes through the node's network (one copy per node on NVLink SHARP
    nodes, else a ring of every rank: ``crossing``, ``collectives.network_phase_s``).
    hybrid_shard shards inside the node only and all-reduces its shard of the gradients across nodes,
    the node's GPUs sharing its network. Prefetch hides a collective behind the compute of the phase: exposed is
    the first unit's all-gather (the last unit's reduce-scatter in backward) plus what exceeds the phase's compute.

    Under gloo (a fleet whose instance type says ``process_group_backend: gloo``: a CPU lab) FSDP calls each
    collective synchronously on the training thread, so nothing overlaps, and gloo's reduce-scatter is an all-reduce
    (twice the bytes of a ring reduce-scatter).
    """
    sizes = profile_sizes(profile)
    params_gb = sizes.parameters * sizes.compute / 1e9
    units = max(1.0, sizes.parameters / max(sizes.unit, 1.0))
    slow_intra = row_min(np.where(present, np.array([b.intra_gbps for b in type_bases], dtype=float)[tidx], np.inf))
    lat_intra = row_max(np.where(present, np.array([b.intra_latency_s for b in type_bases], dtype=float)[tidx], 0.0))
    hybrid = layout.sharding == "hybrid_shard"
    across = (nodes > 1) & ~hybrid

    def collective(gb: float) -> np.ndarray:  # one all-gather (a reduce-scatter moves as much) of gb gathered GB
        return hierarchical_s(ALL_GATHER, gb, node_gpus=node_gpus, intra_gbps=slow_intra, intra_hop_s=lat_intra,
                              nodes=nodes, ranks=ranks, net_gbps=slow_gbps, net_hop_s=max_lat, crossing=crossing,
                              calls=units, across=across)  # fmt: skip

    blocking = row_max(np.where(present, np.array([b.blocking_collectives for b in type_bases], float)[tidx], 0)) > 0
    gather = collective(params_gb)
    # the flat gradients, in the reduce dtype (= the compute dtype); gloo reduces them with an all-reduce
    scatter = np.where(blocking, 2.0, 1.0) * collective(params_gb)
    cross = np.zeros_like(gather)
    if hybrid:  # the shard's gradients all-reduced across nodes; g shards leave each node through its network
        cross_latency = units * allreduce_latency(nodes, 1.0, 0.0, max_lat)  # one call per unit, ring or tree
        cross = np.where(nodes > 1, phase_s(ALL_REDUCE, params_gb, nodes, slow_gbps) + cross_latency, 0)
    gathers_backward = 0.0 if layout.sharding == "shard_grad_op" else 1.0
    exposed_fwd = gather / units + np.maximum(0.0, gather * (1 - 1 / units) - forward)
    back = gathers_backward * gather + scatter + cross
    exposed_bwd = scatter / units + np.maximum(0.0, back - scatter / units - backward)
    comm = accumulation * (gather + back)
    sent = _fsdp_sent_gb(params_gb, nodes, ranks, crossing, across, hybrid, 2.0 + gathers_backward + blocking)
    return comm, np.where(blocking, comm, accumulation * (exposed_fwd + exposed_bwd)), accumulation * sent


def _fsdp_sent_gb(
    params_gb: float,
    nodes: np.ndarray,
    ranks: np.ndarray,
    crossing: np.ndarray,
    across: np.ndarray,
    hybrid: bool,
    collectives: np.ndarray,
) -> np.ndarray:
    """GB each node's network sends per micro-step of FSDP: ``collectives`` all-gathers and reduce-scatters (as
    many bytes each; gloo's reduce-scatter is an all-reduce, two) of the gathered parameters across nodes, or
    hybrid_shard's all-reduce of the shard's gradients over the nodes."""
    gathered = np.where(across, network_phase_s(params_gb, nodes, ranks, 1.0, crossing, ALL_GATHER), 0.0)
    crossed = np.where(hybrid & (nodes > 1), phase_s(ALL_REDUCE, params_gb, nodes, 1.0), 0.0)
    return collectives * gathered + crossed


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
