"""What one instance type does with a profile, computed once per type (never per fleet).

The fleet model (:mod:`predictor.model.fleets`) combines these per-type quantities over any number of fleets:
compute seconds per sample on the type's GPU, input-pipeline seconds per sample, the intra-node all-reduce time, the
inter-node link, the kind of prediction (for its error) and the words that explain how each number was reached.

Compute on another GPU comes, in order of preference, from:
1. the profile's operator table (``ops``) and the per-operator latency model: the ratio target / profiled GPU,
   operator by operator, applied to the measured time (systematic errors cancel); from a CPU or meta profile,
   absolutely (:mod:`predictor.model.ops`);
2. the step-level roofline split (:mod:`predictor.model.compute`), with the learned cross-GPU correction for GPUs
   in its training data;
3. for a CPU profile without an operator table, FLOPs at an assumed share of peak (an extrapolation, said so).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from predictor.catalog.catalog import Catalog
from predictor.catalog.gpus import CATALOG_EXTRA, GPU, die_twin, gpu_table
from predictor.catalog.instances import InstanceType
from predictor.documents.profile import Profile
from predictor.exceptions import ConfigError, PredictionError, UnknownNameError
from predictor.model.collectives import ALL_REDUCE, ring_latency
from predictor.model.compute import compute_ratio, peak_tflops, runs_tf32, tf32_kind
from predictor.model.correction import features, load_correction
from predictor.model.layout import parse
from predictor.model.network import (
    Buckets,
    Link,
    NetworkModel,
    allreduce_time,
    calibrate,
    ddp_buckets,
    inter_node_link,
    intra_node_link,
)
from predictor.model.ops import ComputeEstimate, framework_s, ops_compute, prepare
from predictor.model.scaling import contention_bound
from predictor.model.uncertainty import Z80, model_error, sharded_error

CPU_TO_GPU_UTILISATION = 0.35  # assumed share of the GPU's peak a step reaches when only FLOPs are known
# eager PyTorch + Lightning spend a few ms per step on the host (kernel launches, hooks, optimizer loop) whatever the
# GPU: without a measured framework time or an operator table, no step is predicted below this (judgement)
MIN_GPU_STEP_S = 0.003


@dataclass(frozen=True)
class Source:
    """What the profile measured, computed once for every type."""

    gpu: GPU | None
    per_device_batch: int
    world: int
    compute_s: float  # one step's compute (step - input wait - exposed communication)
    data_s: float
    backward_share: float  # of compute
    flops: float | None  # per sample
    achieved_tflops: float | None
    measured: bool  # False for a capture-only profile (no step was timed)
    ops: Any = None  # the operator table classified and summed on the profiled GPU (predictor.model.ops.prepare)

    @classmethod
    def of(cls, profile: Profile, catalog: Catalog) -> Source:
        gpu = _source_gpu(profile, catalog)
        b = profile.batch.per_device
        compute, data, bwd_share, _ = source_times(profile)
        compute, bwd_share = _plain_step(profile, compute, bwd_share)
        flops = profile.model.flops.per_sample if profile.model.flops and profile.model.flops.per_sample else None
        achieved = flops * b / compute / 1e12 if flops and compute > 0 else None
        world = profile.hardware.world_size or profile.hardware.devices * profile.hardware.nodes
        prepared = prepare(profile, gpu, compute)
        return cls(gpu, b, world, compute, data, bwd_share, flops, achieved, compute > 0, prepared)


@dataclass(frozen=True)
class TypeBasis:
    """Per-type quantities of the fleet model."""

    name: str
    gpu: str
    per_sample_s: float
    input_per_sample_s: float
    intra_s: float  # intra-node all-reduce of one instance (0 for single-GPU types)
    intra_lat_s: float  # its latency part (2 (g-1) hops); the rest is the bandwidth term
    intra_kind: str  # the intra-node link ("" for single-GPU types)
    intra_gbps: float  # its effective bandwidth, GB/s (inf for single-GPU types: nothing crosses it)
    intra_latency_s: float
    optimizer_s: float  # the optimizer step of the whole model on one GPU, once per optimizer step
    step_floor_s: float  # host seconds per micro-step, whatever the batch (framework + kernel launches; step_floor())
    grad_pass_s: float  # one pass over the gradients in GPU memory (bytes / bandwidth): DDP's bucket copies cost this
    s_per_byte: float  # one pass over one byte of GPU memory (1 / bandwidth; 0 when the bandwidth is unknown)
    contention_bound: float  # the share of the GPU's SMs NCCL's kernels can hold (predictor.model.scaling)
    inter: Link  # the profile's measured link when it was measured on this very type, else the catalog's
    plain_inter: Link  # the catalog's link (mixed fleets never use a measurement of one type)
    kind: str  # the kind of prediction (its model error)
    model_error: float
    sharded_error: float  # the kind's width on whole sharded multi-GPU steps (NaN: not calibrated there)
    gpus: int
    gpu_memory_gib: float
    compute_share: float | None  # compute-bound share of the step, when known (for the bottleneck in words)
    notes: tuple[str, ...]
    link_note: str  # how the measured inter-node link is used (fleets of this one type only); "" when it is not
    extrapolation: tuple[str, ...]
    # gloo (a CPU lab): collectives called without async_op block the training thread, and gloo's reduce-scatter
    # is an all-reduce; nccl: they run on their own streams, overlapping compute
    blocking_collectives: bool = False


def _source_gpu(profile: Profile, catalog: Catalog) -> GPU | None:
    key = profile.hardware.gpu
    if key is None:
        return None
    try:
        return catalog.gpu(key)
    except UnknownNameError as exc:
        advice = "" if CATALOG_EXTRA in str(exc) else f" Add the GPU's specs in {CATALOG_EXTRA}."  # said once
        raise PredictionError(f"The profile's GPU {key!r} has no specs in the catalog: {exc}{advice}") from None


def source_times(profile: Profile) -> tuple[float, float, float, float]:
    """(compute s, input s, backward share of compute, exposed comm s) of one profiled step.

    A capture-only profile (``ops`` present, no step timed) gives (0, 0, 2/3, 0): its time comes from the operator
    table alone.
    """
    t = profile.timing
    step = t.step_time_s.p50
    if not step > 0:
        if profile.ops is not None:
            return 0.0, 0.0, _ops_backward_share(profile), 0.0
        raise PredictionError(
            f"The profile's timing.step_time_s.p50 is {step!r}: no step was timed, so there is nothing to scale. "
            "Profile more steps (SriftyCallback(profile_steps=...)), give the measured step time, or capture the "
            "operator table (srifty capture) so the time can be predicted from it."
        )
    exposed = 0.0
    comm = profile.communication
    if comm is not None and comm.exposed_s is not None:
        exposed = comm.exposed_s.p50
    data, bwd_share = 0.0, 2 / 3
    if t.phases_s and all(p in t.phases_s for p in ("data", "forward", "backward", "optimizer")):
        data = t.phases_s["data"].p50
        fwd, bwd, opt = (t.phases_s[p].p50 for p in ("forward", "backward", "optimizer"))
        bwd_share = max(0.0, bwd - exposed) / max(1e-12, fwd + max(0.0, bwd - exposed) + opt)
    compute = max(step - data - exposed, step * 0.05)
    return compute, data, bwd_share, exposed


def _plain_step(profile: Profile, compute: float, bwd_share: float) -> tuple[float, float]:
    """A step measured under activation checkpointing (``profile.layout`` ends in ``+ac``) back to a plain step: its
    backward recomputed the blocks' forward, the forward share of the step times the blocks' share of the
    parameters (what :func:`predictor.model.fleets.recompute_share` adds back for a layout with +ac). FSDP's
    collectives are already out of ``compute`` where the profile measured them as exposed communication."""
    try:
        checkpointed = bool(profile.layout) and parse(str(profile.layout)).activation_checkpointing
    except ConfigError:
        checkpointed = False
    if not checkpointed or compute <= 0:
        return compute, bwd_share
    st = profile.model.structure
    blocks = 1.0
    if st is not None and st.blocks and st.block_parameters:
        blocks = min(1.0, st.blocks * st.block_parameters / profile.model.parameters)
    # measured: forward f, backward b + r with r = f x blocks; the plain step is f + b
    forward = 1.0 - bwd_share
    extra = forward * blocks
    plain = 1.0 - extra
    return compute * plain, max(0.0, bwd_share - extra) / plain


def _ops_backward_share(profile: Profile) -> float:
    ops = profile.ops.ops if profile.ops is not None else ()
    total = sum(o.count * o.flops for o in ops)
    backward = sum(o.count * o.flops for o in ops if o.phase == "backward")
    return backward / total if total > 0 else 2 / 3


def step_floor(profile: Profile, src: Source, kind: str) -> float:
    """Seconds per micro-step that a GPU cannot take away, whatever the batch: the host runs the framework's Python
    (measured: :func:`framework_s`), runs Lightning's own step (``LIGHTNING_STEP_S``) and launches every kernel of the
    step (``HOST_S_PER_KERNEL`` each, counted from the operator table) before the GPU can finish. Without either,
    the FLOPs-only path keeps ``MIN_GPU_STEP_S``."""
    if src.ops is not None:
        return src.ops.host_s
    framework = framework_s(profile)
    if framework is None:
        return MIN_GPU_STEP_S if kind == "from_cpu" else 0.0
    return framework


def grad_bytes(profile: Profile) -> float:
    """Bytes DDP all-reduces per step: the measured gradient bytes, else 4 per trainable parameter."""
    m = profile.model
    trainable = m.parameters if m.trainable_parameters is None else min(m.trainable_parameters, m.parameters)
    return float(m.gradient_bytes if m.gradient_bytes is not None else trainable * 4)


def bucket_sizes(profile: Profile) -> Buckets:
    """The gradient buckets in the order they become ready: measured when the profile has them, else DDP's."""
    comm = profile.communication
    if comm is not None and comm.bucket_detail:
        return [(float(b.bytes), 1) for b in sorted(comm.bucket_detail, key=lambda b: b.index)]
    return ddp_buckets(grad_bytes(profile))


