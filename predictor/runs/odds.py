"""What the ranking asks of a run under a deadline, in closed form: the expected time and cost of a spot fleet with
its on-demand fallback (:func:`expected_with_fallback`, from the spot statistics of traces or the catalog's rates),
and the chance of finishing in time (:func:`deadline_odds`: the training's log-normal with the held-out width of its
regime, the start-up, spot's interruptions and the fallback), with the factor a plan's time is held to at a
confidence (:func:`confidence_factor`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.exceptions import ConfigError
from predictor.model.uncertainty import MAX_SD, Z80, normal_cdf, z_of
from predictor.runs.traces import Trace, spells

# Mean spell without spot capacity, measured on the single-node traces (bench/spot_replay.py prints it): the
# zone-median of each zone's mean spell without spot, the files read as the Can't Be Late simulator reads them
# (3.12 h). Physical: the wait for capacity after an interruption; bounded by the traces' longest spells.
DOWN_SPELL_S = 3.1 * 3600.0


@dataclass(frozen=True)
class SpotStats:
    """Spot capacity as traces recorded it: what the ranking uses in place of the catalog's Spot Advisor rates."""

    rate_per_hr: float  # interruptions per spot-instance hour: 1 / the mean spell with spot
    down_s: float  # the mean spell without spot: the wait for capacity after an interruption
    availability: float
    source: str
    spells: int | None = None  # spells with spot the traces hold: the rate's sample (relative error ~ 1/sqrt(spells))

    @classmethod
    def of(cls, traces: Sequence[Trace], source: str = "") -> SpotStats:
        """Mean spells over every zone given (a zone's spells counted whole)."""
        up: list[float] = []
        down: list[float] = []
        there = total = 0
        for t in traces:
            for row in t.available:
                with_spot, without = spells(row)
                up.extend(with_spot * t.gap_s)
                down.extend(without * t.gap_s)
                there += int(row.sum())
                total += row.size
        if not up:
            raise ConfigError.between(
                "The spot traces{source} never have spot available: there is nothing to rank spot on. Leave them "
                "out, or rank on-demand only (set {market} to on-demand).",
                parameter="traces",
                source=f" {source}" if source else "",
            )
        mean_down = float(np.mean(down)) if down else 0.0
        return cls(3600.0 / float(np.mean(up)), mean_down, there / total, source, len(up))


# What spot capacity does to a guarded run's cost beyond the expectation: the 10th and 90th percentiles of
# ln(replayed / expected cost) of the srifty policy on the development traces, each priced from its whole trace's
# spells as --spot-trace gives them (bench/spot_replay.py prints both; 840 jobs, deadlines 1.1-2x). A run's window
# holds more or less spot than its trace's mean; the expectation's own error is in it too. Held out: 79 % of the
# multi-node traces' runs and 76 % of the development traces' at deadlines of 3-10x inside. Measured on p3.2xlarge
# traces of 2022-23; with the catalog's Spot Advisor rates (no trace) it is applied as measured, not checked.
CAPACITY_LOG_WIDTH = (-0.381, 0.336)


@dataclass(frozen=True)
class Fallback:
    """Arrays aligned with the candidates."""

    od_share: np.ndarray  # expected share of the work the policy runs on-demand
    time_s: np.ndarray  # expected wall time, start-up included
    cost_usd: np.ndarray


# The deadline policy's line (predictor.runs.deadline.Srifty): a run first takes spot whenever it is there for
# HEAD_START of its slack (and until (1 + TAIL) x its work before the deadline, where the slack is larger), then
# keeps a straight line to the work at the deadline less a restart; defined here, where the ranking reads them, and
# used by the policy itself (one definition).
HEAD_START = 0.25
TAIL = 1.0


