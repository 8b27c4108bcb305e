"""The plan (``srifty.plan/v1``): ranked fleets for a profile under constraints, the choice and why.

It crosses a boundary (written by ``srifty recommend`` or the callback, read by ``srifty terraform`` and the
migration), so it is a versioned document like the profile.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

from predictor.documents.atomic import atomic_write_json, read_json_document
from predictor.documents.profile import MAX_SAMPLES_PER_STEP, Software
from predictor.documents.schema import doc_field, from_dict, json_schema, to_dict
from predictor.exceptions import ConfigError, ProfileSchemaError

# a log-normal's 99th percentile over its 90th, in log distance from the median: z(0.99) / z(0.90)
LIFE_Z_RATIO: Final = 2.3263 / 1.2816

PLAN_SCHEMA: Final = "srifty.plan/v1"
Risk = Literal["none", "low", "medium", "high"]  # a ranked fleet's spot risk and migration effort
PerformanceRisk = Literal["low", "medium", "high"]


# the request vocabulary a plan records, declared once (predictor.ranking.constraints' Objective and Market enums,
# the CLI's choices and the service's schema read these; tests/recommendation/test_constraints.py holds the enums to
# them)
ObjectiveName = Literal["cost", "time", "cost_per_sample"]
DEPRECATED_OBJECTIVES = ("cost_per_sample",)  # ranks exactly as cost: read in old plans, never asked
OBJECTIVES: tuple[str, ...] = tuple(o for o in get_args(ObjectiveName) if o not in DEPRECATED_OBJECTIVES)
FleetMarket = Literal["on-demand", "spot", "mixed"]  # the market one fleet is bought in
CheckpointSource = Literal["given", "measured", "estimated"]  # where a plan's checkpoint cost comes from
MarketName = Literal["on-demand", "spot", "mixed", "any"]  # what a request asks: one, or any (each of the three)
MARKETS: tuple[str, ...] = get_args(MarketName)
# how a multi-node fleet's nodes meet: "auto", EFA on the types that have it (what srifty terraform attaches) and TCP
# sockets on the others; "tcp", sockets on every type (a cluster without EFA: the user's own VPC or launch template,
# Kubernetes without the EFA device plugin)
TransportName = Literal["auto", "tcp"]
TRANSPORTS: tuple[str, ...] = get_args(TransportName)


@dataclass(frozen=True)
class PlanGroup:
    """Instances of one type in a ranked fleet."""

    instance_type: str = doc_field("EC2 (or user-defined) instance type")
    count: int = doc_field("instances of this type", min=1)
    gpus_per_instance: int = doc_field("GPUs per instance (ranks per node)", min=1)
    gpu: str = doc_field("canonical GPU key")
    on_demand: int = doc_field("instances of this type bought on demand", min=0)
    spot: int = doc_field("instances of this type bought on spot", min=0)
    usd_per_hour: float = doc_field("price of this group per hour", min=0)
    per_device_batch: float = doc_field(
        "samples per GPU per optimizer step, the group's mean (micro-batch x accumulation; the speed-proportional "
        "split in mixes)",
        min=0,
    )
    throughput_samples_s: float = doc_field(
        "samples per second this group contributes (its weighted capacity in an Auto Scaling group)", exclusive_min=0
    )
    micro_batches: tuple[int, ...] | None = doc_field(
        "the batch each of the group's GPUs takes per micro-step, in rank order (they differ by one sample at "
        "most); with the other groups' they add up to global_batch / accumulate_grad_batches. Absent in plans made "
        "before it was recorded",
        default=None,
    )
    accumulate_grad_batches: int | None = doc_field(
        "micro-steps per optimizer step (Lightning's accumulate_grad_batches; the same in every group); absent: 1",
        default=None,
        min=1,
    )


@dataclass(frozen=True)
class PlanLayout:
    """A ranked fleet's parallel layout (:mod:`predictor.model.layout`) and the Lightning strategy that runs it."""

    name: str = doc_field(
        "the layout: ddp, fsdp:full_shard, fsdp:shard_grad_op, fsdp:hybrid_shard, pipeline:<stages>; +ac: "
        "activation checkpointing"
    )
    strategy: Literal["ddp", "fsdp", "pipeline"] = doc_field("how state and work are spread over the GPUs")
    sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard"] | None = doc_field(
        "fsdp's sharding (null for ddp and pipeline)", default=None
    )
    activation_checkpointing: bool = doc_field("each block keeps its input and recomputes the rest", default=False)
    pipeline_stages: int = doc_field("pipeline stages (1: no pipeline)", default=1, min=1)
    shard_group: int = doc_field("GPUs one copy of the sharded state is spread over (1: not sharded)", default=1, min=1)
    lightning_strategy: Literal["ddp", "fsdp", "pipeline"] = doc_field(
        "the Lightning strategy the job starts with (Trainer(strategy=...)): ddp or fsdp (pipeline: not launchable)",
        default="ddp",
    )
    lightning_args: dict[str, Any] | None = doc_field(
        "its keyword arguments, block classes by name (e.g. sharding_strategy, auto_wrap_policy, "
        "activation_checkpointing_policy, state_dict_type)",
        default=None,
    )
    launchable: bool = doc_field("srifty launch can start it", default=True)
    needs: str | None = doc_field("what running it would take, when srifty launch cannot start it", default=None)


