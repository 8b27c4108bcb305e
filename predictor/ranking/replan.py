"""Should a running job move to another fleet? Re-rank the work that is left with what the run has measured.

Three triggers of a voluntary move use this (issue #7): *drift* (the measured throughput on the current fleet is off the
plan's prediction: the observation calibrates the ranking, which may now prefer another fleet), *price* (a
refreshed catalog makes another fleet cheaper for the remaining work) and *deadline* (at the measured speed the current
fleet finishes the remaining work after the plan's deadline). They come down to the same comparison:

    stay:  the remaining samples at the measured (else predicted) throughput of the current fleet, at its price
    move:  the best fleet of a re-ranking of the remaining samples + what moving costs

Moving is voluntary, so the new fleet is brought up while the old one still trains (see ``srifty launch``): the move
costs the new fleet's provisioning and restart time (paid, not yet training), one checkpoint save on the old fleet and
one load on the new, and no lost work. A move is advised only when it saves more than ``threshold`` of the cost (or,
with the time objective, the time) of staying: a small gain is not worth the risk of a move. The deadline comes
first: when staying finishes after it and the re-ranking (under what is left of the deadline, at the plan's confidence)
found a fleet that meets it, the move is advised whatever it costs; a plan's deadline is a promise, its cost a
preference.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from predictor.catalog import Catalog
from predictor.catalog.zones import group_spot_prices
from predictor.documents.plan import Plan, PlanEntry
from predictor.documents.profile import Profile
from predictor.documents.schema import to_dict
from predictor.exceptions import ConfigError, NoFeasibleConfigError, SriftyError
from predictor.ranking import Calibration, Constraints, rank
from predictor.ranking.core import unmeasured_checkpoint
from predictor.ranking.words import three
from predictor.runs.spot import REPROVISION_S, RESTART_S, on_demand_cost, planned_save_s

Why = Literal["drift", "price", "deadline"]


@dataclass(frozen=True)
class MoveDecision:
    move: bool
    why: Why
    reason: str  # in words, for the log
    current_fleet: str
    remaining_samples: float
    measured_throughput_samples_s: float | None
    predicted_throughput_samples_s: float  # the plan's prediction for the current fleet
    stay: float  # cost (USD) or time (h) of the remaining work on the current fleet, by the objective
    go: float | None  # the same on the target fleet, the move included
    savings: float  # share of ``stay`` saved by moving (negative: moving loses)
    migration_cost_usd: float
    migration_downtime_s: float
    target: PlanEntry | None
    plan: Plan | None  # the re-ranking of the remaining work (what the launcher moves to)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target"] = to_dict(self.target) if self.target is not None else None
        d["plan"] = self.plan.to_dict() if self.plan is not None else None
        return d


def drift(measured_throughput: float, predicted_throughput: float) -> float:
    """Relative deviation of the measurement from the prediction (+0.2: 20 % faster than predicted)."""
    return measured_throughput / predicted_throughput - 1.0


@dataclass(frozen=True)
class Late:
    """Staying finishes after the plan's deadline: the hours the remaining work takes on ``fleet`` (at the measured
    speed, else the predicted one) and the hours left of the deadline."""

    fleet: str
    stay_h: float
    left_h: float
    measured: bool

    def __str__(self) -> str:
        speed = "the measured" if self.measured else "the predicted"
        return (
            f"at {speed} speed {self.fleet} needs {three(self.stay_h)} h for the remaining work and "
            f"{three(self.left_h)} h are left of the deadline"
        )


def late(
    plan: Plan, entry: PlanEntry, remaining_samples: float, measured_throughput: float | None, elapsed_h: float
) -> Late | None:
    """Whether staying on ``entry``'s fleet finishes the remaining work after the plan's deadline (None: it does not,
    or the plan has none). The fleet is running: its start-up is not counted again; a spot fleet's expected
    interruptions stay in, in proportion."""
    if plan.constraints.deadline_h is None:
        return None
    throughput = measured_throughput or entry.throughput_samples_s
    training_h = _own_training_h(plan, entry)
    if entry.late_move_to is None:  # its time is its own (not the expectation of a move): interruptions and all
        training_h = max(training_h, entry.time_h - (entry.startup_s or 0.0) / 3600)
    stay_h = training_h * remaining_samples / plan.constraints.work_samples * entry.throughput_samples_s / throughput
    left_h = plan.constraints.deadline_h - elapsed_h
    return Late(entry.fleet, stay_h, left_h, measured_throughput is not None) if stay_h > left_h else None


def _own_training_h(plan: Plan, entry: PlanEntry) -> float:
    """The entry's fleet's own training time for the plan's work, start-up excluded: its node failures and periodic
    checkpoints priced as the ranking prices them (:func:`~predictor.runs.spot.on_demand_cost`; an entry with a late
    move is on-demand, whose figures are the move's expectation, not the fleet's own)."""
    work_s = plan.constraints.work_samples / entry.throughput_samples_s
    save, load = planned_save_s(plan, entry), plan.checkpoint_s
    own = on_demand_cost(work_s, save, restart_s=entry.startup_s or 0.0, gpus=entry.gpus, load_s=load)
    return float(own.expected_time_s[0]) / 3600


def remaining_constraints(plan: Plan, remaining_samples: float, *, elapsed_h: float = 0.0, spent_usd: float = 0.0):
    """The plan's constraints for the work that is left: the same objective, markets and limits; what is left of
    the deadline and the budget; savings measured against the current fleet. No move when late is counted: the
    re-ranking is that move (the run's speed is measured)."""
    c = plan.constraints
    deadline = None if c.deadline_h is None else c.deadline_h - elapsed_h
    budget = None if c.budget_usd is None else c.budget_usd - spent_usd
    if (deadline is not None and deadline <= 0) or (budget is not None and budget <= 0):
        return None
    # move_if_late off: the speed is measured now, and this is the move it counted on
    return Constraints.from_plan(
        c,
        samples=remaining_samples,
        deadline_h=deadline,
        budget_usd=budget,
        current_fleet=None,
        top=5,
        move_if_late=False,
    )


def price_now(entry: PlanEntry, catalog: Catalog) -> float:
    """What the entry's fleet costs per hour at the catalog's current prices, its spot part in one zone as the
    ranking prices it (:mod:`predictor.catalog.zones`; a review: each type's cheapest zone read a mix 44 % below its
    plan's price, and staying looked that much cheaper); the plan's price where one is gone."""
    try:
        types = [catalog.get(g.instance_type) for g in entry.groups]
    except SriftyError:
        return entry.usd_per_hour
    _, spot = group_spot_prices(types, [g.spot for g in entry.groups], entry.region)
    total = 0.0
    for g, it, sp in zip(entry.groups, types, spot, strict=True):
        od = it.price_usd_hr(entry.region, "on-demand")
        if (g.on_demand and od is None) or (g.spot and sp != sp):  # nan: no zone offers the fleet's spot part
            return entry.usd_per_hour
        total += g.on_demand * (od or 0.0) + (g.spot * sp if g.spot else 0.0)
    return total


def _stay(entry: PlanEntry, plan: Plan, remaining: float, throughput: float, objective: str, usd_hr: float) -> float:
    """The plan's own cost (time) of the entry, scaled to the remaining work, the measured speed and today's price
    (spot interruptions and checkpoints stay in, in proportion)."""
    scale = remaining / plan.constraints.work_samples * entry.throughput_samples_s / throughput
    if entry.late_move_to is not None:  # its figures are the expectation of a move: staying is the fleet's own
        own_h = _own_training_h(plan, entry) + (entry.startup_s or 0.0) / 3600
        return own_h * scale if objective == "time" else own_h * scale * usd_hr
    return entry.time_h * scale if objective == "time" else entry.cost_usd * scale * usd_hr / entry.usd_per_hour


def decide_move(
    profile: Profile,
    plan: Plan,
    current: int,
    remaining_samples: float,
    *,
    why: Why,
    measured_throughput: float | None = None,
    catalog: Catalog | None = None,
    threshold: float = 0.15,
    elapsed_h: float = 0.0,
    spent_usd: float = 0.0,
    known: dict[str, float] | None = None,
    checkpoint_s: float | None = None,
) -> MoveDecision:
    """Compare staying on ``plan.entries[current]`` with moving to the best fleet for the remaining work.

    ``measured_throughput`` (samples/s on the current fleet) calibrates the re-ranking: the factor measured/predicted
    applies to the current fleet's GPU (homogeneous fleets; a mix cannot tell which GPU was off), exactly as an
    observation posted to ``srifty serve`` would. ``known``: factors by GPU measured earlier (on the fleets the job
    ran on before), applied too, so that a job does not move back to a GPU it already found slow. When staying
    finishes after the deadline (:func:`late`), the re-ranking's target (it meets what is left of the deadline at the
    plan's confidence) is a move whatever the savings. ``checkpoint_s``: one checkpoint's cost, as ``rank`` takes it;
    default: the plan's where its caller gave it (:func:`given_checkpoint_s`), else the profile's."""
    _check_move(plan, current, remaining_samples, measured_throughput)
    checkpoint_s = given_checkpoint_s(plan) if checkpoint_s is None else checkpoint_s
    entry = plan.entries[current]
    objective = plan.constraints.objective
    throughput = measured_throughput or entry.throughput_samples_s
    catalog = catalog or Catalog.load()
    stay = _stay(entry, plan, remaining_samples, throughput, objective, price_now(entry, catalog))
    unit = "h" if objective == "time" else "USD"

    def decision(move: bool, reason: str, **kw: Any) -> MoveDecision:
        facts = (entry.fleet, remaining_samples, measured_throughput, entry.throughput_samples_s, stay)
        return MoveDecision(move, why, reason, *facts, **{**_NO_MOVE, **kw})

    constraints = remaining_constraints(plan, remaining_samples, elapsed_h=elapsed_h, spent_usd=spent_usd)
    if constraints is None:
        return decision(False, "the deadline or the budget is already used up: moving cannot help")
    calibration = _calibration(plan, entry, measured_throughput, known)
    behind = late(plan, entry, remaining_samples, measured_throughput, elapsed_h)
    here = replace(constraints, current_fleet=entry.fleet)
    try:
        replanned = rank(profile, here, catalog=catalog, calibration=calibration, checkpoint_s=checkpoint_s)
    except NoFeasibleConfigError as exc:
        missed = f"{behind}, and " if behind else ""
        return decision(False, f"{missed}no fleet meets the constraints for the remaining work ({exc}): staying")
    target = replanned.entries[replanned.chosen]
    if target.fleet == entry.fleet and target.market == entry.market:
        still = f"{entry.fleet} is still the best fleet for the remaining work"
        return decision(False, still + (f" (though {behind})" if behind else ""), plan=replanned)
    migration_usd, downtime_s = _migration(profile, plan, entry, target, checkpoint_s)
    go = target.time_h + downtime_s / 3600 if objective == "time" else target.cost_usd + migration_usd
    savings = 1.0 - go / stay if stay > 0 else -math.inf
    words = _move_words(target, go, stay, unit, entry, savings, measured_throughput)
    move = savings > threshold or behind is not None  # the re-ranking's target meets what is left of the deadline
    said = f"move: {behind}; " if behind else "move: " if move else f"stay (under the {threshold:.0%} threshold): "
    figures = dict(go=go, savings=savings, migration_cost_usd=migration_usd, migration_downtime_s=downtime_s)
    return decision(move, said + words, target=target, plan=replanned, **figures)


# a decision's figures when there is no move to weigh
_NO_MOVE: dict[str, Any] = dict(
    go=None, savings=0.0, migration_cost_usd=0.0, migration_downtime_s=0.0, target=None, plan=None
)


def _move_words(
    target: PlanEntry, go: float, stay: float, unit: str, entry: PlanEntry, savings: float, measured: float | None
) -> str:
    """The move's case in words: both totals for the remaining work, and the measurement when there is one."""
    words = (
        f"{target.fleet} ({target.market}): {go:,.2f} {unit} for the remaining work, the move included, against "
        f"{stay:,.2f} {unit} on {entry.fleet} ({savings:+.0%})"
    )
    if measured is not None:
        words += f"; measured {measured:,.1f} samples/s, predicted {entry.throughput_samples_s:,.1f}"
    return words


def _check_move(plan: Plan, current: int, remaining_samples: float, measured_throughput: float | None) -> None:
    """Refuse what :func:`decide_move` cannot compare: a fleet index outside the plan, no remaining work, a measured
    throughput that is not positive.

    Raises:
        ConfigError: naming the argument.
    """
    if not 0 <= current < len(plan.entries):
        raise ConfigError(
            f"The plan has {len(plan.entries)} fleets; the current one must be an index below that. Got {current}.",
            parameter="current",
            value=current,
        )
    if not remaining_samples > 0:
        raise ConfigError(
            f"remaining_samples must be > 0. Got {remaining_samples}.", parameter="remaining_samples", value=None
        )
    if measured_throughput is not None and not measured_throughput > 0:
        raise ConfigError(
            f"measured_throughput must be > 0 samples/s. Got {measured_throughput}.",
            parameter="measured_throughput",
            value=measured_throughput,
        )


def _calibration(
    plan: Plan, entry: PlanEntry, measured_throughput: float | None, known: dict[str, float] | None
) -> Calibration | None:
    """The re-ranking's calibration: the factors ``known`` from earlier fleets, and measured/predicted on the current
    fleet's GPU (homogeneous fleets only; it replaces the plan's own factor for that GPU). None when there is none."""
    factors = dict(known or {})
    gpus = {g.gpu for g in entry.groups}
    if measured_throughput is not None and len(gpus) == 1:
        gpu = gpus.pop()
        # the entry's prediction may carry the plan's own factor for this GPU: the new one replaces it
        applied = {c.gpu: c.factor for c in plan.calibration or ()}.get(gpu, 1.0)
        factors[gpu] = applied * measured_throughput / entry.throughput_samples_s
    return Calibration(factors, {}) if factors else None


def given_checkpoint_s(plan: Plan) -> float | None:
    """The checkpoint cost ``plan`` was ranked with where its caller gave it (``rank(checkpoint_s=...)``: the plan's
    ``checkpoint_source`` says so), else None: a figure the profile measured or its size gave is the profile's to
    give again (the job's own profile may have measured it since). A re-ranking that dropped a given one priced
    every fleet's interruptions and the move with another checkpoint than the plan's."""
    return plan.checkpoint_s if plan.checkpoint_source == "given" else None


def _migration(
    profile: Profile, plan: Plan, entry: PlanEntry, target: PlanEntry, given_s: float | None = None
) -> tuple[float, float]:
    """(what a move costs in USD, the training's downtime in seconds): a checkpoint saved on the current fleet and
    loaded on the target (a figure the caller gave, ``given_s``, for both; else the profile's measured times; else
    the plan's figures: the save its entry records, spread over a sharded current fleet's nodes, and the plan's
    one-node figure, estimated from the size, loaded on every node), the target provisioned and restarted; the new
    fleet is paid from its request on, the old one trains on until it saves."""
    checkpoint = profile.checkpoint
    if given_s is not None:
        save_s = load_s = given_s
    elif checkpoint is not None:
        save_s, load_s = checkpoint.save_s, checkpoint.load_s or checkpoint.save_s
    else:
        whole = unmeasured_checkpoint(profile)[0] if plan.checkpoint_s is None else plan.checkpoint_s
        save_s = whole if entry.checkpoint_s is None else entry.checkpoint_s
        load_s = whole
    idle_new_s = REPROVISION_S + RESTART_S + save_s + load_s
    migration_usd = target.usd_per_hour * idle_new_s / 3600 + entry.usd_per_hour * save_s / 3600
    return migration_usd, save_s + RESTART_S + load_s
