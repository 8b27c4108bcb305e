"""Spot under a deadline: when to gamble on spot capacity, when to fall back to on-demand, and what a run would have
cost on the capacity AWS actually had.

One model of a run, in whole ticks of ``tick_s`` seconds (the trace's gap, or a multiple of it):

- the job needs ``work`` ticks of training on the fleet (the plan's predicted time, start-up excluded);
- every new fleet (a spot start, an on-demand start, a return to spot) costs ``restart`` ticks before training
  resumes: the checkpoint save of the fleet it leaves, the new fleet's start-up and the checkpoint load, rounded
  up to whole ticks (conservative);
- spot is usable during tick ``k`` of zone ``z`` when the trace has the fleet's spot node count available at ``k``;
  a spot fleet whose capacity goes away is preempted at the tick's start. AWS gives a two-minute notice: when the
  checkpoint save fits in it (``save_on_notice``, what ``srifty launch`` does), nothing trained is lost; otherwise the
  progress since the last periodic checkpoint is;
- on-demand capacity is always there; waiting costs nothing; every tick of a running fleet is billed at its price.

A :class:`Policy` decides at each tick boundary from what it could know then (the job, the time, the committed
progress, the fleet it runs, the availability observed so far): stay, start spot (which zone), wait for spot, or run
on-demand. Every policy here except ``on-demand`` keeps the same hard rule (:func:`must_run_on_demand`): it never
lets the slack fall below what an on-demand finish needs, so a feasible deadline is always met.

:func:`replay` runs a policy over a trace; :func:`optimum` is the hindsight optimum, an exact dynamic programme over
the same tick model knowing the whole trace (and never losing work): the yardstick no online policy can beat.

Policies: ``on-demand`` (never spot), ``greedy`` (spot whenever available, wait otherwise, on-demand only when the
deadline forces it: Can't Be Late's greedy with its safety net), ``uniform`` (Can't Be Late's uniform progress: run
on-demand while behind the straight line from 0 to the work at the deadline, with hysteresis), and ``srifty`` (the
product's: fill the spot-less time with on-demand only as much as the expected spot progress in the remaining time
falls short of the remaining work).

References: Wu et al., *Can't Be Late: Optimizing Spot Instance Savings under Deadlines*, NSDI 2024; the traces:
github.com/skypilot-org/spot-traces.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from predictor.exceptions import ConfigError

NOTICE_S = 120.0  # the EC2 spot interruption notice
WAIT, ON_DEMAND = -1, -2  # actions besides "spot in zone z" (z >= 0)
TraceValues = Literal["available", "preempted"]


# ---------------------------------------------------------------- traces


@dataclass(frozen=True)
class Trace:
    """Spot availability of one or more zones: ``available[z, k]`` is True when zone ``z`` had the fleet's spot node
    count at tick ``k``; ``gap_s`` seconds per tick."""

    gap_s: float
    available: np.ndarray  # (zones, ticks) bool
    names: tuple[str, ...] = ()
    counts: np.ndarray | None = None  # (zones, ticks) instances available, when the trace gives counts

    @property
    def ticks(self) -> int:
        return int(self.available.shape[1])

    @property
    def hours(self) -> float:
        return self.ticks * self.gap_s / 3600.0

    def resample(self, factor: int) -> Trace:
        """Ticks of ``factor`` x the gap; a coarse tick is available only when every tick in it was (a preemption
        anywhere inside ends the spot fleet: conservative for spot)."""
        if factor <= 1:
            return self
        n = self.ticks // factor
        a = self.available[:, : n * factor].reshape(self.available.shape[0], n, factor).all(axis=2)
        return Trace(self.gap_s * factor, a, self.names)

    def window(self, start: int, length: int) -> Trace:
        return Trace(self.gap_s, self.available[:, start : start + length], self.names)

    def availability(self) -> float:
        """Share of ticks with spot in at least one zone."""
        return float(self.available.any(axis=0).mean()) if self.ticks else 0.0


def _trace_error(path: str, field_name: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"Spot trace {path}: {field_name} {fix}", parameter=field_name, value=value)


def read_trace(
    source: str | os.PathLike[str] | dict[str, Any],
    *,
    nodes: int = 1,
    values: TraceValues | None = None,
) -> tuple[Trace, list[str]]:
    """One zone's trace in the format of skypilot-org/spot-traces: ``{"metadata": {"gap_seconds": G}, "data": [...]}``
    where ``data`` holds, per tick, the number of instances available (``values="available"``, the repository's
    README) or, for its single-node files, a preempted flag (``"preempted"``: 1 = no capacity, how the Can't Be Late
    simulator reads them). ``metadata.values`` may say which; ``values`` overrides it. Spot is usable at a tick when at
    least ``nodes`` instances are available.

    Returns the trace and notes (how it was read). Raises :class:`ConfigError` naming the field, the value and the fix.
    """
    path = str(source) if not isinstance(source, dict) else "(inline)"
    if isinstance(source, dict):
        doc = source
    else:
        try:
            with open(source) as f:
                doc = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"Spot trace {path} is not JSON ({exc}).", parameter="trace", value=path) from None
    if not isinstance(doc, dict):
        raise _trace_error(path, "the document", type(doc).__name__, "must be an object with 'metadata' and 'data'.")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise _trace_error(
            path, "metadata.gap_seconds", None, "is missing: write {\"metadata\": {\"gap_seconds\": 300}, ...}."
        )
    gap = meta["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap <= 0:
        raise _trace_error(path, "metadata.gap_seconds", gap, f"must be a number of seconds > 0; got {gap!r}.")
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise _trace_error(path, "data", type(data).__name__, "must be a non-empty list of instance counts per tick.")
    bad = [(i, v) for i, v in enumerate(data) if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        i, v = bad[0]
        raise _trace_error(path, f"data[{i}]", v, f"must be a number of instances; got {v!r} ({len(bad)} such).")
    arr = np.asarray(data, dtype=float)
    if (arr < 0).any() or (arr != np.floor(arr)).any():
        i = int(np.flatnonzero((arr < 0) | (arr != np.floor(arr)))[0])
        raise _trace_error(path, f"data[{i}]", data[i], f"must be a whole number of instances >= 0; got {data[i]!r}.")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"nodes must be a whole number >= 1; got {nodes!r}.", parameter="nodes", value=nodes)
    notes: list[str] = []
    declared = meta.get("values")
    how = values or declared
    if how is None:
        how = "available"
        if set(np.unique(arr)) <= {0.0, 1.0}:
            notes.append(
                f"{os.path.basename(path)}: 0/1 values read as instances available (the spot-traces README); the Can't "
                "Be Late simulator reads its single-node files as preempted flags: --trace-values preempted"
            )
    if how not in ("available", "preempted"):
        raise _trace_error(path, "metadata.values", how, "must be 'available' or 'preempted'.")
    if how == "preempted":
        if not set(np.unique(arr)) <= {0.0, 1.0}:
            raise _trace_error(path, "data", "counts", "holds counts above 1: it cannot be read as preempted flags.")
        counts = np.where(arr > 0, 0.0, 1.0)
    else:
        counts = arr
    if nodes > 1 and counts.max() < nodes:
        notes.append(
            f"{os.path.basename(path)}: never {nodes} instances available (at most {int(counts.max())}): spot is "
            "never usable for this fleet"
        )
    name = os.path.splitext(os.path.basename(path))[0]
    return Trace(float(gap), (counts >= nodes)[None, :], (name,), counts[None, :]), notes


def combine(traces: Sequence[Trace]) -> Trace:
    """Zones side by side (the plan may move between them): same gap, cut to the shortest."""
    if not traces:
        raise ConfigError("At least one trace is needed.", parameter="trace")
    gaps = {t.gap_s for t in traces}
    if len(gaps) != 1:
        raise ConfigError(
            f"Traces of one replay must share metadata.gap_seconds; got {sorted(gaps)}.", parameter="trace"
        )
    n = min(t.ticks for t in traces)
    return Trace(
        traces[0].gap_s,
        np.concatenate([t.available[:, :n] for t in traces]),
        tuple(name for t in traces for name in t.names),
    )


# ---------------------------------------------------------------- the job


@dataclass(frozen=True)
class Job:
    """A run to place, in seconds and USD per hour of the whole fleet."""

    work_s: float  # training time on the fleet (start-up excluded)
    deadline_s: float  # from the start of the run
    restart_s: float  # save + start-up + restore, per new fleet
    spot_usd_hr: float  # the fleet on its spot market (a mixed fleet: its on-demand base + spot share)
    od_usd_hr: float  # the same fleet all on-demand
    checkpoint_interval_s: float | None = None  # periodic checkpoints while on spot (None: none)
    save_on_notice: bool = True  # the save fits the two-minute notice: a preemption loses nothing

    def __post_init__(self) -> None:
        for name in ("work_s", "deadline_s", "spot_usd_hr", "od_usd_hr"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be a number > 0; got {v!r}.", parameter=name, value=v)
        if not (math.isfinite(self.restart_s) and self.restart_s >= 0):
            raise ConfigError(f"restart_s must be >= 0; got {self.restart_s!r}.", parameter="restart_s")


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
        )

    @property
    def feasible(self) -> bool:
        """An on-demand run from the start meets the deadline."""
        return self.restart + self.work <= self.deadline


# ---------------------------------------------------------------- policies


@dataclass
class State:
    """What a policy sees at a tick boundary."""

    tick: int
    done: int  # committed progress (ticks of work)
    running: int | None  # None, ON_DEMAND, or a spot zone
    overhead: int  # restart ticks still to pay on the running fleet
    available: np.ndarray  # (zones,) spot usable this tick
    seen: np.ndarray  # (zones, tick) availability observed so far (this tick excluded)


def must_run_on_demand(s: State, j: Ticks) -> bool:
    """The hard rule: anything but on-demand for one more tick could leave too little time for an on-demand finish.

    Worst case of one more tick off on-demand: no committed progress, then a fresh on-demand fleet (``restart``)
    for the remaining work. The rule held a tick ago, so an on-demand fleet started (or kept) now finishes in time:
    ``tick + restart + left <= deadline``."""
    return s.tick + 1 + j.restart + (j.work - s.done) > j.deadline


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
        return WAIT if zone is None else zone


class UniformProgress(Policy):
    """Can't Be Late's uniform progress: the target is the straight line from 0 to the work at the deadline (less
    one restart); behind it, run on-demand when spot is not there; ahead of it, wait for spot. Hysteresis: an
    on-demand fleet is kept until the progress is a restart's worth ahead of the line, and left only for spot."""

    name = "uniform"

    def decide(self, s: State, j: Ticks) -> int:
        if must_run_on_demand(s, j):
            return ON_DEMAND
        horizon = max(1, j.deadline - j.restart)
        target = j.work * (s.tick + 1) / horizon
        zone = _spot_zone(s)
        if s.running == ON_DEMAND:
            if zone is not None and s.done >= target + j.restart:
                return zone
            return ON_DEMAND
        if zone is not None:
            return zone
        return ON_DEMAND if s.done < target else WAIT