def check_choice(plan: Plan, choice: int) -> None:
    """Refuse a ``choice`` (``--choice``) outside the plan's ranked fleets, naming the range.

    Raises:
        ConfigError: ``choice`` is not an index of ``plan.entries``.
    """
    if not 0 <= choice < len(plan.entries):
        raise ConfigError.between(
            "The plan has {count} ranked fleets: {choice} must be between 0 and {last}. Got {index}.",
            parameter="choice",
            value=choice,
            count=len(plan.entries),
            last=len(plan.entries) - 1,
            index=choice,
        )


def scaled_interval(total: float, fixed: float, lo: float, hi: float) -> tuple[float, float]:
    """The 80% interval of a run's time or cost, ``lo`` and ``hi`` the step time's interval over the step time: only
    the training part scales with it; what is fixed (the fleet's start-up, waited for and billed before the first
    step) is not uncertain with it, so the interval never goes below it. The interval contains ``total`` by
    construction: ``lo`` above 1 or ``hi`` below 1 is taken as 1, and the bounds are clamped to ``total`` (the sum
    ``fixed + (total - fixed)`` can round past it)."""
    fixed = min(max(fixed, 0.0), total)
    low, high = fixed + (total - fixed) * min(lo, 1.0), fixed + (total - fixed) * max(hi, 1.0)
    return min(low, total), max(high, total)


def _check_contains(name: str, interval: tuple[float, ...] | None, estimate: float) -> None:
    """An entry's 80% interval is ``[low, high]`` around its own estimate (a relative 1e-9 for rounding in a plan
    written as JSON): one that excludes the estimate is a defect of the interval, refused where it is read."""
    if interval is None:
        return
    slack = 1e-9 * max(abs(estimate), 1e-300)
    if len(interval) != 2 or not interval[0] - slack <= estimate <= interval[1] + slack:
        raise ProfileSchemaError(
            f"{name}: expected an interval [low, high] that contains the entry's own estimate {estimate:g}, got "
            f"{list(interval)}. Make the plan again with `srifty recommend --out plan.json`.",
            field=name,
            value=list(interval),
        )


def _check_batches(entry: Any) -> None:
    """The batches an entry hands the job are whole samples a step can hold: every micro-batch from 1 to
    :data:`~predictor.documents.profile.MAX_SAMPLES_PER_STEP`, the accumulation too, and the global batch they make
    no larger (``accumulate_grad_batches: 1e12`` or ``micro_batches: [1e9]`` were read, and the launched job
    "finished" having trained nothing: no dataset holds one such step)."""
    limit = MAX_SAMPLES_PER_STEP
    total = 0
    for k, g in enumerate(entry.groups):
        a = g.accumulate_grad_batches or 1
        if isinstance(a, bool) or not isinstance(a, int) or not 1 <= a <= limit:
            raise ProfileSchemaError(
                f"groups[{k}].accumulate_grad_batches: expected a whole number from 1 to {limit:,}, got {a!r}. "
                "Make the plan again with `srifty recommend --out plan.json`.",
                field=f"groups[{k}].accumulate_grad_batches",
                value=a,
            )
        for b in g.micro_batches or ():
            if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= limit:
                raise ProfileSchemaError(
                    f"groups[{k}].micro_batches: expected whole numbers of samples from 1 to {limit:,}, got {b!r}. "
                    "Make the plan again with `srifty recommend --out plan.json`.",
                    field=f"groups[{k}].micro_batches",
                    value=b,
                )
            total += b * a
    if total > limit or (entry.global_batch is not None and entry.global_batch > limit):
        raise ProfileSchemaError(
            f"global_batch: the entry's batches make {max(total, entry.global_batch or 0):,} samples per optimizer "
            f"step, more than {limit:,}: no dataset holds one such step. Make the plan again with `srifty recommend`.",
            field="global_batch",
            value=max(total, entry.global_batch or 0),
        )


