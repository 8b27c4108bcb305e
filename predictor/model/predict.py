"""``predict(profile, fleet)``: iteration time, throughput, breakdown, bottleneck and memory fit of one fleet.

A one-row view of the fleet model (:func:`predictor.model.fleets.predict_mixes`) with the words that explain it.
Step time on the fleet = the slowest group's (compute + input pipeline) + the all-reduce time backward does not hide
+ the data-parallel losses (stragglers, contention: :mod:`predictor.model.scaling`). Compute on each GPU comes from
:mod:`predictor.model.basis` (operator table, roofline split or FLOPs); all-reduce from :mod:`predictor.model.network`;
memory from :mod:`predictor.model.memory`; intervals from :mod:`predictor.model.uncertainty`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from predictor.catalog.catalog import Catalog, over_tcp
from predictor.catalog.feasible import exclusion
from predictor.catalog.fleet import Fleet, Group, parse_fleet
from predictor.catalog.torch_builds import default_image
from predictor.documents.checks import check_choice
from predictor.documents.plan import TRANSPORTS
from predictor.documents.profile import Profile, load_profile
from predictor.documents.work import global_batch as global_batch_of
from predictor.exceptions import ConfigError, PredictionError
from predictor.model.artefact import model_version
from predictor.model.basis import TypeBasis
from predictor.model.batch import rank_batches
from predictor.model.fleets import (
    PREFER_SIMPLER,
    SCALINGS,
    SIMPLICITY,
    ManyPredictions,
    Scaling,
    applies,
    bases,
    combine,
    predict_mixes,
    recompute_factor,
)
from predictor.model.layout import DDP, Layout, parse
from predictor.model.memory import activations_known, estimate_memory
from predictor.model.network import DEFAULT_NETWORK, NetworkModel, inter_node_link, link_words
from predictor.model.scaling import ScalingModel

# pydantic (the service's OpenAPI document, predictor.service.answers) reads the string under each field as its
# description; a plain dict, so that the model imports no pydantic
_DOCUMENTED: dict[str, Any] = {"use_attribute_docstrings": True}


@dataclass(frozen=True)
class GroupPrediction:
    """One group of the fleet (one instance type): its share of the batch, its step and its memory per GPU."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _DOCUMENTED
    instance_type: str
    """the EC2 instance type (or catalog extra) of the group"""
    count: int
    """instances of it in the fleet"""
    gpu: str | None
    """its GPU, as the catalog names it"""
    per_device_batch: float
    """samples per GPU per optimizer step (the group's mean: a mixed fleet splits in proportion to speed)"""
    micro_batch: int
    """the largest batch a GPU of the group takes per micro-step"""
    accumulate_grad_batches: int
    """micro-steps per optimizer step"""
    rank_batches: tuple[int, ...]
    """each GPU's micro-batch (they differ by one sample at most)"""
    compute_s: float
    """seconds of compute per optimizer step on one of its GPUs (its micro-steps and its share of the optimizer step)"""
    input_s: float
    """seconds per optimizer step the training waits for its input (the profile's data phase, scaled to the
    instance's CPUs)"""
    memory_gib: float
    """GiB a GPU needs (a floor, weights, gradients, optimizer state and the CUDA context, where memory_known is
    false)"""
    fits_memory: bool
    """whether that fits the GPU's usable memory"""
    memory_margin: float
    """(usable - needed) / usable: negative when it does not fit"""
    memory_parts_gib: dict[str, float] = field(default_factory=dict)
    """GiB per GPU by part: weights, gradients, optimizer state, activations, gathered shards, ..."""


