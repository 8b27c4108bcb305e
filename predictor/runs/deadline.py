"""Spot under a deadline: when to gamble on spot capacity, when to fall back to on-demand, and what a run would have
cost on the capacity AWS actually had.

One model of a run, in whole ticks of ``tick_s`` seconds (the trace's gap, or a multiple of it):

- the job needs ``work`` ticks of training on the fleet (the plan's predicted time, start-up excluded);
- every new fleet (a spot start, an on-demand start, a return to spot) costs ``restart`` ticks before training
  resumes: the checkpoint save of the fleet it leaves, the new fleet's start-up and the checkpoint load, rounded
  up to whole ticks (conservative); a start with nothing trained has nothing to save or load and costs its
  start-up alone (``startup_s``, where given), though the policies' rules plan every start at the full restart;
- spot is usable during tick ``k`` of zone ``z`` when the trace has the fleet's spot node count available at ``k``;
  a spot fleet whose capacity goes away is preempted at the tick's start. AWS gives a two-minute notice: when the
  checkpoint save fits in it (``save_on_notice``, what ``srifty launch`` does), nothing trained is lost; otherwise the
  progress since the last periodic checkpoint is;
- on spot the job saves every ``checkpoint_interval_s`` of training since its fleet started or last saved (its
  timer, ``CheckpointWriter.due``), and trains none while it saves (``save_s``: what the ranking's
  ``work x save / interval`` counts; the replay pays whole ticks as the saves add up, the fraction carried to the
  next save, and none for a save at the very end of the work); a save commits the progress once its time is paid,
  and a preemption during it loses it. On-demand fleets save at their own, far longer interval (node failures alone)
  and that, like the node failures themselves, stays out of the replay;
- on-demand capacity is always there; waiting costs nothing; every tick of a running fleet is billed at its price.

A :class:`Policy` decides at each tick boundary from what it could know then (the job, the time, the progress as
srifty launch's guard sees it, the fleet it runs, the availability observed so far): stay, start spot (which zone),
wait for spot, or run on-demand. Every policy here except ``on-demand`` keeps the same hard rule
(:func:`must_run_on_demand`): it never lets the slack fall below what an on-demand finish needs, so a feasible
deadline is always met.

:func:`replay` runs a policy over a trace; :func:`optimum` is the hindsight optimum, an exact dynamic programme over
the same tick model knowing the whole trace (and never losing work, so taking no periodic save): the yardstick no
online policy can beat.

Policies: ``on-demand`` (never spot), ``greedy`` (spot whenever available, wait otherwise, on-demand only when the
deadline forces it: Can't Be Late's greedy with its safety net), ``uniform`` (Can't Be Late's uniform progress: run
on-demand while behind the straight line from 0 to the work at the deadline, with hysteresis), and ``srifty`` (the
product's: uniform progress whose line starts after a quarter of the slack, and no earlier than twice the work before
the deadline, so that spot gets a head start, and which returns to spot as soon as the run is on track).

The traces are read by :mod:`predictor.runs.traces`; what the ranking asks of a run under a deadline (the
expectation with the fallback, the chance of finishing in time) is :mod:`predictor.runs.odds`.

References: Wu et al., *Can't Be Late: Optimizing Spot Instance Savings under Deadlines*, NSDI 2024; the traces:
github.com/skypilot-org/spot-traces.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from predictor.catalog.catalog import Catalog
from predictor.documents.plan import check_choice
from predictor.exceptions import ConfigError
from predictor.runs.odds import HEAD_START, TAIL, confidence_factor
from predictor.runs.spot import (
    DEFAULT_CHECKPOINT_S,
    NOTICE_MARGIN_S,
    NOTICE_S,
    deadline_interval_cap_s,
    on_demand_time_s,
    planned_save_s,
    saves_on_notice,
)
from predictor.runs.traces import Trace

WAIT, ON_DEMAND = -1, -2  # actions besides "spot in zone z" (z >= 0)
# How much training srifty launch's guard sees before it knows the step time: a job's SpotPreemption writes
# PROGRESS.json at its leg's first step and then every ``progress_s`` (60 s by default), the second record carrying
# the measured step; until then the guard plans for the step at the plan's confidence (its quantile).
MEASURED_AFTER_S = 60.0


# ---------------------------------------------------------------- the job


@dataclass(frozen=True)
class OnDemandFinish:
    """What an on-demand finish of the work left takes beyond it, which srifty launch's guard keeps in hand for its
    hard rule (:func:`~predictor.runs.spot.on_demand_time_s`: the on-demand fleet's periodic saves, and its node
    failures, each a restart, a load and the work since the last save): the fleet's GPUs, its save, a failure's
    restart (the start-up) and load, and the plan's confidence, at which the failures are held once the step is
    measured (before, their expectation, as the guard holds them). The replay trains without node failures: this is
    what its policy keeps in hand, as the launch's does (a 7B on 8 p4d, 64 GPUs, with 30 h left: 2.0 h at 90 %)."""

    gpus: float
    save_s: float | None
    restart_s: float
    load_s: float | None = None
    confidence: float | None = None

    def __post_init__(self) -> None:
        for name in ("gpus", "restart_s", "save_s", "load_s"):
            v = getattr(self, name)
            if (v is not None or name in ("gpus", "restart_s")) and not (
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
            ):
                raise ConfigError(f"finish.{name} must be a number >= 0; got {v!r}.", parameter=name, value=v)
        c = self.confidence
        if c is not None and not (isinstance(c, (int, float)) and 0 < c < 1):
            raise ConfigError(
                f"finish.confidence must be between 0 and 1 (e.g. 0.9) or None; got {c!r}.", parameter="confidence"
            )

    def most_ticks(self, work: int, tick_s: float) -> int:
        """The most :meth:`extra_ticks` gives for any work left up to ``work`` (it never falls as the work grows),
        measured or not."""
        return max(self.extra_ticks(work, tick_s, measured) for measured in (False, True))

    def extra_ticks(self, left: int, tick_s: float, measured: bool) -> int:
        """Whole ticks an on-demand finish of ``left`` ticks of training takes beyond them, as the guard rounds them
        (its finish up, its work left up)."""
        if left <= 0:
            return 0
        confidence = self.confidence if measured else None
        finish = _on_demand_s(left * tick_s, self.save_s, self.restart_s, self.gpus, confidence, self.load_s)
        return max(0, math.ceil(finish / tick_s - 1e-9) - left)