@dataclass(frozen=True)
class PlanEntry:
    """One ranked fleet."""

    rank: int = doc_field("1 = best by the objective", min=1)
    fleet: str = doc_field("instance_type:count[,instance_type:count]")
    groups: tuple[PlanGroup, ...] = doc_field("the instance types of the fleet, in the order of the fleet string")
    gpus: int = doc_field("GPUs in all", min=1)
    nodes: int = doc_field("instances in all", min=1)
    region: str = doc_field("region of the price")
    market: FleetMarket = doc_field("capacity market; mixed: on-demand base + spot")
    spot_share: float = doc_field("share of the instances on spot", min=0, max=1)
    usd_per_hour: float = doc_field("price of the whole fleet per hour", min=0)
    iteration_time_s: float = doc_field(
        "predicted time of one optimizer step (its micro-steps and one all-reduce)", min=0
    )
    iteration_time_interval_s: tuple[float, ...] = doc_field("80% interval of the step time [p10, p90]")
    throughput_samples_s: float = doc_field("predicted samples per second", exclusive_min=0)
    time_h: float = doc_field(
        "wall time for the work at the predicted step time (the interval's median): start-up and checkpoints "
        "included, spot interruptions at their expected count",
        min=0,
    )
    cost_usd: float = doc_field(
        "cost of time_h (the median step time, spot interruptions at their expected count): per-second billing, "
        "60 s minimum per instance",
        min=0,
    )
    cost_interval_usd: tuple[float, ...] = doc_field(
        "80% interval of the cost from the step-time interval (the start-up's cost is fixed: not scaled with it)"
    )
    expected_interruptions: float = doc_field("expected spot interruptions over the run (0 on-demand)", min=0)
    interruption_overhead_s: float = doc_field(
        "expected time one interruption costs (a spot reclaim, or on demand a node's failure): re-provisioning, "
        "restart, checkpoint load, and the save on the two-minute notice where it fits, else the work lost since "
        "the last checkpoint",
        min=0,
    )
    risk: Risk = doc_field("spot risk label")
    performance_risk: PerformanceRisk = doc_field(
        "how uncertain the prediction is: low (80% interval within about +-13%), medium (+-32%), high"
    )
    migration_effort: Risk = doc_field(
        "none: the current fleet; low: same GPU, one node; medium: another GPU or several nodes; high: mixed GPUs"
    )
    memory_gib: float = doc_field("predicted memory per GPU (the fullest group)", min=0)
    pareto: bool = doc_field("on the time-cost Pareto front")
    checkpoint_interval_s: float | None = doc_field(
        "periodic checkpoint interval: Young-Daly's, from spot interruptions and node failures, and under a deadline, "
        "for a spot or mixed fleet whose save misses the spot notice, no longer than leaves the slack for the work at "
        "risk and the saves (none: the run is shorter than it)",
        default=None,
        min=0,
    )
    savings_vs_current: float | None = doc_field(
        "cost saved vs the current fleet for the same work, as a share (negative: dearer); null when unknown or "
        "when the current fleet cannot train the model",
        default=None,
    )
    global_batch: int | None = doc_field(
        "samples per optimizer step over every GPU, accumulation included (the constraints' global_batch under "
        "strong scaling)",
        default=None,
        min=1,
    )
    startup_s: float | None = doc_field(
        "start-up before the first step (provisioning, boot, setup, data staging, warm-up), included in time_h and "
        "cost_usd; 0 for the fleet already running",
        default=None,
        min=0,
    )
    memory_known: bool | None = doc_field(
        "false: the profile has no activation memory, so memory_gib counts weights, gradients and optimizer state "
        "only (a floor: whether the fleet fits is unknown); absent in plans made before it was recorded",
        default=None,
    )
    on_demand_fallback: float | None = doc_field(
        "spot and mixed entries: the expected share of the work the deadline policy runs on-demand to keep the "
        "deadline (included in time_h and cost_usd; 0 without a deadline or when spot alone fits it)",
        default=None,
        min=0,
        max=1,
    )
    deadline_probability: float | None = doc_field(
        "under a deadline: the chance of finishing within it (the prediction's log-normal spread of its regime, the "
        "start-up, spot interruptions, and the deadline policy's on-demand fallback for spot and mixed fleets); "
        "absent without a deadline and in plans made before it was recorded",
        default=None,
        min=0,
        max=1,
    )
    late_move_to: str | None = doc_field(
        "with move_if_late: the fleet the job moves to when its measured speed says this one misses the deadline (a "
        "fleet that meets it at the confidence after the check); time_h, cost_usd and deadline_probability count the "
        "move; absent when the fleet meets the deadline at the confidence on its own",
        default=None,
    )
    late_move_chance: float | None = doc_field(
        "with late_move_to: the chance the move is made (this fleet's own chance of missing the deadline)",
        default=None,
        min=0,
        max=1,
    )
    time_interval_h: tuple[float, ...] | None = doc_field(
        "80% interval of time_h from the step-time interval (the start-up is fixed: not scaled with it); absent in "
        "plans made before it was recorded",
        default=None,
    )
    layout: PlanLayout | None = doc_field(
        "the parallel layout and its Lightning strategy (absent in plans made before layouts: ddp)", default=None
    )
    checkpoint_s: float | None = doc_field(
        "what one checkpoint save costs on this fleet, in seconds: the plan's checkpoint_s, or, where no profile "
        "measured it, that estimate spread over the nodes of a sharded layout, which each write their part (a load "
        "is the plan's on every fleet: each node fetches the whole checkpoint); absent in plans made before it was "
        "recorded",
        default=None,
        min=0,
    )

    def __post_init__(self) -> None:
        _check_batches(self)
        _check_contains("iteration_time_interval_s", self.iteration_time_interval_s, self.iteration_time_s)
        _check_contains("time_interval_h", self.time_interval_h, self.time_h)
        _check_contains("cost_interval_usd", self.cost_interval_usd, self.cost_usd)

    def life_basis_h(self) -> float:
        """The hours a fleet's life cap is reckoned from: its predicted time; for an entry that moves when late, the
        later of that expectation and its interval's end (the deadline or later), the fleet training on until then
        when it is on time."""
        if self.late_move_to is not None and self.time_interval_h:
            return max(self.time_h, self.time_interval_h[1])
        return self.time_h

    def life_cap_h(self) -> float:
        """The default life cap of this entry's fleet (hours): the later of :meth:`life_basis_h` x 1.5 and the time's
        99th percentile, plus an hour. The percentile reads the 80% interval's upper end as a log-normal's 90th
        (z 2.326 / 1.282 of its log distance from ``time_h``): a wide interval (a profile without an operator table,
        a regime the model knows little of) widens the cap with it, so that a run inside its own prediction is not
        cut short (a trial: 1.41 h predicted, 0.50-4.4 h, capped at 3.1 h). Infinite for an infinite basis."""
        basis = self.life_basis_h()
        if not math.isfinite(basis):
            return math.inf
        high = self.time_range_h()[1]
        p99 = self.time_h * (high / self.time_h) ** LIFE_Z_RATIO if high > self.time_h > 0 else self.time_h
        return max(basis * 1.5, p99) + 1.0

    def time_range_h(self) -> tuple[float, float]:
        """The time's 80% interval: ``time_interval_h``, or for a plan written before it was recorded, the same rule
        from the step-time interval (:func:`scaled_interval`, the start-up fixed where the plan has it)."""
        if self.time_interval_h:
            return self.time_interval_h[0], self.time_interval_h[1]
        step = self.iteration_time_s or 1.0
        lo, hi = (t / step for t in self.iteration_time_interval_s)
        return scaled_interval(self.time_h, (self.startup_s or 0.0) / 3600, lo, hi)

    @property
    def heterogeneous(self) -> bool:
        return len({g.gpu for g in self.groups}) > 1

    @property
    def accumulate_grad_batches(self) -> int:
        """Micro-steps per optimizer step (1 in plans that do not say)."""
        return int(self.groups[0].accumulate_grad_batches or 1) if self.groups else 1

    def rank_batches(self) -> list[int] | None:
        """Every GPU's micro-batch in rank order (group order), or None in plans made before they were recorded."""
        if any(g.micro_batches is None for g in self.groups):
            return None
        return [b for g in self.groups for b in g.micro_batches or ()]

    def batch_per_gpu(self) -> str:
        """Each group's per-GPU micro-batch, times the accumulation when there is one: "32", "16x4", "6/5"."""
        parts = []
        for g in self.groups:
            sizes = sorted(set(g.micro_batches or ()), reverse=True)
            micro = "/".join(map(str, sizes)) if sizes else f"{g.per_device_batch:g}"
            parts.append(micro + (f"x{g.accumulate_grad_batches}" if (g.accumulate_grad_batches or 1) > 1 else ""))
        return ", ".join(parts)