@dataclass(frozen=True)
class Prediction:
    """What one fleet is predicted to do."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _DOCUMENTED
    fleet: str
    """the fleet, instance_type:count[,instance_type:count]"""
    iteration_time_s: float
    """seconds per optimizer step"""
    throughput_samples_s: float
    """samples per second over the fleet (global_batch / iteration_time_s)"""
    interval: dict[str, tuple[float, float]]
    """80 % interval (low, high) of iteration_time_s and throughput_samples_s, from the held-out errors of the path
    and regime that priced it"""
    breakdown: dict[str, float]
    """where an optimizer step's seconds go: compute_s, input_s, allreduce_s (all of it), exposed_comm_s (the part
    not hidden behind the backward pass), dp_loss_s (stragglers, contention, gradient copies), baseline_wait_s (an
    'up to' network held to its baseline)"""
    bottleneck: str
    """what limits the step, in words"""
    fits_memory: bool
    """whether every group fits its GPUs' memory"""
    groups: tuple[GroupPrediction, ...]
    """one entry per instance type of the fleet"""
    global_batch: float
    """samples per optimizer step over the fleet"""
    accumulate_grad_batches: int
    """micro-steps per optimizer step"""
    scaling: str
    """strong (the profiled global batch kept) or weak (the profiled per-GPU batch kept)"""
    batch_split: str
    """how the global batch splits over the GPUs, in words"""
    allreduce_limiting: str
    """which link limits the gradient all-reduce: none, intra-node KIND or network KIND"""
    assumptions: tuple[str, ...] = field(default=())
    """what the prediction takes for granted (the layout, the network's transport and rate, the batch split, ...)"""
    extrapolation: tuple[str, ...] = field(default=())
    """where it goes beyond the data its terms were fitted or checked on"""
    layout: str = "ddp"
    """the parallel layout (predictor.model.layout; pipeline:STAGES has one stage a node)"""
    memory_known: bool = True
    """false where the profile has no activation memory: memory_gib is then a floor and micro-batches are held to the
    profiled one"""
    cannot_run: tuple[str, ...] = field(default=())
    """'TYPE: reason' for each type whose GPU cannot run the profiled training as profiled (bf16 or FP8 before the
    GPUs that have them, no build of the profiled torch for it: predictor.catalog.feasible, the rule srifty recommend
    leaves types out by); the step is priced all the same, for a run that cannot start"""
    performance_model: str = field(default_factory=model_version)
    """the model that made it: schema + digest of the fitted constants and the model's code"""

    def to_dict(self) -> dict[str, Any]:
        """The prediction as JSON reads it back: every tuple a list (``json.loads(json.dumps(d)) == d``)."""
        return _lists(asdict(self))