@functools.lru_cache(maxsize=65536)
def _on_demand_s(
    left_s: float, save_s: float | None, restart_s: float, gpus: float, confidence: float | None, load_s: float | None
) -> float:
    """:func:`~predictor.runs.spot.on_demand_time_s`, kept: a replay asks it at the ticks where the hard rule could
    bind (1.4-5.4 ms a call at 64-4,096 GPUs), its policies of the same values."""
    return on_demand_time_s(left_s, save_s, restart_s, gpus, confidence, load_s)


@dataclass(frozen=True)
class Job:
    """A run to place, in seconds and USD per hour of the whole fleet."""

    work_s: float  # training time on the fleet (start-up excluded)
    deadline_s: float  # from the start of the run
    restart_s: float  # save + start-up + restore, per new fleet
    spot_usd_hr: float  # the fleet on its spot market (a mixed fleet: its on-demand base + spot share)
    od_usd_hr: float  # the same fleet all on-demand
    checkpoint_interval_s: float | None = None  # periodic checkpoints while on spot (None: none)
    save_s: float = 0.0  # each periodic checkpoint's save on spot, during which the job does not train
    # a start with nothing trained (the run's first): the start-up alone, nothing to save or load (None: restart_s)
    startup_s: float | None = None
    # what an on-demand finish adds, kept in hand by the policy's hard rule as the launch's guard does (None: nothing)
    finish: OnDemandFinish | None = None
    save_on_notice: bool = True  # the save fits the two-minute notice: a preemption loses nothing
    # what the policy plans for until it has trained ``measured_after_s`` and so knows the step (None: the work
    # itself, known from the start): srifty launch's guard holds the plan's quantile until the job reports its step
    planned_work_s: float | None = None
    measured_after_s: float = MEASURED_AFTER_S

    def __post_init__(self) -> None:
        for name in ("work_s", "deadline_s", "spot_usd_hr", "od_usd_hr"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be a number > 0; got {v!r}.", parameter=name, value=v)
        p = self.planned_work_s
        if p is not None and not (isinstance(p, (int, float)) and math.isfinite(p) and p > 0):
            raise ConfigError(f"planned_work_s must be a number > 0 or None; got {p!r}.", parameter="planned_work_s")
        if not (math.isfinite(self.measured_after_s) and self.measured_after_s >= 0):
            raise ConfigError(
                f"measured_after_s must be >= 0; got {self.measured_after_s!r}.", parameter="measured_after_s"
            )
        if self.startup_s is not None and not (
            isinstance(self.startup_s, (int, float)) and 0 <= self.startup_s <= self.restart_s
        ):
            raise ConfigError(
                f"startup_s must be between 0 and restart_s ({self.restart_s!r}) or None; got {self.startup_s!r}.",
                parameter="startup_s",
                value=self.startup_s,
            )
        for name in ("restart_s", "save_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name} must be a number >= 0; got {v!r}.", parameter=name, value=v)


@dataclass(frozen=True)
class Ticks:
    """The job in whole ticks."""

    tick_s: float
    work: int
    deadline: int
    restart: int
    checkpoint: int | None
    spot_usd: float  # per tick
    od_usd: float
    save_on_notice: bool
    # what an on-demand finish of the work left takes beyond it (its periodic saves and node failures: srifty
    # launch's guard, :func:`~predictor.runs.spot.on_demand_time_s`), for the hard rule alone; the replay's 0
    finish_extra: int = 0
    planned: int | None = None  # the work the policy plans for until ``measured_after`` ticks are trained
    measured_after: int = 0
    save: float = 0.0  # each periodic checkpoint's save on spot, in ticks (a fraction: paid as the saves add up)
    first_restart: int | None = None  # a start with nothing trained: its start-up alone (None: ``restart``)

    def seen(self, trained: int, done: int) -> tuple[Ticks, int]:
        """The job and the progress ``done`` as a policy knows them once ``trained`` ticks of work are done: the
        planned work until the step is measured (the progress in the same share of it), the work itself after."""
        if self.planned is None or self.planned == self.work or trained >= self.measured_after:
            return self, done
        return replace(self, work=self.planned, planned=None), math.floor(done * self.planned / self.work + 1e-9)

    @classmethod
    def of(cls, job: Job, tick_s: float) -> Ticks:
        ck = job.checkpoint_interval_s
        return cls(
            tick_s,
            max(1, math.ceil(job.work_s / tick_s - 1e-9)),
            math.floor(job.deadline_s / tick_s + 1e-9),
            math.ceil(job.restart_s / tick_s - 1e-9),
            None if ck is None or not math.isfinite(ck) else max(1, math.ceil(ck / tick_s - 1e-9)),
            job.spot_usd_hr * tick_s / 3600.0,
            job.od_usd_hr * tick_s / 3600.0,
            job.save_on_notice,
            planned=None if job.planned_work_s is None else max(1, math.ceil(job.planned_work_s / tick_s - 1e-9)),
            measured_after=math.ceil(job.measured_after_s / tick_s - 1e-9),
            save=0.0 if ck is None or not math.isfinite(ck) else job.save_s / tick_s,
            first_restart=None if job.startup_s is None else math.ceil(job.startup_s / tick_s - 1e-9),
        )

    @property
    def fresh(self) -> int:
        """The ticks a start with nothing trained pays: its start-up (nothing to save or load)."""
        return self.restart if self.first_restart is None else self.first_restart

    @property
    def feasible(self) -> bool:
        """An on-demand run from the start meets the deadline."""
        return self.fresh + self.work <= self.deadline


# ---------------------------------------------------------------- policies


@dataclass
class State:
    """What a policy sees at a tick boundary."""

    tick: int
    done: int  # progress (ticks of work): the steps done where the save fits the notice or as the guard sees them
    running: int | None  # None, ON_DEMAND, or a spot zone
    overhead: int  # restart ticks still to pay on the running fleet
    available: np.ndarray  # (zones,) spot usable this tick
    seen: np.ndarray  # (zones, tick) availability observed so far (this tick excluded)


def must_run_on_demand(s: State, j: Ticks) -> bool:
    """The hard rule: anything but on-demand for one more tick could leave too little time for an on-demand finish.

    Worst case of one more tick off on-demand: no committed progress, then a fresh on-demand fleet (``restart``)
    for the remaining work. The rule held a tick ago, so an on-demand fleet started (or kept) now finishes in time:
    ``tick + restart + left <= deadline``, the left work with what its finish adds (``finish_extra``)."""
    return s.tick + 1 + j.restart + (j.work - s.done) + j.finish_extra > j.deadline


def start_cut_short(s: State, j: Ticks) -> bool:
    """A new spot fleet pays ``restart`` ticks before it trains: started now, the hard rule would send the run to
    on-demand before its first tick of training, so the start would only add a restart. Every policy here checks
    its spot starts (and returns to spot) against it, in the replay and srifty launch's guard alike: on-demand is the
    same finish for one restart less (a trial's p3 plan replayed a spot start, on-demand a tick later and spot
    again: 3 starts, $12.44 against the entry's $6.43)."""
    return s.tick + 2 * j.restart + 1 + (j.work - s.done) + j.finish_extra > j.deadline


def _spot_in(zone: int, s: State, j: Ticks) -> int:
    """Spot in ``zone``, or on-demand where that is a new start the hard rule would cut short."""
    return ON_DEMAND if zone != s.running and start_cut_short(s, j) else zone


class Policy:
    """Decides at each tick: a spot zone (>= 0), :data:`WAIT` or :data:`ON_DEMAND`."""

    name = "policy"

    def reset(self, j: Ticks, zones: int) -> None:
        """Called once before a run."""

    def decide(self, s: State, j: Ticks) -> int:
        raise NotImplementedError


def _spot_zone(s: State) -> int | None:
    """The zone to use: the one running if still available, else the first available."""
    if s.running is not None and s.running >= 0 and s.available[s.running]:
        return s.running
    idx = np.flatnonzero(s.available)
    return int(idx[0]) if idx.size else None


class OnDemand(Policy):
    name = "on-demand"

    def decide(self, s: State, j: Ticks) -> int:
        return ON_DEMAND


class Greedy(Policy):
    """Spot whenever available, wait otherwise; on-demand only once the deadline forces it (then to the end)."""

    name = "greedy"

    def decide(self, s: State, j: Ticks) -> int:
        if s.running == ON_DEMAND or must_run_on_demand(s, j):
            return ON_DEMAND
        zone = _spot_zone(s)
        return WAIT if zone is None else _spot_in(zone, s, j)


class UniformProgress(Policy):
    """Can't Be Late's uniform progress: the target is the straight line to the work at the deadline (less one
    restart); behind it, run on-demand while spot is away; ahead of it, wait for spot. An on-demand fleet is kept
    until the progress is ``hysteresis`` restarts ahead of the line, then left for spot (the paper's hysteresis)."""

    name = "uniform"
    head_start = 0.0  # share of the slack before the line starts (0: from the run's start)
    tail: float | None = None  # the line starts no earlier than (1 + tail) x the work before the deadline
    hysteresis = 1.0  # restarts ahead of the line before an on-demand fleet is left for spot

    def target(self, s: State, j: Ticks) -> float:
        """The progress the line asks for at the end of this tick."""
        horizon = max(1, j.deadline - j.restart)
        slack = max(0, horizon - j.work)
        x0 = self.head_start * slack
        if self.tail is not None:
            x0 = max(x0, slack - self.tail * j.work)
        return j.work * (s.tick + 1 - x0) / max(1.0, horizon - x0)

    def decide(self, s: State, j: Ticks) -> int:
        if must_run_on_demand(s, j):
            return ON_DEMAND
        target = self.target(s, j)
        zone = _spot_zone(s)
        if s.running == ON_DEMAND:
            if zone is not None and s.done >= target + self.hysteresis * j.restart:
                return _spot_in(zone, s, j)
            return ON_DEMAND
        if zone is not None:
            return _spot_in(zone, s, j)
        return ON_DEMAND if s.done < target else WAIT


class Srifty(UniformProgress):
    """The product's policy: uniform progress with a head start for spot and a return to spot as soon as the run is
    on track.

    - the line starts after ``head_start`` (0.25) of the slack: a run first waits for spot for up to a quarter of
      its slack before on-demand is used (bounded: 0 is uniform progress, 1 is greedy);
    - and no earlier than ``(1 + tail)`` x the work before the deadline (``tail`` 1): a run with slack to spare (a
      deadline of 3-10x its work) waits for spot like greedy, then keeps a line with as much slack as work for the
      rest (uniform progress would buy on-demand from the first tick without spot);
    - an on-demand fleet is left for spot as soon as spot is there and the progress is on the line
      (``hysteresis`` 0): on-demand time is only bought while the run is behind;
    - always the hard rule (:func:`must_run_on_demand`).

    The constants were chosen on the single-node traces (2022-10-26 and 2023-02-15 availability, 2023-04-22
    preemption) only, as round values in the flat middle of the grid (bench/spot_replay.py --grid); the multi-node
    traces are the held-out check.
    """

    name = "srifty"
    head_start = HEAD_START  # defined with the ranking's fluid run of this policy (predictor.runs.odds)
    tail = TAIL
    hysteresis = 0.0


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (OnDemand, Greedy, UniformProgress, Srifty)}


def policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError(
            f"Unknown policy {name!r}: use one of {', '.join(POLICIES)} (or 'optimum' in srifty replay).",
            parameter="policy",
            value=name,
        ) from None


# ---------------------------------------------------------------- replay


@dataclass
class Outcome:
    """What a run did."""

    policy: str
    finished: bool
    finished_h: float | None
    cost_usd: float
    deadline_met: bool
    preemptions: int
    hours: dict[str, float]  # spot, on-demand, waiting; restarting and saving (part of spot/on-demand billed time)
    lost_h: float
    starts: int
    progress: np.ndarray | None = None  # committed work (h) at each tick's end, for plots
    market: np.ndarray | None = None  # -1 wait, -2 on-demand, z spot

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON; the optimum's path is not kept (its programme holds costs only): its preemptions,
        starts, lost and market hours are null, not 0 (a trial read ``"starts": 0`` for a run that started)."""
        path = bool(self.hours)
        return {
            "policy": self.policy,
            "finished": self.finished,
            "finished_h": None if self.finished_h is None else round(self.finished_h, 4),
            "cost_usd": round(self.cost_usd, 4) if math.isfinite(self.cost_usd) else None,  # none: no run finished
            "deadline_met": self.deadline_met,
            "preemptions": self.preemptions if path else None,
            "starts": self.starts if path else None,
            "lost_h": round(self.lost_h, 4) if path else None,
            "hours": {k: round(v, 4) for k, v in self.hours.items()} if path else None,
        }


@dataclass
class _Run:
    """A replayed run as it goes: the committed progress, the progress (committed + since the last checkpoint), the
    fleet running, its restart ticks left, its training ticks since its last periodic save (or its start), the save
    in progress (``saving``: the progress it commits once its time is paid; ``owed``: that time, in ticks, with the
    fraction of a tick the saves before it left unpaid, ``carried``) and the ticks spent."""

    done: int = 0
    progress: int = 0
    running: int | None = None
    overhead: int = 0
    since: int = 0
    owed: float = 0.0
    saving: int | None = None
    carried: float = 0.0
    spent: dict[str, int] = field(
        default_factory=lambda: {"spot": 0, "on-demand": 0, "waiting": 0, "restarting": 0, "saving": 0}
    )

    def start(self, market: int, overhead: int) -> None:
        """A new fleet on ``market``, ``overhead`` ticks before it trains; the job's save timer starts with it."""
        self.stop()
        self.running, self.overhead = market, overhead

    def stop(self) -> None:
        """The fleet leaves (its leaving save, in the next start's restart, replaces a save in progress) or is
        preempted (a save in progress is lost with the fleet: its progress was never committed); the unpaid
        fraction of the saves made before is kept for the next."""
        if self.saving is not None:
            self.owed, self.saving = self.carried, None
        self.running, self.overhead, self.since = None, 0, 0

    def tick(self, j: Ticks) -> None:
        """One tick of the running fleet (billed by the caller): a restart tick, a tick of a periodic save in
        progress (on spot: the progress is committed once its time is paid) or a tick of training, committed on
        on-demand, and on spot saved every ``j.checkpoint`` ticks of training since the fleet started or last saved,
        as the job's timer does (``CheckpointWriter.due``)."""
        spot = self.running != ON_DEMAND
        self.spent["spot" if spot else "on-demand"] += 1
        if self.overhead > 0:
            self.overhead -= 1
            self.spent["restarting"] += 1
        elif spot and self.saving is not None:
            self.owed -= 1.0
            self.spent["saving"] += 1
            if self.owed < 1.0 - 1e-9:  # paid (its last fraction carried to the next save)
                self.done, self.saving = self.saving, None
        else:
            self.progress += 1
            self.since += 1
            if not spot:
                self.done = self.progress
            elif j.checkpoint is not None and self.since >= j.checkpoint:
                self.since, self.carried, self.owed = 0, self.owed, self.owed + j.save
                if self.owed >= 1.0 - 1e-9:
                    self.saving = self.progress
                else:  # within the fraction the last saves left
                    self.done = self.progress