@dataclass(frozen=True)
class PlanCalibration:
    """A measured correction applied to the predictions of one GPU (the observations feedback loop)."""

    gpu: str = doc_field("canonical GPU key")
    factor: float = doc_field("measured / predicted throughput applied to this GPU's compute", exclusive_min=0)
    observations: int = doc_field("observed runs of this model behind the factor", min=1)


@dataclass(frozen=True)
class PlanConstraints:
    """The constraints the plan was made under."""

    work_samples: float = doc_field("samples to train", exclusive_min=0)
    objective: ObjectiveName = doc_field("what is minimised")
    market: MarketName = doc_field("capacity markets considered")
    regions: tuple[str, ...] = doc_field("regions considered")
    max_instances: int = doc_field("largest fleet considered", min=1)
    max_types: int = doc_field("instance types per fleet considered (1: homogeneous only)", default=1, min=1, max=3)
    spot_share: float | None = doc_field(
        "mixed market: share of the instances above the on-demand base bought on spot (each entry's own spot_share "
        "is its share of all its instances)",
        default=None,
        min=0,
        max=1,
    )
    on_demand_base: int | None = doc_field("on-demand instances before the spot share applies", default=None, min=0)
    current_fleet: str | None = doc_field("the fleet savings and migration effort are measured against", default=None)
    allow: tuple[str, ...] | None = doc_field("instance types or families considered (none: all)", default=None)
    deny: tuple[str, ...] | None = doc_field("instance types or families left out", default=None)
    deadline_h: float | None = doc_field("wall-time limit", default=None, exclusive_min=0)
    confidence: float | None = doc_field(
        "chance of finishing within the deadline a fleet had to have (absent in plans made before it was recorded: "
        "those held the predicted time to the deadline)",
        default=None,
        min=0.5,
        max=0.999,
    )
    move_if_late: bool | None = doc_field(
        "the job carries MigrationTriggers: on-demand fleets under the confidence on their own were ranked with the "
        "move its deadline trigger makes when the measured speed is late (absent: not counted)",
        default=None,
    )
    budget_usd: float | None = doc_field("cost limit", default=None, exclusive_min=0)
    max_hourly_usd: float | None = doc_field("limit on the fleet's price per hour", default=None, exclusive_min=0)
    min_memory_headroom: float = doc_field("GPU memory to keep free, as a share", default=0.0, min=0, max=0.9)
    scaling: Literal["strong", "weak"] | None = doc_field(
        "strong: every fleet trains the profiled global batch (the same training); weak: every GPU keeps the "
        "profiled per-GPU batch, so the global batch grows with the fleet. Absent in plans made before it was "
        "recorded (those kept the per-GPU batch)",
        default=None,
    )
    global_batch: int | None = doc_field(
        "strong scaling: the samples per optimizer step every fleet trains", default=None, min=1
    )
    allow_arm64: bool | None = doc_field("arm64 (Graviton) instance types were allowed", default=None)
    driver: str | None = doc_field(
        "the NVIDIA driver the nodes' image was taken to have (absent: the default image's, predictor/data/"
        "cuda_builds.json images); GPUs no build of the profiled torch runs on it were left out",
        default=None,
    )
    transport: TransportName | None = doc_field(
        "how multi-node fleets were priced to meet: auto, EFA on the types that have it (absent: the same); tcp, "
        "NCCL's sockets on every type (srifty terraform then attaches no EFA interface)",
        default=None,
    )
    startup_s: float | None = doc_field(
        "a new fleet's start-up as given (null: per instance type, predictor/runs/startup.py)",
        default=None,
        min=0,
        max=7 * 86400,
    )
    dataset_gb: float | None = doc_field(
        "data staged onto every new instance before training", default=None, min=0, max=1e6
    )
    layouts: tuple[str, ...] | None = doc_field(
        "the parallel layouts ranked (predictor.model.layout names; pipeline: one stage per node); absent in plans "
        "made before layouts: ddp only",
        default=None,
    )


