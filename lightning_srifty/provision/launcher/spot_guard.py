"""The launcher's deadline-aware spot policy (issue #25): at each check, stay on spot, wait for spot, fall back to
on-demand or return to spot, and never let the slack fall below what an on-demand finish needs.

:class:`SpotGuard` feeds a :mod:`predictor.runs.deadline` policy (default :class:`~predictor.runs.deadline.Srifty`)
what
``srifty launch`` knows, in the policy's tick model with the check interval as the tick:

- the deadline: the plan's ``constraints.deadline_h`` from when the launch began working to the plan;
- the work: the plan's steps (``work_samples`` / the global batch) at the measured step time (``PROGRESS.json``),
  else at the plan's predicted one at the plan's confidence (the global batch / the entry's throughput, x
  ``odds.confidence_factor``: the quantile the ranking held to the deadline; start-up and interruptions excluded,
  the tick model counts those itself);
- the progress: the job's global step (``PROGRESS.json``, ``PREEMPTED.json``);
- the restart: the last move's measured downtime (or its checkpoint + new fleet up + restart), else the plan's
  start-up for the fleet and a checkpoint save and load (``plan.checkpoint_s``);
- spot availability: what the launcher saw last (a spot fleet running or started: there; a notice or a refused spot
  start: gone), one observation per tick for the policy's history.

The on-demand fallback is the same fleet (types and counts) all on-demand (:func:`on_demand_fleet`): the plan's own
entry when it has one, else a copy of the spot entry priced from the catalog. "Return to spot" is the spot (or
mixed) entry itself. The launcher moves between them on its own (:mod:`lightning_srifty.provision.launcher.launch`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lightning_srifty.provision.terraform.money import group_usd_per_hour
from predictor.catalog import Catalog
from predictor.documents.checks import refused
from predictor.documents.plan import Plan, PlanEntry, scaled_interval
from predictor.exceptions import ConfigError
from predictor.runs import deadline, odds
from predictor.runs.spot import on_demand_cost, on_demand_time_s, planned_save_s, saves_on_notice

Running = Literal["spot", "on-demand"] | None
Action = Literal["spot", "wait", "on-demand"]
POLICY_NAMES = ("srifty", "greedy", "uniform", "off")
DEFAULT_CHECK_S = 300.0


@dataclass(frozen=True)
class Decision:
    """What the guard decided at one check, with the figures it decided on (hours)."""

    action: Action
    forced: bool  # the hard rule decided (on-demand, whatever the policy would do)
    time_left_h: float  # until the deadline
    work_left_h: float  # training still to do, at the step time in use
    restart_h: float  # what one more fleet start costs before training resumes
    at_risk_h: float = 0.0  # training a preemption would undo (a save that misses the notice), kept in hand too

    @property
    def slack_h(self) -> float:
        """Time to spare: the time left less the work left."""
        return self.time_left_h - self.work_left_h

    def describe(self) -> str:
        """``slack 3.10 h > the 0.40 h an on-demand finish needs: waiting for spot``."""
        what = {"spot": "spot", "wait": "waiting for spot", "on-demand": "on-demand"}[self.action]
        slack, needs = duration(self.slack_h * 3600), duration(self.restart_h * 3600)
        if self.forced and self.slack_h < self.restart_h:  # a trial read "slack -68.90 h, within a check of ..."
            return (
                f"slack {slack}: the deadline is out of reach even on-demand (the work left takes "
                f"{duration(self.work_left_h * 3600)} at the step time in use, {duration(self.time_left_h * 3600)} "
                f"are left): {what}, the soonest finish"
            )
        if self.at_risk_h > 0:  # the save misses the notice: the training not saved is kept in hand too
            needs = (
                f"{duration((self.restart_h + self.at_risk_h) * 3600)} an on-demand finish needs after a preemption "
                f"({needs} to restart, {duration(self.at_risk_h * 3600)} of training to redo: the save misses the "
                "spot notice)"
            )
        else:
            needs = f"{needs} an on-demand finish needs"
        if self.forced:
            return f"slack {slack}, within a check of the {needs} (the hard rule): {what}"
        return f"slack {slack} > the {needs}: {what}"


def duration(seconds: float) -> str:
    """``3.10 h``, ``12 min`` or ``0.7 s``: hours for a run's scale, smaller units where hours would read 0.00."""
    if abs(seconds) >= 360:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.0f} min" if abs(seconds) >= 60 else f"{seconds:.1f} s"