def _as_guarded(j: Ticks, trained: int, progress: int) -> tuple[Ticks, int]:
    """The run and its progress as srifty launch's guard sees them (:meth:`Ticks.seen`): the steps done, and where
    the save misses the notice, the training a preemption can undo counted beside the work left, for the hard rule
    and a start alike: the whole periodic interval (the guard does not see when the job last saved), at most the
    steps done. A replay that counted the progress saved instead went back to spot as soon as a forced on-demand
    start had saved it by leaving, and was forced back within the interval: a 7B on one p4d at 34 h, 6 starts.
    After a preemption that lost work the guard keeps the newest step it saw (``SpotGuard.progress`` never goes
    back), and so does the replay's caller (``trained``): safe, as the run resumes from a save at most an interval
    behind it, which the interval kept in hand covers (the job saves again before it is passed)."""
    known, done = j.seen(trained, progress)
    if j.save_on_notice:
        return known, done
    at_risk = min(done, known.checkpoint if known.checkpoint is not None else done)
    return replace(known, finish_extra=known.finish_extra + at_risk), done


def _with_finish(finish: OnDemandFinish | None, j: Ticks, tick: int, done: int, most: int, measured: bool) -> Ticks:
    """``j`` at ``tick`` with ``done`` with what an on-demand finish of the work left adds kept in hand
    (:class:`OnDemandFinish`), where either rule (:func:`must_run_on_demand`, :func:`start_cut_short`) could bind with
    its bound ``most``; elsewhere that bound, which gives the same decisions (the rules are the only readers of
    ``finish_extra``) without the call."""
    if finish is None:
        return j
    left = j.work - done
    more = most
    if tick + 2 * j.restart + 1 + left + j.finish_extra + most > j.deadline:
        more = finish.extra_ticks(left, j.tick_s, measured)
    return replace(j, finish_extra=j.finish_extra + more)