@dataclass(frozen=True)
class Plan:
    """Ranked fleets (srifty.plan/v1)."""

    schema: Literal["srifty.plan/v1"] = doc_field("document type and version")
    constraints: PlanConstraints = doc_field("what was asked")
    entries: tuple[PlanEntry, ...] = doc_field("the best fleets, ranked by the objective")
    pareto: tuple[PlanEntry, ...] = doc_field("the time-cost Pareto front, fastest first")
    chosen: int = doc_field("index in entries of the recommendation", min=0)
    why: str = doc_field("the reason in words: objective and binding constraint")
    considered: int = doc_field(
        "candidate fleets evaluated: every fleet shape in every region and market asked, priced there or not (the "
        "exclusions are counted over them)",
        min=0,
    )
    excluded: dict[str, int] = doc_field("candidates left out, by reason")
    catalog_source: str = doc_field("catalog copy used")
    catalog_snapshot: str = doc_field("date of the catalog data")
    excluded_types: dict[str, int] | None = doc_field(
        "instance types left out before candidates were formed, by reason", default=None
    )
    calibration: tuple[PlanCalibration, ...] | None = doc_field(
        "measured corrections from observed runs of this model (srifty serve's feedback loop)", default=None
    )
    model: str | None = doc_field("model name from the profile", default=None)
    profile_gpu: str | None = doc_field("GPU the profile was measured on", default=None)
    created_at: str | None = doc_field("UTC time the plan was made", default=None)
    notes: tuple[str, ...] | None = doc_field("assumptions and warnings", default=None)
    checkpoint_s: float | None = doc_field(
        "what one checkpoint save costs on one node, and its load on any fleet, in seconds: measured by the profile, "
        "else estimated from its size or assumed (srifty launch sizes torchrun's shutdown grace from it; each entry's "
        "own save is its checkpoint_s)",
        default=None,
        min=0,
    )
    checkpoint_source: CheckpointSource | None = doc_field(
        "where checkpoint_s comes from: given (by the ranking's caller), measured (by the profile), estimated (from "
        "the checkpoint's size, a small one at a default); a re-ranking of the job's remaining work keeps a given "
        "one; absent in plans made before it was recorded",
        default=None,
    )
    written_by: str | None = doc_field("the release that made the plan, e.g. 'lightning-srifty 0.2.0'", default=None)
    performance_model: str | None = doc_field(
        "the performance model that predicted the entries: its schema and the first 12 hex digits of the sha256 of "
        "its fitted constants and of predictor/model's code, e.g. 'srifty.model/v3+1a2b3c4d5e6f' (the same for every "
        "plan made with the same numbers and that code); absent in plans made before it was recorded",
        default=None,
    )
    software: Software | None = doc_field(
        "the profiled environment (Python, torch, lightning, lightning-srifty versions): what srifty terraform "
        "installs on the fleet's nodes; absent in plans made before #22",
        default=None,
    )

    def __post_init__(self) -> None:
        if self.entries and self.chosen >= len(self.entries):
            raise ProfileSchemaError(
                f"chosen: expected the index of one of the plan's {len(self.entries)} entries (0 to "
                f"{len(self.entries) - 1}), got {self.chosen}. Make the plan again with `srifty recommend --out "
                "plan.json`, or set chosen to the index of one of its entries.",
                field="chosen",
                value=self.chosen,
            )

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        return atomic_write_json(path, self.to_dict())


