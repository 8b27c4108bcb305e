"""``rank(profile, constraints)``: every homogeneous fleet (CUDA type x 1..max instances x region x market) predicted
with :func:`predictor.predict_many.predict_many`, priced with spot risk, filtered by the constraints and ranked.

Candidates that cannot be priced, do not fit in GPU memory, or break a constraint are excluded and counted by reason;
when none is left, :class:`NoFeasibleConfigError` says which constraint binds, the best achievable time under the
budget and the cheapest cost under the deadline.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from predictor._validation import check_choice, check_int, check_number
from predictor.catalog.catalog import Catalog
from predictor.exceptions import ConfigError, NoFeasibleConfigError
from predictor.plan import PLAN_SCHEMA, Plan, PlanConstraints, PlanEntry
from predictor.predict_many import predict_many
from predictor.profile import Profile
from predictor.spot import DEFAULT_CHECKPOINT_S, risk_label, spot_cost

Objective = Literal["cost", "time", "cost_per_sample"]


@dataclass(frozen=True)
class Constraints:
    """What the user wants. Work is ``steps`` (of the profiled global batch) or ``samples``."""

    steps: int | None = None
    samples: float | None = None
    deadline_h: float | None = None
    budget_usd: float | None = None
    objective: Objective = "cost"
    regions: tuple[str, ...] = ("us-east-1",)
    market: Literal["on-demand", "spot", "any"] = "any"
    max_instances: int = 16
    max_hourly_usd: float | None = None
    allow: tuple[str, ...] = field(default=())  # instance types or families; empty = all
    deny: tuple[str, ...] = field(default=())
    min_memory_headroom: float = 0.0
    top: int = 10

    def validate(self) -> None:
        owner = "rank()"
        if (self.steps is None) == (self.samples is None):
            raise ConfigError(
                "Give the work as exactly one of 'steps' or 'samples' (e.g. --steps 100000).",
                parameter="steps",
                value=self.steps,
            )
        if self.steps is not None:
            check_int(owner, "steps", self.steps, minimum=1)
        if self.samples is not None:
            check_number(owner, "samples", self.samples, minimum=0, exclusive=True)
        for name in ("deadline_h", "budget_usd", "max_hourly_usd"):
            if getattr(self, name) is not None:
                check_number(owner, name, getattr(self, name), minimum=0, exclusive=True)
        check_choice(owner, "objective", self.objective, ("cost", "time", "cost_per_sample"))
        check_choice(owner, "market", self.market, ("on-demand", "spot", "any"))
        check_int(owner, "max_instances", self.max_instances, minimum=1)
        check_int(owner, "top", self.top, minimum=1)
        check_number(owner, "min_memory_headroom", self.min_memory_headroom, minimum=0)


def _allowed(name: str, family: str, constraints: Constraints) -> bool:
    if constraints.allow and name not in constraints.allow and family not in constraints.allow:
        return False
    return name not in constraints.deny and family not in constraints.deny


def rank(
    profile: Profile,
    constraints: Constraints,
    *,
    catalog: Catalog | None = None,
    checkpoint_s: float = DEFAULT_CHECKPOINT_S,
) -> Plan:
    """Rank fleets; raise NoFeasibleConfigError (with the binding constraint and hints) when none is feasible."""
    constraints.validate()
    catalog = catalog or Catalog.load()
    global_batch = profile.batch.global_batch or profile.batch.per_device * (profile.hardware.world_size or 1)
    samples = float(constraints.samples if constraints.samples is not None else constraints.steps * global_batch)
    markets = ("on-demand", "spot") if constraints.market == "any" else (constraints.market,)
    excluded: dict[str, int] = {}

    def exclude(reason: str, n: int) -> None:
        if n:
            excluded[reason] = excluded.get(reason, 0) + int(n)

    counts = np.arange(1, constraints.max_instances + 1)
    rows = []  # (type, region, market, usd/h per instance, interruption rate)
    for it in catalog.filter(cuda_only=True):
        if not _allowed(it.name, it.family, constraints):
            exclude("not allowed by allow/deny", len(counts) * len(constraints.regions) * len(markets))
            continue
        if it.gpu not in catalog.gpus:
            exclude(f"GPU without specs ({it.gpu})", len(counts) * len(constraints.regions) * len(markets))
            continue
        for region in constraints.regions:
            for market in markets:
                price = it.price_usd_hr(region, market)  # type: ignore[arg-type]
                if price is None:
                    exclude(f"no {market} price in {region}", len(counts))
                    continue
                rate = (it.interruption_rate_per_hr or 0.0) if market == "spot" else 0.0
                rows.append((it.name, region, market, price, rate))
    if not rows:
        raise NoFeasibleConfigError(
            "No instance type has a price in "
            + ", ".join(constraints.regions)
            + f" for the {constraints.market} market. Try --regions us-east-1 or --market any."
        )
    types = sorted({r[0] for r in rows})
    many = predict_many(profile, [t for t in types for _ in counts], np.tile(counts, len(types)), catalog=catalog)
    pos = {t: i * len(counts) for i, t in enumerate(types)}
    idx = np.array([pos[r[0]] + c - 1 for r in rows for c in counts])
    n = np.tile(counts, len(rows)).astype(float)
    usd_hr = np.repeat([r[3] for r in rows], len(counts)) * n
    rate = np.repeat([r[4] for r in rows], len(counts))
    work_s = samples / many.throughput_samples_s[idx]
    spot = spot_cost(work_s, n, rate, checkpoint_s)
    time_h = spot.expected_time_s / 3600
    cost = usd_hr * time_h
    step = many.iteration_time_s[idx]
    scale_lo, scale_hi = many.iteration_time_lo_s[idx] / step, many.iteration_time_hi_s[idx] / step
    considered = len(idx)

    gpu_gib = np.array([catalog.get(t).gpu_memory_gib for t in types]).repeat(len(counts))[idx]
    ok = many.fits_memory[idx] & (many.memory_gib[idx] <= gpu_gib * (1 - constraints.min_memory_headroom))
    exclude("does not fit in GPU memory (with the headroom asked)", int((~ok).sum()))
    keep = ok.copy()
    for name, limit, values in (
        ("max_hourly_usd", constraints.max_hourly_usd, usd_hr),
        ("deadline", constraints.deadline_h, time_h),
        ("budget", constraints.budget_usd, cost),
    ):
        if limit is not None:
            over = keep & (values > limit)
            exclude(f"over the {name.replace('_', ' ')}", int(over.sum()))
            keep &= ~over
    if not keep.any():
        raise _infeasible(constraints, ok, time_h, cost)

    key = time_h if constraints.objective == "time" else cost
    order = [int(i) for i in np.argsort(np.where(keep, key, np.inf), kind="stable")[: int(keep.sum())]]
    pareto_set = _pareto(np.flatnonzero(keep), time_h, cost)
    labels = risk_label(spot.expected_interruptions)

    def entry(i: int, rank_no: int) -> PlanEntry:
        t, region, market = rows[i // len(counts)][:3]
        c = int(n[i])
        it = catalog.get(t)
        tau = spot.checkpoint_interval_s[i]
        return PlanEntry(
            rank=rank_no,
            fleet=f"{t}:{c}",
            instance_type=t,
            count=c,
            gpus=it.gpus * c,
            gpu=it.gpu or "",
            region=region,
            market=market,
            usd_per_hour=float(usd_hr[i]),
            iteration_time_s=float(step[i]),
            iteration_time_interval_s=(float(step[i] * scale_lo[i]), float(step[i] * scale_hi[i])),
            throughput_samples_s=float(many.throughput_samples_s[idx[i]]),
            time_h=float(time_h[i]),
            cost_usd=float(cost[i]),
            cost_interval_usd=(float(cost[i] * scale_lo[i]), float(cost[i] * scale_hi[i])),
            expected_interruptions=float(spot.expected_interruptions[i]),
            risk=str(labels[i]),
            memory_gib=float(many.memory_gib[idx[i]]),
            pareto=i in pareto_set,
            checkpoint_interval_s=float(tau) if np.isfinite(tau) else None,
        )

    entries = [entry(i, r + 1) for r, i in enumerate(order[: constraints.top])]
    pareto = [entry(i, order.index(i) + 1) for i in sorted(pareto_set, key=lambda i: time_h[i])]
    return Plan(
        schema=PLAN_SCHEMA,
        constraints=PlanConstraints(
            work_samples=samples,
            objective=constraints.objective,
            market=constraints.market,
            regions=tuple(constraints.regions),
            max_instances=constraints.max_instances,
            deadline_h=constraints.deadline_h,
            budget_usd=constraints.budget_usd,
            max_hourly_usd=constraints.max_hourly_usd,
            min_memory_headroom=constraints.min_memory_headroom,
        ),
        entries=tuple(entries),
        pareto=tuple(pareto),
        chosen=0,
        why=_why(constraints, entries[0], ok, time_h, cost, key),
        considered=considered,
        excluded=excluded,
        catalog_source=catalog.info.source,
        catalog_snapshot=catalog.info.snapshot,
        model=profile.model.name,
        profile_gpu=profile.hardware.gpu,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        notes=(
            f"work: {samples:,.0f} samples; spot overhead assumes a {checkpoint_s:.0f} s checkpoint and "
            "Spot Advisor interruption rates",
        ),
    )


def _pareto(candidates: np.ndarray, time_h: np.ndarray, cost: np.ndarray) -> set[int]:
    """Indices not dominated in (time, cost)."""
    front: set[int] = set()
    best_cost = np.inf
    for i in sorted(candidates, key=lambda i: (time_h[i], cost[i])):
        if cost[i] < best_cost:
            front.add(int(i))
            best_cost = cost[i]
    return front


def _why(
    constraints: Constraints, best: PlanEntry, fits: np.ndarray, time_h: np.ndarray, cost: np.ndarray, key: np.ndarray
) -> str:
    goal = {
        "cost": "the lowest expected cost",
        "time": "the shortest expected time",
        "cost_per_sample": "the lowest cost per sample",
    }[constraints.objective]
    text = f"{best.fleet} ({best.market}, {best.region}) has {goal}: {best.time_h:.3g} h, ${best.cost_usd:,.3g}"
    unconstrained = float(np.min(np.where(fits, key, np.inf)))
    chosen_key = best.time_h if constraints.objective == "time" else best.cost_usd
    if chosen_key > unconstrained * 1.0001:
        binding = "deadline" if constraints.deadline_h is not None else "budget"
        text += f"; the {binding} binds (without it the best would reach {unconstrained:,.2f})"
    return text


def _infeasible(constraints: Constraints, fits: np.ndarray, time_h: np.ndarray, cost: np.ndarray) -> Exception:
    if not fits.any():
        return NoFeasibleConfigError(
            "No fleet fits the model in GPU memory (with the headroom asked). Use larger "
            "GPUs, a smaller per-GPU batch, or shard the model (FSDP / DeepSpeed)."
        )
    parts = []
    under_budget = fits & (cost <= (constraints.budget_usd or np.inf))
    under_deadline = fits & (time_h <= (constraints.deadline_h or np.inf))
    if constraints.deadline_h is not None:
        fastest = float(np.min(np.where(under_budget, time_h, np.inf)))
        parts.append(
            f"the deadline of {constraints.deadline_h:g} h binds: the fastest fleet "
            + (f"within the budget takes {fastest:.1f} h" if np.isfinite(fastest) else "takes longer")
        )
    if constraints.budget_usd is not None:
        cheapest = float(np.min(np.where(under_deadline, cost, np.inf)))
        parts.append(
            f"the budget of ${constraints.budget_usd:,.0f} binds: the cheapest fleet "
            + (f"meeting the deadline costs ${cheapest:,.0f}" if np.isfinite(cheapest) else "costs more")
        )
    if constraints.max_hourly_usd is not None and not parts:
        parts.append(f"no fleet costs less than ${constraints.max_hourly_usd:g}/h")
    hints = "Hints: relax the binding constraint, allow spot (--market any), more instances (--max-instances)."
    return NoFeasibleConfigError("No fleet meets the constraints: " + "; ".join(parts) + ". " + hints)