def policy_for(name: str | None, entry: PlanEntry, plan: Plan) -> str:
    """The spot policy to run: ``name`` when given (checked), else ``srifty`` for a spot or mixed entry of a plan with
    a deadline and ``off`` otherwise.

    Raises:
        ConfigError: an unknown name, or a policy asked for where it has nothing to work with (naming the fix).
    """
    if name is None:
        return "srifty" if entry.market != "on-demand" and plan.constraints.deadline_h else "off"
    if name not in POLICY_NAMES:
        expected = "one of {" + ", ".join(POLICY_NAMES) + "}"
        raise refused(
            "The 'spot_policy' parameter of launch()", expected, name, parameter="spot_policy", owner="launch()"
        )
    if name != "off" and entry.market == "on-demand":
        raise ConfigError.between(
            "{spot_policy} {name} steers a spot or mixed fleet, but the chosen entry {fleet} is on-demand: choose a "
            "spot or mixed entry ({choice}) or leave {spot_policy} off.",
            parameter="spot_policy",
            value=name,
            name=name,
            fleet=entry.fleet,
        )
    if name != "off" and not plan.constraints.deadline_h:
        raise ConfigError.between(
            "{spot_policy} {name} weighs spot against a deadline, but the plan has none (constraints.deadline_h): "
            "rank with srifty recommend --deadline H, or use {spot_policy} off.",
            parameter="spot_policy",
            value=name,
            name=name,
        )
    return name


def on_demand_fleet(plan: Plan, index: int, catalog: Any = None) -> tuple[Plan, int]:
    """The fleet of ``plan.entries[index]`` all on-demand, as ``(plan, index)``: the entry itself when it is
    on-demand, the plan's entry with the same instance types, counts and region on-demand when it has one, else the
    plan with an on-demand copy of the entry appended (priced from ``catalog``, default ``Catalog.load()``; its
    predicted time without the spot interruptions but with its node failures, and the checkpoint interval for those
    by the plan's one rule, :func:`~predictor.runs.spot.on_demand_cost`; no spot risk).

    Raises:
        ConfigError: the catalog has no on-demand price for a type of the fleet in its region.
    """
    entry = plan.entries[index]
    if entry.market == "on-demand":
        return plan, index
    shape = [(g.instance_type, g.count) for g in entry.groups]
    for i, other in enumerate(plan.entries):
        if (
            other.market == "on-demand"
            and other.region == entry.region
            and [(g.instance_type, g.count) for g in other.groups] == shape
        ):
            return plan, i

    od = _on_demand_copy(plan, index, Catalog.load() if catalog is None else catalog)
    entries = type(plan.entries)((*plan.entries, od))  # the plan's own sequence type (tuple or list)
    return dataclasses.replace(plan, entries=entries), len(plan.entries)


def _on_demand_copy(plan: Plan, index: int, catalog: Any) -> PlanEntry:
    """``plan.entries[index]`` bought on-demand (:func:`on_demand_fleet`), ranked after the plan's entries."""
    entry = plan.entries[index]
    groups = type(entry.groups)(
        dataclasses.replace(
            g,
            on_demand=g.count,
            spot=0,
            usd_per_hour=group_usd_per_hour(
                catalog, g.instance_type, entry.region, g.count, 0, f"entries[{index}].groups[{k}].instance_type"
            ),
        )
        for k, g in enumerate(entry.groups)
    )
    usd = sum(g.usd_per_hour for g in groups)
    # the same work on the same GPUs, without spot's interruptions: its node failures and their checkpoint interval
    start_s = entry.startup_s or 0.0
    work_s = plan.constraints.work_samples / entry.throughput_samples_s
    priced = on_demand_cost(
        work_s, planned_save_s(plan, entry), restart_s=start_s, gpus=entry.gpus, load_s=plan.checkpoint_s
    )
    time_h = (start_s + float(priced.expected_time_s[0])) / 3600
    tau = float(priced.checkpoint_interval_s[0])
    # the intervals by the plan's one rule (the start-up fixed), on the on-demand time and price
    step = entry.iteration_time_s or 1.0
    lo, hi = (t / step for t in entry.iteration_time_interval_s)
    start_h = start_s / 3600
    od = dataclasses.replace(
        entry,
        rank=len(plan.entries) + 1,
        groups=groups,
        market="on-demand",
        spot_share=0.0,
        usd_per_hour=usd,
        time_h=time_h,
        cost_usd=usd * time_h,
        time_interval_h=scaled_interval(time_h, start_h, lo, hi),
        cost_interval_usd=scaled_interval(usd * time_h, usd * start_h, lo, hi),
        expected_interruptions=0.0,
        interruption_overhead_s=0.0,
        risk="none",
        pareto=False,
        checkpoint_interval_s=tau if math.isfinite(tau) else None,
        savings_vs_current=None,
    )
    return od


