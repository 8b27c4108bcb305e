"""``predict(profile, fleet)``: iteration time, throughput, breakdown, bottleneck and memory fit of a fleet.

Step time on the fleet = the slowest group's (compute + input pipeline) + the all-reduce time backward does not
hide. Compute scales from the profiled GPU by :mod:`predictor.perf.compute`; all-reduce by
:mod:`predictor.perf.network`; memory by :mod:`predictor.perf.memory`. Intervals combine the profile's measured
step-time CV with the model's own error (``MODEL_ERROR``, provisional until the validation of issue #4 sets them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from predictor.catalog.catalog import Catalog
from predictor.catalog.gpus import GPU
from predictor.exceptions import PredictionError, UnknownNameError
from predictor.fleet import Fleet, parse_fleet
from predictor.perf.compute import compute_ratio, peak_tflops
from predictor.perf.correction import features, load_correction
from predictor.perf.memory import estimate_memory
from predictor.perf.network import (
    DEFAULT_NETWORK,
    NetworkModel,
    allreduce_time,
    calibrate,
    ddp_bucket_sizes,
    exposed_time,
)
from predictor.profile import Profile

Scaling = Literal["weak", "strong"]
Z80 = 1.2816  # p10/p90 of a normal
# relative sd of the model by kind of prediction. "scaling": the log-residual sd of the 182 same-GPU scaling cases of
# `srifty eval`; "cross": the analytic split's log-residual sd over the 980 cross-GPU cases (used for GPUs the learned
# correction never saw; with the correction, its own residual sd replaces it); "cross-flops": the same for the split
# computed from the profile's FLOPs (the 272 cases of the models with known FLOPs). All measured in-sample
# (BENCHMARKS.md). "same" (one GPU, as profiled) and "from_cpu" are judgement, not measured.
MODEL_ERROR = {"same": 0.05, "scaling": 0.12, "cross": 0.32, "cross-flops": 0.15, "from_cpu": 0.5}
CPU_TO_GPU_UTILISATION = 0.35  # assumed share of the GPU's peak a step reaches when only FLOPs are known
# eager PyTorch + Lightning spend a few ms per step on the host (kernel launches, hooks, optimizer loop) whatever the
# GPU: the FLOPs-only path (CPU profile) cannot predict less than this per step (judgement, not measured here)
MIN_GPU_STEP_S = 0.003


@dataclass(frozen=True)
class GroupPrediction:
    instance_type: str
    count: int
    gpu: str | None
    per_device_batch: float
    compute_s: float
    input_s: float
    memory_gib: float
    fits_memory: bool
    memory_margin: float


@dataclass(frozen=True)
class Prediction:
    """What one fleet is predicted to do."""

    fleet: str
    iteration_time_s: float
    throughput_samples_s: float
    interval: dict[str, tuple[float, float]]
    breakdown: dict[str, float]
    bottleneck: str
    fits_memory: bool
    groups: tuple[GroupPrediction, ...]
    global_batch: float
    scaling: str
    batch_split: str
    allreduce_limiting: str
    assumptions: tuple[str, ...] = field(default=())
    extrapolation: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["interval"] = {k: list(v) for k, v in self.interval.items()}
        out["assumptions"], out["extrapolation"] = list(self.assumptions), list(self.extrapolation)
        return out


def _source_gpu(profile: Profile, catalog: Catalog) -> GPU | None:
    key = profile.hardware.gpu
    if key is None:
        return None
    try:
        return catalog.gpu(key)
    except UnknownNameError as exc:
        raise PredictionError(
            f"The profile's GPU {key!r} has no specs in the catalog: {exc} Add the GPU's specs with --catalog-extra."
        ) from None


def _source_times(profile: Profile) -> tuple[float, float, float, float]:
    """(compute s, input s, backward share of compute, exposed comm s) of one profiled step."""
    t = profile.timing
    step = t.step_time_s.p50
    if not step > 0:
        raise PredictionError(
            f"The profile's timing.step_time_s.p50 is {step!r}: no step was timed, so there is nothing to scale. "
            "Profile more steps (SriftyCallback(profile_steps=...)) or give the measured step time."
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


def predict(
    profile: Profile,
    fleet: Fleet | str | Iterable[tuple[str, int]],
    *,
    catalog: Catalog | None = None,
    scaling: Scaling = "weak",
    network: NetworkModel = DEFAULT_NETWORK,
    calibration: Mapping[str, float] | None = None,
) -> Prediction:
    """Predict one fleet from a profile (``network``: the link constants, see :class:`NetworkModel`;
    ``calibration``: measured/predicted throughput factors by GPU key, from observations of this model).

    Raises:
        PredictionError: the profile cannot be scaled to this fleet (e.g. CPU profile without FLOPs).
        UnknownNameError, ConfigError: a bad fleet.
    """
    if scaling not in ("weak", "strong"):
        raise PredictionError(
            f"The 'scaling' parameter of predict() must be one of {{'weak', 'strong'}}. Got {scaling!r}."
        )
    catalog = catalog or Catalog.load()
    if not isinstance(fleet, Fleet):
        fleet = parse_fleet(fleet, catalog)
    assumptions: list[str] = []
    extrapolation: list[str] = []
    src = _source_gpu(profile, catalog)
    b_src = profile.batch.per_device
    src_world = profile.hardware.world_size or profile.hardware.devices * profile.hardware.nodes
    compute_src, data_src, bwd_share, _ = _source_times(profile)
    per_sample_src = compute_src / b_src
    precision = profile.model.precision
    flops = profile.model.flops.per_sample if profile.model.flops and profile.model.flops.per_sample else None
    achieved = flops * b_src / compute_src / 1e12 if flops else None

    kinds: set[str] = set()
    per_sample: list[float] = []
    shares: list[float | None] = []
    for group in fleet.groups:
        it = group.instance
        if not it.cuda:
            raise PredictionError(
                f"{it.name} has {it.accelerator} ({it.accelerator_kind}), not a CUDA GPU: a CUDA "
                "PyTorch job cannot run on it."
            )
        try:
            dst = catalog.gpu(it.gpu or "")
        except UnknownNameError:
            raise PredictionError(
                f"{it.name}'s GPU {it.gpu!r} has no specs in the catalog. Add them with "
                "--catalog-extra (docs/catalog.md)."
            ) from None
        ps, share = _scaled_per_sample(
            per_sample_src, src, dst, precision, profile, flops, achieved, assumptions, kinds, extrapolation
        )
        factor = (calibration or {}).get(dst.key)
        if factor:
            ps /= factor
            assumptions.append(f"{dst.key}: calibrated x{factor:.2f} from observed runs of this model")
        per_sample.append(ps)
        shares.append(share)
    if fleet.gpus > 1:
        kinds.add("scaling")
    split, global_batch, split_note = _split(fleet, per_sample, b_src, src_world, profile, scaling)
    assumptions.append(split_note)

    groups: list[GroupPrediction] = []
    for group, ps, b in zip(fleet.groups, per_sample, split):
        it = group.instance
        cpus_src = (profile.hardware.cpu_count or 0) / max(1, profile.hardware.devices)
        cpus_dst = it.vcpus / it.gpus
        input_s = data_src * (b / b_src) * (cpus_src / cpus_dst if cpus_src else 1.0)
        mem = estimate_memory(profile, b, it.gpu_memory_gib)
        groups.append(
            GroupPrediction(
                it.name, group.count, it.gpu, b, ps * b, input_s, mem.bytes_per_gpu / 2**30, mem.fits, mem.margin
            )
        )
    if not profile.hardware.cpu_count:
        assumptions.append("input pipeline time kept as profiled (no CPU count in the profile)")
    assumptions.append("memory: " + mem.basis)  # the same basis for every group

    ar = _allreduce(profile, fleet, catalog, assumptions, network)
    slowest = max(groups, key=lambda g: g.compute_s + g.input_s)
    bwd_time = min(g.compute_s for g in groups) * bwd_share
    exposed = exposed_time(ar.seconds, bwd_time, _bucket_sizes(profile))
    step = slowest.compute_s + slowest.input_s + exposed
    throughput = global_batch / step

    cv = profile.timing.step_time_s.cv or 0.0
    model_err = max(_model_error(k) for k in kinds) if kinds else MODEL_ERROR["same"]
    if ar.seconds > 0:
        model_err = math.hypot(model_err, 0.1 * exposed / step)
    sd = math.hypot(cv, model_err)
    lo, hi = step * math.exp(-Z80 * sd), step * math.exp(Z80 * sd)
    if fleet.gpus > 8 * max(1, src_world):
        extrapolation.append(
            f"{fleet.gpus} GPUs from a profile of {src_world}: all-reduce and stragglers at this "
            "scale are modelled, not measured"
        )
    if "from_cpu" in kinds:
        extrapolation.append("profiled on CPU: GPU compute time estimated from FLOPs alone")

    return Prediction(
        fleet=str(fleet),
        iteration_time_s=step,
        throughput_samples_s=throughput,
        interval={"iteration_time_s": (lo, hi), "throughput_samples_s": (global_batch / hi, global_batch / lo)},
        breakdown={
            "compute_s": slowest.compute_s,
            "input_s": slowest.input_s,
            "allreduce_s": ar.seconds,
            "exposed_comm_s": exposed,
        },
        bottleneck=_bottleneck(groups, slowest, exposed, step, ar.limiting, shares[groups.index(slowest)]),
        fits_memory=all(g.fits_memory for g in groups),
        groups=tuple(groups),
        global_batch=global_batch,
        scaling=scaling,
        batch_split=split_note,
        allreduce_limiting=ar.limiting,
        assumptions=tuple(dict.fromkeys(assumptions)),
        extrapolation=tuple(extrapolation),
    )


def _scaled_per_sample(
    per_sample_src: float,
    src: GPU | None,
    dst: GPU,
    precision: str,
    profile: Profile,
    flops: float | None,
    achieved: float | None,
    assumptions: list[str],
    kinds: set[str],
    extrapolation: list[str],
) -> tuple[float, float | None]:
    """Seconds per sample on ``dst`` and the compute-bound share used (None when unknown)."""
    matmul = profile.model.float32_matmul_precision
    if src is None:
        if flops is None:
            raise PredictionError(
                "The profile was measured without a GPU and has no FLOPs per sample, so its time "
                "cannot be scaled to a GPU. Profile on a GPU, or keep count_flops=True so the "
                "profile records model.flops."
            )
        peak = peak_tflops(dst, precision, matmul)
        if not peak:
            raise PredictionError(f"{dst.key} has no peak FLOPS for {precision}: add them with --catalog-extra.")
        kinds.add("from_cpu")
        assumptions.append(
            f"GPU compute from FLOPs at {CPU_TO_GPU_UTILISATION:.0%} of peak, at least "
            f"{MIN_GPU_STEP_S * 1e3:.0f} ms per step (profile measured on CPU)"
        )
        per_sample = flops / (peak * 1e12 * CPU_TO_GPU_UTILISATION)
        return max(per_sample, MIN_GPU_STEP_S / profile.batch.per_device), 1.0
    try:
        scale = compute_ratio(src, dst, precision, matmul, achieved)
    except ValueError as exc:
        raise PredictionError(f"{exc}: add the GPUs' specs with --catalog-extra.") from None
    if scale.basis == "same GPU":
        kinds.add("same")
        return per_sample_src, (scale.compute_share if achieved is not None else None)
    ratio = scale.ratio
    correction = load_correction()
    if achieved is not None:  # FLOPs give the split directly; the correction was learned for the neutral split
        kinds.add("cross-flops")
        note = "split from the profile's FLOPs, no learned correction"
    elif not correction.covers(src.key, dst.key):
        unseen = [k for k in (src.key, dst.key) if not correction.covers(k)]
        note = f"no learned correction: {', '.join(unseen)} not in its training data"
        kinds.add("cross")
        extrapolation.append(f"{', '.join(unseen)} never measured in the validation data: analytic scaling only")
    else:
        try:
            factor = math.exp(correction.predict_one(features(src, dst, precision, matmul, 1.0)))
            ratio *= factor
            note = f"learned correction x{factor:.2f}"
            kinds.add("cross-corrected")
        except ValueError:
            note = "no learned correction (a spec is missing)"
            kinds.add("cross")
    assumptions.append(f"{src.key} -> {dst.key}: time x{ratio:.2f} ({scale.basis}; {note})")
    return per_sample_src * ratio, (scale.compute_share if achieved is not None else None)


def _model_error(kind: str) -> float:
    """Relative sd of the model for a kind of prediction ("cross-corrected": the learned correction's residuals)."""
    if kind == "cross-corrected":
        return load_correction().residual_sd_
    return MODEL_ERROR[kind]


def _split(
    fleet: Fleet, per_sample: list[float], b_src: int, src_world: int, profile: Profile, scaling: Scaling
) -> tuple[list[float], float, str]:
    ranks = fleet.gpus
    global_batch = float(b_src * ranks) if scaling == "weak" else float(profile.batch.global_batch or b_src * src_world)
    if not fleet.heterogeneous:
        b = global_batch / ranks
        return [b] * len(fleet.groups), global_batch, f"{scaling} scaling: {b:g} samples per GPU"
    speeds = [1 / p for p in per_sample]
    total = sum(s * g.gpus for s, g in zip(speeds, fleet.groups))
    split = [global_batch * s / total for s in speeds]
    text = ", ".join(f"{g.instance.name} {b:.1f}" for g, b in zip(fleet.groups, split))
    return split, global_batch, f"{scaling} scaling, per-GPU batch split in proportion to predicted speed: {text}"


def _grad_bytes(profile: Profile) -> float:
    return float(
        profile.model.gradient_bytes if profile.model.gradient_bytes is not None else profile.model.parameters * 4
    )


def _link_override(profile: Profile, instance_names: set[str], assumptions: list[str]) -> Any:
    """The inter-node link measured by the profile, when it was measured across nodes of this very type."""
    comm = profile.communication
    same_link = (
        profile.hardware.nodes > 1
        and profile.hardware.instance_type is not None
        and instance_names == {profile.hardware.instance_type}
    )
    if not (same_link and comm is not None and comm.bucket_detail and (comm.world_size or 1) > 1):
        return None
    override = calibrate(
        [b.bytes for b in comm.bucket_detail], [b.allreduce_s.p50 for b in comm.bucket_detail], comm.world_size or 2
    )
    if override is not None:
        assumptions.append(
            f"inter-node all-reduce calibrated from the profile's measured buckets on "
            f"{profile.hardware.instance_type}: {override.gbps:.2f} GB/s effective"
        )
    return override


def _bucket_sizes(profile: Profile) -> list[float]:
    comm = profile.communication
    if comm is not None and comm.bucket_detail:
        return [float(b.bytes) for b in sorted(comm.bucket_detail, key=lambda b: b.index)]
    return ddp_bucket_sizes(_grad_bytes(profile))


def _allreduce(profile: Profile, fleet: Fleet, catalog: Catalog, assumptions: list[str], network: NetworkModel) -> Any:
    override = (
        _link_override(profile, {g.instance.name for g in fleet.groups}, assumptions) if fleet.nodes > 1 else None
    )
    groups: list[tuple[Any, int]] = [(g.instance, g.count) for g in fleet.groups]
    return allreduce_time(_grad_bytes(profile), groups, catalog.gpus, override, network)


def _bottleneck(
    groups: list[GroupPrediction],
    slowest: GroupPrediction,
    exposed: float,
    step: float,
    limiting: str,
    compute_share: float | None,
) -> str:
    """The one thing that limits the step, in words."""
    fastest = min(g.compute_s + g.input_s for g in groups)
    if len(groups) > 1 and slowest.compute_s + slowest.input_s > 1.15 * fastest:
        return f"straggler group ({slowest.instance_type})"
    if exposed > 0.3 * step:
        return "network" if limiting.startswith("network") else f"GPU interconnect ({limiting})"
    if slowest.input_s > slowest.compute_s:
        return "input pipeline"
    if compute_share is not None and compute_share < 0.5:
        return "memory bandwidth"
    return "compute"