@functools.cache
def writer() -> str:
    """This release, as documents record who wrote them (read from the installed metadata once)."""
    try:
        return f"lightning-srifty {importlib.metadata.version('lightning-srifty')}"
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "lightning-srifty (source tree)"


def load_plan(source: str | os.PathLike[str] | dict[str, Any]) -> Plan:
    """A plan from a path or parsed data; errors name the field."""
    data = (
        source
        if isinstance(source, dict)
        else read_json_document(source, "Plan", "Make one with `srifty recommend --out plan.json`.")
    )
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        newer = isinstance(got, str) and got.startswith("srifty.plan/")
        fix = (
            " A plan of another major version: use the lightning-srifty release that wrote it "
            f"({data.get('written_by') or 'see its written_by'}), or make the plan again with this one."
            if newer
            else " Make one with `srifty recommend --out plan.json`."
        )
        raise ProfileSchemaError(
            f"schema: this lightning-srifty reads {PLAN_SCHEMA!r}, got {got!r}.{fix}", field="schema", value=got
        )
    return from_dict(Plan, data)


def plan_json_schema() -> dict[str, Any]:
    """The published JSON Schema of srifty.plan/v1 (predictor/schemas/plan.v1.schema.json)."""
    return json_schema(Plan, schema_id="https://lightning-srifty.dev/schemas/plan.v1.schema.json", title=PLAN_SCHEMA)