def replay(job: Job, trace: Trace, pol: Policy, *, record: bool = False) -> Outcome:
    """Run ``pol`` over ``trace`` from its first tick until the work is done (or the trace ends)."""
    j = Ticks.of(job, trace.gap_s)
    pol.reset(j, trace.available.shape[0])
    a = trace.available
    r = _Run()
    trained = 0  # the most trained: a step once measured stays known, lost work or not
    cost = 0.0
    preemptions = starts = lost = 0
    prog_log = np.zeros(trace.ticks) if record else None
    mkt_log = np.full(trace.ticks, WAIT) if record else None
    finished_at: int | None = None
    most = 0 if job.finish is None else job.finish.most_ticks(max(j.work, j.planned or 0), j.tick_s)
    for k in range(trace.ticks):
        avail = a[:, k]
        if r.running is not None and r.running >= 0 and not avail[r.running]:  # preempted at the tick's start
            preemptions += 1
            if not j.save_on_notice:
                lost += r.progress - r.done
                r.progress = r.done
            r.done = r.progress
            r.stop()
        trained = max(trained, r.progress)
        known, seen_done = _as_guarded(j, trained, r.progress if j.save_on_notice else trained)
        known = _with_finish(job.finish, known, k, seen_done, most, trained >= j.measured_after)
        act = pol.decide(State(k, seen_done, r.running, r.overhead, avail, a[:, :k]), known)
        if act >= 0 and not avail[act]:
            raise RuntimeError(f"policy {pol.name} chose spot in zone {act} at tick {k}, where there is none")
        if act == WAIT:
            r.done = r.progress  # a voluntary stop saves first
            r.stop()
        elif act != r.running:
            r.done = r.progress  # leaving a fleet saves first (nothing to save, or load, before any training)
            r.start(act, j.restart if r.progress else j.fresh)
            starts += 1
        if r.running is None:
            r.spent["waiting"] += 1
        else:
            cost += j.od_usd if r.running == ON_DEMAND else j.spot_usd
            r.tick(j)
        if prog_log is not None and mkt_log is not None:  # record
            prog_log[k] = r.progress
            mkt_log[k] = WAIT if r.running is None else r.running
        if r.progress >= j.work:
            finished_at = k + 1
            break
    h = j.tick_s / 3600.0
    done_h = None if finished_at is None else finished_at * h
    met = finished_at is not None and finished_at <= j.deadline
    hours = {key: v * h for key, v in r.spent.items()}
    out = Outcome(pol.name, finished_at is not None, done_h, cost, met, preemptions, hours, lost * h, starts)
    return _recorded(out, h, finished_at or trace.ticks, prog_log, mkt_log)