def measured_link(profile: Profile, instance_type: str, crossing: float) -> Link | None:
    """The inter-node link measured by the profile, when it was measured across nodes of this very type: its rate,
    crossing nodes as the catalog's link of the type does (``crossing``)."""
    comm = profile.communication
    if not (
        profile.hardware.nodes > 1
        and profile.hardware.instance_type == instance_type
        and comm is not None
        and comm.bucket_detail
        and (comm.world_size or 1) > 1
    ):
        return None
    seconds = [b.allreduce_s.p50 for b in comm.bucket_detail]
    nodes = profile.hardware.nodes
    return calibrate([b.bytes for b in comm.bucket_detail], seconds, comm.world_size or 2, nodes, crossing)


def target_gpu(it: InstanceType, catalog: Catalog) -> GPU:
    if not it.cuda:
        raise PredictionError(
            f"{it.name} has {it.accelerator} ({it.accelerator_kind}), not a CUDA GPU: a CUDA PyTorch job cannot run "
            "on it."
        )
    try:
        return catalog.gpu(it.gpu or "")
    except UnknownNameError:
        raise PredictionError(
            f"{it.name}'s GPU {it.gpu!r} has no specs in the catalog. Add them in {CATALOG_EXTRA}."
        ) from None


def type_basis(
    profile: Profile,
    src: Source,
    it: InstanceType,
    catalog: Catalog,
    network: NetworkModel,
    calibration: Mapping[str, float] | None = None,
) -> TypeBasis:
    """Everything about ``it`` that does not depend on the fleet it is part of."""
    dst = target_gpu(it, catalog)
    notes: list[str] = []
    extrapolation: list[str] = []
    per_sample, share, kind, opt_share, reading_sd = _per_sample(profile, src, dst, notes, extrapolation)
    factor = (calibration or {}).get(dst.key)
    if factor:
        per_sample /= factor
        notes.append(f"{dst.key}: calibrated x{factor:.2f} from observed runs of this model")
    # the optimizer step runs once per optimizer step (not per sample or micro-step), on the rank's shard
    optimizer = per_sample * src.per_device_batch * opt_share
    per_sample *= 1.0 - opt_share
    cpu_ratio = _cpu_ratio(profile, it)
    intra = allreduce_time(grad_bytes(profile), [(it, 1)], catalog.gpus, net=network).seconds
    link = intra_node_link(it, catalog.gpus, network)
    plain, measured, link_note = _inter_links(profile, it, catalog, network)
    _framework_note(profile, notes)
    return TypeBasis(
        name=it.name,
        gpu=dst.key,
        per_sample_s=per_sample,
        optimizer_s=optimizer,
        step_floor_s=step_floor(profile, src, kind),
        input_per_sample_s=src.data_s / src.per_device_batch * cpu_ratio,
        intra_s=intra,
        intra_lat_s=float(ring_latency(ALL_REDUCE, it.gpus, link.latency_s)) if link is not None else 0.0,
        intra_kind=link.kind if link is not None else "",
        intra_gbps=link.gbps if link is not None else math.inf,
        intra_latency_s=link.latency_s if link is not None else 0.0,
        grad_pass_s=grad_bytes(profile) / (dst.memory_bw_gbps * 1e9) if dst.memory_bw_gbps else 0.0,
        s_per_byte=1.0 / (dst.memory_bw_gbps * 1e9) if dst.memory_bw_gbps else 0.0,
        contention_bound=contention_bound(dst.sms, it.process_group_backend == "gloo"),
        inter=measured or plain,
        plain_inter=plain,
        kind=kind,
        model_error=math.hypot(model_error(kind), reading_sd),
        sharded_error=sharded_error(kind, dst.key),
        gpus=it.gpus,
        gpu_memory_gib=it.gpu_memory_gib,
        compute_share=share,
        notes=tuple(notes),
        link_note=link_note,
        extrapolation=tuple(extrapolation),
        blocking_collectives=it.process_group_backend == "gloo",
    )