def total_steps(plan: Plan, global_batch: int) -> int:
    """Optimizer steps the plan's work takes at ``global_batch`` samples per step."""
    return max(1, math.ceil(plan.constraints.work_samples / global_batch - 1e-9))


class SpotGuard:
    """The policy, fed what the launcher measures (see the module doc). Pure apart from the clock it is given:
    :meth:`decide` takes ``now`` (unix seconds), so tests script time.

    Args:
        policy: a :mod:`predictor.runs.deadline` policy (``Srifty()``, ``Greedy()``, ``UniformProgress()``).
        started_unix: when the launch began working to the plan (the deadline counts from then).
        deadline_h: the plan's deadline.
        steps: the optimizer steps of the whole run.
        step_s: the predicted seconds per optimizer step (replaced by the measured one once the job reports it).
        restart_s: a new fleet's start-up and a checkpoint save and load, as predicted (replaced by the measured one).
        check_s: seconds between checks: the tick of the policy's model.
        spot_usd_hr, od_usd_hr: the fleet on its spot (or mixed) market and all on-demand, per hour.
        gpus: the fleet's GPUs, whose node failures an on-demand finish meets (0: none priced).
        checkpoint_s: the plan's checkpoint save (None: :data:`~predictor.runs.spot.DEFAULT_CHECKPOINT_S`), which sets
            the on-demand finish's periodic checkpoints for those failures.
        confidence: the plan's (``constraints.confidence``): the on-demand finish's node failures are held at that
            quantile (None, a plan made before confidences: their expectation).
        load_s: a checkpoint's load after a node failure (None: the save's).
        save_s: the leaving fleet's save, part of ``restart_s`` (a node failure gives no notice to save on).
        startup_s: a node failure's restart before its load, as the ranking prices it: the fleet's start-up (None:
            the whole ``restart_s``). A measured move (:meth:`restarted`) makes it slower by what the move took beyond
            the predicted one, its save aside; never faster.
        at_risk_s: the training a spot preemption can lose: the fleet's periodic checkpoint interval where its save
            misses the notice (inf: it takes no periodic save), 0 where the save fits it. The hard rule keeps it in
            hand (never more than the steps done), as the ranking's fallback does: the guard sees the steps done,
            not the steps saved.

    The hard rule leaves room for what an on-demand finish of the steps left takes beyond them
    (:func:`~predictor.runs.spot.on_demand_time_s`: its periodic saves, and its node failures, each costing the
    restart, a load and the work since the last save); the policy's own line is drawn on the steps as before. The
    plan's one quantile is held once: while the step is predicted, at the confidence (its factor) with the failures
    at their expectation, as the ranking holds it; once the job has measured its step, the failures at the
    confidence. A measured step time already holds the saves its leg made, so they are counted twice then: at most
    the save's share of a step (``checkpoint_s`` over the interval, under 1 % for the plan's intervals), on the
    deadline's safe side.
    """

    def __init__(
        self,
        policy: deadline.Policy,
        *,
        started_unix: float,
        deadline_h: float,
        steps: int,
        step_s: float,
        restart_s: float,
        check_s: float,
        spot_usd_hr: float,
        od_usd_hr: float,
        gpus: float = 0.0,
        checkpoint_s: float | None = None,
        confidence: float | None = None,
        load_s: float | None = None,
        save_s: float = 0.0,
        startup_s: float | None = None,
        at_risk_s: float = 0.0,
    ) -> None:
        for name, value in (("deadline_h", deadline_h), ("step_s", step_s), ("check_s", check_s)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"The spot guard's {name} must be > 0. Got {value!r}.", parameter=name, value=value)
        self.policy = policy
        self.started_unix, self.deadline_s, self.steps = started_unix, deadline_h * 3600.0, steps
        self.predicted_step_s, self.predicted_restart_s = step_s, restart_s
        self.measured_step_s: float | None = None  # the job's, once it reports
        self.measured_restart_s: float | None = None
        self.check_s, self.spot_usd_hr, self.od_usd_hr = check_s, spot_usd_hr, od_usd_hr
        self.gpus, self.checkpoint_s, self.confidence = gpus, checkpoint_s, confidence
        self.load_s = load_s  # a checkpoint's load after a failure (default: its save's)
        self.save_s, self.startup_s = save_s, startup_s  # a move's save; a failure's restart
        self.measured_save_s: float | None = None  # the measured move's own save
        self.at_risk_s = at_risk_s
        self.step = 0
        self.available = True  # until seen otherwise: the plan priced spot as there
        self._seen: list[bool] = []  # spot availability at each tick passed
        self.policy.reset(self.ticks(started_unix), 1)

    # --- what the launcher tells it -----------------------------------------------------------------------------------

    def progress(self, step: int | None, step_time_s: float | None = None) -> None:
        """The job's global step (never backwards: a resume from an older checkpoint keeps the newest seen until it
        is passed) and its measured seconds per step."""
        if step is not None:
            self.step = max(self.step, int(step))
        if step_time_s is not None and math.isfinite(step_time_s) and step_time_s > 0:
            self.measured_step_s = float(step_time_s)

    def restarted(self, seconds: float | None, save_s: float | None = None) -> None:
        """A move's measured cost before training resumed (the old leg's last step to the new leg's first), and its
        save's (``save_s``, part of it; None: not measured)."""
        if seconds is not None and math.isfinite(seconds) and seconds >= 0:
            self.measured_restart_s = float(seconds)
            ok = save_s is not None and math.isfinite(save_s) and 0 <= save_s <= seconds
            self.measured_save_s = float(save_s) if ok and save_s is not None else None

    def observe(self, available: bool, now: float | None = None) -> None:
        """What the launcher saw of spot capacity: a spot fleet running or started (True), a notice or a refused
        spot start (False)."""
        self._catch_up(time.time() if now is None else now)
        self.available = bool(available)

    # --- the model ----------------------------------------------------------------------------------------------------

    @property
    def step_s(self) -> float:
        return self.measured_step_s or self.predicted_step_s

    @property
    def restart_s(self) -> float:
        return self.predicted_restart_s if self.measured_restart_s is None else self.measured_restart_s

    @property
    def failure_restart_s(self) -> float:
        """A node failure's restart before its load (:attr:`startup_s`), slower by what a measured move took beyond
        the predicted one, each without its save (a faster save says nothing of a failure's start-up: a review's
        move that saved in 20 s of a predicted 600 and started 250 s slow had made failures free); never faster."""
        predicted = self.predicted_restart_s if self.startup_s is None else self.startup_s
        if self.measured_restart_s is None:
            return predicted
        save = self.save_s if self.measured_save_s is None else self.measured_save_s
        beyond = (self.measured_restart_s - save) - (self.predicted_restart_s - self.save_s)
        return predicted + max(0.0, beyond)

    @property
    def at_risk_now_s(self) -> float:
        """The training a preemption would undo now: ``at_risk_s``, never more than the steps done."""
        return min(self.at_risk_s, self.step * self.step_s)

    @property
    def work_left_s(self) -> float:
        """An on-demand finish of the steps left: their training at :attr:`step_s`, the periodic saves and the node
        failures it meets (:func:`~predictor.runs.spot.on_demand_time_s`), the failures at the plan's confidence once
        the step is measured (before, the step is at it)."""
        left_s = max(0, self.steps - self.step) * self.step_s
        if left_s <= 0:
            return 0.0
        confidence = self.confidence if self.measured_step_s is not None else None
        return on_demand_time_s(left_s, self.checkpoint_s, self.failure_restart_s, self.gpus, confidence, self.load_s)

    def _tick(self, now: float) -> int:
        """Ticks passed since the start, rounded up (time counts as spent: conservative for the deadline)."""
        return max(0, math.ceil((now - self.started_unix) / self.check_s - 1e-9))

    def _catch_up(self, now: float) -> None:
        """One availability observation per tick passed: what was last seen."""
        tick = self._tick(now)
        self._seen.extend([self.available] * (tick - len(self._seen)))

    def ticks(self, now: float) -> deadline.Ticks:
        """The run in ticks as of ``now``: the work is the steps done (rounded down) plus the steps left (rounded
        up), the restart rounded up and the deadline down, all against the deadline; ``finish_extra`` what an
        on-demand finish adds to the steps left (:attr:`work_left_s`) and the training a preemption would undo
        (``at_risk_s``, at most the steps done), for the hard rule."""
        t = self.check_s
        done = math.floor(self.step * self.step_s / t + 1e-9)
        left = math.ceil(max(0, self.steps - self.step) * self.step_s / t - 1e-9)
        finish = math.ceil(self.work_left_s / t - 1e-9)
        at_risk = math.ceil(self.at_risk_now_s / t - 1e-9)  # what a preemption would undo
        return deadline.Ticks(
            tick_s=t,
            work=max(1, done + left),
            deadline=math.floor(self.deadline_s / t + 1e-9),
            restart=math.ceil(self.restart_s / t - 1e-9),
            checkpoint=None,
            spot_usd=self.spot_usd_hr * t / 3600.0,
            od_usd=self.od_usd_hr * t / 3600.0,
            save_on_notice=True,
            finish_extra=max(0, finish - left) + at_risk,
        )

    def state(self, now: float, running: Running, available: bool | None = None) -> deadline.State:
        self._catch_up(now)
        tick, j = self._tick(now), self.ticks(now)
        return deadline.State(
            tick=tick,
            done=min(j.work, math.floor(self.step * self.step_s / self.check_s + 1e-9)),
            running={"spot": 0, "on-demand": deadline.ON_DEMAND, None: None}[running],
            overhead=0,
            available=np.array([self.available if available is None else available]),
            seen=np.array([self._seen[:tick]], dtype=bool).reshape(1, tick),
        )

    def decide(self, now: float, running: Running, available: bool | None = None) -> Decision:
        """What to run from ``now`` to the next check, given the fleet ``running`` (None: none) and spot capacity
        (``available``; None: what was last seen. The launcher asks "would you move if spot were there?" with True
        while on on-demand, and then tries a spot start). The hard rule
        (:func:`predictor.runs.deadline.must_run_on_demand`) is checked here too, whatever the policy."""
        s, j = self.state(now, running, available), self.ticks(now)
        forced = deadline.must_run_on_demand(s, j)
        act = deadline.ON_DEMAND if forced else self.policy.decide(s, j)
        action: Action = "on-demand" if act == deadline.ON_DEMAND else "wait" if act == deadline.WAIT else "spot"
        if action == "spot" and not s.available[0]:
            action = "wait"  # a policy never picks a zone without spot; kept safe all the same
        return Decision(
            action,
            forced,
            time_left_h=(self.started_unix + self.deadline_s - now) / 3600.0,
            work_left_h=self.work_left_s / 3600.0,
            restart_h=self.restart_s / 3600.0,
            at_risk_h=self.at_risk_now_s / 3600.0,
        )