def _lists(value: Any) -> Any:
    """``value`` with every tuple, at any depth, a list."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


AUTO_LAYOUTS = tuple(f"{name}{ac}" for name in SIMPLICITY for ac in ("", "+ac"))  # simplest first, as ranked
AUTO = "auto"  # the layout srifty recommend runs the fleet with (predict_auto): srifty predict's, the service's default


def predict_auto(
    profile: Profile | Mapping[str, Any],
    fleet: Fleet | str | Iterable[tuple[str, int]],
    *,
    catalog: Catalog | None = None,
    **options: Any,
) -> Prediction:
    """:func:`predict` under the layout ``srifty recommend`` runs this fleet with, chosen by the ranking's own rule
    (:func:`~predictor.model.fleets.choose_layouts` over the layouts srifty launch can start, :data:`AUTO_LAYOUTS`):
    plain DDP where it fits without gradient accumulation, else the simplest that fits unless a more complex one is
    faster by more than :data:`~predictor.model.fleets.PREFER_SIMPLER`; none fits: the closest layout's prediction
    (:func:`_closest`), which says so. ``srifty predict`` with no ``--layout`` (issue #37 M2: it answered "does not
    fit: 604.9 GiB/GPU" for the LoRA profile on g5.xlarge, which recommend runs at 18.5 GiB with activation
    checkpointing and accumulation). Until 2026-11-30 this chose by its own rule, which lacked the first clause: it
    said FSDP for ResNet-50 on four g5.xlarge (258 ms) where recommend ran DDP (517 ms), calling FSDP "the one srifty
    recommend runs".

    Raises:
        PredictionError, UnknownNameError, ConfigError: as :func:`predict` with plain DDP.
    """
    profile = as_profile(profile)
    catalog, fleet = fleet_over(fleet, catalog, options.pop("transport", "auto"))
    # the rule's first clause, as the ranking takes it (choose_layouts: the simplest layout, plain DDP, where it fits
    # without accumulation): one prediction, not the layouts' sweep and then the chosen one again
    best = predict(profile, fleet, catalog=catalog, layout=DDP, **options)  # raises where no layout splits the batch
    if not (best.fits_memory and best.accumulate_grad_batches == 1):
        names = sorted({g.instance.name for g in fleet.groups})
        tidx = np.array([[names.index(g.instance.name) for g in fleet.groups]])
        cnt = np.array([[g.count for g in fleet.groups]], dtype=float)
        many = predict_mixes(profile, names, tidx, cnt, catalog=catalog, layouts=AUTO_LAYOUTS, **options)
        if not (many.fits_memory[0] and many.splittable[0]):
            return _closest(profile, fleet, catalog, best, **options)
        chosen = many.layout_names[int(many.layout_index[0])]
        best = predict(profile, fleet, catalog=catalog, layout=chosen, **options) if chosen != DDP.name else best
    why = (
        f"layout {best.layout}: the one srifty recommend runs this fleet with (plain DDP where it fits without "
        f"gradient accumulation; else the simplest layout that fits, unless another is {PREFER_SIMPLER:.0%} faster); "
        "--layout NAME predicts another"
    )
    return dataclasses.replace(best, assumptions=(why, *best.assumptions))


NONE_FITS = (
    "no layout srifty launch can start fits this fleet"  # how predict_auto's note of a fleet nothing fits begins
)


def _closest(profile: Profile, fleet: Fleet, catalog: Catalog, ddp: Prediction, **options: Any) -> Prediction:
    """A fleet no launchable layout fits: the prediction of the layout that comes closest (the least share of its
    GPUs' memory on its fullest group; plain DDP on a tie), saying so. It had been plain DDP's, whatever was closer,
    with the advice to shard: a 7B model on two g5.xlarge read 669.8 GiB a GPU and "shard the model and optimizer
    state", which needs 43.6 and fits no better (an audit)."""

    ranks = fleet.gpus

    def least(p: Prediction) -> tuple[float, str, float]:
        """(share of its GPU's memory, type, GiB a GPU) of the fullest group at one sample a micro-step."""
        needs = []
        for g in p.groups:
            it = catalog.get(g.instance_type)
            gib = estimate_memory(profile, 1.0, it.gpu_memory_gib, parse(p.layout), ranks, it.gpus).bytes_per_gpu
            needs.append((gib / 2**30 / it.gpu_memory_gib, g.instance_type, gib / 2**30))
        return max(needs)

    tried = [ddp]
    for name in AUTO_LAYOUTS[1:]:
        try:
            tried.append(predict(profile, fleet, catalog=catalog, layout=name, **options))
        except ConfigError:
            continue  # the layout does not apply to this fleet (sharding on one GPU, +ac without model.structure)
    closest = min(tried, key=lambda p: least(p)[0])  # min keeps the first (the simplest) on a tie
    share, name, gib = least(closest)
    if share <= 1:  # memory is not what keeps it out (a mix's split past the profiled batch, a known limit): DDP's
        return ddp
    g = next(g for g in closest.groups if g.instance_type == name)
    why = (
        f"{NONE_FITS} ({', '.join(p.layout for p in tried)} tried): this is {closest.layout}, the closest, which "
        f"needs {gib:.1f} GiB a GPU on {name} ({catalog.get(name).gpu_memory_gib:g} GiB) even at one sample a "
        f"micro-step; a GPU with more memory or more GPUs holds it. Its time and memory here are at "
        f"{g.micro_batch} samples a micro-step, which no GPU of it holds: a fleet that fits takes its own"
    )
    return dataclasses.replace(closest, assumptions=(why, *closest.assumptions))


def _stage_per_node(name: str, nodes: int) -> str:
    """``pipeline`` (``+ac``) as the ranking names it, one stage per node: ``pipeline:<the fleet's nodes>``; any other
    name as given."""
    raw = name.strip().lower()
    return f"pipeline:{nodes}{raw[len('pipeline') :]}" if raw in ("pipeline", "pipeline+ac") else name


def predict(
    profile: Profile | Mapping[str, Any],
    fleet: Fleet | str | Iterable[tuple[str, int]],
    *,
    catalog: Catalog | None = None,
    scaling: Scaling = "strong",
    network: NetworkModel = DEFAULT_NETWORK,
    calibration: Mapping[str, float] | None = None,
    dp_model: ScalingModel | None = None,
    layout: Layout | str = AUTO,
    transport: str = "auto",
) -> Prediction:
    """Predict one fleet from a profile (``network``: the link constants, :class:`NetworkModel`; ``transport``: "auto",
    EFA where the type has it, or "tcp", a cluster without EFA (:func:`fleet_over`); ``calibration``: measured /
    predicted throughput factors by GPU key; ``dp_model``: the data-parallel loss constants, default the fitted ones;
    ``layout``: a :class:`Layout` or its name, e.g. ``"ddp"``, ``"fsdp:full_shard+ac"`` (``pipeline:<p>``: p nodes of
    one type), or ``"auto"`` (the default, as srifty predict's and the service's): :func:`predict_auto`'s)).

    Raises:
        PredictionError: the profile cannot be scaled to this fleet (e.g. CPU profile without FLOPs).
        UnknownNameError, ConfigError: a bad fleet, or a layout that does not apply to it or to the profile.
    """
    check_choice("predict()", "scaling", scaling, SCALINGS)
    if isinstance(layout, str) and layout.strip().lower() == AUTO:
        options = {"scaling": scaling, "network": network, "calibration": calibration, "dp_model": dp_model}
        return predict_auto(profile, fleet, catalog=catalog, transport=transport, **options)
    profile, (catalog, fleet) = as_profile(profile), fleet_over(fleet, catalog, transport)
    layout = parse(_stage_per_node(layout, fleet.nodes)) if isinstance(layout, str) else layout
    _check_layout(profile, fleet, layout)
    src, many, row_bases = _one_row(profile, fleet, catalog, network, calibration, scaling, dp_model, layout)

    groups = _group_predictions(profile, fleet, layout, many, row_bases)
    step, global_batch = float(many.iteration_time_s[0]), float(many.global_batch[0])
    split_note = _split_note(fleet, groups, scaling, global_batch)
    losses = (float(many.dp_loss_s[0]), step)
    assumptions = _assumptions(profile, fleet, layout, row_bases, split_note, losses, catalog, network)
    if fleet.nodes > 1:
        assumptions += _baseline_words(fleet, row_bases, float(many.baseline_wait_s[0]), step)
    limiting = _limiting(fleet, row_bases, float(many.allreduce_s[0]))
    recompute = recompute_factor(profile, src, layout)
    return Prediction(
        fleet=str(fleet),
        iteration_time_s=step,
        throughput_samples_s=float(many.throughput_samples_s[0]),
        interval=_interval(many, global_batch),
        breakdown=_breakdown(many),
        bottleneck=_bottleneck(groups, many, limiting, row_bases, recompute),
        fits_memory=bool(many.fits_memory[0]),
        groups=tuple(groups),
        global_batch=global_batch,
        accumulate_grad_batches=int(many.accumulation[0]),
        scaling=scaling,
        batch_split=split_note,
        allreduce_limiting=limiting,
        assumptions=tuple(dict.fromkeys(assumptions)),
        extrapolation=tuple(dict.fromkeys(_extrapolation(fleet, row_bases, src.world))),
        layout=_layout_name(fleet, layout),
        memory_known=activations_known(profile),
        cannot_run=cannot_run(profile, fleet, catalog),
    )


def fleet_over(
    fleet: Fleet | str | Iterable[tuple[str, int]], catalog: Catalog | None, transport: str
) -> tuple[Catalog, Fleet]:
    """(the catalog, the fleet) as their nodes meet under ``transport`` (:data:`TRANSPORTS`): "tcp" prices every
    type as a cluster without EFA sees it (:meth:`Catalog.over_tcp`), a parsed fleet's types included.

    Raises:
        ConfigError: an unknown transport, or a bad fleet (:func:`parse_fleet`).
    """
    check_choice("predict()", "transport", transport, TRANSPORTS)
    catalog = catalog or Catalog.load()
    if transport == "tcp" and catalog.transport != "tcp":
        catalog = catalog.over_tcp()
    if not isinstance(fleet, Fleet):
        return catalog, parse_fleet(fleet, catalog)
    if catalog.transport == "tcp":
        fleet = Fleet(tuple(Group(over_tcp(g.instance), g.count) for g in fleet.groups))
    return catalog, fleet


def as_profile(profile: Profile | Mapping[str, Any]) -> Profile:
    """A :class:`Profile`, or a parsed srifty.profile/v1 document (a dict, as the service takes it) validated into
    one (:func:`~predictor.documents.profile.load_profile`: ProfileSchemaError names the field).

    Raises:
        ProfileSchemaError: a malformed document.
        TypeError: neither.
    """
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, Mapping):
        return load_profile(dict(profile))
    raise TypeError(
        f"profile: expected a Profile or a srifty.profile/v1 dict, got {type(profile).__name__}: "
        "load one with predictor.documents.profile.load_profile(path)"
    )