def expected_with_fallback(
    spot_wall_s: np.ndarray,
    work_s: np.ndarray,
    interruptions: np.ndarray,
    deadline_s: float,
    startup_s: np.ndarray,
    restart_s: np.ndarray,
    spot_usd_hr: np.ndarray,
    od_usd_hr: np.ndarray,
    down_s: float = DOWN_SPELL_S,
    at_risk_s: np.ndarray | float = 0.0,
) -> Fallback:
    """What a spot (or mixed) run is expected to take and cost when the deadline policy guards it: the fluid run of
    the policy srifty launch keeps (:class:`predictor.runs.deadline.Srifty`).

    ``spot_wall_s`` is the spot-only time after start-up (:func:`predictor.runs.spot.spot_cost`: checkpoints, restarts
    and lost work) for ``work_s`` of training with ``interruptions`` expected; each interruption also waits
    ``down_s`` for capacity, so spot alone progresses at ``g = work / (spot_wall + waits)``, and on-demand can train
    a share ``phi = interruptions x (down_s - restart) / (spot_wall + waits)`` of the time (spot away, less the
    restart each on-demand spell starts with). From the end of the start-up, with ``L = deadline - start-up -
    restart`` (where the policy's line reaches the work) and the slack ``S = L - work``:

    - spot alone until the line starts (:data:`HEAD_START` of the slack, no earlier than (1 + :data:`TAIL`) x the
      work before ``L``) and after it while the run is ahead of the line: no on-demand where spot alone finishes by
      ``L`` (``spot_wall + waits <= L``);
    - behind the line (from where spot's progress meets it), on-demand runs while spot is away and spot while it is
      there: where that holds the line (``g + phi >= the line's slope``) on-demand does ``work - g L`` and the run
      ends at ``L``; where it does not, the run falls further behind until the hard rule
      (:func:`predictor.runs.deadline.must_run_on_demand`) starts on-demand for the rest, which ends at the deadline;
    - no slack (``S <= 0``): on-demand from the first tick, no spot start and no restart (the rule's first decision).
    - ``at_risk_s``, the training a preemption can lose (a save that misses the notice: up to an interval), the hard
      rule keeps in hand beside the restart: ``L`` is shorter by it.

    Each spell on-demand behind the line costs a restart billed on-demand (one per interruption while behind); spot
    is billed for its share of the work at its own overhead; waiting is not billed. With spot always there this is
    the hard rule's run (spot spends the slack, on-demand finishes at the deadline). Against the replays on the traces
    the cost is 17.6 / 18.1 % off on development / held out (BENCHMARKS.md)."""
    shape = np.broadcast(np.asarray(spot_wall_s, float), np.asarray(work_s, float)).shape
    spot_wall, work, start, restart, n = (
        np.broadcast_to(np.asarray(x, float), shape) for x in (spot_wall_s, work_s, startup_s, restart_s, interruptions)
    )
    greedy = spot_wall + n * down_s  # spot whenever there, waiting when not
    line_end = deadline_s - start - restart - np.broadcast_to(np.asarray(at_risk_s, float), shape)
    from_start = line_end <= work  # no slack
    behind = ~from_start & (greedy > line_end)
    share = from_start.astype(float)
    time = start + np.where(from_start, work, greedy)
    od_billed = np.where(from_start, work, 0.0)
    at = np.flatnonzero(behind)  # the rest, computed for those only (a million candidates, most ahead)
    if at.size:
        od_work, billed, forced = _behind_the_line(work[at], greedy[at], n[at], down_s, restart[at], line_end[at])
        share[at] = od_work / np.maximum(work[at], 1e-9)
        time[at] = start[at] + line_end[at] + forced * restart[at]
        od_billed[at] = billed
    spot_billed = np.where(from_start, 0.0, spot_wall * (1 - share))
    cost = (
        start * np.where(from_start, od_usd_hr, spot_usd_hr) + spot_billed * spot_usd_hr + od_billed * od_usd_hr
    ) / 3600
    return Fallback(share, time, cost)


def _behind_the_line(work, greedy, interruptions, down_s, restart, line_end):
    """For :func:`expected_with_fallback`'s runs that fall behind the policy's line (arrays of those only): the
    work on-demand does, what it is billed (each on-demand spell starts a fleet: a restart; the hard rule's switch
    one more) and the share of that switch's restart the run pays (0 where the line holds)."""
    slack = line_end - work
    # the share of the time spot is away that on-demand can train in: each spell behind starts a fleet (a restart)
    g, phi = work / greedy, interruptions * np.maximum(down_s - restart, 0.0) / greedy
    x0 = np.clip(np.maximum(HEAD_START * slack, slack - TAIL * work), 0.0, slack)
    slope = work / (line_end - x0)
    t1 = x0 + g * x0 / (slope - g)  # where spot alone meets the line (behind: g < slope)
    holds = g + phi >= slope
    t_hard = np.where(holds, line_end, (slack - phi * t1) / np.where(holds, 1.0, 1 - g - phi))  # the rule's switch
    od_work = np.clip(np.where(holds, work - g * line_end, phi * (t_hard - t1) + (line_end - t_hard)), 0.0, work)
    spells = interruptions * (t_hard - t1) / greedy
    # the hard rule's switch starts one more fleet; continuous where it comes with the rest nearly done (the fluid
    # run's boundary: a restart billed for no work made the cost jump there)
    switch = np.where(holds, 0.0, np.minimum(1.0, (line_end - t_hard) / np.maximum(restart, 1e-9)))
    return od_work, od_work + (spells + switch) * restart, switch