def _inter_links(
    profile: Profile, it: InstanceType, catalog: Catalog, network: NetworkModel
) -> tuple[Link, Link | None, str]:
    """``it``'s inter-node link from the catalog, the one the profile measured across nodes of it (None when it did
    not), and the words for the measured one."""
    plain = inter_node_link(it, network, catalog.gpus)
    measured = measured_link(profile, it.name, plain.crossing)
    if measured is None:
        return plain, None, ""
    if catalog.transport == "tcp" and plain.kind == "tcp" and measured.gbps > network.socket_ceiling_gbps:
        # faster than NCCL's sockets move a node: measured on another transport (the type's EFA), not this one's
        return (
            plain,
            None,
            (
                f"the profile's all-reduce across {it.name} nodes ({measured.gbps:.2f} GB/s) is faster than NCCL's "
                f"sockets move a node ({network.socket_ceiling_gbps:g} GB/s): it ran over EFA, so transport tcp prices "
                "the sockets"
            ),
        )
    # a window of the run measured the burst at most: the baseline still holds a long run
    measured = dataclasses.replace(measured, sustained_gbps=plain.sustained_gbps)
    words = f"inter-node all-reduce calibrated from the profile's measured buckets on {it.name}: "
    return plain, measured, f"{words}{measured.gbps:.2f} GB/s effective"