def cannot_run(profile: Profile, fleet: Fleet, catalog: Catalog) -> tuple[str, ...]:
    """The reason, as "TYPE: reason", for each of ``fleet``'s types that cannot run the profiled training as profiled,
    by the rule srifty recommend leaves types out by (:func:`~predictor.catalog.feasible.exclusion`); an arm64 type
    named in the fleet is the caller's choice, not a reason."""
    out = []
    for g in fleet.groups:
        name = g.instance.gpu
        gpu = catalog.gpu(name) if name is not None and name in catalog.gpus else None
        why = exclusion(g.instance, gpu, profile, allow_arm64=True, driver=default_image()[1])
        if why:
            out.append(f"{g.instance.name}: {why}")
    return tuple(dict.fromkeys(out))


def _interval(many: Any, global_batch: float) -> dict[str, tuple[float, float]]:
    """The one row's 80 % interval, of the step and of the throughput it gives."""
    lo, hi = float(many.iteration_time_lo_s[0]), float(many.iteration_time_hi_s[0])
    return {"iteration_time_s": (lo, hi), "throughput_samples_s": (global_batch / hi, global_batch / lo)}


def _breakdown(many: Any) -> dict[str, float]:
    """Where the one row's step time goes: compute, input, the all-reduce and its exposed part, data-parallel losses."""
    return {
        "compute_s": float(many.compute_s[0]),
        "input_s": float(many.input_s[0]),
        "allreduce_s": float(many.allreduce_s[0]),
        "exposed_comm_s": float(many.exposed_comm_s[0]),
        "dp_loss_s": float(many.dp_loss_s[0]),
        "baseline_wait_s": float(many.baseline_wait_s[0]),
    }