def _recorded(out: Outcome, h: float, ticks: int, progress: np.ndarray | None, market: np.ndarray | None) -> Outcome:
    """``out`` with the recorded progress (hours trained: ``h`` hours a tick) and market of its first ``ticks`` ticks,
    when recorded."""
    if progress is not None and market is not None:
        out.progress = progress[:ticks] * h
        out.market = market[:ticks]
    return out


# ---------------------------------------------------------------- the hindsight optimum


def optimum(job: Job, trace: Trace) -> Outcome:
    """The cheapest run that meets the deadline knowing the whole trace: an exact dynamic programme over the tick
    model (states: progress x {waiting, on-demand or spot in each zone with the restart ticks left}), forward in
    time, vectorised over progress. It never loses work (it would save before a preemption it knows of). When the
    deadline cannot be met even on-demand, it is the cheapest run finishing as early as any can (a start and the work,
    on-demand or on spot that stays), what every policy then does: the cheapest run finishing at all within the trace
    had read $0.76 in 73 h beside the policies' $6.30 in 2.1 h (a trial)."""
    j = Ticks.of(job, trace.gap_s)
    zones, horizon = trace.available.shape
    W, R, R0 = j.work, j.restart, j.fresh
    inf = np.inf
    # markets: 0 = on-demand, 1 + z = spot in zone z; each has R + 1 phases (restart ticks left after the tick: R-1..0
    # are in restart, "0" trains) -- phase index r = ticks still to pay, 0 = training
    M = zones + 1
    phases = max(R, 1)
    run = np.full((M, phases, W + 1), inf)  # cost, after the tick, of being on market m with phase r and progress p
    wait = np.full(W + 1, inf)
    wait[0] = 0.0
    price = np.array([j.od_usd] + [j.spot_usd] * zones)
    best = (inf, -1)
    deadline = j.deadline if j.feasible else R0 + W  # infeasible: the earliest finish
    for k in range(min(horizon, deadline)):
        avail = np.concatenate([[True], trace.available[:, k]])
        any_state = np.minimum(wait, run.min(axis=(0, 1)))  # leave whatever runs (a preempted spot fleet too)
        new = np.full_like(run, inf)
        for m in range(M):
            if avail[m]:
                new[m] = _market_tick(run[m], any_state, R, R0) + price[m]
        run, wait = new, any_state
        done = run[:, 0, W].min()
        if done < best[0]:
            best = (float(done), k + 1)
    cost, at = best
    h = j.tick_s / 3600.0
    return Outcome(
        "optimum",
        at > 0,
        at * h if at > 0 else None,
        cost if at > 0 else float("nan"),
        at > 0 and at <= j.deadline,
        0,
        {},
        0.0,
        0,
    )


def _market_tick(cont: np.ndarray, start: np.ndarray, R: int, R0: int | None = None) -> np.ndarray:
    """One tick of one available market in :func:`optimum`'s programme, before its price: the cheapest cost of each
    (phase, progress) after the tick, from ``cont`` (this market's states before it: phase r = restart ticks still
    to pay, 0 = training) or a fresh start from ``start`` (any state, R restart ticks, the first paid now; from
    nothing trained, ``R0``: the start-up alone)."""
    out = _market_tick_full(cont, start, R)
    R0 = R if R0 is None else R0
    if R0 < R:  # a start with nothing trained: its start-up alone (R0 <= R: within the phases)
        if R0 == 0:
            if out.shape[1] > 1:
                out[0, 1] = min(out[0, 1], start[0])
        else:
            out[R0 - 1, 0] = min(out[R0 - 1, 0], start[0])
    return out


def _market_tick_full(cont: np.ndarray, start: np.ndarray, R: int) -> np.ndarray:
    """:func:`_market_tick` with every start paying ``R``."""
    inf = np.inf
    phases, W = cont.shape[0], cont.shape[1] - 1
    out = np.full_like(cont, inf)
    if R == 0:
        trained = np.minimum(cont[0], start)
        out[0, 1:] = trained[:-1]
        out[0, W] = min(out[0, W], trained[W])
        return out
    # phase after the tick: from a continuing fleet in phase r (r ticks left before), r-1 left after; training fleets
    # (phase 0) train one more tick
    out[0, 1:] = cont[0, :-1]
    out[0, W] = min(out[0, W], cont[0, W])
    if R > 1:
        # phase r (r >= 1 ticks left) pays one: r - 1 left; phase 1 -> 0 (ready to train next tick)
        out[0] = np.minimum(out[0], cont[1]) if phases > 1 else out[0]
        out[1:-1] = np.minimum(out[1:-1], cont[2:])
    # a fresh start pays one restart tick now: R - 1 left
    out[R - 1] = np.minimum(out[R - 1], start)
    return out