def _cpu_ratio(profile: Profile, it: InstanceType) -> float:
    """The input pipeline's scale on ``it``: the cores a rank's loader can use on the profiled host over those on
    ``it`` (1 when the profile does not say its CPUs). A loader uses at most its ``num_workers`` + 1 processes
    (``batch.loader_workers``): vCPUs beyond those load nothing faster. Where the profile does not say its workers, no
    more cores are credited than the profiled host gave a GPU (fewer still slow it): a ratio of vCPUs alone made a
    loader of 4 workers 12x faster on a type of 48 vCPUs a GPU (a review)."""
    cpus_src = (profile.hardware.cpu_count or 0) / max(1, profile.hardware.devices)
    if not cpus_src:
        return 1.0
    cpus_dst = it.vcpus / it.gpus
    workers = profile.batch.loader_workers
    if workers is None:
        return max(cpus_src / cpus_dst, 1.0)
    used = workers + 1.0
    return min(cpus_src, used) / min(cpus_dst, used)


def _framework_note(profile: Profile, notes: list[str]) -> None:
    """Says the host's own time per micro-step when the profile has one (a floor under every micro-step)."""
    framework = framework_s(profile)
    if framework:  # the rest of a small step's time, which the operator note's GPU work and launches do not show
        notes.append(
            f"the host's own time per micro-step, {framework * 1e3:.3g} ms as profiled (the step less its data, "
            "forward, backward and optimizer phases: Lightning's loop, hooks, logging), plus launching the step's "
            "kernels, bounds every micro-step from below, whatever the GPU"
        )