def guarded_ranges(mid: Fallback, low: Fallback, high: Fallback) -> tuple[np.ndarray, np.ndarray]:
    """The 80 % intervals (N, 2) of a guarded run's time (s) and cost, from the policy's run at the prediction's
    median (``mid``) and its 10th / 90th percentile speeds (``low``: faster, ``high``: slower): the time is the run's
    (an on-demand finish keeps it by the deadline where the training fits); the cost adds spot capacity's width
    (:data:`CAPACITY_LOG_WIDTH`) to the speed's, in quadrature (the two independent)."""
    cost = np.maximum(mid.cost_usd, 1e-12)
    below = np.abs(np.log(np.maximum(np.minimum(low.cost_usd, cost), 1e-12) / cost))
    above = np.abs(np.log(np.maximum(high.cost_usd, cost) / cost))
    cost_lo = cost * np.exp(-np.hypot(below, CAPACITY_LOG_WIDTH[0]))
    cost_hi = cost * np.exp(np.hypot(above, CAPACITY_LOG_WIDTH[1]))
    time_lo, time_hi = np.minimum(low.time_s, mid.time_s), np.maximum(high.time_s, mid.time_s)
    return np.stack([time_lo, time_hi], axis=1), np.stack([cost_lo, cost_hi], axis=1)


@dataclass(frozen=True)
class DeadlineOdds:
    """Arrays aligned with the candidates."""

    probability: np.ndarray  # chance of finishing by the deadline
    time_s: np.ndarray  # wall time at the confidence asked (its quantile), start-up included


def deadline_odds(
    deadline_s: float,
    confidence: float,
    sd: np.ndarray,
    startup_s: np.ndarray,
    uncertain_s: np.ndarray,
    guarded: np.ndarray,
    fallback_at: Any,
) -> DeadlineOdds:
    """Each candidate's chance of finishing within ``deadline_s``, and its time at ``confidence``.

    The part of the run the performance model predicts, ``uncertain_s`` (the training, with an unguarded spot fleet's
    checkpoints and expected interruptions), is log-normal with the prediction's relative ``sd`` (the held-out width
    of its regime and the profile's own spread, :mod:`predictor.model.uncertainty`); the start-up is taken as
    predicted. Where the deadline policy guards a spot or mixed fleet (``guarded``), ``uncertain_s`` is the training
    alone: the policy watches the measured progress and moves the rest on-demand in time, so the run ends by the
    deadline whenever the training at its true speed fits after the start-up (a restart kept in hand is what the
    policy spends, :func:`expected_with_fallback`). So ``P = Phi(ln((deadline - start-up) / uncertain) / sd)``.

    ``fallback_at(factor)``: the guarded fleets' :class:`Fallback` with the work scaled by ``factor``; its time at the
    confidence's factor is the guarded time at the quantile. The time at the quantile is within the deadline exactly
    when the probability is at least ``confidence`` (both follow the same factor), so the filter and the figure
    shown never disagree.
    """

    sd = _bounded_sd(sd)
    room = deadline_s - np.asarray(startup_s, float)
    uncertain = np.maximum(np.asarray(uncertain_s, float), 1e-9)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(np.where(room > 0, room, np.nan) / uncertain) / sd
    x = np.where(room > 0, np.where(sd > 0, x, np.where(uncertain <= room, np.inf, -np.inf)), -np.inf)
    probability = normal_cdf(x)
    factor = at_confidence(sd, confidence)
    time = np.asarray(startup_s, float) + uncertain * factor
    if np.any(guarded):
        time = np.where(guarded, fallback_at(factor).time_s, time)
    return DeadlineOdds(probability, time)


def _bounded_sd(sd: np.ndarray) -> np.ndarray:
    """A prediction's relative sd as the deadline reads it: unknown (nan) or wider than :data:`MAX_SD` is MAX_SD."""
    return np.minimum(np.nan_to_num(np.asarray(sd, float), nan=MAX_SD), MAX_SD)


def at_confidence(sd: np.ndarray, confidence: float) -> np.ndarray:
    """How much longer than predicted each candidate's training is at ``confidence`` (its quantile over the
    median, ``exp(z sd)``), as :func:`deadline_odds` holds it to the deadline."""
    return np.exp(z_of(confidence) * _bounded_sd(sd))