@dataclass
class Srifty(Policy):
    """The product's policy. At each tick it estimates what spot can still do before the deadline from what it has
    seen (the share of time spot was there and how long a spell lasted, with a prior worth ``prior_weight_h`` hours)
    and runs on-demand while spot is away only as much as the remaining work exceeds that estimate:

    - the *deficit*: remaining work - ``pessimism`` x expected spot progress in the time left (the time spot is
      there, less a restart per spell); ``pessimism`` < 1 discounts the estimate for its variance;
    - spot away: on-demand while the deficit is positive (an on-demand fleet is kept until the deficit is a restart
      below zero: hysteresis), else wait, which is free;
    - spot there: a spot fleet stays, a waiting run starts spot; an on-demand fleet moves to spot only when the
      expected spell repays it: ``(od - spot) x (spell - restart) > spot x restart``, plus ``od x restart`` when the
      deficit says it must come back to on-demand later;
    - always the hard rule (:func:`must_run_on_demand`).
    """

    pessimism: float = 0.8
    prior_availability: float = 0.5
    prior_spell_h: float = 2.0
    prior_weight_h: float = 12.0
    name: str = field(default="srifty", init=False)

    def reset(self, j: Ticks, zones: int) -> None:
        self._seen = 0  # ticks observed
        self._there = 0  # ticks with spot in some zone
        self._spells = 0  # spot spells begun
        self._prev = False

    def _observe(self, s: State) -> None:
        while self._seen < s.seen.shape[1]:  # incremental: the history grows one tick per call
            there = bool(s.seen[:, self._seen].any())
            self._there += there
            self._spells += there and not self._prev
            self._prev = there
            self._seen += 1

    def _estimate(self, j: Ticks) -> tuple[float, float]:
        """(availability share, mean spot spell in ticks) from history and prior."""
        w = self.prior_weight_h * 3600.0 / j.tick_s
        there = self.prior_availability * w + self._there
        avail = there / (w + self._seen)
        prior_spells = self.prior_availability * w / max(1.0, self.prior_spell_h * 3600.0 / j.tick_s)
        return float(avail), float(max(1.0, there / (prior_spells + self._spells)))

    def decide(self, s: State, j: Ticks) -> int:
        self._observe(s)
        if must_run_on_demand(s, j):
            return ON_DEMAND
        avail, spell = self._estimate(j)
        left = j.work - s.done
        remaining = max(0, j.deadline - s.tick - j.restart)  # keep one restart in hand
        spot_progress = avail * remaining * max(0.0, 1.0 - j.restart / spell)
        deficit = left - self.pessimism * spot_progress
        zone = _spot_zone(s)
        if zone is not None:
            if s.running != ON_DEMAND:
                return zone
            gain = (j.od_usd - j.spot_usd) * (spell - j.restart) - j.spot_usd * j.restart
            if deficit > 0:
                gain -= j.od_usd * j.restart
            return zone if gain > 0 else ON_DEMAND
        if s.running == ON_DEMAND:
            return ON_DEMAND if deficit > -j.restart else WAIT
        return ON_DEMAND if deficit > 0 else WAIT


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (OnDemand, Greedy, UniformProgress)} | {"srifty": Srifty}


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
    hours: dict[str, float]  # spot, on-demand, waiting, restarting (part of spot/on-demand billed time)
    lost_h: float
    starts: int
    progress: np.ndarray | None = None  # committed work (h) at each tick's end, for plots
    market: np.ndarray | None = None  # -1 wait, -2 on-demand, z spot

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "finished": self.finished,
            "finished_h": None if self.finished_h is None else round(self.finished_h, 4),
            "cost_usd": round(self.cost_usd, 4),
            "deadline_met": self.deadline_met,
            "preemptions": self.preemptions,
            "starts": self.starts,
            "lost_h": round(self.lost_h, 4),
            "hours": {k: round(v, 4) for k, v in self.hours.items()},
        }