def measured_optimizer_share(profile: Profile) -> float:
    """The optimizer phase's share of forward + backward + optimizer as measured (0 when the phases are not)."""
    phases = profile.timing.phases_s or {}
    if not all(p in phases for p in ("forward", "backward", "optimizer")):
        return 0.0
    total = sum(phases[p].p50 for p in ("forward", "backward", "optimizer"))
    return phases["optimizer"].p50 / total if total > 0 else 0.0


def tf32_words(src: GPU, dst: GPU, matmul: str | None, kind: str = "cross-flops") -> str:
    """What a prediction without an operator table across the TF32 line (:func:`predictor.model.compute.crosses_tf32`)
    cannot know, its width (``kind``'s TF32 regime), and how to do better."""
    tensor, cuda = (dst, src) if runs_tf32(dst) else (src, dst)
    if matmul in ("high", "medium"):
        which, width = "convolutions and matmuls", "held-out width"
    else:
        said = f"under float32_matmul_precision {matmul!r}" if matmul else "by PyTorch's default ('highest')"
        which = f"convolutions (cuDNN's default; its matmuls stay FP32 {said})"
        # every published FP32 run the width was calibrated on ran its matmuls on TF32 too
        width = "held-out width, calibrated on runs whose matmuls ran TF32 too (none at 'highest' is in the data)"
    factor = math.exp(Z80 * model_error(f"{kind}-tf32"))
    unknown = "the profile's FLOPs do not say" if kind == "cross-flops" else "a profile without FLOPs does not say"
    return (
        f"FP32 across the TF32 line: the {tensor.key} runs {which} on TF32 tensor cores, the {cuda.key} on its "
        "FP32 CUDA cores, at shares of their peaks that differ by operator (ResNet-50's TF32 convolutions 0.34 of the "
        f"H100's TF32 peak, large TF32 GEMMs 0.64-0.81); {unknown} which operators the step runs, "
        f"so this time carries that regime's {width} (x{factor:.2f} either way at 80%). An operator table "
        "prices each operator on its own pipe: SriftyCallback records one by default (capture_ops=True), or `srifty "
        "capture` builds one without a GPU"
    )