def _layout_name(fleet: Fleet, layout: Layout) -> str:
    """The layout as run: a pipeline's stages are the fleet's nodes."""
    if layout.strategy == "pipeline":
        return f"pipeline:{fleet.nodes}" + ("+ac" if layout.activation_checkpointing else "")
    return layout.name


def _one_row(
    profile: Profile,
    fleet: Fleet,
    catalog: Catalog,
    network: NetworkModel,
    calibration: Mapping[str, float] | None,
    scaling: Scaling,
    dp_model: ScalingModel | None,
    layout: Layout,
) -> tuple[Any, Any, list[Any]]:
    """The fleet model (:func:`~predictor.model.fleets.combine`) on this one fleet: the source, the row of every
    figure, and the type bases of its groups.

    Raises:
        PredictionError: more GPUs than the profiled global batch has samples (strong scaling).
    """
    names = sorted({g.instance.name for g in fleet.groups})
    tidx = np.array([[names.index(g.instance.name) for g in fleet.groups]])
    cnt = np.array([[g.count for g in fleet.groups]], dtype=float)
    src, type_bases = bases(profile, names, catalog, network, calibration)
    many = combine(profile, src, type_bases, tidx, cnt, scaling, dp_model, layout)
    if not many.splittable[0]:
        raise PredictionError(
            f"{fleet} has {fleet.gpus} GPUs, more than the {global_batch_of(profile)} samples of the profiled global "
            "batch: every GPU needs at least one sample. Use fewer GPUs, or weak scaling to grow the global batch (a "
            "different training)."
        )
    return src, many, [type_bases[i] for i in tidx[0]]


def _group_predictions(
    profile: Profile, fleet: Fleet, layout: Layout, many: ManyPredictions, row_bases: list[TypeBasis]
) -> list[GroupPrediction]:
    """Each group's share of the one-row prediction ``many``: its batch split, micro-batch and accumulation, its
    compute and input per optimizer step (the optimizer step over its owners: the shard group under FSDP, the stages
    of a pipeline), and its memory per GPU (:func:`estimate_memory`)."""
    accumulation = int(many.accumulation[0])
    groups = []
    # the optimizer step's owners: the shard group under FSDP, the stages of a pipeline (as in fleets.combine)
    owners = int(many.stages[0]) * layout.shard_group(min(g.instance.gpus for g in fleet.groups), fleet.gpus)
    for k, (group, basis) in enumerate(zip(fleet.groups, row_bases)):
        micro = int(many.micro_batch[0, k])
        mem = estimate_memory(
            profile, micro, basis.gpu_memory_gib, layout, fleet.gpus, min(g.instance.gpus for g in fleet.groups),
            micro_steps=accumulation,
        )  # fmt: skip
        groups.append(
            GroupPrediction(
                group.instance.name,
                group.count,
                group.instance.gpu,
                float(many.per_device_batch[0, k]),
                micro,
                accumulation,
                tuple(rank_batches(many.micro_low[0, k], many.micro_plus[0, k], int(many.group_gpus[0, k]))),
                max(basis.per_sample_s * micro, basis.step_floor_s) * accumulation + basis.optimizer_s / owners,
                basis.input_per_sample_s * micro * accumulation,
                mem.bytes_per_gpu / 2**30,
                mem.fits,
                mem.margin,
                {k: v / 2**30 for k, v in mem.parts.items()},
            )
        )
    return groups