def confidence_factor(entry: Any, confidence: float | None) -> float:
    """How much longer than predicted a plan entry's training is at ``confidence`` (its quantile over the median):
    ``exp(z sd)`` with the entry's relative sd read back from its step's 80% interval. 1.0 at 0.5, for a plan that
    recorded no confidence (its deadline held the predicted time) and for an entry without an interval. The
    ranking, the launch's spot guard (until it measures the step) and the replay plan for the same quantile."""

    interval = getattr(entry, "iteration_time_interval_s", None)
    if confidence is None or not interval or not entry.iteration_time_s:
        return 1.0
    sd = max(0.0, math.log(max(interval[1], entry.iteration_time_s) / entry.iteration_time_s) / Z80)
    return math.exp(z_of(confidence) * sd)


Z95 = 1.6449  # p95 of a normal: a p5 is a median x exp(-Z95 sd)
# When a job that carries MigrationTriggers has measured its speed: its first check comes after 30 steps, the next
# ``check_every_s`` (default 600 s) on; the later one is counted (a first check of a few seconds' steps may be noisy).
LATE_CHECK_S = 600.0
# The least expected saving over its target a late move must bring to be counted: a preference, not physics (a move
# disrupts a run; MigrationTriggers asks 15 % of a voluntary one). On the decision scenarios 0 / 5 / 10 % gave 66 /
# 64 / 62 of 85 picks within 5 % of the oracle with the move made, and 7 / 5 / 3 runs relying on it.
LATE_MOVE_GAIN = 0.05


@dataclass(frozen=True)
class LateMoves:
    """Arrays aligned with the candidates; ``target`` is -1 where no move is counted (the fleet meets the deadline
    at the confidence on its own, or no move is expected to be worth it)."""

    target: np.ndarray  # the candidate the job moves to when measured late
    move_p: np.ndarray  # the chance the move is made: the fleet's own chance of missing the deadline
    probability: np.ndarray  # the chance of finishing by the deadline, the move counted
    time_s: np.ndarray  # expected wall time, the move counted
    cost_usd: np.ndarray  # expected cost, the move counted
    confident_time_s: np.ndarray  # the time at the confidence, the move counted
    time_range_s: np.ndarray  # (N, 2) the run's 80% interval of time, the move counted (nan: no move counted)
    cost_range_usd: np.ndarray  # (N, 2) the same of its cost


def late_moves(
    deadline_s: float,
    confidence: float,
    odds: DeadlineOdds,
    *,
    sd: np.ndarray,
    startup_s: np.ndarray,
    train_s: np.ndarray,
    wall_s: np.ndarray,
    cost_usd: np.ndarray,
    usd_hr: np.ndarray,
    movable: np.ndarray,
    group: np.ndarray,
    save_s: np.ndarray | float,
    resume_s: float,
    by_time: bool,
    cost_cap: float = math.inf,
) -> LateMoves:
    """What a deadline is worth to a job that moves when its measured speed says it will be late (MigrationTriggers'
    deadline trigger, :func:`predictor.ranking.replan.late`): an on-demand fleet whose own chance is under
    ``confidence`` is tried first when a surer fleet can still finish all of the work after the check.

    The move, in time: the fleet's start-up, :data:`LATE_CHECK_S` of training, the target's start-up (the fleet
    trains on meanwhile), a save (``save_s``), a restart and a load (``resume_s``), then the whole work on the target
    (what was trained before the move is not counted: conservative). The target is, among the ``movable`` candidates
    of the same ``group`` (the region), the cheapest (``by_time``: the fastest) whose time at the confidence fits
    that: a move is possible. The chance of finishing: the fleet's own, and when it is late the job's re-ranking at
    the check moves to a fleet that meets what is left at ``confidence`` (the named target is one; the re-ranking,
    with the speed measured, may prefer another), so ``own + (1 - own) x confidence``. Expected time and cost: the
    fleet's predicted (median) figures with its chance, the move's with the other (the fleet billed to its save, the
    target from its request): conservative, a fleet on time being faster than its median. A move is counted only on
    a ``movable`` fleet under the confidence on its own, expected to beat its target by the objective by
    :data:`LATE_MOVE_GAIN`, and whose move's cost fits ``cost_cap`` (a budget); the time at the confidence is then
    the lesser of the two ways (each at the quantile of its own prediction), within the deadline exactly when the
    probability is at least ``confidence``."""
    sd = np.minimum(np.nan_to_num(np.asarray(sd, float), nan=MAX_SD), MAX_SD)
    own_q = startup_s + train_s * np.exp(z_of(confidence) * sd)  # a target's time at the confidence, from its request
    lead = startup_s + LATE_CHECK_S + save_s + resume_s  # the fleet's part before the target's own time counts
    target = _cheapest_within(deadline_s - lead, own_q, wall_s if by_time else cost_usd, movable, group)
    t = np.maximum(target, 0)
    p_own = np.asarray(odds.probability, float)
    miss = 1.0 - p_own
    time = (1 - miss) * wall_s + miss * (lead + startup_s[t] + train_s[t])
    moved_cost = usd_hr * (startup_s + LATE_CHECK_S + startup_s[t] + save_s) / 3600 + cost_usd[t]
    cost = (1 - miss) * cost_usd + miss * moved_cost
    better = (time < wall_s[t] * (1 - LATE_MOVE_GAIN)) if by_time else (cost < cost_usd[t] * (1 - LATE_MOVE_GAIN))
    counted = (target >= 0) & (target != np.arange(len(t))) & movable & better & (p_own < confidence)
    counted &= moved_cost <= cost_cap
    ranges = _ranges(deadline_s, sd, startup_s, train_s, wall_s, cost_usd, usd_hr, t, lead, moved_cost, time, cost)
    return LateMoves(
        np.where(counted, target, -1),
        np.where(counted, miss, 0.0),
        np.where(counted, p_own + miss * confidence, p_own),
        np.where(counted, time, wall_s),
        np.where(counted, cost, cost_usd),
        np.where(counted, np.minimum(odds.time_s, lead + own_q[t]), odds.time_s),
        *(np.where(counted[:, None], r, np.nan) for r in ranges),
    )