def replay(job: Job, trace: Trace, pol: Policy, *, record: bool = False) -> Outcome:
    """Run ``pol`` over ``trace`` from its first tick until the work is done (or the trace ends)."""
    j = Ticks.of(job, trace.gap_s)
    pol.reset(j, trace.available.shape[0])
    a = trace.available
    done = progress = 0  # committed, and trained (committed + since the last checkpoint)
    running: int | None = None
    overhead = 0
    cost = 0.0
    preemptions = starts = lost = 0
    spent = {"spot": 0, "on-demand": 0, "waiting": 0, "restarting": 0}
    prog_log = np.zeros(trace.ticks) if record else None
    mkt_log = np.full(trace.ticks, WAIT) if record else None
    finished_at: int | None = None
    for k in range(trace.ticks):
        avail = a[:, k]
        if running is not None and running >= 0 and not avail[running]:  # preempted at the tick's start
            preemptions += 1
            if not j.save_on_notice:
                lost += progress - done
                progress = done
            done = progress
            running, overhead = None, 0
        s = State(k, progress if j.save_on_notice else done, running, overhead, avail, a[:, :k])
        act = pol.decide(s, j)
        if act >= 0 and not avail[act]:
            raise RuntimeError(f"policy {pol.name} chose spot in zone {act} at tick {k}, where there is none")
        if act == WAIT:
            if running is not None:
                done = progress  # a voluntary stop saves first
            running, overhead = None, 0
        elif act != running:
            done = progress  # leaving a fleet saves first
            running, overhead = act, j.restart
            starts += 1
        if running is None:
            spent["waiting"] += 1
        else:
            cost += j.od_usd if running == ON_DEMAND else j.spot_usd
            spent["on-demand" if running == ON_DEMAND else "spot"] += 1
            if overhead > 0:
                overhead -= 1
                spent["restarting"] += 1
            else:
                progress += 1
                if running == ON_DEMAND or (j.checkpoint is not None and progress % j.checkpoint == 0):
                    done = progress
        if record:
            prog_log[k] = progress  # type: ignore[index]
            mkt_log[k] = WAIT if running is None else running  # type: ignore[index]
        if progress >= j.work:
            finished_at = k + 1
            break
    h = j.tick_s / 3600.0
    out = Outcome(
        pol.name,
        finished_at is not None,
        None if finished_at is None else finished_at * h,
        cost,
        finished_at is not None and finished_at <= j.deadline,
        preemptions,
        {key: v * h for key, v in spent.items()},
        lost * h,
        starts,
    )
    if record:
        n = finished_at or trace.ticks
        out.progress = prog_log[:n] * h  # type: ignore[index]
        out.market = mkt_log[:n]  # type: ignore[index]
    return out


