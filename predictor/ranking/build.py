"""Plan building: one ranked candidate as a :class:`PlanEntry` (groups with their whole per-GPU batches and
accumulation), and the plan's notes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from predictor.catalog.instances import InstanceType
from predictor.documents.plan import FleetMarket, PlanEntry, PlanGroup, PlanLayout, Risk, scaled_interval
from predictor.documents.profile import Profile
from predictor.model.batch import rank_batches
from predictor.model.fleets import ManyPredictions
from predictor.model.layout import Layout, parse
from predictor.model.memory import activations_known, wrap_min_params
from predictor.ranking.candidates import MARKET_NAMES, Candidates
from predictor.ranking.explain import CurrentFleet, migration_effort, performance_risk
from predictor.runs.spot import SpotCost, risk_label


@dataclass(frozen=True)
class Scored:
    """The arrays over candidates an entry is read from."""

    many: ManyPredictions
    cand: Candidates
    spot: SpotCost
    time_h: np.ndarray
    cost: np.ndarray
    usd_hr: np.ndarray
    regions: tuple[str, ...]
    startup_s: np.ndarray  # per candidate: the new fleet's start-up (in time_h and cost)
    save_s: np.ndarray  # per candidate: one checkpoint save on the fleet (its load is the plan's checkpoint_s)
    od_share: np.ndarray | None = None  # per candidate: the deadline policy's expected on-demand share of the work
    deadline_p: np.ndarray | None = None  # per candidate, under a deadline: the chance of finishing by it
    confident_time_h: np.ndarray | None = None  # per candidate, under a deadline: the time at the confidence asked
    late_target: np.ndarray | None = None  # per candidate, with move_if_late: the candidate moved to when late (-1)
    late_p: np.ndarray | None = None  # per candidate, with move_if_late: the chance that move is made
    late_ranges: tuple[np.ndarray, np.ndarray] | None = None  # with move_if_late: the (N, 2) time (s), cost intervals
    # under a deadline: candidates' (n, 2) time (s) and cost intervals as the policy runs the guarded fleets (nan:
    # not guarded), spot capacity's width in the cost (predictor.runs.odds.guarded_ranges); computed per entry
    guarded_ranges: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None


PIPELINE_NEEDS = (
    "Lightning has no pipeline strategy: run it with torch.distributed.pipelining (a manual split of the blocks "
    "into one stage per node, ScheduleGPipe or Schedule1F1B over the accumulation's micro-batches)"
)


def layout_of(many: ManyPredictions, row: int) -> Layout:
    """The layout candidate ``row`` was predicted with (a pipeline with its stages)."""
    name = many.layout_names[int(many.layout_index[row])]
    if name.startswith("pipeline"):
        name = name.replace("pipeline", f"pipeline:{int(many.stages[row])}")
    return parse(name)


def plan_layout(
    layout: Layout, block: str | None = None, *, wrap_min_params: int | None = None, shard_group: int = 1
) -> PlanLayout:
    """What the plan records of a layout: its parts and the Lightning strategy (with its arguments) that runs it,
    for a model whose repeated block is ``block`` (:meth:`predictor.model.layout.Layout.lightning`)."""
    strategy, args = layout.lightning(block, wrap_min_params)
    return PlanLayout(
        name=layout.name,
        strategy=layout.strategy,
        sharding=layout.sharding,
        activation_checkpointing=layout.activation_checkpointing,
        pipeline_stages=layout.pipeline_stages,
        shard_group=shard_group,
        lightning_strategy=strategy,
        lightning_args=args or None,
        launchable=layout.launchable,
        needs=None if layout.launchable else PIPELINE_NEEDS,
    )


def entry_layout(layout: Layout, profile: Profile, groups: list[PlanGroup]) -> PlanLayout:
    """The plan's record of ``layout`` on a fleet of ``groups`` (its shard group: the smallest node's GPUs under
    hybrid sharding, every rank under full sharding)."""
    st = profile.model.structure
    return plan_layout(
        layout,
        st.block if st is not None else None,
        wrap_min_params=wrap_min_params(profile),
        shard_group=layout.shard_group(
            min(g.gpus_per_instance for g in groups), sum(g.count * g.gpus_per_instance for g in groups)
        ),
    )


def _groups(scored: Scored, i: int, sh: int, types: list[InstanceType]) -> list[PlanGroup]:
    """Candidate ``i``'s groups of equal instances: their market split, price, per-GPU batch and throughput."""
    many, cand = scored.many, scored.cand
    accumulation = int(many.accumulation[sh])
    groups = []
    for k in range(many.counts.shape[1]):
        c = int(many.counts[sh, k])
        if c == 0:
            continue
        it = types[int(many.type_index[sh, k])]
        groups.append(
            PlanGroup(
                instance_type=it.name,
                count=c,
                gpus_per_instance=it.gpus,
                gpu=it.gpu or "",
                on_demand=int(cand.on_demand[i, k]),
                spot=int(cand.spot[i, k]),
                usd_per_hour=float(cand.group_usd[i, k]),
                per_device_batch=float(many.per_device_batch[sh, k]),
                throughput_samples_s=float(
                    many.per_device_batch[sh, k] * many.group_gpus[sh, k] / many.iteration_time_s[sh]
                ),
                micro_batches=tuple(
                    rank_batches(many.micro_low[sh, k], many.micro_plus[sh, k], int(many.group_gpus[sh, k]))
                ),
                accumulate_grad_batches=accumulation,
            )
        )
    return groups