def _assumptions(
    profile: Profile,
    fleet: Fleet,
    layout: Layout,
    row_bases: list[TypeBasis],
    split_note: str,
    loss_and_step: tuple[float, float],
    catalog: Catalog,
    network: NetworkModel,
) -> list[str]:
    """What the prediction assumes, in words: the batch split, each type's notes and the measured link, the input
    pipeline, the memory estimate's basis, FSDP's collectives, and the data-parallel losses' share of the step."""
    assumptions = [split_note]
    for basis in row_bases:
        assumptions += basis.notes
    if len(row_bases) == 1 and fleet.nodes > 1 and row_bases[0].link_note:
        assumptions.append(row_bases[0].link_note)
    if fleet.nodes > 1:
        assumptions.append(_network_words(layout, row_bases, fleet, catalog.transport, network))
    assumptions.append(_input_words(profile, fleet))
    gpus_per_node = min(g.instance.gpus for g in fleet.groups)
    assumptions.append("memory: " + estimate_memory(profile, 1.0, 1.0, layout, fleet.gpus, gpus_per_node).basis)
    if layout.sharded:
        assumptions.append(
            f"{layout.name}: FSDP collectives every micro-step (Lightning's FSDPStrategy does not skip them under "
            "gradient accumulation), overlapped with compute by prefetch"
        )
    dp_loss, step = loss_and_step
    if dp_loss > 0:
        assumptions.append(
            f"data-parallel losses (stragglers, communication contention): {dp_loss / step:.1%} of the step"
        )
    return assumptions


INPUT_NOT_MODELLED = "input pipeline: not modelled"  # how the words of a profile without a data phase begin


def _input_words(profile: Profile, fleet: Fleet) -> str:
    """What the prediction takes the input pipeline (the DataLoader's wait) to cost, in words: nothing for a capture
    (it runs no DataLoader: a trial read "input 0.0 ms" on a 4-vCPU g5.xlarge for ImageNet as a measured zero), the
    measured step's share where no data phase was timed apart, else the profiled wait, scaled by CPUs per GPU where
    the profile counts them."""
    if not profile.timing.step_time_s.p50 > 0:
        return (
            f"{INPUT_NOT_MODELLED} (the capture ran no DataLoader: 0 ms a step); a loader that decodes on the CPU "
            "(JPEG images, audio) can set the step on types with few vCPUs per GPU: a profile of the real run "
            "(SriftyCallback) measures it"
        )
    if "data" not in (profile.timing.phases_s or {}):
        return "input pipeline: inside the measured step (its data wait not timed apart), scaled with the compute"
    if not profile.hardware.cpu_count:
        return "input pipeline time kept as profiled (no CPU count in the profile)"
    cpus = profile.hardware.cpu_count / max(1, profile.hardware.devices)
    types = sorted({(g.instance.name, g.instance.vcpus / max(1, g.instance.gpus)) for g in fleet.groups})
    return (
        f"input pipeline: the profile's data time scaled by CPUs per GPU ({cpus:g} profiled -> "
        + ", ".join(f"{per:g} on {name}" for name, per in types)
        + "), as the DataLoader's workers scale"
    )