def _per_sample(profile: Profile, src: Source, dst: GPU, notes: list[str], extrapolation: list[str]) -> ComputeEstimate:
    """The compute per sample on ``dst``, its compute-bound share when known, the kind of prediction, the optimizer
    step's share of that compute."""
    per_sample_src = src.compute_s / src.per_device_batch
    if profile.ops is not None:
        result = ops_compute(profile, src, dst, notes, extrapolation)
        if result is not None:
            return result
    opt_share = measured_optimizer_share(profile)
    if not src.measured:
        raise PredictionError(
            "The profile has no timed step and its operator table could not be used (see above): nothing to "
            "predict from. Profile a real run with SriftyCallback()."
        )
    precision = profile.model.precision
    matmul = profile.model.float32_matmul_precision
    if src.gpu is None:
        if src.flops is None:
            raise PredictionError(
                "The profile was measured without a GPU and has neither an operator table nor FLOPs per sample, so "
                "its time cannot be scaled to a GPU (the profile's notes say why: a run that ended during warm-up "
                "never reached the step they are captured on). Profile on a GPU, or run past SriftyCallback's "
                "warm-up with its default capture_ops=True and count_flops=True, or write a profile with `srifty "
                "capture`."
            )
        peak = peak_tflops(dst, precision, matmul)
        if not peak:
            raise PredictionError(f"{dst.key} has no peak FLOPS for {precision}: add them in {CATALOG_EXTRA}.")
        notes.append(
            f"GPU compute from FLOPs at {CPU_TO_GPU_UTILISATION:.0%} of peak, at least "
            f"{MIN_GPU_STEP_S * 1e3:.0f} ms per step (profile measured on CPU)"
        )
        extrapolation.append("profiled on CPU: GPU compute time estimated from FLOPs alone")
        return ComputeEstimate(src.flops / (peak * 1e12 * CPU_TO_GPU_UTILISATION), 1.0, "from_cpu", 0.0)
    try:
        scale = compute_ratio(src.gpu, dst, precision, matmul, src.achieved_tflops)
    except ValueError as exc:
        raise PredictionError(f"{exc}: add the GPUs' specs in {CATALOG_EXTRA}.") from None
    share = scale.compute_share if src.achieved_tflops is not None else None
    if scale.basis == "same GPU":
        return ComputeEstimate(per_sample_src, share, "same", opt_share)
    ratio, kind, note = _cross_gpu(src, src.gpu, dst, precision, matmul, scale.ratio, extrapolation)
    notes.append(f"{src.gpu.key} -> {dst.key}: time x{ratio:.2f} ({scale.basis}; {note})")
    return ComputeEstimate(per_sample_src * ratio, share, kind, opt_share)


def _cross_gpu(
    src: Source, src_gpu: GPU, dst: GPU, precision: str, matmul: str | None, ratio: float, extrapolation: list[str]
) -> tuple[float, str, str]:
    """(time ratio, kind of prediction, what it rests on) of a measured step scaled to another GPU without an
    operator table: the split from the profile's FLOPs, else the analytic split with the learned correction where
    it covers both GPUs; each kind has its own regime across the TF32 line (:func:`tf32_kind`), said so."""
    ratio, path, note = _cross_path(src, src_gpu, dst, precision, matmul, ratio, extrapolation)
    kind = tf32_kind(path, src_gpu, dst, precision)
    if kind != path:
        extrapolation.append(tf32_words(src_gpu, dst, matmul, path))
    return ratio, kind, note


def _cross_path(
    src: Source, src_gpu: GPU, dst: GPU, precision: str, matmul: str | None, ratio: float, extrapolation: list[str]
) -> tuple[float, str, str]:
    correction = load_correction()
    if src.achieved_tflops is not None:  # FLOPs give the split directly; the correction was learned for the neutral
        return ratio, "cross-flops", "split from the profile's FLOPs, no learned correction"
    # a GPU the correction has not seen but whose die it has (the H200: the H100's) takes the twin pair's correction
    seen = [g for g in gpu_table().values() if correction.covers(g.key)]
    pair = [g if correction.covers(g.key) else (die_twin(g, seen) or g) for g in (src_gpu, dst)]
    if not correction.covers(pair[0].key, pair[1].key):
        unseen = [k for k in (src_gpu.key, dst.key) if not correction.covers(k)]
        extrapolation.append(f"{', '.join(unseen)} never measured in the validation data: analytic scaling only")
        return ratio, "cross", f"no learned correction: {', '.join(unseen)} not in its training data"
    try:
        factor = math.exp(correction.predict_one(features(pair[0], pair[1], precision, matmul, 1.0)))
    except ValueError:
        return ratio, "cross", "no learned correction (a spec is missing)"
    stand_ins = [f"{g.key} as {t.key} (its die)" for g, t in zip((src_gpu, dst), pair, strict=True) if g.key != t.key]
    if stand_ins:
        extrapolation.append(f"{', '.join(stand_ins)}: the learned correction of its twin, never measured itself")
        return ratio * factor, "cross-corrected", f"learned correction x{factor:.2f}, {', '.join(stand_ins)}"
    return ratio * factor, "cross-corrected", f"learned correction x{factor:.2f}"