def entry(
    scored: Scored,
    i: int,
    rank_no: int,
    types: list[InstanceType],
    profile: Profile,
    current: CurrentFleet | None,
    pareto: bool,
) -> PlanEntry:
    many, cand, spot = scored.many, scored.cand, scored.spot
    sh = int(cand.shape[i])
    groups = _groups(scored, i, sh, types)
    nodes = sum(g.count for g in groups)
    step = float(many.iteration_time_s[sh])
    lo, hi = float(many.iteration_time_lo_s[sh]) / step, float(many.iteration_time_hi_s[sh]) / step
    cost = float(scored.cost[i])
    tau = spot.checkpoint_interval_s[i]
    return PlanEntry(
        rank=rank_no,
        fleet=",".join(f"{g.instance_type}:{g.count}" for g in groups),
        groups=tuple(groups),
        gpus=sum(g.count * g.gpus_per_instance for g in groups),
        nodes=nodes,
        region=scored.regions[int(cand.region[i])],
        market=cast(FleetMarket, str(MARKET_NAMES[cand.market[i]])),  # numpy's strings carry no Literal type
        spot_share=sum(g.spot for g in groups) / nodes,
        usd_per_hour=float(scored.usd_hr[i]),
        iteration_time_s=step,
        iteration_time_interval_s=(step * lo, step * hi),
        throughput_samples_s=float(many.throughput_samples_s[sh]),
        time_h=float(scored.time_h[i]),
        cost_usd=cost,
        **{
            "time_interval_h": scaled_interval(float(scored.time_h[i]), float(scored.startup_s[i]) / 3600, lo, hi),
            "cost_interval_usd": scaled_interval(
                cost, float(scored.usd_hr[i]) * float(scored.startup_s[i]) / 3600, lo, hi
            ),
            **_guarded(scored, i),
            **_late_move(scored, i, types),
        },
        expected_interruptions=float(spot.expected_interruptions[i]),
        interruption_overhead_s=float(spot.per_interruption_s[i]),
        risk=cast(Risk, str(risk_label(spot.expected_interruptions[i : i + 1])[0])),  # its labels are Risk values
        performance_risk=performance_risk(float(many.model_sd[sh])),
        migration_effort=migration_effort(groups, profile, current),
        savings_vs_current=(1 - cost / current[2]) if current and current[2] > 0 else None,
        memory_gib=float(many.memory_gib[sh]),
        memory_known=activations_known(profile),
        pareto=pareto,
        checkpoint_interval_s=float(tau) if np.isfinite(tau) else None,
        global_batch=round(float(many.global_batch[sh])),
        startup_s=float(scored.startup_s[i]),
        on_demand_fallback=(float(scored.od_share[i]) if scored.od_share is not None and cand.market[i] != 0 else None),
        deadline_probability=None if scored.deadline_p is None else round(float(scored.deadline_p[i]), 4),
        layout=entry_layout(layout_of(many, sh), profile, groups),
        checkpoint_s=float(scored.save_s[i]),
    )


def _guarded(scored: Scored, i: int) -> dict[str, Any]:
    """A guarded fleet's intervals as the deadline policy runs it (an on-demand finish, spot capacity's width in the
    cost); empty for the others (their intervals scale with the prediction's)."""
    if scored.guarded_ranges is None:
        return {}
    times, costs = scored.guarded_ranges(np.array([i]))
    if not np.isfinite(times).all():
        return {}
    (t_lo, t_hi), (c_lo, c_hi) = (tuple(float(v) for v in r[0]) for r in (times, costs))
    return {"time_interval_h": (t_lo / 3600, t_hi / 3600), "cost_interval_usd": (c_lo, c_hi)}


def _late_move(scored: Scored, i: int, types: list[InstanceType]) -> dict[str, Any]:
    """Candidate ``i``'s move when measured late (``late_move_to``, ``late_move_chance``); empty when none counted."""
    j = -1 if scored.late_target is None else int(scored.late_target[i])
    if j < 0 or scored.late_p is None:
        return {}
    groups = _groups(scored, j, int(scored.cand.shape[j]), types)
    fleet = ",".join(f"{g.instance_type}:{g.count}" for g in groups)
    out: dict[str, Any] = {"late_move_to": fleet, "late_move_chance": round(float(scored.late_p[i]), 4)}
    if scored.late_ranges is not None:  # the run's intervals, the move counted (not the fleet's own)
        (t_lo, t_hi), (c_lo, c_hi) = (tuple(float(v) for v in r[i]) for r in scored.late_ranges)
        out.update(time_interval_h=(t_lo / 3600, t_hi / 3600), cost_interval_usd=(c_lo, c_hi))
    return out