def _network_words(
    layout: Layout,
    row_bases: list[TypeBasis],
    fleet: Fleet,
    transport: str = "auto",
    net: NetworkModel = DEFAULT_NETWORK,
) -> str:
    """How a multi-node fleet's nodes are priced to meet (:func:`~predictor.model.network.link_words`): the slowest
    group's network sets the pace, the groups' largest crossing the algorithm (predictor.model.fleets); a fleet of
    catalog extras' RDMA nodes is named as such; ``transport`` "tcp": sockets by the user's choice, where the socket
    ceiling of ``net`` binds, the rate the line and the host staging alone would allow."""
    measured = len(row_bases) == 1 and row_bases[0].inter.kind == "measured"
    slowest = min(row_bases, key=lambda b: b.plain_inter.gbps)
    staging, link = slowest.plain_inter.staging, slowest.plain_inter
    instance = next(g.instance for g in fleet.groups if g.instance.name == slowest.name)
    line = inter_node_link(instance, dataclasses.replace(net, socket_ceiling_gbps=1e12)).gbps  # the ceiling lifted
    capped = link.kind == "tcp" and link.gbps < line
    rate = (
        "at the rate the profile measured"
        if measured
        else f"{link.gbps * 8:,.4g} Gbit/s effective per node"
        + (
            ": the most NCCL's socket transport has been seen to move a node (NVIDIA/nccl#398, #450); the line rate "
            f"of {slowest.name}'s interface"
            + (" with its host staging" if staging < 1.0 else "")
            + f" would allow {line * 8:,.4g} Gbit/s"
            if capped
            else f" ({slowest.name}'s {slowest.gpus} GPUs' transfers staged through host memory: {staging:.0%} of the "
            "transport's rate, as nccl-tests of such nodes measured)"
            if staging < 1.0
            else ""
        )
    )
    how = None
    if layout.strategy == "pipeline":
        how = "each stage's activations sent to the next point to point"
    elif layout.sharding == "hybrid_shard":
        how = "each GPU's gradient shard all-reduced over a ring of the nodes"
    crossing = max(b.plain_inter.crossing for b in row_bases)
    without_efa = [b.name for b in row_bases if b.plain_inter.kind == "tcp"]
    # a link the profile measured carries the calibrated links' width, not the host-staged one: nothing to say
    staged = [] if measured else [b.name for b in row_bases if b.plain_inter.kind == "efa" and b.plain_inter.staged]
    # every group a catalog extra's RDMA node: named as its fabric; staged nodes whose entries say they are
    rdma = all(g.instance.efa and g.instance.gpudirect_rdma and g.instance.origin != "bundled" for g in fleet.groups)
    said = bool(staged) and all(g.instance.gpudirect_rdma is False for g in fleet.groups if g.instance.name in staged)
    declared = [g.instance.name for g in fleet.groups] if rdma else None
    unused = [g.instance.name for g in fleet.groups if g.instance.efa_interfaces > 0] if transport == "tcp" else []
    return link_words(crossing, rate, without_efa, how, staged, declared, said, unused)


def _baseline_words(fleet: Fleet, row_bases: list[TypeBasis], wait: float, step: float) -> list[str]:
    """What an "up to" network sustains (``Link.sustained_gbps``): the baseline of the fleet's slowest, and whether
    the step waits for it; nothing where every group's network sustains its rate."""
    unknown = {g.instance for g in fleet.groups if g.instance.network_up_to and not g.instance.network_baseline_gbps}
    words = [
        f"{it.name}'s network is rated 'up to {it.network_gbps:g} Gigabit' and the catalog has no baseline for it: "
        "the burst's rate is taken for the whole run, though AWS holds such a network to its baseline once its "
        "burst credits are spent (5-60 minutes); a long run may be slower"
        for it in sorted(unknown, key=lambda it: it.name)
    ]
    # a baseline at or above the burst's rate (g4dn.4xlarge: 20 against 0.4 x 25) never holds a step: not said
    capped = [
        (g.instance, b.plain_inter)
        for g, b in zip(fleet.groups, row_bases)
        if b.plain_inter.sustained_gbps < b.plain_inter.gbps
    ]
    if not capped:
        return words
    it, link = min(capped, key=lambda pair: pair[1].sustained_gbps)
    waited = f"{wait:,.3g} s" if wait >= 1 else f"{wait * 1e3:,.3g} ms"
    held = (
        f"this step's traffic needs more: {waited} a step ({wait / step:.0%}) of waiting for it is priced in"
        if wait > 0
        else "this step's traffic stays under it: no wait"
    )
    return [
        *words,
        f"{it.name}'s network is rated 'up to {it.network_gbps:g} Gigabit': {link.gbps * 8:,.3g} Gbit/s effective "
        f"while its burst credits last (5-60 minutes, AWS), then its {it.network_baseline_gbps:g} Gbit/s baseline "
        f"({link.sustained_gbps * 8:,.3g} effective), and {held}",
    ]


def _extrapolation(fleet: Fleet, row_bases: list[TypeBasis], src_world: int) -> list[str]:
    """Where the prediction extrapolates: each type's own, and a fleet over 8x the profile's GPUs."""
    extrapolation = [e for basis in row_bases for e in basis.extrapolation]
    if fleet.gpus > 8 * max(1, src_world):
        extrapolation.append(
            f"{fleet.gpus} GPUs from a profile of {src_world}: all-reduce and stragglers at this "
            "scale are modelled, not measured"
        )
    return extrapolation