def _ranges(deadline_s, sd, startup_s, train_s, wall_s, cost_usd, usd_hr, t, lead, moved_cost, time, cost):
    """The 80% intervals of a run that moves when late (arrays of :func:`late_moves`), the move to the named target,
    whatever the two predictions' errors share: below the lesser of the fleet's own p5 and the move's p5 with at most
    10 % (one of the two ways at its p5 or lower), above the later of the deadline and the move's p90 with at most
    10 % (the fleet on time, or the move within its p90: one of the two happens with at least 90 %); the cost's
    likewise, the fleet billed to the deadline when on time. Each contains its expectation."""
    train_t, wall_t, cost_t = train_s[t], np.maximum(wall_s[t], 1e-9), cost_usd[t]
    low, high = np.exp(-Z95 * sd), np.exp(Z80 * sd)  # a p5 and a p90 over the median
    own_lo = startup_s + train_s * low
    moved_lo, moved_hi = lead + startup_s[t] + train_t * low[t], lead + startup_s[t] + train_t * high[t]
    moved_cost_at = lambda end: moved_cost + cost_t * ((end - lead) / wall_t - 1)  # noqa: E731 - the target to ``end``
    time_lo = np.minimum(np.minimum(own_lo, moved_lo), time)
    time_hi = np.maximum(np.maximum(deadline_s, moved_hi), time)
    cost_lo = np.minimum(np.minimum(cost_usd * own_lo / np.maximum(wall_s, 1e-9), moved_cost_at(moved_lo)), cost)
    cost_hi = np.maximum(np.maximum(usd_hr * deadline_s / 3600, moved_cost_at(moved_hi)), cost)
    return np.stack([time_lo, time_hi], axis=1), np.stack([cost_lo, cost_hi], axis=1)


def _cheapest_within(room: np.ndarray, need: np.ndarray, key: np.ndarray, movable: np.ndarray, group: np.ndarray):
    """For each candidate, the ``movable`` candidate of its ``group`` with the least ``key`` among those whose
    ``need`` is within the candidate's ``room`` (-1: none). A running minimum over the targets sorted by need, looked
    up by the room: O(n log n) for a million candidates."""
    out = np.full(len(room), -1)
    for g in np.unique(group):
        mine = group == g
        pool = np.flatnonzero(movable & mine)
        if not len(pool):
            continue
        pool = pool[np.argsort(need[pool], kind="stable")]
        keys = key[pool]
        best = pool[_running_argmin(keys)]
        at = np.searchsorted(need[pool], room[mine], side="right") - 1
        out[mine] = np.where(at >= 0, best[np.maximum(at, 0)], -1)
    return out


def _running_argmin(values: np.ndarray) -> np.ndarray:
    """Index of the least value of ``values[: i + 1]`` for every ``i`` (the first of equals)."""
    running = np.minimum.accumulate(values)
    is_new = np.concatenate(([True], values[1:] < running[:-1]))
    return np.maximum.accumulate(np.where(is_new, np.arange(len(values)), 0))