def guard_for(
    name: str,
    plan: Plan,
    index: int,
    od_plan: Plan,
    od_index: int,
    *,
    started_unix: float,
    global_batch: int,
    check_s: float,
) -> SpotGuard | None:
    """The guard for the spot (or mixed) ``plan.entries[index]`` and its on-demand twin; None for ``off``."""
    if name == "off":
        return None
    entry, od = plan.entries[index], od_plan.entries[od_index]
    ckpt = plan.checkpoint_s if plan.checkpoint_s is not None else 0.0  # the load, on any fleet
    save = entry.checkpoint_s if entry.checkpoint_s is not None else ckpt  # the leaving fleet's own save
    # at the plan's confidence until the job reports its measured step (the quantile the ranking held to the deadline)
    at_confidence = odds.confidence_factor(entry, plan.constraints.confidence)
    return SpotGuard(
        deadline.policy(name),
        started_unix=started_unix,
        deadline_h=float(plan.constraints.deadline_h or 0.0),
        steps=total_steps(plan, global_batch),
        step_s=global_batch / entry.throughput_samples_s * at_confidence,
        restart_s=(entry.startup_s or 0.0) + save + ckpt,  # start-up, the leaving save and the restore
        check_s=check_s,
        spot_usd_hr=entry.usd_per_hour,
        od_usd_hr=od.usd_per_hour,
        gpus=float(od.gpus),
        checkpoint_s=planned_save_s(plan, od),
        confidence=plan.constraints.confidence,
        load_s=plan.checkpoint_s,
        save_s=save,
        startup_s=entry.startup_s or 0.0,  # a failure restarts with the start-up and its load, as the ranking prices it
        # a preemption loses the training since the last periodic save where the save misses the notice
        at_risk_s=0.0 if saves_on_notice(save) else (deadline.planned_interval_s(plan, index) or math.inf),
    )