def _check_layout(profile: Profile, fleet: Fleet, layout: Layout) -> None:
    """Raise ConfigError when ``layout`` cannot run ``fleet`` or cannot be sized from ``profile``."""
    cnt = np.array([[g.count for g in fleet.groups]], dtype=float)
    per_node = np.array([[g.instance.gpus for g in fleet.groups]], dtype=float)
    if layout.strategy == "pipeline" and layout.pipeline_stages != fleet.nodes:
        raise ConfigError(
            f"layout {layout.name!r} has {layout.pipeline_stages} stages but {fleet} has {fleet.nodes} nodes: a "
            f"pipeline has one stage per node. Use pipeline:{fleet.nodes}.",
            parameter="layout",
            value=layout.name,
        )
    if not applies(profile, layout, cnt, per_node)[0]:
        raise ConfigError(
            f"layout {layout.name!r} does not apply to {fleet} with this profile: sharding needs 2 GPUs or more, "
            "hybrid_shard several multi-GPU nodes of one type, a pipeline nodes of one type, and +ac or a pipeline "
            "the model's block (model.structure). Use ddp or another layout.",
            parameter="layout",
            value=layout.name,
        )


def _split_note(fleet: Fleet, groups: list[GroupPrediction], scaling: str, global_batch: float) -> str:
    what = "the profiled global batch" if scaling == "strong" else "the profiled per-GPU batch"
    head = f"{scaling} scaling ({what}): global batch {global_batch:g}"

    def one(g: GroupPrediction) -> str:
        sizes = sorted(set(g.rank_batches), reverse=True)
        micro = "/".join(map(str, sizes))
        if g.accumulate_grad_batches > 1:
            return f"{micro} x {g.accumulate_grad_batches} accumulated = {g.per_device_batch:g} samples per GPU"
        return f"{micro} samples per GPU"

    if not fleet.heterogeneous:
        return f"{head}, {one(groups[0])}"
    text = ", ".join(f"{g.instance_type} {one(g)}" for g in groups)
    return f"{head}, split in proportion to predicted speed: {text}"


def _limiting(fleet: Fleet, row_bases: list[TypeBasis], allreduce: float) -> str:
    """Which link limits the all-reduce: "none", "intra-node <kind>" or "network <kind>"."""
    if allreduce <= 0:
        return "none"
    intra = max(b.intra_s for b in row_bases)
    if fleet.nodes > 1 and allreduce > intra:  # the phases are pipelined: the network phase is the slower one
        single = len(row_bases) == 1
        links = [b.inter if single else b.plain_inter for b in row_bases]
        return f"network {min(links, key=lambda link: link.gbps).label}"
    kind = max(row_bases, key=lambda b: b.intra_s).intra_kind
    return f"intra-node {kind}"


def _bottleneck(
    groups: list[GroupPrediction], many: ManyPredictions, limiting: str, bases: list[TypeBasis], recompute: float
) -> str:
    """The one thing that limits the one-row ``many``'s step, in words, from the slowest group and its basis (its
    compute-bound share, and whether its micro-step is the host's floor, Lightning's step and the kernel launches,
    not its GPU work, which activation checkpointing's ``recompute`` factor lengthens, as the step's own time does);
    a step held by an "up to" network's baseline names it."""
    if many.baseline_wait_s[0] > 0:
        return "network (an 'up to' network's baseline, once its burst credits are spent)"
    index, exposed, step = int(many.slowest_group[0]), float(many.exposed_comm_s[0]), float(many.iteration_time_s[0])
    slowest, basis = groups[index], bases[index]
    compute_share = basis.compute_share
    host_bound = basis.step_floor_s >= basis.per_sample_s * recompute * slowest.micro_batch
    fastest = min(g.compute_s + g.input_s for g in groups)
    if len(groups) > 1 and slowest.compute_s + slowest.input_s > 1.15 * fastest:
        return f"straggler group ({slowest.instance_type})"
    if exposed > 0.3 * step:
        return "network" if limiting.startswith("network") else f"GPU interconnect ({limiting})"
    if slowest.input_s > slowest.compute_s:
        return "input pipeline"
    if host_bound:
        return "the host (Lightning's step and the kernel launches: a faster GPU does not help)"
    if compute_share is not None and compute_share < 0.5:
        return "memory bandwidth"
    return "compute"
