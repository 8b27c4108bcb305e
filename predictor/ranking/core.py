"""``rank(profile, constraints)``: every feasible candidate fleet predicted, priced with spot risk, filtered and
ranked (see :mod:`predictor.ranking`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from predictor.catalog.catalog import Catalog
from predictor.catalog.feasible import exclusion
from predictor.catalog.fleet import parse_fleet
from predictor.catalog.instances import SPOT_OUTLIER_HINT, InstanceType, Price
from predictor.documents.plan import PLAN_SCHEMA, CheckpointSource, Plan, PlanCalibration, PlanEntry, writer
from predictor.documents.profile import Profile
from predictor.documents.work import Work
from predictor.exceptions import ConfigError, NoFeasibleConfigError, PredictionError, SriftyError
from predictor.model.artefact import model_version
from predictor.model.fleets import PREFER_SIMPLER, ManyPredictions, predict_mixes, row_sum
from predictor.model.layout import Layout
from predictor.model.layout import parse as parse_layout
from predictor.model.memory import checkpoint_bytes
from predictor.ranking import candidates as cands
from predictor.ranking.build import PIPELINE_NEEDS, Scored, entry, layout_of
from predictor.ranking.constraints import Constraints, Market, Objective, constraint_defaults
from predictor.ranking.explain import (
    LIMIT_OF,
    TIE,
    CurrentFleet,
    chance,
    fmt,
    infeasible,
    layout_why,
    manual_loop_note,
    no_table_note,
    unmeasured_note,
    why,
    within,
)
from predictor.ranking.pareto import pareto
from predictor.ranking.validation import validation_notes
from predictor.ranking.words import PYTHON, Words, chance_beside, names, three
from predictor.runs.odds import (
    DOWN_SPELL_S,
    LATE_CHECK_S,
    LATE_MOVE_GAIN,
    DeadlineOdds,
    Fallback,
    SpotStats,
    at_confidence,
    deadline_odds,
    expected_with_fallback,
    guarded_ranges,
    late_moves,
)
from predictor.runs.spot import (
    DEFAULT_CHECKPOINT_S,
    FAILURES_PER_GPU_HR,
    RESTART_S,
    ROOT_VOLUME_BYTES_S,
    busiest_node_share,
    deadline_interval_cap_s,
    estimated_checkpoint_s,
    on_demand_cost,
    saves_on_notice,
    sharded_save_s,
    spot_cost,
)
from predictor.runs.startup import (
    BILLING_MINIMUM_S,
    BOOT_S,
    PROVISION_S,
    SETUP_S,
    WARMUP_S,
    billed_hours,
    fleet_startup_s,
    measured_ready,
)
from predictor.runs.startup import (
    measured as measured_startup,
)


@dataclass(frozen=True)
class Calibration:
    """Measured/predicted throughput factors by GPU key for one model (from observed runs)."""

    factors: Mapping[str, float]
    observations: Mapping[str, int]

    def entries(self) -> list[PlanCalibration]:
        return [PlanCalibration(gpu, float(f), int(self.observations.get(gpu, 1))) for gpu, f in self.factors.items()]


def rank(
    profile: Profile,
    constraints: Constraints,
    *,
    catalog: Catalog | None = None,
    checkpoint_s: float | None = None,
    calibration: Calibration | None = None,
    spot_stats: SpotStats | None = None,
    words: Words = PYTHON,
) -> Plan:
    """Rank fleets; raise NoFeasibleConfigError (with the binding constraint and hints) when none is feasible.
    ``words``: the caller's names for the constraints in the plan's prose and the errors (:mod:`.words`).

    ``spot_stats``: spot capacity as traces recorded it (:class:`predictor.runs.odds.SpotStats`): its interruption
    rate replaces the catalog's Spot Advisor rates and its wait for capacity the traces' default.

    ``checkpoint_s``: what one checkpoint costs (save, and load after an interruption); default: the profile's
    measured cost (``profile.checkpoint``), else :data:`predictor.runs.spot.DEFAULT_CHECKPOINT_S`.

    The steps: the instance types (:func:`_instance_types`) and the candidate shapes (:func:`_shapes`), predicted
    under the launchable layouts (:func:`_launchable`) and priced (:func:`_priced`); each candidate's time and cost
    with start-up, spot interruptions and the deadline's fallback (:func:`_score`); the constraints applied
    (:func:`_feasible`); the best first (:func:`_order`); the plan with its reasons and notes (:func:`_plan`).
    """
    constraints.validate()
    checkpoint_s, checkpoint_note, spreads, source = _checkpoint_cost(profile, checkpoint_s)
    catalog = _transported(catalog or Catalog.load(), constraints)
    cands.check_names(constraints, catalog)
    work = constraints.work(profile)
    factors = dict(calibration.factors) if calibration else None
    r = _Ranking(profile, constraints, catalog, work, checkpoint_s, calibration, factors, spot_stats, words, spreads,
                 source)  # fmt: skip
    types, names, efficient, layouts, many, cand = _candidates(r, Market(constraints.market).markets())
    known_startup = measured_startup()  # read once: the start-up figures and the plan's note
    current, current_note = _current(r)
    scored = _score(r, types, names, many, cand, current, known_startup)
    ok, keep = _feasible(r, scored, (types, names, many, cand, current, known_startup))
    key = scored.time_h if constraints.objective == Objective.TIME else scored.cost
    order, pareto_idx, keyed = _order(constraints, keep, key, scored)
    pareto_set = {int(i) for i in pareto_idx}

    def one(i: int, rank_no: int) -> PlanEntry:
        return entry(scored, i, rank_no, types, profile, current, i in pareto_set)

    entries = [one(i, n + 1) for n, i in enumerate(order)]
    front = [one(int(i), _place(int(i), order, keyed)) for i in pareto_idx]
    notes = (
        [n for n in (unmeasured_note(profile), no_table_note(profile), manual_loop_note(profile)) if n]  # caveats
        + _notes(constraints, work, checkpoint_s, checkpoint_note, names, efficient, calibration, current, spot_stats)
        + _spot_notes(constraints, spot_stats)
        + ([current_note] if current_note else [])
        + _startup_notes(constraints, types, entries[0], current, known_startup, words)
        + _outlier_notes(entries, types)
        + _risk_notes(constraints, scored, ok, key, entries, lambda i: one(i, 0))
        + validation_notes(profile, work, constraints, words)
    )
    # priced without the deadline (its fallback to on-demand is in the spot fleets' prices): what binds, measured
    relaxed = functools.partial(_without_deadline, r, scoring=(types, names, many, cand, current, known_startup))
    reason = why(constraints, entries[0], ok, _values(scored), key, relaxed)
    return _plan(r, scored, names, layouts, current, entries, front, reason, notes)


def _transported(catalog: Catalog, constraints: Constraints) -> Catalog:
    """The catalog as the fleets' nodes meet: with transport tcp, every type as a cluster without EFA sees it
    (NCCL's sockets, :meth:`Catalog.over_tcp`)."""
    return catalog.over_tcp() if constraints.transport == "tcp" else catalog


def _without_deadline(
    r: _Ranking, name: str, scoring: tuple[Any, ...]
) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """The values and key of the candidates priced without the deadline (``scoring``: :func:`_score`'s arguments
    after the ranking), for the counterfactual of a binding deadline; None for a limit that changes no price."""
    if name != "deadline_h":
        return None
    free = dataclasses.replace(r, constraints=dataclasses.replace(r.constraints, deadline_h=None))
    again = _score(free, *scoring)
    return _values(again), (again.time_h if r.constraints.objective == Objective.TIME else again.cost)


def _candidates(
    r: _Ranking, markets: tuple[str, ...]
) -> tuple[list[InstanceType], list[str], list[int], list[Layout], ManyPredictions, cands.Candidates]:
    """The instance types, the candidate shapes over them (the most cost-efficient types for 3-type mixes), each
    predicted under the launchable layouts and priced in the markets asked."""
    types = _instance_types(r)
    names = [it.name for it in types]
    efficient = (
        cands.efficient_types(r.profile, names, types, r.catalog, r.factors, r.constraints)
        if r.constraints.max_types >= 3
        else []
    )
    tidx, cnt = _shapes(r.constraints, types, efficient, markets)
    layouts = r.constraints.layout_list()
    many = predict_mixes(
        r.profile, names, tidx, cnt, catalog=r.catalog, calibration=r.factors, scaling=r.constraints.scaling,
        layouts=_launchable(r.constraints, layouts),
    )  # fmt: skip
    return types, names, efficient, layouts, many, _priced(r, many, types, markets)


@dataclass(frozen=True)
class _Ranking:
    """What one ranking is asked, read by its steps, and the candidates they exclude on the way, counted by reason
    (the steps fill ``excluded_types`` and ``excluded`` in order: the plan reports them as filled)."""

    profile: Profile
    constraints: Constraints
    catalog: Catalog
    work: Work
    checkpoint_s: float
    calibration: Calibration | None
    factors: dict[str, float] | None
    spot_stats: SpotStats | None
    words: Words = PYTHON
    # an estimated save (no profile measured it, none given): a sharded fleet's nodes each write their part
    checkpoint_spreads: bool = False
    checkpoint_source: CheckpointSource = "estimated"  # where checkpoint_s comes from (the plan records it)
    excluded: dict[str, int] = field(default_factory=dict)
    excluded_types: dict[str, int] = field(default_factory=dict)


def _checkpoint_cost(profile: Profile, checkpoint_s: float | None) -> tuple[float, str, bool, CheckpointSource]:
    """What one checkpoint costs on one node, where the figure comes from (a note, and the plan's word for it), and
    whether a sharded fleet's save spreads over its nodes: the one given, else the profile's measured save (or load,
    the larger), else its size written at the fleet's root volume's baseline
    (:func:`predictor.runs.spot.estimated_checkpoint_s`: a captured 70B model's 1.1 TB were priced at the 30 s a small
    model's checkpoint is assumed to take, a save on the spot notice with nothing lost), which spreads
    (:func:`predictor.runs.spot.sharded_save_s`)."""
    if checkpoint_s is not None:
        return checkpoint_s, "assumed", False, "given"
    measured = profile.checkpoint
    if measured is not None:
        note = f"measured by the profile ({measured.where or 'local'}; remote storage adds its transfer)"
        return max(measured.save_s, measured.load_s or 0.0), note, False, "measured"
    return (*unmeasured_checkpoint(profile), True, "estimated")


def unmeasured_checkpoint(profile: Profile) -> tuple[float, str]:
    """An unmeasured checkpoint's cost and its note (:func:`predictor.runs.spot.estimated_checkpoint_s`)."""
    state = checkpoint_bytes(profile)
    seconds = estimated_checkpoint_s(state)
    if seconds <= DEFAULT_CHECKPOINT_S:
        return seconds, "assumed"
    return seconds, (
        f"estimated: {three(state / 1e9)} GB of weights and optimizer state at the root volume's "
        f"{ROOT_VOLUME_BYTES_S / 2**20:.0f} MiB/s gp3 baseline, not measured; on a sharded fleet each node saves "
        "its part, in each entry's checkpoint_s"
    )


def _instance_types(r: _Ranking) -> list:
    """The instance types left to rank (:func:`predictor.ranking.candidates.instance_types`), counting the others
    by reason in ``excluded_types``.

    Raises:
        NoFeasibleConfigError: none is left, with the reasons and the constraints to relax.
    """
    excluded_types = r.excluded_types
    types = cands.instance_types(r.profile, r.constraints, r.catalog, excluded_types)
    if not types:
        raise NoFeasibleConfigError(
            "No instance type is left to rank: "
            + (", ".join(f"{n} {why}" for why, n in excluded_types.items()) or "the catalog has no CUDA types")
            + f". Check {names(r.words, 'allow', 'deny', 'regions')} (prices are bundled for us-east-1 and a few more) "
            f"and {r.words.name('allow_arm64')}.",
            binding=("instance_types",),
            excluded=excluded_types,
            hints=("allow", "deny", "regions", "allow_arm64"),
        )
    return types


def _shapes(
    constraints: Constraints, types: list, efficient: list[int], markets: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The candidate shapes (type index and count of each group, :func:`predictor.ranking.candidates.shapes`).

    Raises:
        ConfigError: more candidates (shapes x markets x regions) than
            :data:`predictor.ranking.candidates.MAX_CANDIDATES`.
    """
    total = cands.shape_count(len(types), len(efficient), constraints) * len(markets) * len(constraints.regions)
    if total > cands.MAX_CANDIDATES:
        raise ConfigError.between(
            f"{total:,} candidate fleets is over the limit of {cands.MAX_CANDIDATES:,}: lower {{max_instances}} "
            f"({constraints.max_instances}) or {{max_types}} ({constraints.max_types}), or narrow the types with "
            "{allow}.",
            parameter="max_instances",
            value=constraints.max_instances,
        )
    return cands.shapes(len(types), constraints, efficient)


def _launchable(constraints: Constraints, layouts: list[Layout]) -> list[Layout]:
    """The layouts asked that srifty launch can start (pipelines are only evaluated, :func:`_pipeline_note`).

    Raises:
        ConfigError: none of them is launchable.
    """
    runnable = [x for x in layouts if x.launchable]
    if not runnable:
        raise ConfigError(
            f"The 'layouts' constraint ({', '.join(constraints.layouts)}) has no layout srifty launch can start: "
            "pipelines are evaluated and shown next to the ranked fleets, never chosen. Add ddp or an fsdp layout.",
            parameter="layouts",
            value=list(constraints.layouts),
        )
    return runnable


def _priced(r: _Ranking, many: ManyPredictions, types: list, markets: tuple[str, ...]) -> cands.Candidates:
    """Every predicted shape in every market and region it has a price in
    (:func:`predictor.ranking.candidates.price`).

    Raises:
        NoFeasibleConfigError: no shape has a price.
    """
    constraints, excluded = r.constraints, r.excluded
    cand = cands.price(many, types, constraints, markets, excluded)
    if not len(cand.shape):
        raise NoFeasibleConfigError(
            f"No fleet has a {constraints.market} price in {', '.join(constraints.regions)}. "
            f"Try {r.words.setting('regions', ('us-east-1',))} or {r.words.setting('market', 'any')}.",
            binding=("market",),
            excluded=excluded,
            hints=("regions", "market"),
        )
    return cand


def _score(
    r: _Ranking,
    types: list,
    names: list[str],
    many: ManyPredictions,
    cand: cands.Candidates,
    current: CurrentFleet | None,
    known_startup: dict[str, float],
) -> Scored:
    """Each priced candidate's wall time and cost for the work: the new fleet's start-up (none for the fleet already
    running), the expected spot interruptions and restarts, EC2's per-second billing; under a deadline, spot and
    mixed fleets as srifty launch's policy runs them (falling back to on-demand, :func:`expected_with_fallback`)."""
    constraints, spot_stats, checkpoint_s = r.constraints, r.spot_stats, r.checkpoint_s
    startup_by_shape = (
        np.full(len(many.counts), float(constraints.startup_s))
        if constraints.startup_s is not None
        else fleet_startup_s(types, many.type_index, many.counts, constraints.dataset_gb, known_startup)
    )
    if current is not None:  # the fleet already running starts nothing
        startup_by_shape = np.where(_is_fleet(current[0], names, many), 0.0, startup_by_shape)
    s = cand.shape
    startup = startup_by_shape[s]
    run_s = r.work.samples / many.throughput_samples_s[s]
    rate = cand.rate_per_hr if spot_stats is None else row_sum(cand.spot) * spot_stats.rate_per_hr
    gpus = many.group_gpus[s].sum(axis=1)  # every fleet, on-demand too, loses a node without a notice now and then
    save_s = _save_s(r, many, s)
    cap = _interval_cap(r, many, cand, startup, save_s, run_s, gpus)
    spot = spot_cost(
        run_s, np.ones(len(s)), rate, save_s, restart_s=startup, gpus=gpus, load_s=checkpoint_s, max_interval_s=cap
    )
    wall_s = startup + spot.expected_time_s
    usd_hr = row_sum(cand.group_usd)
    scored = Scored(
        many, cand, spot, wall_s / 3600, usd_hr * billed_hours(wall_s), usd_hr, tuple(constraints.regions), startup,
        save_s, np.zeros(len(s)),
    )  # fmt: skip
    if constraints.deadline_h is None:
        return scored
    # the work as an on-demand fleet trains it: its node failures priced (spot's interruptions not), what the
    # deadline's on-demand spells and moves take, as every on-demand fleet's own time does (a review: a guarded spot
    # fleet running all on-demand outranked the same fleet bought on-demand, whose failures alone were priced)
    od_run_s = on_demand_cost(run_s, save_s, restart_s=startup, gpus=gpus, load_s=checkpoint_s).expected_time_s
    scored, odds = _under_deadline(r, scored, od_run_s, DOWN_SPELL_S if spot_stats is None else spot_stats.down_s)
    return _with_late_moves(r, scored, odds, od_run_s) if constraints.move_if_late else scored


def _interval_cap(r: _Ranking, many: ManyPredictions, cand: cands.Candidates, startup: np.ndarray,
                  save_s: np.ndarray, run_s: np.ndarray, gpus: np.ndarray) -> np.ndarray | float:  # fmt: skip
    """Under a deadline, the periodic checkpoint interval of each guarded (spot or mixed) fleet whose save does not
    fit the spot notice (:func:`deadline_interval_cap_s`, at the plan's confidence: the quantile the policy plans
    for until it measures the step). inf elsewhere (Young-Daly's interval alone)."""
    c = r.constraints
    if c.deadline_h is None:
        return math.inf
    at = np.flatnonzero(_guarded_mask(cand) & ~saves_on_notice(save_s))  # those only: a million candidates, few here
    if not at.size:
        return math.inf
    factor = at_confidence(many.model_sd[cand.shape[at]], c.confidence)
    cap = np.full(len(run_s), np.inf)
    cap[at] = deadline_interval_cap_s(
        c.deadline_h * 3600.0, startup[at], save_s[at], r.checkpoint_s, run_s[at], gpus[at], factor
    )
    return cap


def _guarded_mask(cand: cands.Candidates) -> np.ndarray:
    """The candidates srifty launch's deadline policy guards: spot or mixed, with an on-demand price to fall back on."""
    return (cand.market != 0) & np.isfinite(cand.od_usd)


def _save_s(r: _Ranking, many: ManyPredictions, s: np.ndarray) -> np.ndarray:
    """Each candidate's checkpoint save: an estimated one (:attr:`_Ranking.checkpoint_spreads`) as the busiest node of
    a sharded layout writes its part (:func:`predictor.runs.spot.busiest_node_share`); DDP's rank 0 and a pipeline's
    (Lightning has none: the script's own) write it whole, as does a measured or given save."""
    sharded = np.array([parse_layout(name).sharded for name in many.layout_names])
    return _fleet_save_s(r, many.group_gpus[s], many.counts[s], sharded[many.layout_index[s]])


def _fleet_save_s(r: _Ranking, group_gpus: np.ndarray, counts: np.ndarray, sharded: np.ndarray | bool) -> np.ndarray:
    """The save of each fleet of (N, K) GPUs and instances by group: the ranking's one figure, or an estimated one as
    the busiest node of a sharded fleet writes its part (:func:`_save_s`; the current fleet's, :func:`_current`)."""
    if not r.checkpoint_spreads:
        return np.full(len(np.atleast_2d(counts)), float(r.checkpoint_s))
    return sharded_save_s(r.checkpoint_s, busiest_node_share(group_gpus, counts, sharded))


def _under_deadline(r: _Ranking, scored: Scored, run_s: np.ndarray, down_s: float) -> tuple[Scored, DeadlineOdds]:
    """Under the deadline: each candidate's chance of meeting it, and the spot and mixed fleets (guarded) as srifty
    launch's policy runs them (:func:`expected_with_fallback`), with their intervals (for the entries only)."""
    many, cand, spot, startup, usd_hr = scored.many, scored.cand, scored.spot, scored.startup_s, scored.usd_hr
    c, s, save_s = r.constraints, cand.shape, scored.save_s
    guarded = _guarded_mask(cand)
    deadline_s = float(c.deadline_h or 0.0) * 3600

    # what a preemption can lose where the save does not fit the notice: the training since the last periodic save
    at_risk = np.where(saves_on_notice(save_s), 0.0, spot.checkpoint_interval_s)

    def fallback_at(factor: np.ndarray | float = 1.0, at: Any = slice(None)) -> Fallback:
        """The guarded fleets (``at``: those candidates) as the policy runs them, the work (and what it exposes to
        spot) x ``factor``."""
        return expected_with_fallback(
            spot.expected_time_s[at] * factor, run_s[at] * factor, spot.expected_interruptions[at] * factor,
            deadline_s, startup[at], startup[at] + save_s[at] + r.checkpoint_s, usd_hr[at], cand.od_usd[at],
            down_s=down_s, at_risk_s=np.minimum(at_risk[at], run_s[at] * factor),
        )  # fmt: skip

    def ranges_of(i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidates ``i``'s intervals as the policy runs them (:func:`guarded_ranges`): for the entries only, a
        million candidates need none."""
        step = many.iteration_time_s[s[i]]
        speeds = (many.iteration_time_lo_s[s[i]] / step, many.iteration_time_hi_s[s[i]] / step)
        floor = usd_hr[i] * billed_hours(np.zeros(len(i)))  # the minimum bill, as the point's cost
        runs = (fallback_at(f, i) for f in (1.0, *speeds))
        times, costs = guarded_ranges(*(dataclasses.replace(f, cost_usd=np.maximum(f.cost_usd, floor)) for f in runs))
        keep = guarded[i][:, None]
        return np.where(keep, times, np.nan), np.where(keep, costs, np.nan)

    fb = fallback_at()
    wall_s = scored.time_h * 3600
    odds = deadline_odds(
        deadline_s, c.confidence, many.model_sd[s], startup, np.where(guarded, run_s, wall_s - startup), guarded,
        fallback_at,
    )  # fmt: skip
    return dataclasses.replace(
        scored, time_h=np.where(guarded, fb.time_s, wall_s) / 3600,
        cost=np.where(guarded, np.maximum(fb.cost_usd, usd_hr * billed_hours(np.zeros(len(s)))), scored.cost),
        od_share=np.where(guarded, fb.od_share, 0.0), deadline_p=odds.probability,
        confident_time_h=odds.time_s / 3600, guarded_ranges=ranges_of,
    ), odds  # fmt: skip


def _with_late_moves(r: _Ranking, scored: Scored, odds: DeadlineOdds, run_s: np.ndarray) -> Scored:
    """The on-demand fleets under the confidence on their own, ranked with the move the job's deadline trigger makes
    when its measured speed is late (:func:`predictor.runs.odds.late_moves`): their expected time and cost, and
    their chance of finishing in time, the move counted."""
    c, many, s = r.constraints, scored.many, scored.cand.shape
    # a fleet moved to must be one the ranking could choose: it trains the model, and within the price per hour
    trains = many.splittable[s] & many.fits_memory[s] & (many.memory_share[s] <= 1 - c.min_memory_headroom)
    movable = (scored.cand.market == 0) & trains & (scored.usd_hr <= (c.max_hourly_usd or math.inf))
    moves = late_moves(
        float(c.deadline_h or 0.0) * 3600, c.confidence, odds,
        sd=many.model_sd[s], startup_s=scored.startup_s, train_s=run_s,
        wall_s=scored.time_h * 3600, cost_usd=scored.cost, usd_hr=scored.usd_hr, movable=movable,
        group=scored.cand.region, save_s=scored.save_s, resume_s=RESTART_S + r.checkpoint_s,
        by_time=c.objective == Objective.TIME, cost_cap=c.budget_usd if c.budget_usd is not None else math.inf,
    )  # fmt: skip
    return dataclasses.replace(
        scored, time_h=moves.time_s / 3600, cost=moves.cost_usd, deadline_p=moves.probability,
        confident_time_h=moves.confident_time_s / 3600, late_target=moves.target, late_p=moves.move_p,
        late_ranges=(moves.time_range_s, moves.cost_range_usd),
    )  # fmt: skip


def _values(scored: Scored) -> dict[str, np.ndarray]:
    """The measures the constraints limit, by the names the explanations use."""
    instances = scored.cand.on_demand.sum(axis=1) + scored.cand.spot.sum(axis=1)
    return {
        "time_h": scored.time_h,
        # what the deadline limits: the time at the confidence asked (the point estimate without a deadline)
        "confident_time_h": scored.time_h if scored.confident_time_h is None else scored.confident_time_h,
        "cost_usd": scored.cost,
        "usd_per_hour": scored.usd_hr,
        "instances": instances,
        **({} if scored.deadline_p is None else {"deadline_p": scored.deadline_p}),
    }


def _described(e: PlanEntry) -> str:
    """A fleet in a refusal's words: what it is, where bought, what it costs (at its predicted time, which a
    refusal at a confidence may not name: a trial read a 90 % time beside the median's cost), and the share of the
    work a spot fleet's deadline runs on-demand, which its cost holds (a trial read a spot fleet's "$0.41/h, $3.16
    for the work in its predicted 3.92 h", the on-demand fallback's cost, unexplained)."""
    said = (
        f"{e.fleet}, {e.market}, ${e.usd_per_hour:,.2f}/h, ${e.cost_usd:,.2f} for the work in its predicted "
        f"{fmt('time_h', e.time_h)}"
    )
    if e.on_demand_fallback:
        share = e.on_demand_fallback
        said += f", {'<1%' if share < 0.005 else '>99%' if 0.995 <= share < 1 else f'{share:.0%}'} of it on-demand"
        said += " to keep the deadline"
    return said


def _feasible(r: _Ranking, scored: Scored, scoring: tuple[Any, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ok, keep) over the priced candidates: ok splits the global batch and fits in GPU memory with the headroom
    asked; keep is ok and within the limits (max_hourly_usd, deadline_h, budget_usd). The others are counted by
    reason in ``excluded``. ``scoring``: :func:`_score`'s arguments after the ranking, for a refusal's words (each
    best fleet described, and a money limit's best priced without a deadline no fleet meets).

    Raises:
        NoFeasibleConfigError: nothing is kept, naming the binding constraint (:func:`infeasible`).
    """
    constraints, excluded = r.constraints, r.excluded
    many, s = scored.many, scored.cand.shape
    splittable = many.splittable[s]
    cands.count(excluded, f"more GPUs than the {r.work.global_batch} samples of the global batch", ~splittable)
    fits = many.fits_memory[s] & (many.memory_share[s] <= 1 - constraints.min_memory_headroom)
    manual = bool(r.profile.batch.manual_optimization)
    cands.count(
        excluded,
        "does not fit in GPU memory (with the headroom asked"
        + (
            ", and without gradient accumulation, which Lightning refuses for a module that steps its own optimizers)"
            if manual
            else ", even with gradient accumulation)"
            if constraints.scaling == "strong"
            else ")"
        ),
        splittable & ~fits,
    )
    ok = splittable & fits
    keep = ok.copy()
    values = _values(scored)  # once: it sums the fleets' instances over every candidate
    for name, limit in constraints.limits().items():
        measure = values[LIMIT_OF[name]]
        over = keep & (measure > limit)
        said = r.words.name(name)
        reason = f"under {constraints.confidence:.0%} to meet {said}" if name == "deadline_h" else f"over {said}"
        cands.count(excluded, reason, over)
        keep &= ~over
    if not keep.any():
        if scoring is None:
            raise infeasible(constraints, ok, values, excluded, r.words)
        raise infeasible(
            constraints, ok, values, excluded, r.words, _describer(r, scored, scoring[0]),
            unbound=lambda: _unbound(r, scoring),
        )  # fmt: skip
    return ok, keep


def _describer(r: _Ranking, scored: Scored, types: list) -> Callable[[int], str]:
    """Candidate index -> the fleet in a refusal's words (:func:`_described`), as ``scored`` prices it."""
    return lambda i: _described(entry(scored, i, 1, types, r.profile, None, False))


def _unbound(r: _Ranking, scoring: tuple[Any, ...]) -> tuple[dict[str, np.ndarray], Callable[[int], str]]:
    """The candidates' values and words priced without the deadline (``scoring``: :func:`_score`'s arguments after
    the ranking): a money limit's best where no fleet meets the deadline (a trial's budget read the cheapest at
    $0.07, the fallback's on-demand price of a deadline none met, where the cheapest without it is $0.02)."""
    free = dataclasses.replace(r, constraints=dataclasses.replace(r.constraints, deadline_h=None))
    again = _score(free, *scoring)
    return _values(again), _describer(free, again, scoring[0])


def _order(
    constraints: Constraints, keep: np.ndarray, key: np.ndarray, scored: Scored
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(the ``top`` kept candidates, best first; the Pareto front of time and cost; the key with infinity where not
    kept). Each place goes to the best by the other measure (cost for a time objective, time for cost; then the key)
    of the fleets within :data:`~predictor.ranking.explain.TIE` of the best left by the objective's ``key`` and with
    no more of their instances on spot than it: a difference no prediction resolves, as a refusal names them. The
    fastest was first at any price (p6-b300.48xlarge:2 for 6.897 min and $32.74 before p6-b200.48xlarge:2 for 6.928
    min and $26.31); spot's risk is no such difference (an audit: the advisor's buckets price a V100's spot capacity
    far below what its traces show, and the time's interval leaves it out), so a spot fleet never ties with an
    on-demand one."""
    keyed = np.where(keep, key, np.inf)
    top = min(constraints.top, int(keep.sum()))
    other = scored.cost if constraints.objective == Objective.TIME else scored.time_h
    spot = scored.cand.spot.sum(axis=1) / np.maximum(
        scored.cand.spot.sum(axis=1) + scored.cand.on_demand.sum(axis=1), 1
    )
    # a place's pick is within TIE of the best left, itself at most the top-th best: no later candidate can be picked
    bound = np.partition(keyed, top - 1)[top - 1] * (1 + TIE) if top < len(keyed) else np.inf
    left = [int(i) for i in np.flatnonzero(keyed <= bound)]
    order: list[int] = []
    while left and len(order) < top:
        best = min(left, key=lambda i: (keyed[i], spot[i]))
        tied = [i for i in left if keyed[i] <= keyed[best] * (1 + TIE) and spot[i] <= spot[best] + 1e-9]
        pick = min(tied, key=lambda i: (other[i], keyed[i]))
        order.append(pick)
        left.remove(pick)
    return order, pareto(np.flatnonzero(keep), scored.time_h, scored.cost), keyed


def _place(i: int, order: list[int], keyed: np.ndarray) -> int:
    """Candidate ``i``'s place: its place in ``order`` where listed (the tie rule may list it after a worse key), else
    at least the place after the list."""
    return order.index(i) + 1 if i in order else max(len(order), int((keyed < keyed[i]).sum())) + 1


def _plan(
    r: _Ranking,
    scored: Scored,
    names: list[str],
    layouts: list[Layout],
    current: CurrentFleet | None,
    entries: list[PlanEntry],
    front: list[PlanEntry],
    reason: str,
    notes: list[str],
) -> Plan:
    """The plan: the ranked entries and the Pareto front, why the first is chosen (and runs its layout,
    :func:`layout_why`), and the notes with the layouts' (:func:`_layout_notes`, :func:`_pipeline_note`) and what
    acts through a deadline given without one (:func:`_deadline_only_notes`)."""
    profile, constraints, catalog, factors, calibration = r.profile, r.constraints, r.catalog, r.factors, r.calibration
    many = scored.many

    def predict_ddp(fleet: str):
        from predictor.model.predict import predict

        return predict(profile, fleet, catalog=catalog, calibration=factors, scaling=constraints.scaling, layout="ddp")

    best_gib = min(catalog.get(g.instance_type).gpu_memory_gib for g in entries[0].groups)
    pipelines = [x for x in layouts if not x.launchable]
    pipeline_note = (
        _pipeline_note(profile, names, many, pipelines, catalog, factors, constraints.scaling) if pipelines else None
    )
    return Plan(
        schema=PLAN_SCHEMA,
        constraints=constraints.to_plan(r.work, current[0] if current else None),
        entries=tuple(entries),
        pareto=tuple(front),
        chosen=0,
        why=reason + layout_why(profile, entries[0], predict_ddp, best_gib),
        # every shape in every region and market, priced or not: the exclusions (a shape without a price in a
        # region among them) are counted over the same candidates, so they never add up past it
        considered=len(many.counts) * len(scored.regions) * len(Market(constraints.market).markets()),
        excluded=r.excluded,
        excluded_types=r.excluded_types or None,
        calibration=tuple(calibration.entries()) if calibration and calibration.factors else None,
        catalog_source=catalog.info.source,
        catalog_snapshot=catalog.info.snapshot,
        model=profile.model.name,
        profile_gpu=profile.hardware.gpu,
        software=profile.software,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        written_by=writer(),
        performance_model=model_version(),
        checkpoint_s=float(r.checkpoint_s),
        checkpoint_source=r.checkpoint_source,
        notes=tuple(
            notes
            + _layout_notes(constraints, many)
            + ([pipeline_note] if pipeline_note else [])
            + _deadline_only_notes(constraints, r.words)
        ),
    )


def _deadline_only_notes(constraints: Constraints, words: Words) -> list[str]:
    """What a constraint that acts through the deadline did without one: nothing (a trial's confidence of 0.8 with
    no deadline was taken without a word, and the plan recorded it as though it had counted)."""
    if constraints.deadline_h is not None:
        return []
    defaults = constraint_defaults()
    given = [
        words.setting(name, getattr(constraints, name))
        for name in ("confidence", "move_if_late")
        if getattr(constraints, name) != defaults[name]
    ]
    if not given:
        return []
    return [
        f"{' and '.join(given)} {'act' if len(given) > 1 else 'acts'} {DEADLINE_ONLY_NOTE}: "
        f"{'they' if len(given) > 1 else 'it'} changed nothing in this ranking (give "
        f"{words.name('deadline_h')} to rank by the chance of meeting it)"
    ]


def _notes(
    constraints: Constraints,
    work: Work,
    checkpoint_s: float,
    checkpoint_note: str,
    names: list[str],
    efficient: list[int],
    calibration: Calibration | None,
    current: CurrentFleet | None,
    spot_stats: SpotStats | None,
) -> list[str]:
    """The plan's notes on its scaling, work, spot overhead (the traces' interruption rates where ``spot_stats``,
    else the Spot Advisor's), mixes, calibration and the current fleet."""
    rates = "the spot traces'" if spot_stats is not None else "Spot Advisor"
    if constraints.scaling == "strong":
        scaling = (
            f"strong scaling: every fleet trains the profiled global batch of {work.global_batch} samples per "
            "optimizer step (the same training), split over its GPUs, with gradient accumulation where a GPU cannot "
            "hold its share"
        )
    else:
        scaling = (
            "weak scaling (asked): every GPU keeps the profiled per-GPU batch, so the global batch grows with the "
            "fleet and the training changes (learning rate, convergence)"
        )
    notes = [
        scaling,
        f"work: {work.samples:,.0f} samples ({work.optimizer_steps:,.0f} optimizer steps of the profiled global batch "
        f"of {work.global_batch}); spot overhead with a {checkpoint_s:.3g} s checkpoint ({checkpoint_note}) and "
        f"{rates} interruption rates, and node failures without a notice at {FAILURES_PER_GPU_HR:.2g} per "
        "GPU-hour on every fleet (checkpointed at Young-Daly's interval); any lost instance stops a synchronous DDP "
        "step until it is replaced",
    ]
    if constraints.max_types >= 3 and len(names) > cands.MIX3_TYPES:
        notes.append(
            f"3-type mixes formed from the {cands.MIX3_TYPES} most cost-efficient types only: "
            + ", ".join(names[j] for j in efficient)
        )
    if calibration and calibration.factors:
        notes.append(
            "calibrated from observed runs of this model: "
            + ", ".join(
                f"{g} x{f:.2f} ({calibration.observations.get(g, 1)} runs)" for g, f in calibration.factors.items()
            )
        )
    if current:
        notes.append(f"savings and migration effort against {current[0]} ({current[2]:,.2f} USD for the work)")
    if constraints.transport == "tcp":
        notes.append(
            f"{TRANSPORT_NOTE}: multi-node fleets priced with NCCL's sockets over each node's primary interface, "
            "EFA not used where a type has it (the Terraform srifty writes from this plan attaches none)"
        )
    return notes


TRANSPORT_NOTE = "transport tcp (asked)"  # how the note begins (srifty recommend prints it)


LATE_MOVE_NOTE = "move_if_late:"  # how the note of the choice's move when late begins (the CLI shows it)
BUDGET_NOTE = "budget at risk"  # how the note of a choice whose cost interval passes the budget begins (CLI shows it)
DEADLINE_ONLY_NOTE = "through a deadline, and none was given"  # inside the note of _deadline_only_notes (CLI shows it)
RISK_NOTE = "left out for risk"  # how the note of the fleets the confidence alone left out begins (the CLI shows it)


def _risk_notes(
    constraints: Constraints,
    scored: Scored,
    ok: np.ndarray,
    key: np.ndarray,
    entries: list[PlanEntry],
    entry_of: Callable[[int], PlanEntry],
    shown: int = 3,
) -> list[str]:
    """Under a deadline, the fleets better by the objective than the choice whose predicted time meets the deadline
    but whose chance of it is under the confidence asked: what the confidence costs, and what it avoids; then the
    choice's move when late (:func:`_late_move_notes`) and its cost interval against the budget
    (:func:`_budget_notes`)."""
    late = _late_move_notes(constraints, entries) + _budget_notes(constraints, entries)
    if scored.deadline_p is None or constraints.deadline_h is None or not entries:
        return late
    values = _values(scored)
    others = within(constraints, ok, values, leave_out="deadline_h")
    risky = others & (scored.time_h <= constraints.deadline_h) & (scored.deadline_p < constraints.confidence)
    best = entries[0].time_h if constraints.objective == Objective.TIME else entries[0].cost_usd
    risky &= key < best
    if not risky.any():
        return late
    idx = np.flatnonzero(risky)
    idx = idx[np.argsort(key[idx], kind="stable")][:shown]
    said = []
    for i in idx:
        e = entry_of(int(i))
        p = chance_beside(float(scored.deadline_p[i]), constraints.confidence)
        said.append(
            f"{e.fleet} ({e.market}, {fmt('time_h', e.time_h)}, ${e.cost_usd:,.2f}) meets "
            f"{fmt('time_h', constraints.deadline_h)} at {p}"
        )
    lower = "--confidence lowers it" + (
        "; no move when late is counted for them: no fleet could take the rest in time, or the move is not expected "
        f"to save {LATE_MOVE_GAIN:.0%} over that fleet"
        if constraints.move_if_late
        else "; --move-if-late counts a late move"
    )
    return [
        f"{RISK_NOTE} (under the {constraints.confidence:.0%} confidence asked; {lower}): " + "; ".join(said),
        *late,
    ]


def _budget_notes(constraints: Constraints, entries: list[PlanEntry]) -> list[str]:
    """The choice's 80 % cost interval past the budget, said: the budget holds its expected cost (a trial's spot plan
    listed at $9.06 under a $15 budget replayed at $26-52 in windows with little spot)."""
    e = entries[0] if entries else None
    if e is None or constraints.budget_usd is None or e.cost_interval_usd[1] <= constraints.budget_usd:
        return []
    why = (
        "spot capacity over the run's hours: a window with less spot than the mean runs more of it on-demand"
        if e.market != "on-demand"
        else "the prediction's spread"
    )
    usd = lambda v: f"${v:,.2f}" if v >= 1 else f"${v:.3g}"  # noqa: E731 - cents as the table shows them ($0.0194)
    return [
        f"{BUDGET_NOTE}: {e.fleet} ({e.market}) is within the {usd(constraints.budget_usd)} budget at its expected "
        f"{usd(e.cost_usd)}; its 80% cost interval reaches {usd(e.cost_interval_usd[1])} ({why})"
    ]


def _late_move_notes(constraints: Constraints, entries: list[PlanEntry]) -> list[str]:
    """The choice's move when late (``move_if_late``), in words: its own chance, the move's, what it needs."""
    e = entries[0] if entries else None
    if e is None or e.late_move_to is None or e.late_move_chance is None or constraints.deadline_h is None:
        return []
    return [
        f"{LATE_MOVE_NOTE} {e.fleet} meets {fmt('time_h', constraints.deadline_h)} at {1 - e.late_move_chance:.0%} on "
        f"its own; when MigrationTriggers measures it late (by {LATE_CHECK_S / 60:.0f} min of training) the job "
        f"re-ranks what is left and moves to a fleet that meets it at the {constraints.confidence:.0%} asked "
        f"({e.late_move_to} does): {chance(e.deadline_probability)} with the move. Its time and cost are the "
        "expectation of the two ways. The Trainer must carry SpotPreemption() and MigrationTriggers(), run by srifty "
        "launch (docs/migration.md)"
    ]


def _outlier_notes(entries: list[PlanEntry], types: list[InstanceType]) -> list[str]:
    """A note for each spot price of a listed fleet that is far below its region's other zones
    (:meth:`InstanceType.spot_outlier`) or whose interruption rate is assumed (:meth:`InstanceType.spot_unlisted`)."""
    by_name = {t.name: t for t in types}
    said: dict[tuple[str, str], str] = {}
    estimated: dict[str, list[Price]] = {}  # by region: the spot prices that are estimates, not a zone's measure
    for e in entries:
        if e.market == "on-demand":
            continue
        for g in e.groups:
            key = (g.instance_type, e.region)
            if key not in said and g.instance_type in by_name and g.spot:
                it = by_name[g.instance_type]
                said[key] = "; ".join(n for n in (it.spot_outlier(e.region), it.spot_unlisted()) if n)
                price = it.price(e.region, "spot")
                if price is not None and price.estimated:
                    estimated.setdefault(e.region, []).append(dataclasses.replace(price, source=it.name))
    return [note for note in said.values() if note] + [_estimated_note(r, p) for r, p in estimated.items()]


def _estimated_note(region: str, prices: list[Price]) -> str:
    """The listed fleets' spot prices in ``region`` that the catalog estimates (on-demand less the Spot Instance
    Advisor's savings) where no zone's price was measured: a trial read $0.41/h in the table as a price, where the
    catalog shows it as ~0.410."""
    names = [p.source for p in prices]
    named = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
    dates = sorted({p.as_of for p in prices if p.as_of})
    return (
        f"the spot price{'s' if len(names) > 1 else ''} of {named} in {region} "
        f"{'are estimates' if len(names) > 1 else 'is an estimate'} (on-demand less the Spot Instance Advisor's "
        f"savings{', ' + ' to '.join(dates[:: max(1, len(dates) - 1)]) if dates else ''}), not a zone's measured "
        f"price: {SPOT_OUTLIER_HINT} (aws ec2 describe-spot-price-history --instance-types {' '.join(names)})"
    )


# Fewer spells with spot than this and the traces' interruption rate is uncertain by more than a third (Poisson:
# 1 / sqrt(n)): said in the plan's notes (a trial's 4-tick trace priced 8 interruptions an hour without a word).
FEW_SPELLS = 10


def _spot_notes(constraints: Constraints, stats: SpotStats | None) -> list[str]:
    notes = []
    if stats is not None and constraints.market != "on-demand":
        notes.append(
            f"spot capacity from the traces {stats.source}: spot there {stats.availability:.0%} of the time, "
            f"{stats.rate_per_hr:.3g} interruptions per instance-hour (in place of the Spot Advisor rates), "
            f"{stats.down_s / 3600:.2f} h without spot on average after one"
            + (
                f"; from {stats.spells} spell{'s' if stats.spells != 1 else ''} with spot, so the rate is uncertain "
                f"by about x{1 + 1 / math.sqrt(stats.spells):.2g} (a longer trace narrows it)"
                if stats.spells is not None and stats.spells < FEW_SPELLS
                else ""
            )
        )
    if constraints.deadline_h is not None and constraints.market != "on-demand":
        wait = DOWN_SPELL_S / 3600 if stats is None else stats.down_s / 3600
        where = "the spot-traces' median" if stats is None else "the traces'"
        notes.append(
            "spot and mixed fleets include the on-demand fallback srifty launch's deadline policy would make (each "
            f"interruption also waits {wait:.1f} h for capacity, {where}; on_demand_fallback: the expected share): "
            "check one on a trace with srifty replay"
        )
    return notes


def _layout_notes(constraints: Constraints, many) -> list[str]:
    """How the layouts were ranked, and how many fleets each was kept for."""
    kept = np.bincount(many.layout_index[many.fits_memory], minlength=len(many.layout_names))
    used = ", ".join(f"{name} {n:,}" for name, n in zip(many.layout_names, kept) if n)
    return [
        "layouts: each fleet is ranked with the simplest of "
        + ", ".join(x.name for x in constraints.layout_list() if x.launchable)
        + f" that fits, unless a more complex one is over {PREFER_SIMPLER:.0%} faster (fleets that fit, by layout: "
        + (used or "none")
        + "); FSDP and activation checkpointing need the model's block (model.structure) where they checkpoint or "
        "wrap by block"
    ]


def _pipeline_note(profile, names, many, pipelines, catalog, factors, scaling) -> str | None:
    """Pipelines (evaluated, not launchable): the fleet where one does best against that fleet's ranked layout."""
    st = profile.model.structure
    if not (st is not None and st.blocks and st.block and st.saved_bytes_per_sample is not None):
        return "pipelines not evaluated: they are staged by the model's blocks, and the profile has no model.structure"
    present = many.counts > 0
    rows = np.flatnonzero((present.sum(axis=1) == 1) & (row_sum(many.counts) >= 2))
    if not len(rows):
        return "pipelines: no fleet of two or more nodes of one type to stage them on"
    try:
        pipe = predict_mixes(
            profile, names, many.type_index[rows], many.counts[rows], catalog=catalog, calibration=factors,
            scaling=scaling, layouts=pipelines,
        )  # fmt: skip
    except SriftyError as exc:
        return f"pipelines not evaluated: {exc}"
    fit = pipe.fits_memory & pipe.splittable
    if not fit.any():
        return f"pipelines ({', '.join(x.name for x in pipelines)}): none of {len(rows):,} multi-node fleets fits"
    both = fit & many.fits_memory[rows]  # compared where a launchable layout runs the same fleet, else by speed
    gain = pipe.throughput_samples_s / np.where(both, many.throughput_samples_s[rows], 1.0)
    j = int(np.argmax(np.where(both if both.any() else fit, gain, -np.inf)))
    r = int(rows[j])
    fleet = ",".join(f"{names[t]}:{c}" for t, c in zip(many.type_index[r], many.counts[r]) if c)
    name = layout_of(pipe, j).name
    theirs = (
        f"its ranked layout {layout_of(many, r).name}: {three(many.throughput_samples_s[r])} samples/s, "
        f"{many.memory_gib[r]:.1f} GiB/GPU"
        if many.fits_memory[r]
        else "no launchable layout fits it"
    )
    return (
        f"pipelines (evaluated, not launchable; {PIPELINE_NEEDS}): best {name} on {fleet}: "
        f"{three(pipe.throughput_samples_s[j])} samples/s, {pipe.memory_gib[j]:.1f} GiB/GPU, "
        f"{pipe.accumulation[j]} micro-batches per step ({theirs})"
    )


def _is_fleet(fleet: str, names: list[str], many) -> np.ndarray:
    """Which candidate shapes are exactly ``fleet`` (``type:count[,type:count]``)."""
    want = np.zeros(len(names) + 1, dtype=int)
    for part in fleet.split(","):
        name, _, n = part.partition(":")
        if name not in names:
            return np.zeros(len(many.counts), dtype=bool)
        want[names.index(name)] = int(n or 1)
    counts, tidx = many.counts, many.type_index
    same = np.all((counts == 0) | (want[tidx] == counts), axis=1)
    return same & (counts.sum(axis=1) == want.sum())


def _startup_notes(
    constraints: Constraints,
    types: list,
    best: PlanEntry,
    current: CurrentFleet | None,
    known: dict[str, float],
    words: Words = PYTHON,
) -> list[str]:
    """What start-up and billing assume (``words``: the caller's), and "keep the fleet you have" when it finishes
    sooner and for less."""
    if constraints.startup_s is not None:
        how = f"{constraints.startup_s:.0f} s as given"
    else:
        used = {it.name for it in types} & set(known)
        how = (
            f"{PROVISION_S['default']:.0f} s provisioning ({PROVISION_S['large']:.0f} s for p4d/p5-class), "
            f"{BOOT_S:.0f} s boot, {SETUP_S:.0f} s setup, {WARMUP_S:.0f} s warm-up"
            + (f", data staging of {constraints.dataset_gb:g} GB" if constraints.dataset_gb else "")
            + (f"; provisioning measured by srifty launch for {', '.join(sorted(used))}" if used else "")
        )
        ready = sorted({it.name for it in types} & set(measured_ready()))
        if ready:
            how += f"; boot to first step (boot, setup, warm-up) measured by srifty launch for {', '.join(ready)}"
    notes = [
        f"every new fleet's time and cost include its start-up ({how}; override with {words.name('startup_s')}) and "
        "EC2's per-second "
        f"billing with a {BILLING_MINIMUM_S:.0f} s minimum per instance"
    ]
    if current is not None:
        fleet, _, cost, hours = current
        if best.fleet == fleet:
            notes.append(
                f"keep the fleet you have: {fleet} is the best fleet for this work (it starts nothing; every new "
                "fleet pays its start-up first)"
            )
        elif hours <= best.time_h and cost <= best.cost_usd:
            notes.append(
                f"keep the fleet you have: {fleet} finishes the work in {hours * 60:.3g} min for {cost:,.4g} USD, "
                f"sooner and cheaper than the best new fleet ({best.fleet}: {best.time_h * 60:.3g} min with "
                # every entry rank builds has its start-up (None only in plans written before it was recorded)
                f"{(best.startup_s or 0.0) / 60:.3g} min of start-up, {best.cost_usd:,.4g} USD)"
            )
    return notes


def _current(r: _Ranking) -> tuple[CurrentFleet | None, str | None]:
    """((fleet, GPU, on-demand cost of the work) of the current hardware when known, priced and able to train the
    model; else None), and a note when it is known but cannot be compared."""
    profile, constraints, catalog, work, factors = r.profile, r.constraints, r.catalog, r.work, r.factors
    text = constraints.current_fleet
    if text is None and profile.hardware.instance_type:
        text = f"{profile.hardware.instance_type}:{max(1, profile.hardware.nodes)}"
    if text is None:
        return None, None
    try:
        fleet = parse_fleet(text, catalog, "current_fleet" if constraints.current_fleet is not None else "fleet")
    except SriftyError:
        if constraints.current_fleet is not None:
            raise
        return None, None  # the profiled instance is not in the catalog: no comparison
    from predictor.model.predict import predict

    reason = None
    for g in fleet.groups:
        name = g.instance.gpu
        gpu = catalog.gpu(name) if name is not None and name in catalog.gpus else None
        reason = reason or exclusion(g.instance, gpu, profile, allow_arm64=True)
    try:
        # the current fleet runs the layout the profile was taken under (a sharded run is not judged as DDP)
        layout = profile.layout or "ddp"
        pred = predict(profile, fleet, catalog=catalog, calibration=factors, scaling=constraints.scaling, layout=layout)
        if not pred.fits_memory:
            reason = reason or "it cannot hold the model in GPU memory"
    except (PredictionError, ConfigError) as exc:  # ConfigError: the profile's layout does not apply to it
        reason = reason or str(exc)
        pred = None
    if reason or pred is None:
        return None, f"no savings computed: the current fleet {fleet} cannot train this model ({reason})"
    usd = sum((g.instance.price_usd_hr(constraints.regions[0]) or math.nan) * g.count for g in fleet.groups)
    if not math.isfinite(usd):
        return None, None
    gpus = ",".join(sorted({g.instance.gpu or "" for g in fleet.groups}))
    n_gpus = sum(g.instance.gpus * g.count for g in fleet.groups)
    # already running: no start-up; on-demand, its node failures and periodic checkpoints as any fleet's (_score)
    run_s = np.array([work.samples / pred.throughput_samples_s])
    groups = fleet.groups
    gpus_, counts = np.array([[g.instance.gpus * g.count for g in groups]]), np.array([[g.count for g in groups]])
    save_s = float(_fleet_save_s(r, gpus_, counts, parse_layout(layout).sharded)[0])  # as the candidates' (_save_s)
    wall_s = on_demand_cost(run_s, save_s, restart_s=0.0, gpus=n_gpus, load_s=r.checkpoint_s).expected_time_s
    return CurrentFleet(str(fleet), gpus, usd * float(billed_hours(wall_s)[0]), float(wall_s[0]) / 3600), None