# ---------------------------------------------------------------- from a plan


@dataclass(frozen=True)
class PlannedRun:
    """A plan entry as a :class:`Job`, with what the replay needs to say about it."""

    job: Job
    fleet: str
    market: str
    spot_nodes: int  # instances on spot: the count the trace must have available
    notes: tuple[str, ...]


def job_from_plan(plan: Any, choice: int | None = None, *, deadline_h: float | None = None,
                  catalog: Any = None, step_quantile: float | None = None) -> PlannedRun:  # fmt: skip
    """The run of ``plan.entries[choice]`` (default: the plan's choice) under the plan's deadline (or
    ``deadline_h``), as ``srifty launch`` runs it: the work is the plan's optimizer steps x the step time (the
    prediction, or its ``step_quantile``: :func:`confidence_factor`); the policy plans for the step at the plan's
    confidence until it has trained :data:`MEASURED_AFTER_S` and measured it, as the launch's guard does. Each new
    fleet costs the entry's start-up plus a checkpoint save and load (``plan.checkpoint_s``), spot is the entry's
    price (a mixed fleet: its on-demand base plus its spot share) and on-demand the same fleet all on-demand (from
    the catalog).

    Raises:
        ConfigError: no deadline, an entry without spot instances or on-demand prices, a choice out of range, a
            ``step_quantile`` outside (0, 1).
    """

    index = plan.chosen if choice is None else choice
    check_choice(plan, index)
    entry = plan.entries[index]
    deadline = deadline_h if deadline_h is not None else plan.constraints.deadline_h
    if deadline is None:
        raise ConfigError.between(
            "The plan has no deadline: give one ({deadline_h}), or rank again with a deadline (srifty recommend "
            "--deadline).",
            parameter="deadline_h",
        )
    if step_quantile is not None and not (isinstance(step_quantile, (int, float)) and 0 < step_quantile < 1):
        raise ConfigError.between(
            "{step_quantile} must be between 0 and 1, e.g. 0.9 (0.5: the predicted step); got {got!r}.",
            parameter="step_quantile",
            value=step_quantile,
            got=step_quantile,
        )
    work_s, planned_s, notes = _planned_work_s(plan, entry, step_quantile)
    ck = plan.checkpoint_s if plan.checkpoint_s is not None else DEFAULT_CHECKPOINT_S  # the load, on any fleet
    save = planned_save_s(plan, entry)  # this fleet's own save (a sharded one's nodes each write their part)
    spot_nodes = sum(g.spot for g in entry.groups)
    od, sp = _fleet_prices(entry, index, catalog if catalog is not None else Catalog.load())
    if entry.market == "on-demand" and spot_nodes == 0:
        spot_nodes = entry.nodes  # an on-demand entry replayed as if bought on spot
        notes.append(f"{entry.fleet} is an on-demand entry: replayed as the same fleet on spot")
    job = Job(
        work_s=work_s,
        deadline_s=deadline * 3600.0,
        restart_s=(entry.startup_s or 0.0) + save + ck,
        startup_s=entry.startup_s or 0.0,
        # the guard's on-demand twin: the same GPUs and save, a failure restarting with the start-up and a load
        finish=OnDemandFinish(
            float(entry.gpus), save, entry.startup_s or 0.0, plan.checkpoint_s, plan.constraints.confidence
        ),
        spot_usd_hr=sp,
        od_usd_hr=od,
        checkpoint_interval_s=planned_interval_s(plan, index, deadline_h=deadline),
        save_s=save,
        save_on_notice=bool(saves_on_notice(save)),
        planned_work_s=planned_s,
    )
    notes.extend(_interval_notes(plan, index, job, save, deadline))
    return PlannedRun(job, entry.fleet, entry.market, spot_nodes, tuple(notes))


def _interval_notes(plan: Any, index: int, job: Job, save: float, deadline_h: float) -> list[str]:
    """What the replay says of the checkpoints: a save that misses the notice, the periodic saves' time on spot, and
    an interval the replay's ``deadline_h`` made shorter than the plan's own (a launch of the plan saves at its
    own)."""
    notes = []
    if not job.save_on_notice:
        notes.append(
            f"a checkpoint save on this fleet takes {save:.0f} s, more than the {NOTICE_S - NOTICE_MARGIN_S:.0f} s the "
            f"{NOTICE_S:.0f} s spot notice leaves for it: a preemption loses the work since the last periodic "
            "checkpoint"
        )
    tau, stored = job.checkpoint_interval_s, plan.entries[index].checkpoint_interval_s
    if tau is not None and job.work_s * save / tau >= 0.01 * job.work_s:
        notes.append(
            f"the periodic checkpoints (every {tau / 3600:.2f} h of training, {save:.0f} s each) pause the training "
            f"on spot, {job.work_s * save / tau / 3600:.2f} h over the whole run there, as the plan's time counts them"
        )
    if tau is not None and (stored is None or tau < stored * (1 - 1e-6)) and deadline_h != plan.constraints.deadline_h:
        was = "none" if stored is None else f"{stored / 3600:.2f} h"
        notes.append(
            f"the periodic checkpoint interval is {tau / 3600:.2f} h for this deadline (the plan's: {was}), short "
            "enough to keep the training a preemption can lose within the slack; a launch of the plan saves at its "
            "own deadline's interval"
        )
    return notes