# ---------------------------------------------------------------- the hindsight optimum


def optimum(job: Job, trace: Trace) -> Outcome:
    """The cheapest run that meets the deadline knowing the whole trace: an exact dynamic programme over the tick
    model (states: progress x {waiting, on-demand or spot in each zone with the restart ticks left}), forward in
    time, vectorised over progress. It never loses work (it would save before a preemption it knows of). When the
    deadline cannot be met even on-demand, the cheapest run finishing at all within the trace is returned."""
    j = Ticks.of(job, trace.gap_s)
    zones, horizon = trace.available.shape
    W, R = j.work, j.restart
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
    deadline = j.deadline if j.feasible else horizon
    for k in range(min(horizon, deadline)):
        avail = np.concatenate([[True], trace.available[:, k]])
        any_state = np.minimum(wait, run.min(axis=(0, 1)))  # leave whatever runs (a preempted spot fleet too)
        new = np.full_like(run, inf)
        for m in range(M):
            if not avail[m]:
                continue
            cont = run[m]
            # continue: phase r > 0 -> r - 1 with no progress (r counted before the tick)
            # start fresh from any state: R restart ticks, the first paid now
            start = any_state
            if R == 0:
                trained = np.minimum(cont[0], start)
                new[m, 0, 1:] = trained[:-1]
                new[m, 0, W] = min(new[m, 0, W], trained[W])
            else:
                # phase after the tick: from a continuing fleet in phase r (r ticks left before), r-1 left after
                stay = np.full((phases, W + 1), inf)
                # training fleets (phase 0) train one more tick
                stay[0, 1:] = cont[0, :-1]
                stay[0, W] = min(stay[0, W], cont[0, W])
                if R > 1:
                    # phase r (r >= 1 ticks left) pays one: r - 1 left; phase 1 -> 0 (ready to train next tick)
                    stay[0] = np.minimum(stay[0], cont[1]) if phases > 1 else stay[0]
                    stay[1:-1] = np.minimum(stay[1:-1], cont[2:])
                # a fresh start pays one restart tick now: R - 1 left
                fresh = np.full((phases, W + 1), inf)
                fresh[R - 1] = start
                new[m] = np.minimum(stay, fresh)
            new[m] += price[m]
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