def planned_interval_s(plan: Any, index: int, *, deadline_h: float | None = None) -> float | None:
    """The periodic checkpoint interval of ``plan.entries[index]`` as the job saves at it, the replay replays it and
    the launch's guard keeps its training at risk in hand: the plan's (None: the run is shorter than it), and for a
    spot or mixed entry whose save misses the notice under the plan's deadline (or ``deadline_h``), no longer than
    :func:`~predictor.runs.spot.deadline_interval_cap_s` (a plan ranked before the sixty-second session carries
    Young-Daly's alone: 16.5 h for a 7B on one p4d, which sent the guard to on-demand hours early)."""
    entry = plan.entries[index]
    stored = entry.checkpoint_interval_s if entry.checkpoint_interval_s is not None else math.inf
    deadline = deadline_h if deadline_h is not None else plan.constraints.deadline_h
    save = planned_save_s(plan, entry)
    if entry.market == "on-demand" or deadline is None or saves_on_notice(save):
        return entry.checkpoint_interval_s
    load = plan.checkpoint_s if plan.checkpoint_s is not None else DEFAULT_CHECKPOINT_S
    factor = confidence_factor(entry, plan.constraints.confidence)
    run_s = _predicted_work_s(plan, entry)
    cap = deadline_interval_cap_s(deadline * 3600.0, entry.startup_s or 0.0, save, load, run_s, entry.gpus, factor)
    tau = min(stored, float(cap[0]))
    return tau if math.isfinite(tau) else None


def _predicted_work_s(plan: Any, entry: Any) -> float:
    """The entry's training at the predicted step: the plan's optimizer steps x the step (a plan made before the
    global batch was recorded: its predicted time less the start-up)."""
    if entry.global_batch:
        return plan.constraints.work_samples / entry.global_batch * entry.iteration_time_s
    return max(1.0, entry.time_h * 3600 - (entry.startup_s or 0.0))


def _planned_work_s(plan: Any, entry: Any, step_quantile: float | None) -> tuple[float, float | None, list[str]]:
    """(the entry's work in seconds at the step's ``step_quantile`` (None: the prediction), the work the policy
    plans for until it measures the step (the plan's confidence; None: the same), notes). The work is the plan's
    optimizer steps x the predicted step (a plan made before the global batch was recorded: its predicted time less
    the start-up)."""
    notes: list[str] = []
    predicted_s = _predicted_work_s(plan, entry)
    if not entry.global_batch:
        notes.append("the plan does not record its global batch: the work is its predicted time less the start-up")
    work_s = predicted_s * confidence_factor(entry, step_quantile)
    if step_quantile is not None and step_quantile != 0.5:
        notes.append(
            f"the step is taken at its {step_quantile:.0%} quantile: x{work_s / predicted_s:.2f} the predicted "
            "training time"
        )
    factor = confidence_factor(entry, plan.constraints.confidence)
    planned_s: float | None = None
    if factor > 1.0:  # the deadline was asked at a confidence: the policy plans for that quantile until it measures
        planned_s = predicted_s * factor
        notes.append(
            f"until the step is measured (its first {MEASURED_AFTER_S:.0f} s of training) the policy plans for the "
            f"plan's {plan.constraints.confidence:.0%} confidence, x{factor:.2f} the predicted training time, as "
            "srifty launch's guard does"
        )
    return work_s, planned_s, notes


def _fleet_prices(entry: Any, index: int, catalog: Any) -> tuple[float, float]:
    """($/h of the fleet all on-demand, $/h of it as bought): the on-demand fallback from the catalog; spot as the
    plan priced it (an on-demand entry: its groups at the catalog's spot prices, as if bought on spot)."""
    od = sp = 0.0
    for g in entry.groups:
        it = catalog.get(g.instance_type)
        p_od = it.price_usd_hr(entry.region, "on-demand")
        p_sp = it.price_usd_hr(entry.region, "spot")
        if p_od is None:
            raise ConfigError.between(
                "{type} has no on-demand price in {region} in the catalog: the fallback cannot be priced. Refresh the "
                "catalog (srifty catalog refresh) or pick another entry with {choice}.",
                parameter="choice",
                value=index,
                type=g.instance_type,
                region=entry.region,
            )
        od += p_od * g.count
        sp += p_od * g.on_demand + (p_sp if p_sp is not None else p_od) * g.spot
    return od, (entry.usd_per_hour if entry.market != "on-demand" else sp)  # what the plan priced
