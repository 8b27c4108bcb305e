"""Spot under a deadline (issue #25): traces read with clear errors, the policies' hard rule, the hindsight optimum
checked against brute force, the replay's accounting, the ranking's fallback and ``srifty replay``."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re

import numpy as np
import pytest

from _support import MINIMAL, ROOT
from lightning_srifty.cli import main
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError
from predictor.ranking import Constraints, rank
from predictor.ranking.core import FEW_SPELLS as odds_spells_enough
from predictor.runs import deadline as dl
from predictor.runs import odds, traces
from predictor.runs.spot import spot_cost


def trace_of(*zones: list[int], gap: float = 600.0) -> traces.Trace:
    return traces.combine_traces([traces.read_trace({"metadata": {"gap_seconds": gap}, "data": z})[0] for z in zones])


def job(work_ticks: int, deadline_ticks: int, restart_ticks: int = 1, gap: float = 600.0, **kw) -> dl.Job:
    return dl.Job(work_ticks * gap, deadline_ticks * gap, restart_ticks * gap, 1.0, 3.0, **kw)


# ---------------------------------------------------------------- traces


@pytest.mark.parametrize(
    ("doc", "field", "says"),
    [
        ([1, 0, 1], "the document", "must be an object"),
        ({"data": [1]}, "metadata.gap_seconds", "is missing"),
        ({"metadata": {"gap_seconds": 0}, "data": [1]}, "metadata.gap_seconds", "must be a number of seconds > 0"),
        ({"metadata": {"gap_seconds": -5}, "data": [1]}, "metadata.gap_seconds", "got -5"),
        ({"metadata": {"gap_seconds": "300"}, "data": [1]}, "metadata.gap_seconds", "got '300'"),
        ({"metadata": {"gap_seconds": 300}, "data": []}, "data", "non-empty list"),
        ({"metadata": {"gap_seconds": 300}, "data": {"a": 1}}, "data", "non-empty list"),
        ({"metadata": {"gap_seconds": 300}, "data": [1, -1, 0]}, "data[1]", "whole number of instances >= 0"),
        ({"metadata": {"gap_seconds": 300}, "data": [1, 0.5]}, "data[1]", "whole number"),
        ({"metadata": {"gap_seconds": 300}, "data": [1, "x"]}, "data[1]", "must be a number of instances"),
        ({"metadata": {"gap_seconds": 300}, "data": [1, True]}, "data[1]", "must be a number of instances"),
        ({"metadata": {"gap_seconds": 300, "values": "free"}, "data": [1]}, "metadata.values", "'available' or"),
    ],
)
def test_bad_traces_name_the_field_and_the_fix(doc, field, says) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        traces.read_trace(doc)
    assert err.value.parameter == field


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kind, says",
    [
        ("fifo", "cannot be read: is a FIFO, not a regular file"),
        ("folder", "cannot be read: is a folder, not a regular file"),
        ("device", "cannot be read: is a device, not a regular file"),
        ("binary", "is not JSON ('utf-8' codec can't decode"),
        ("deep", "is not JSON (nested too deeply)"),
        ("missing", "does not exist: give the path of a JSON trace"),
        ("ticks", "data may hold at most 1,000,000 ticks (116 days at gap_seconds=10): replay a window of it"),
    ],
)
def test_a_trace_that_is_not_a_bounded_json_file_is_refused_by_name(tmp_path, kind, says) -> None:
    """Issue #36 M6: srifty replay read traces with a plain open(): a FIFO hung it, a 6M-tick trace ran past 120 s,
    and a folder, binary bytes or deep nesting were tracebacks. Now the bounded reader and a tick limit."""
    path = tmp_path / "trace.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path = "/dev/zero"
    elif kind == "binary":
        path.write_bytes(bytes(range(128, 256)))
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "ticks":
        path.write_text(json.dumps({"metadata": {"gap_seconds": 10}, "data": [1] * 1_000_001}))
    with pytest.raises(ConfigError, match=re.escape(says)):
        traces.read_trace(path)


def test_preempted_flags_cannot_hold_counts_and_multi_node_needs_its_count() -> None:
    with pytest.raises(ConfigError, match="counts above 1"):
        traces.read_trace({"metadata": {"gap_seconds": 300}, "data": [0, 3]}, values="preempted")
    t, notes = traces.read_trace({"metadata": {"gap_seconds": 300}, "data": [0, 4, 16, 15]}, nodes=16)
    assert t.available.tolist() == [[False, False, True, False]] and not notes
    t, notes = traces.read_trace({"metadata": {"gap_seconds": 300}, "data": [0, 3]}, nodes=4)
    assert not t.available.any() and "never 4 instances available" in notes[0]
    # the two readings of a single-node file are each other's complement, and a 0/1 file says which it used
    t, notes = traces.read_trace({"metadata": {"gap_seconds": 300}, "data": [1, 0, 1]})
    p, _ = traces.read_trace({"metadata": {"gap_seconds": 300}, "data": [1, 0, 1]}, values="preempted")
    assert (t.available == ~p.available).all() and "--trace-values preempted" in notes[0]


def test_resampling_keeps_a_coarse_tick_only_when_spot_was_there_throughout() -> None:
    t = trace_of([1, 1, 1, 0, 1, 1, 0, 0], gap=32)
    r = t.resample(2)
    assert r.gap_s == 64 and r.available.tolist() == [[True, False, True, False]]


def test_zones_of_one_replay_must_share_the_gap() -> None:
    with pytest.raises(ConfigError, match=r"share metadata\.gap_seconds"):
        traces.combine_traces([trace_of([1], gap=300), trace_of([1], gap=600)])


# ---------------------------------------------------------------- the replay's accounting


def test_spot_all_the_time_costs_restart_and_work_at_the_spot_price() -> None:
    j = job(10, 20, restart_ticks=2)
    o = dl.replay(j, trace_of([1] * 40), dl.Greedy())
    assert o.finished_h == pytest.approx(12 * 600 / 3600) and o.deadline_met and o.preemptions == 0
    assert o.cost_usd == pytest.approx(12 * 600 / 3600 * 1.0)
    od = dl.replay(j, trace_of([1] * 40), dl.OnDemand())
    assert od.cost_usd == pytest.approx(12 * 600 / 3600 * 3.0) and od.hours["spot"] == 0


def test_without_spot_greedy_waits_then_runs_on_demand_just_in_time() -> None:
    j = job(10, 20, restart_ticks=2)
    o = dl.replay(j, trace_of([0] * 40), dl.Greedy())
    # waits while the slack allows, then restart + work on-demand ends exactly at the deadline
    assert o.deadline_met and o.finished_h == pytest.approx(20 * 600 / 3600)
    assert o.hours["waiting"] == pytest.approx(8 * 600 / 3600) and o.hours["spot"] == 0


def test_a_preemption_loses_the_work_since_the_last_checkpoint_when_the_save_does_not_fit_the_notice() -> None:
    avail = [1] * 8 + [0] * 45
    kept = dl.replay(job(20, 40), trace_of(avail), dl.Greedy())
    lost = dl.replay(job(20, 40, checkpoint_interval_s=3 * 600, save_on_notice=False), trace_of(avail), dl.Greedy())
    assert kept.lost_h == 0 and kept.preemptions == lost.preemptions == 1
    # 7 ticks trained after a 1-tick restart, checkpoints at 3 and 6: one tick lost
    assert lost.lost_h == pytest.approx(600 / 3600)
    assert lost.deadline_met and kept.deadline_met and lost.cost_usd > kept.cost_usd


def test_greedy_moves_to_another_zone_when_its_zone_loses_spot() -> None:
    a = [1] * 5 + [0] * 20
    b = [0] * 3 + [1] * 22
    o = dl.replay(job(10, 30), trace_of(a, b), dl.Greedy(), record=True)
    assert o.preemptions == 1 and o.hours["on-demand"] == 0
    assert o.market is not None and set(o.market.tolist()) == {0, 1}


class Broken(dl.Policy):
    """Spot when there, wait otherwise, never the hard rule: what the hard-rule test must catch."""

    name = "broken"

    def decide(self, s: dl.State, j: dl.Ticks) -> int:
        zone = dl._spot_zone(s)
        return dl.WAIT if zone is None else zone


def random_trace(rng: np.random.Generator, n: int, zones: int = 1) -> traces.Trace:
    rows = []
    for _ in range(zones):
        x, row = rng.random() < 0.5, []
        for _ in range(n):
            if rng.random() < 0.15:
                x = not x
            row.append(int(x))
        rows.append(row)
    return trace_of(*rows)


@pytest.mark.parametrize("name", ["greedy", "uniform", "srifty", "on-demand"])
def test_every_policy_meets_every_feasible_deadline(name) -> None:
    rng = np.random.default_rng(7)
    broken_missed = 0
    for _ in range(60):
        work = int(rng.integers(5, 40))
        restart = int(rng.integers(0, 4))
        slack = int(rng.integers(0, work))
        j = job(work, work + restart + slack, restart_ticks=restart)
        tr = random_trace(rng, 3 * (work + restart + slack), zones=int(rng.integers(1, 3)))
        o = dl.replay(j, tr, dl.policy(name))
        assert o.deadline_met, (name, work, restart, slack)
        broken_missed += not dl.replay(j, tr, Broken()).deadline_met
    assert broken_missed > 0  # the traces are hard enough that ignoring the rule misses


# ---------------------------------------------------------------- the hindsight optimum


class Script(dl.Policy):
    name = "script"

    def __init__(self, actions: tuple[int, ...]) -> None:
        self.actions = actions

    def decide(self, s: dl.State, j: dl.Ticks) -> int:
        return self.actions[s.tick] if s.tick < len(self.actions) else dl.ON_DEMAND


def brute_force(j: dl.Job, tr: traces.Trace) -> float:
    ticks = dl.Ticks.of(j, tr.gap_s)
    best = np.inf
    zones = list(range(tr.available.shape[0]))
    for actions in itertools.product([dl.WAIT, dl.ON_DEMAND, *zones], repeat=ticks.deadline):
        if any(a >= 0 and not tr.available[a, k] for k, a in enumerate(actions)):
            continue
        o = dl.replay(j, tr, Script(actions))
        if o.deadline_met:
            best = min(best, o.cost_usd)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_optimum_is_exact_on_small_cases(seed) -> None:
    """Seeds 6-11: a start with nothing trained pays its start-up alone (one or two ticks less than a restart)."""
    rng = np.random.default_rng(seed)
    zones = 1 + seed % 2
    restart = seed % 3
    deadline = 7 if zones == 1 else 6
    work = int(rng.integers(2, deadline - restart + 1))
    tr = random_trace(rng, deadline + 2, zones)
    startup = None if seed < 6 or restart == 0 else max(0, restart - 1 - seed % 2) * 600.0  # R - 1 or R - 2
    j = job(work, deadline, restart_ticks=restart, startup_s=startup)
    assert dl.optimum(j, tr).cost_usd == pytest.approx(brute_force(j, tr))


def test_the_replays_policy_sees_the_training_at_risk_as_the_guard_does() -> None:
    """Where the save misses the notice the policy saw the progress saved: a forced on-demand start saved it all by
    leaving spot, the policy went back to spot a tick later, and was forced off again within the interval (a 7B on
    one p4d at 34 h, its saves taking their time: 6 starts, $141 against the guard's $100). It now sees what
    srifty launch's guard sees: the steps done, and the whole interval at risk (at most the steps done)."""
    j = dl.Ticks.of(job(100, 190, checkpoint_interval_s=15 * 600.0, save_on_notice=False), 600.0)
    for progress, at_risk in ((40, 15), (10, 10), (0, 0)):
        known, done = dl._as_guarded(j, progress, progress)
        assert (done, known.finish_extra) == (progress, at_risk)
    whole = dl.Ticks.of(job(100, 190, save_on_notice=False), 600.0)  # no periodic save: all of it at risk
    assert dl._as_guarded(whole, 40, 40)[0].finish_extra == 40
    notice = dl.Ticks.of(job(100, 190, checkpoint_interval_s=15 * 600.0), 600.0)
    assert dl._as_guarded(notice, 40, 40) == (notice, 40)
    # the edge case itself: on-demand once, and kept
    from predictor.catalog import Catalog

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    llama = load_profile(json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text()))
    kw = dict(steps=20_000, allow=("p4d.24xlarge",), max_instances=1, market="spot")
    plan = rank(llama, Constraints(deadline_h=34.06, confidence=0.9, **kw), catalog=catalog)
    run = dl.job_from_plan(plan, catalog=catalog)
    out = dl.replay(run.job, traces.Trace(600.0, np.ones((1, 400), bool)), dl.policy("srifty"), record=True)
    assert out.deadline_met and out.hours["saving"] > 1.0
    spells = [int(m) for k, m in enumerate(out.market) if k == 0 or m != out.market[k - 1]]
    assert spells[-2:] == [0, dl.ON_DEMAND] and spells.count(0) == 1, spells  # one spot spell, then on-demand kept


def test_a_start_with_nothing_trained_pays_its_start_up_alone() -> None:
    """Every start paid the full restart (the leaving fleet's save, the start-up, the load), the run's first too,
    which has nothing to save or load: a 7B's first start on one p4d paid 1,834 s for its 600 s start-up."""
    always = trace_of([1] * 40)
    j = job(10, 30, restart_ticks=3, startup_s=600.0)
    out = dl.replay(j, always, dl.policy("greedy"))
    assert out.finished_h == pytest.approx(11 / 6) and out.hours["restarting"] == pytest.approx(1 / 6)
    assert dl.replay(job(10, 30, restart_ticks=3), always, dl.policy("greedy")).finished_h == pytest.approx(13 / 6)
    assert dl.optimum(j, always).cost_usd == pytest.approx(11 * 600 / 3600)
    # after training, a new fleet pays the whole restart: spot goes at tick 5 (4 trained), back at tick 6
    cut = trace_of([1] * 5 + [0] + [1] * 40)
    out = dl.replay(j, cut, dl.policy("greedy"))
    assert out.preemptions == 1 and out.starts == 2 and out.hours["restarting"] == pytest.approx(4 / 6)
    # the tick model's feasibility counts it: 1 + 10 ticks meet 11, where 3 + 10 would not
    assert dl.Ticks.of(job(10, 11, restart_ticks=3, startup_s=600.0), 600.0).feasible
    assert dl.replay(job(10, 11, restart_ticks=3, startup_s=600.0), always, dl.policy("srifty")).deadline_met
    with pytest.raises(ConfigError, match="startup_s must be between 0 and restart_s"):
        job(10, 30, restart_ticks=3, startup_s=3 * 600.0 + 1)


def test_periodic_saves_on_spot_pause_the_training_in_the_replay() -> None:
    """The replay's periodic saves took no time (the plan's time counts them): a 7B on one p4d, 617 s saves every
    2.34 h, replayed 0.4 h shorter than it trains. On spot each save now pauses the training for its time, paid in
    whole ticks as it adds up; on-demand commits every tick and saves nothing here (its interval is for node
    failures, far longer); a preemption still loses only the work since the last save."""
    always = trace_of([1] * 200)
    base = dict(checkpoint_interval_s=10 * 600.0, save_on_notice=False)
    free = dl.replay(job(100, 190, **base), always, dl.policy("greedy"))
    # 100 ticks of work, a save every 10 of 0.35 tick: 9 saves before the end (the 10th is at the end), 3.15 ticks
    paid = dl.replay(job(100, 190, save_s=0.35 * 600, **base), always, dl.policy("greedy"))
    assert free.finished_h == pytest.approx(101 / 6) and free.hours["saving"] == 0
    assert paid.finished_h == pytest.approx(104 / 6) and paid.hours["saving"] == pytest.approx(3 / 6)
    assert paid.hours["spot"] == pytest.approx(104 / 6) and paid.cost_usd == pytest.approx(104 * 600 / 3600)
    # a save longer than a tick pays its whole time (2.5 ticks each: 9 saves, 22 ticks paid, 0.5 carried)
    long = dl.replay(job(100, 190, save_s=2.5 * 600, **base), always, dl.policy("greedy"))
    assert long.hours["saving"] == pytest.approx(22 / 6) and long.finished_h == pytest.approx(123 / 6)
    # no interval (a run shorter than it): no periodic save, whatever its time
    assert dl.replay(job(100, 190, save_s=600.0), always, dl.policy("greedy")).hours["saving"] == 0
    # on-demand saves nothing here
    od = dl.replay(job(100, 190, save_s=0.35 * 600, **base), always, dl.policy("on-demand"))
    assert od.hours["saving"] == 0 and od.finished_h == pytest.approx(101 / 6)
    # a preemption loses the work since the last save, and the saves' time is not lost with it
    cut = trace_of([1] * 15 + [0] + [1] * 200)
    out = dl.replay(job(100, 190, save_s=0.35 * 600, **base), cut, dl.policy("greedy"))
    assert out.preemptions == 1 and out.lost_h == pytest.approx(4 / 6)  # trained 14, saved at 10
    assert out.finished and out.deadline_met
    with pytest.raises(ConfigError, match="save_s must be a number >= 0"):
        job(100, 190, save_s=-1.0)


def test_a_save_in_progress_commits_once_paid_and_the_timer_starts_with_each_fleet() -> None:
    """A review's cases: a periodic save was committed as it began, so a preemption during it lost nothing though
    the save never ran (and misses the notice); its time was carried to the next fleet, which had just paid a
    restart with the leaving save in it; and saves came at multiples of the progress, where the job's timer counts
    from each fleet's start (a leg resumed at 29 of a 15-tick interval saved after one tick)."""
    kw = dict(restart_ticks=1, startup_s=600.0, checkpoint_interval_s=5 * 600.0, save_s=600.0, save_on_notice=False)
    # A: 5 ticks trained, the save begins at tick 5, spot goes at tick 6: all 5 lost, a fresh start after
    cut = trace_of([1] * 6 + [0] + [1] * 60)
    a = dl.replay(job(20, 60, **kw), cut, Script((0,) * 6 + (dl.WAIT,) + (0,) * 60))
    assert a.lost_h == pytest.approx(5 / 6) and a.preemptions == 1
    assert a.hours["restarting"] == pytest.approx(2 / 6)  # two start-ups: nothing to save or load either time
    # B: spot x6 (the save begun at tick 5), on-demand x5, spot again: the leave's save replaces it; the second spot
    # leg trains 5 ticks from its own start before it saves (ticks 12-16, save 17; 18-22, save 23; done at 24)
    always = trace_of([1] * 60)
    b = dl.replay(job(20, 60, **kw), always, Script((0,) * 6 + (dl.ON_DEMAND,) * 5 + (0,) * 60))
    assert b.hours["saving"] == pytest.approx(2 / 6) and b.finished_h == pytest.approx(25 / 6)
    assert b.starts == 3 and b.lost_h == 0
    # C: saves of 0.35 tick on legs of 3 ticks cut by preemptions (the save fits the notice): the fraction each leg
    # leaves is carried to the next, the third leg's save pays a tick (dropped at every stop, it was never paid)
    legs = trace_of(([1] * 3 + [0]) * 3 + [1] * 20)
    c = dl.replay(job(12, 60, restart_ticks=0, checkpoint_interval_s=2 * 600.0, save_s=0.35 * 600), legs,
                  dl.policy("greedy"))  # fmt: skip
    assert c.preemptions == 3 and c.hours["saving"] == pytest.approx(1 / 6) and c.lost_h == 0


def test_the_replays_hard_rule_keeps_an_on_demand_finishs_saves_and_failures_in_hand() -> None:
    """srifty launch's guard keeps in hand what an on-demand finish adds to the work left (its periodic saves and node
    failures at the plan's confidence once the step is measured, their expectation before); the replay's policy kept
    nothing (the 7B on 8 p4d, 64 GPUs, with 30 h left: 2.0 h at 90 %). With it, a deadline that leaves less than
    that runs on-demand from the start, where the replay had stayed on spot to the end; until the step is measured
    the failures are held at their expectation, as the guard holds them."""
    finish = dl.OnDemandFinish(gpus=512, save_s=617.0, restart_s=600.0, load_s=617.0, confidence=0.9)
    assert finish.extra_ticks(0, 600.0, True) == 0
    extra = finish.extra_ticks(100, 600.0, False)
    assert 0 < extra <= finish.extra_ticks(100, 600.0, True)
    # spot throughout keeps tick + 1 + restart + left = 1 + 1 + 100 + 1 (the first start's tick) all along
    always = trace_of([1] * 200)
    tight = dict(restart_ticks=1, startup_s=600.0)
    deadline = 103 + extra - 1
    free = dl.replay(job(100, deadline, **tight), always, dl.policy("greedy"))
    kept = dl.replay(job(100, deadline, finish=finish, **tight), always, dl.policy("greedy"))
    assert free.hours["on-demand"] == 0 and kept.hours["spot"] == 0 and kept.deadline_met
    # the first start, unmeasured, at the expectation: spot where the confidence's extra would have sent it on-demand
    at_confidence = finish.extra_ticks(100, 600.0, True)
    assert at_confidence > extra
    first = dl.replay(job(100, 103 + extra, finish=finish, **tight), always, dl.policy("greedy"), record=True)
    assert first.market[0] == 0 and first.deadline_met
    with pytest.raises(ConfigError, match=r"finish\.gpus must be a number >= 0"):
        dl.OnDemandFinish(gpus=-1, save_s=None, restart_s=0.0)
    with pytest.raises(ConfigError, match=r"finish\.confidence must be between 0 and 1"):
        dl.OnDemandFinish(gpus=8, save_s=None, restart_s=0.0, confidence=1.0)
    # the same figure as the guard's, in the same ticks, for a plan's 64 GPUs
    from lightning_srifty.provision.launcher.spot_guard import guard_for, on_demand_fleet
    from predictor.catalog import Catalog

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    llama = load_profile(json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text()))
    kw = dict(steps=100_000, allow=("p4d.24xlarge",), max_instances=8, market="spot")
    plan = rank(llama, Constraints(deadline_h=36.0, confidence=0.9, **kw), catalog=catalog)
    i, e = plan.chosen, plan.entries[plan.chosen]
    assert e.gpus == 64
    run = dl.job_from_plan(plan, catalog=catalog)
    od_plan, od_i = on_demand_fleet(plan, i, catalog)
    g = guard_for("srifty", plan, i, od_plan, od_i, started_unix=0.0, global_batch=e.global_batch, check_s=600.0)
    assert g is not None and run.job.finish is not None
    kept_by_guard = []
    for step in (1_000, 40_000, 90_000):
        g.progress(step, e.iteration_time_s)
        ticks = g.ticks(600.0 * 10)
        left = math.ceil((g.steps - step) * g.step_s / 600.0 - 1e-9)
        kept_by_guard.append(ticks.finish_extra - math.ceil(g.at_risk_now_s / 600.0 - 1e-9))
        # the guard rounds its work left in seconds, the replay in whole ticks (up): the same, or a tick more
        assert 0 <= run.job.finish.extra_ticks(left, 600.0, True) - kept_by_guard[-1] <= 1
    assert kept_by_guard[0] >= 6 and kept_by_guard[-1] < kept_by_guard[0]
    assert run.job.finish.extra_ticks(30 * 6, 600.0, True) == 13  # 30 h left: 2.0 h, 13 ticks of 600 s


def test_a_plans_replay_pays_its_periodic_saves_as_its_time_counts_them() -> None:
    """The shipped 7B on one p4d at 35 h: the replay where spot never goes away takes the plan's periodic saves on
    spot, as its predicted time does, and its first start pays the start-up alone (before: 1.8 h of saves left out,
    the first start's save and load paid, $72.73 against the guard's $76.43)."""
    from predictor.catalog import Catalog

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    llama = load_profile(json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text()))
    kw = dict(steps=20_000, allow=("p4d.24xlarge",), max_instances=1, market="spot")
    plan = rank(llama, Constraints(deadline_h=35.02, confidence=0.9, **kw), catalog=catalog)
    entry = plan.entries[plan.chosen]
    run = dl.job_from_plan(plan, catalog=catalog)
    assert run.job.save_s == pytest.approx(entry.checkpoint_s) and run.job.checkpoint_interval_s is not None
    ticks = dl.Ticks.of(run.job, 600.0)  # the interval in whole ticks: 15 of 600 s, 11 saves before the end
    saves = (ticks.work - 1) // (ticks.checkpoint or ticks.work) * run.job.save_s / 3600
    out = dl.replay(run.job, traces.Trace(600.0, np.ones((1, 400), bool)), dl.policy("srifty"))
    assert out.deadline_met and out.hours["on-demand"] == 0
    assert out.hours["saving"] == pytest.approx(saves, abs=600 / 3600)
    assert out.hours["saving"] > 0.3
    # the replay's time against the plan's, which counts the saves and the interruptions' expected cost too
    assert out.finished_h == pytest.approx(entry.time_h, rel=0.05)


def test_no_policy_beats_the_optimum() -> None:
    rng = np.random.default_rng(3)
    for _ in range(25):
        work = int(rng.integers(5, 30))
        j = job(work, int(work * rng.uniform(1.1, 2.0)) + 2, restart_ticks=int(rng.integers(0, 3)))
        tr = random_trace(rng, 3 * work + 10)
        best = dl.optimum(j, tr)
        assert best.deadline_met
        for name in dl.POLICIES:
            assert dl.replay(j, tr, dl.policy(name)).cost_usd >= best.cost_usd - 1e-9


# ---------------------------------------------------------------- the ranking


def test_expected_fallback_is_bounded_and_zero_when_spot_alone_fits() -> None:
    fb = odds.expected_with_fallback(
        np.array([10.0, 60.0, 300.0]) * 3600,
        np.array([9.0, 45.0, 45.0]) * 3600,
        np.array([1.0, 10.0, 10.0]),
        50 * 3600,
        np.zeros(3),
        np.full(3, 600.0),
        np.ones(3),
        np.full(3, 3.0),
        down_s=3600,
    )
    assert fb.od_share[0] == 0 and 0 < fb.od_share[1] < 1 and ((fb.od_share >= 0) & (fb.od_share <= 1)).all()
    assert (fb.time_s[1:] <= 50 * 3600).all() and fb.od_share[2] > fb.od_share[1]
    assert fb.cost_usd[2] > fb.cost_usd[1] > fb.cost_usd[0]


def test_spot_entries_under_a_deadline_carry_the_fallback_and_keep_it(catalog) -> None:
    profile = load_profile(MINIMAL)
    loose = rank(profile, Constraints(steps=700_000, market="spot", allow=("p3.2xlarge",), max_instances=1),
                 catalog=catalog)  # fmt: skip
    e = loose.entries[0]
    assert e.on_demand_fallback == 0
    od_h = rank(profile, Constraints(steps=700_000, market="on-demand", allow=("p3.2xlarge",), max_instances=1),
                catalog=catalog).entries[0].time_h  # fmt: skip
    assert od_h < e.time_h  # spot's interruptions cost it time (restarts, and the saves on their notices)
    # 100 s of slack past the on-demand time and one restart (start-up + a save and a load): too little for spot's
    # waits for capacity, enough for some spot (the two times are 2 min apart: this p3 is seldom interrupted)
    tight_h = od_h + (e.startup_s + 2 * 30 + 100) / 3600
    # the fallback's pricing at the predicted (median) time: confidence 0.5 (the confidence is tests/test_deadline_odds)
    plan = rank(profile, Constraints(steps=700_000, market="any", allow=("p3.2xlarge",), max_instances=1,
                                     deadline_h=tight_h, confidence=0.5), catalog=catalog)  # fmt: skip
    spot = next(x for x in plan.entries if x.market == "spot")
    od = next(x for x in plan.entries if x.market == "on-demand")
    assert spot.time_h <= tight_h + 1e-9 and spot.on_demand_fallback is not None and 0 < spot.on_demand_fallback < 1
    assert e.cost_usd < spot.cost_usd < od.cost_usd and od.on_demand_fallback is None
    assert any("on-demand fallback" in n for n in plan.notes)


# ---------------------------------------------------------------- srifty replay


@pytest.fixture(scope="module")
def planned(tmp_path_factory, catalog):
    folder = tmp_path_factory.mktemp("replay")
    plan = rank(load_profile(MINIMAL), Constraints(steps=200_000, market="spot", allow=("p3.2xlarge",),
                                                   max_instances=1, deadline_h=30), catalog=catalog)  # fmt: skip
    path = folder / "plan.json"
    plan.save(path)
    trace = folder / "trace.json"
    rng = np.random.default_rng(1)
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": random_trace(rng, 400).available[0]
                                 .astype(int).tolist()}))  # fmt: skip
    return path, trace


def test_replay_prints_every_policy_and_the_optimum_in_json(planned, capsys) -> None:
    plan, trace = planned
    assert main(["replay", "--plan", str(plan), "--trace", str(trace), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [r["policy"] for r in doc["results"]]
    assert names == [*dl.POLICIES, "optimum"]
    for r in doc["results"]:
        assert {"finished_h", "cost_usd", "deadline_met", "preemptions"} <= r.keys() and r["deadline_met"]
    best = doc["results"][-1]["cost_usd"]
    assert all(r["cost_usd"] >= best - 1e-6 for r in doc["results"])
    assert doc["job"]["deadline_h"] == 30 and doc["fleet"] == "p3.2xlarge:1"
    # the optimum keeps no path: its starts and hours are unknown, not 0 (a trial read "starts": 0 and "hours": {})
    assert all(doc["results"][-1][k] is None for k in ("preemptions", "starts", "lost_h", "hours"))
    assert all(isinstance(r["starts"], int) and r["starts"] >= 1 and r["hours"] for r in doc["results"][:-1])


def test_replay_of_a_trace_too_short_to_finish_writes_json_a_parser_reads(planned, tmp_path, capsys) -> None:
    """A trial: a 4-tick trace left the optimum unfinished and ``--format json`` wrote ``"cost_usd": NaN``, which
    JSON parsers refuse; it writes null (and the table "-")."""
    plan, _ = planned
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 1, 0, 1]}))
    assert main(["replay", "--plan", str(plan), "--trace", str(short), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert doc["results"][-1]["policy"] == "optimum" and doc["results"][-1]["cost_usd"] is None
    assert main(["replay", "--plan", str(plan), "--trace", str(short)]) == 0
    assert "optimum" in capsys.readouterr().out


def test_replay_says_what_whole_ticks_and_its_periodic_saves_leave_out(planned, capsys) -> None:
    """A trial: a 0.32 h entry replayed in 0.50 h on 600 s ticks, and a 7B's saves (the plan's 1.5 h of them) left
    out of the replay without a word."""
    plan, trace = planned
    argv = ["replay", "--plan", str(plan), "--trace", str(trace), "--policy", "srifty", "--format", "json"]
    assert main([*argv, "--tick", "36000"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any(n.startswith("whole ticks of 36000 s round the work and each start up") for n in doc["notes"])
    assert doc["job"]["checkpoint_interval_h"] is None or doc["job"]["checkpoint_interval_h"] > 0
    assert doc["job"]["on_demand_finish_extra_h"] >= 0 and doc["job"]["first_start_s"] <= doc["job"]["restart_s"]
    assert main(argv) == 0
    assert not any("whole ticks" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_replay_table_and_plot(planned, tmp_path, capsys) -> None:
    plan, trace = planned
    png = tmp_path / "p.png"
    assert main(["replay", "--plan", str(plan), "--trace", str(trace), "--policy", "srifty", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "srifty" in out and "deadline" in out and png.stat().st_size > 1000


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--start-h", "-5"], "--start-h must be hours >= 0 into the trace. Got -5.0"),
        (["--tick", "0"], "--tick must be a whole multiple of the trace's 600 s between samples. Got 0"),
        (["--tick", "33"], "--tick must be a whole multiple of the trace's 600 s between samples. Got 33"),
        (["--tick", "900"], "Got 900: give 600, 1200"),
    ],
)
def test_replay_refuses_a_start_or_tick_it_would_have_ignored(planned, capsys, flags, says) -> None:
    """Issue #36 M6: --start-h -5 replayed the trace's last 5 h; --tick 0 and --tick 33 were ignored."""
    plan, trace = planned
    assert main(["replay", "--plan", str(plan), "--trace", str(trace), *flags]) == 2
    assert says in capsys.readouterr().err


def test_a_plot_never_goes_through_a_link_or_beside_a_device(planned, tmp_path, capsys) -> None:
    """Issue #36 M4: --plot wrote through a symbolic link (its target replaced by a PNG) and, for a name without a
    suffix, to that name + .png (--plot /dev/null wrote /dev/null.png beside the device). The PNG goes to exactly the
    path given, atomically, and a link, a device or a folder there is refused, naming it."""
    plan, trace = planned
    args = ["replay", "--plan", str(plan), "--trace", str(trace), "--policy", "srifty", "--plot"]
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "p.png"
    link.symlink_to(victim)
    assert main([*args, str(link)]) == 2
    assert "is a symbolic link, not a regular file: refusing to replace it" in capsys.readouterr().err
    assert victim.read_text() == "keep me" and link.is_symlink()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main([*args, str(fifo)]) == 2
    assert "is a FIFO, not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "pipe.png").exists()
    bare = tmp_path / "progress"  # no suffix: written as named
    assert main([*args, str(bare)]) == 0
    assert bare.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "progress.png").exists()
    # issue #36 L1: never over the command's own input (the plan or a trace), refused before anything is read
    for given, flag in ((plan, "--plan"), (trace, f"--trace {trace}")):
        before = given.read_bytes()
        assert main([*args, str(given)]) == 2
        assert f"--plot is the file {flag} reads" in capsys.readouterr().err
        assert given.read_bytes() == before


def test_eval_never_plots_over_its_data(tmp_path, capsys) -> None:
    """Issue #36 L1: `srifty eval --data X --plot X` replaced the measurements with a PNG (after the validation)."""
    data = tmp_path / "m.csv"
    data.write_text("not read\n")
    assert main(["eval", "--data", str(data), "--plot", str(data)]) == 2
    assert "--plot is the file --data reads" in capsys.readouterr().err and data.read_text() == "not read\n"


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"metadata": {"gap_seconds": 0}, "data": [1]}, "metadata.gap_seconds must be a number of seconds > 0"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, -2]}, r"data\[1\] must be a whole number"),
        ({"data": [[1, 0]]}, "metadata.gap_seconds is missing"),
    ],
)
def test_replay_refuses_bad_traces_with_exit_2(planned, tmp_path, capsys, doc, says) -> None:
    plan, _ = planned
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["replay", "--plan", str(plan), "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and pytest.importorskip("re").search(says, err)


def test_replay_needs_a_deadline(planned, tmp_path, capsys, catalog) -> None:
    _, trace = planned
    plan = rank(load_profile(MINIMAL), Constraints(steps=1000, market="spot", allow=("p3.2xlarge",),
                                                   max_instances=1), catalog=catalog)  # fmt: skip
    path = tmp_path / "plan.json"
    plan.save(path)
    assert main(["replay", "--plan", str(path), "--trace", str(trace)]) == 2
    assert "--deadline" in capsys.readouterr().err
    assert main(["replay", "--plan", str(path), "--trace", str(trace), "--deadline", "2h", "--format", "json"]) == 0


def test_spot_traces_replace_the_catalog_rates_in_the_ranking(catalog, tmp_path, capsys) -> None:
    trace = tmp_path / "trace.json"  # 167 h, longer than the deadline
    data = random_trace(np.random.default_rng(5), 1000).available[0].astype(int).tolist()
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": data}))
    profile = load_profile(MINIMAL)
    c = Constraints(steps=700_000, market="any", allow=("p3.2xlarge",), max_instances=1, deadline_h=70)
    plain = rank(profile, c, catalog=catalog)
    stats = odds.SpotStats.of([traces.read_trace(trace)[0]], source="trace.json")
    traced = rank(profile, c, catalog=catalog, spot_stats=stats)
    spot = next(e for e in traced.entries if e.market == "spot")
    before = next(e for e in plain.entries if e.market == "spot")
    assert spot.expected_interruptions > 10 * before.expected_interruptions and spot.cost_usd > before.cost_usd
    assert spot.time_h <= 70 and any("spot capacity from the traces trace.json" in n for n in traced.notes)
    # whose rates the overhead used, said once (a trial read "Spot Advisor rates" beside "in place of" them)
    assert any("the spot traces' interruption rates" in n for n in traced.notes)
    assert not any("Spot Advisor interruption rates" in n for n in traced.notes)
    assert any("Spot Advisor interruption rates" in n for n in plain.notes)
    assert stats.spells >= odds_spells_enough and not any("uncertain by about" in n for n in traced.notes)
    # a trace of a few spells says how uncertain its rate is (a trial's 4-tick trace: 8 an hour, without a word)
    few = odds.SpotStats.of([trace_of([1, 1, 0, 1])], source="short.json")
    said = " ".join(rank(profile, c, catalog=catalog, spot_stats=few).notes)
    assert "from 2 spells with spot, so the rate is uncertain by about x1.7" in said
    with pytest.raises(ConfigError, match="never have spot available"):
        odds.SpotStats.of([trace_of([0, 0, 0])])
    # the same from the command line, and the replay of the plan keeps the deadline
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(MINIMAL))
    out = tmp_path / "plan.json"
    argv = ["recommend", "--profile", str(profile_path), "--steps", "700000", "--market", "any", "--allow",
            "p3.2xlarge", "--max-instances", "1", "--deadline", "70h", "--spot-trace", str(trace),
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["replay", "--plan", str(out), "--trace", str(trace), "--format", "json"]) == 0
    assert all(r["deadline_met"] for r in json.loads(capsys.readouterr().out)["results"])


def test_srifty_waits_for_spot_when_the_deadline_has_slack_to_spare() -> None:
    """A short job with a long deadline and no spot at first: uniform progress buys on-demand at once, srifty waits
    until twice the work is left before the deadline (the new-user walk's 1.8 h job with a 40 h deadline)."""
    j = job(10, 200, restart_ticks=1)
    tr = trace_of([0] * 120 + [1] * 100)
    uniform = dl.replay(j, tr, dl.UniformProgress())
    srifty = dl.replay(j, tr, dl.Srifty())
    assert uniform.hours["spot"] == 0 and uniform.cost_usd == pytest.approx(11 * 600 / 3600 * 3.0)
    assert srifty.hours["on-demand"] == 0 and srifty.cost_usd == pytest.approx(11 * 600 / 3600 * 1.0)
    assert srifty.deadline_met and uniform.deadline_met
    # and when spot never comes, it still finishes in time, on-demand
    late = dl.replay(j, trace_of([0] * 220), dl.Srifty())
    assert late.deadline_met and late.hours["on-demand"] > 0


def test_the_rankings_fallback_is_the_hard_rules_run_on_a_trace_of_spot_always_there() -> None:
    """A new user's trial: a p4d spot plan under a 3 h deadline read $11.34 with 0.6 % on-demand, where the replay of
    the same rule (the launcher's spot guard's) ran 97 % of it on-demand for $63: spot was taken to run until the
    deadline less a restart and on-demand to do the rest after it, past the deadline. The hard rule keeps the slack an
    on-demand finish needs; spot spends it; on-demand finishes at the deadline. On a trace where spot is always there
    the ranking's expectation is the replay's, across the tight deadlines and the loose ones."""
    work, restart, startup, spot_hr, od_hr = 2.66 * 3600, 660.0, 600.0, 4.93, 43.92
    for deadline_h in (2.95, 3.0, 3.05, 3.4, 5.0):
        job = dl.Job(work_s=work, deadline_s=deadline_h * 3600, restart_s=restart, spot_usd_hr=spot_hr,
                           od_usd_hr=od_hr, checkpoint_interval_s=None, save_on_notice=True)  # fmt: skip
        trace = traces.Trace(gap_s=60.0, available=np.ones((1, int(deadline_h * 60) + 200), bool))
        replayed = dl.replay(job, trace, dl.policy("srifty"))
        fb = odds.expected_with_fallback(
            np.array([work]), np.array([work]), np.zeros(1), deadline_h * 3600, np.array([startup]),
            np.array([restart]), np.array([spot_hr]), np.array([od_hr]),
        )  # fmt: skip
        assert float(fb.cost_usd[0]) == pytest.approx(replayed.cost_usd, rel=0.03), deadline_h
    # with spot's overhead over the slack: on-demand finishes the rest at the deadline, never past it
    fb = odds.expected_with_fallback(np.array([4.0 * 3600]), np.array([3.0 * 3600]), np.zeros(1), 3.6 * 3600,
                                     np.zeros(1), np.array([600.0]), np.ones(1), np.full(1, 3.0))  # fmt: skip
    assert 0 < fb.od_share[0] < 1 and fb.time_s[0] == pytest.approx(3.6 * 3600)
    assert fb.od_share[0] == pytest.approx(1 - (3.6 * 3600 - 600 - 3 * 3600) / 3600)  # 1 - slack / overhead


@pytest.mark.parametrize(("up_h", "down_h"), [(3.0, 1.0), (2.0, 2.0), (1.0, 3.0), (5.0, 0.5)])
def test_the_rankings_fallback_is_the_policys_run_where_spot_comes_and_goes(up_h: float, down_h: float) -> None:
    """The ranking's expected cost of a guarded spot run is the policy's (srifty's line: on-demand only while the run
    is behind it, and back to spot), not the hard rule's alone: the hard rule priced each wait for capacity as slack
    spent until on-demand finished the run (on 2 h of spot and 2 h without, at 1.3x the work, x1.26 the replay's
    cost; on the spot traces 23.9 % from the replay, now 17.6 %). Spells of spot that come and go on a clock, 20 h
    of work, deadlines 1.3-3x: within 8 % of the replay. (At 1.1x the policy's stay on on-demand until the run is
    back on its line costs more than this sees: BENCHMARKS.md.)"""
    work, restart, gap = 20 * 3600.0, 600.0, 60.0
    for factor in (1.3, 1.6, 2.0, 3.0):
        job_ = dl.Job(work, factor * (work + restart), restart, 1.0, 3.0, checkpoint_interval_s=None)
        ticks = int(job_.deadline_s / gap) + 500
        row = (np.arange(ticks) % int((up_h + down_h) * 60)) < up_h * 60
        replayed = dl.replay(job_, traces.Trace(gap_s=gap, available=row[None, :]), dl.policy("srifty"))
        sc = spot_cost(np.array([work]), np.ones(1), np.array([1 / up_h]), 30.0, restart_s=restart - 60)
        fb = odds.expected_with_fallback(
            sc.expected_time_s, np.array([work]), sc.expected_interruptions, job_.deadline_s, np.zeros(1),
            np.array([restart]), np.ones(1), np.full(1, 3.0), down_s=down_h * 3600,
        )  # fmt: skip
        assert float(fb.cost_usd[0]) == pytest.approx(replayed.cost_usd, rel=0.08), (factor, replayed.hours)
        assert float(fb.time_s[0]) <= job_.deadline_s


def test_the_optimum_of_a_deadline_no_run_meets_finishes_as_early_as_any_can() -> None:
    """A trial's replay of an impossible deadline showed the hindsight optimum at $0.76 in 73 h beside every policy's
    $6.30 in 2.1 h (the cheapest run finishing at all): it is the cheapest run finishing as early as any can, what
    every policy then does (on spot where spot stays, else on-demand)."""
    j = job(10, 5, restart_ticks=1)  # 1 + 10 ticks of work: 5 cannot be met
    always, never = trace_of([1] * 60), trace_of([0] * 40 + [1] * 20)
    best = dl.optimum(j, always)
    assert not best.deadline_met and best.finished_h == pytest.approx(11 * 600 / 3600)
    assert best.cost_usd == pytest.approx(11 * 600 / 3600 * 1.0)  # spot there throughout: spot
    best = dl.optimum(j, never)
    assert best.finished_h == pytest.approx(11 * 600 / 3600) and best.cost_usd == pytest.approx(11 * 600 / 3600 * 3.0)
    for name in dl.POLICIES:  # every policy finishes then too
        assert dl.replay(j, never, dl.policy(name)).finished_h == pytest.approx(best.finished_h)


def test_a_guarded_fleets_intervals_are_the_policys_and_carry_spot_capacitys_width(catalog, tmp_path) -> None:
    """A trial: a guarded spot entry's time interval ran past the deadline its "in time" said it meets (31.9 h,
    30-34 h, >99 % for 32 h), and its cost interval ($8.41-9.76) held only the speed's spread, where replays in
    windows with less spot cost 3-5x. The intervals are the policy's run at the speed's 10th / 90th percentiles (an
    on-demand finish keeps the time by the deadline) and the cost's adds spot capacity's width
    (``odds.CAPACITY_LOG_WIDTH``, measured on the traces); a choice whose interval passes the budget says so."""
    trace = tmp_path / "trace.json"
    data = random_trace(np.random.default_rng(5), 1000).available[0].astype(int).tolist()
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": data}))
    stats = odds.SpotStats.of([traces.read_trace(trace)[0]], source="trace.json")
    profile = load_profile(MINIMAL)
    c = Constraints(steps=700_000, market="any", allow=("p3.2xlarge",), max_instances=1, deadline_h=70, budget_usd=1000)
    plan = rank(profile, c, catalog=catalog, spot_stats=stats)
    spot = next(e for e in plan.entries if e.market == "spot")
    od = next(e for e in plan.entries if e.market == "on-demand")
    assert spot.deadline_probability >= 0.9 and spot.time_interval_h[1] <= 70 + 1e-9
    lo, hi = spot.cost_interval_usd
    assert lo <= spot.cost_usd * math.exp(odds.CAPACITY_LOG_WIDTH[0]) + 1e-6
    assert hi >= spot.cost_usd * math.exp(odds.CAPACITY_LOG_WIDTH[1]) - 1e-6
    _, step_hi = od.iteration_time_interval_s
    assert od.cost_interval_usd[1] / od.cost_usd < hi / spot.cost_usd  # on-demand: the speed's spread alone
    assert od.cost_interval_usd[1] / od.cost_usd == pytest.approx(step_hi / od.iteration_time_s, rel=0.05)
    tight = rank(profile, dataclasses.replace(c, budget_usd=(spot.cost_usd + hi) / 2, market="spot"),
                 catalog=catalog, spot_stats=stats)  # fmt: skip
    said = [n for n in tight.notes if n.startswith("budget at risk")]
    assert said and f"its 80% cost interval reaches ${tight.entries[0].cost_interval_usd[1]:,.2f}" in said[0]
    assert not any(n.startswith("budget at risk") for n in plan.notes)


def test_the_review_of_the_fluid_run_and_its_intervals() -> None:
    """A review's findings, each a case: a guarded fleet's interval holds its point where the minimum bill raises it
    (rank() refused its own plan for 100 steps); SpotStats made by hand (no spells counted) ranks; the fluid run's
    cost is continuous where the hard rule's switch comes with the run nearly done (a restart billed for no work made
    $22.00 -> $22.50 across 0.02 s of wait); a scalar work broadcasts over many runs."""
    from predictor.catalog import Catalog

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    profile = load_profile(MINIMAL)
    for c in (Constraints(steps=100, market="spot", deadline_h=5, startup_s=0),
              Constraints(steps=50, market="any", deadline_h=5, current_fleet="p3.2xlarge:1")):  # fmt: skip
        for e in rank(profile, c, catalog=catalog).entries:
            assert e.cost_interval_usd[0] <= e.cost_usd <= e.cost_interval_usd[1], e.fleet
            assert e.time_interval_h[0] <= e.time_h <= e.time_interval_h[1], e.fleet
    hand = odds.SpotStats(0.2, 3600.0, 0.8, "mine")
    assert rank(profile, Constraints(steps=100_000, market="spot", deadline_h=50), catalog=catalog, spot_stats=hand)

    def cost(down_s: float) -> float:
        fb = odds.expected_with_fallback(np.array([20 * 3600.0]), np.array([20 * 3600.0]), np.array([20.0]),
                                         (20 + 20 * 729 / 3600) * 3600 + 600, np.zeros(1), np.array([600.0]),
                                         np.ones(1), np.full(1, 3.0), down_s=down_s)  # fmt: skip
        return float(fb.cost_usd[0])

    walls = [cost(d) for d in np.linspace(700.0, 760.0, 601)]  # across 729 s: spot alone just fits, then not
    assert max(abs(b - a) for a, b in itertools.pairwise(walls)) < 0.05  # no restart's jump ($0.50) anywhere
    three = np.ones(3)
    many = odds.expected_with_fallback(np.array([10.0, 11.0, 30.0]) * 3600, np.array([9.0 * 3600]), three,
                                       20 * 3600.0, 0 * three, 600 * three, three, 3 * three)  # fmt: skip
    assert many.cost_usd.shape == (3,) and np.isfinite(many.cost_usd).all()


def test_the_replay_reads_each_fleets_own_save_and_the_plans_load(planned, catalog) -> None:
    """An entry records its fleet's own save (a sharded fleet's nodes each write their part); the replay's restart is
    the start-up, that save and the plan's load, and whether a preemption loses work is that save's fit in the
    notice, as the ranking priced it (before, the plan's one figure counted twice for every fleet)."""
    import dataclasses

    from predictor.documents.plan import load_plan

    plan = load_plan(json.loads(planned[0].read_text()))
    entry = plan.entries[plan.chosen]
    for save, fits in ((100.0, True), (600.0, False)):
        moved = dataclasses.replace(plan, checkpoint_s=700.0, entries=(dataclasses.replace(entry, checkpoint_s=save),))
        run = dl.job_from_plan(moved, 0, catalog=catalog)
        assert run.job.restart_s == pytest.approx((entry.startup_s or 0.0) + save + 700.0)
        assert run.job.save_on_notice is fits
        assert any(f"save on this fleet takes {save:.0f} s" in n for n in run.notes) is not fits


def test_the_policy_plans_for_the_quantile_only_until_it_has_measured_the_step() -> None:
    """srifty launch's guard holds the plan's quantile until the job reports its step (its first minute of
    training), then the measured one. The replay planned for the quantile throughout: a choice that met its deadline
    at the edge of the confidence replayed all on-demand on a trace where spot never went away (a trial: the entry's
    $1.30 at 0 % on-demand, the replay's $10.52, all on-demand)."""
    always = trace_of([1] * 60)
    known = job(10, 16)  # the work, known from the start: spot throughout
    planned = job(10, 16, planned_work_s=15 * 600.0)  # the quantile leaves no slack for spot
    at_quantile = job(15, 16)  # the old replay: the quantile throughout (here the step really is that slow)
    o_known, o_planned, o_quantile = (
        dl.replay(j, always, dl.policy("srifty"), record=True) for j in (known, planned, at_quantile)
    )
    assert o_known.hours["on-demand"] == 0 and o_quantile.hours["spot"] == 0  # the two ends
    # on-demand from the first tick (the hard rule under the belief), the step measured by the first tick of
    # training, then spot as soon as the run is on its line: 3 ticks of on-demand, the rest on spot
    assert o_planned.market is not None and list(o_planned.market[:4]) == [dl.ON_DEMAND] * 3 + [0]
    assert o_planned.hours["on-demand"] == pytest.approx(3 * 600 / 3600) and o_planned.deadline_met
    assert o_known.cost_usd < o_planned.cost_usd < 0.5 * o_quantile.cost_usd
    # a belief equal to the work replays as a work known from the start
    same = dl.replay(job(10, 16, planned_work_s=10 * 600.0), always, dl.policy("srifty"))
    assert (same.cost_usd, same.hours) == (o_known.cost_usd, o_known.hours)
    with pytest.raises(ConfigError, match="planned_work_s"):
        job(10, 14, planned_work_s=-1.0)


def test_replay_runs_the_predicted_step_and_says_what_it_planned(catalog, tmp_path, capsys) -> None:
    """The replay of a plan whose 90 % quantile barely meets its deadline, on a trace where spot is always there:
    by default the step is the prediction (as the entry's cost assumes) and the policy plans for the quantile until
    it has measured it; ``--step-quantile 0.9`` replays the step come out that slow."""
    asked = Constraints(
        steps=200_000, market="spot", allow=("p3.2xlarge",), max_instances=1, deadline_h=18.8, confidence=0.9
    )
    plan = rank(load_profile(MINIMAL), asked, catalog=catalog)
    entry = plan.entries[plan.chosen]
    path, trace = tmp_path / "plan.json", tmp_path / "trace.json"
    plan.save(path)
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 200}))
    argv = ["replay", "--plan", str(path), "--trace", str(trace), "--policy", "srifty", "--format", "json"]
    docs = []
    for extra in ([], ["--step-quantile", "0.9"]):
        assert main([*argv, *extra]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    predicted, slow = docs
    factor = odds.confidence_factor(entry, 0.9)
    assert predicted["job"]["step_quantile"] == 0.5 and slow["job"]["step_quantile"] == 0.9
    assert predicted["job"]["planned_work_h"] == pytest.approx(predicted["job"]["work_h"] * factor, rel=1e-3)
    assert slow["job"]["work_h"] == pytest.approx(predicted["job"]["planned_work_h"], rel=1e-3)
    fast, late = predicted["results"][0], slow["results"][0]
    assert fast["hours"]["on-demand"] < 0.1 * fast["hours"]["spot"] and fast["cost_usd"] < 2 * entry.cost_usd
    assert late["hours"]["spot"] == 0 and late["cost_usd"] > 5 * entry.cost_usd
    assert any("until the step is measured" in n for n in predicted["notes"])
    assert predicted["job"]["checkpoint_interval_h"] == pytest.approx(entry.checkpoint_interval_s / 3600, rel=1e-3)
    assert main([*argv, "--step-quantile", "1.5"]) == 2
    assert "--step-quantile must be between 0 and 1" in capsys.readouterr().err


def test_the_deadline_interval_leaves_the_slack_for_the_work_at_risk_and_the_saves() -> None:
    from predictor.runs.spot import deadline_interval_s

    slack, work, save = np.array([6.0, 3.0, -1.0, 10.0]), np.array([29.0, 29.0, 29.0, 0.01]), np.full(4, 0.17)
    tau = deadline_interval_s(slack, work, save)
    fits = slack**2 >= 4 * work * save
    assert list(fits) == [True, False, False, True]
    # where one fits: the larger root (the fewest saves), at risk + saves exactly the slack
    assert tau[0] + work[0] * save[0] / tau[0] == pytest.approx(slack[0]) and tau[0] > slack[0] / 2
    # where none does: the interval that spends the least of it; never shorter than a save
    assert tau[1] == pytest.approx(math.sqrt(work[1] * save[1])) and tau[2] == tau[1]
    assert deadline_interval_s(np.array([1.0]), np.array([1e-6]), np.array([0.5]))[0] >= 0.5


def test_a_fleet_whose_save_misses_the_notice_keeps_its_deadline_without_flapping_to_on_demand(catalog) -> None:
    """A captured Llama-2 7B on one p4d spot under a deadline: its 617 s save does not fit the notice, so a
    preemption loses the work since the last periodic checkpoint and the hard rule counts only what is saved. With
    Young-Daly's 16.5 h interval the replay on a trace where spot never went away went to on-demand to commit and
    back 8 times (16 starts, 7.2 h restarting, $150 against the entry's $72.68). The interval now leaves the slack
    for the work at risk and the saves; where no interval can, the entry prices the on-demand it needs."""
    llama = load_profile(json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text()))
    always = traces.Trace(gap_s=600.0, available=np.ones((1, 400), bool))
    kw = {"steps": 20_000, "market": "spot", "allow": ("p4d.24xlarge",), "max_instances": 1, "confidence": 0.9}
    plan = rank(llama, Constraints(deadline_h=36.6, **kw), catalog=catalog)
    entry = plan.entries[plan.chosen]
    assert entry.checkpoint_interval_s is not None and entry.checkpoint_interval_s < 6 * 3600
    replayed = dl.replay(dl.job_from_plan(plan, catalog=catalog).job, always, dl.policy("srifty"))
    assert replayed.starts == 1 and replayed.hours["on-demand"] == 0 and replayed.deadline_met
    assert replayed.cost_usd == pytest.approx(entry.cost_usd, rel=0.1) and entry.on_demand_fallback == 0
    # the launch's guard keeps that interval in hand: a preemption undoes up to it
    from lightning_srifty.provision.launcher.spot_guard import guard_for

    g = guard_for("srifty", plan, plan.chosen, plan, plan.chosen, started_unix=0.0, global_batch=64, check_s=300.0)
    assert g is not None and g.at_risk_s == entry.checkpoint_interval_s
    # a review: the interval used the whole slack, so at confidence 0.5 (a re-plan of an old plan too) the entry read
    # 100 % on-demand and the guard went to on-demand 10.5 h in; a plan's own quantile flapped in the replay
    for deadline_h, confidence, quantile in ((40.0, 0.5, None), (40.0, 0.9, None), (45.0, 0.9, 0.9)):
        plan_ = rank(llama, Constraints(deadline_h=deadline_h, **{**kw, "confidence": confidence}), catalog=catalog)
        entry_ = plan_.entries[plan_.chosen]
        run = dl.job_from_plan(plan_, catalog=catalog, step_quantile=quantile)
        replayed = dl.replay(run.job, always, dl.policy("srifty"))
        assert entry_.on_demand_fallback == 0 and replayed.starts == 1 and replayed.hours["on-demand"] == 0
        slow = odds.confidence_factor(entry_, quantile) if quantile else 1.0
        assert _guarded_on_spot(plan_, slow) == (0, 0.0), (deadline_h, confidence, quantile)
    # a plan ranked before the cap carries Young-Daly's interval: the launch, the job and the replay cap it alike
    old = dataclasses.replace(plan, entries=tuple(dataclasses.replace(e, checkpoint_interval_s=59_417.0)
                                                  for e in plan.entries))  # fmt: skip
    assert dl.planned_interval_s(old, old.chosen) == pytest.approx(entry.checkpoint_interval_s, rel=1e-6)
    assert dl.job_from_plan(old, catalog=catalog).job.checkpoint_interval_s == dl.planned_interval_s(old, old.chosen)
    assert _guarded_on_spot(old, 1.0) == (0, 0.0)
    # no deadline: Young-Daly's interval alone
    free_plan = rank(llama, Constraints(**{**kw, "confidence": 0.5}), catalog=catalog)
    free = free_plan.entries[0]
    assert free.checkpoint_interval_s is not None and free.checkpoint_interval_s > 12 * 3600
    # replayed under a deadline of the replay's own (a trial: the plan's 16.5 h reused without a word)
    run = dl.job_from_plan(free_plan, 0, deadline_h=36.6, catalog=catalog)
    assert run.job.checkpoint_interval_s is not None and run.job.checkpoint_interval_s < 6 * 3600  # at 0.5: 5 h
    assert any("interval is" in n and "(the plan's: 16.50 h)" in n for n in run.notes), run.notes
    assert any("pause the training on spot" in n for n in run.notes)
    # at the edge no interval leaves room for both: the entry prices the on-demand the hard rule will need
    edge = rank(llama, Constraints(deadline_h=33.1, **kw), catalog=catalog)
    assert edge.entries[edge.chosen].on_demand_fallback > 0.3


def _guarded_on_spot(plan, slow: float) -> tuple[int, float]:
    """srifty launch's guard over a run where spot never goes away, checked every 5 min: the job's steps at the
    predicted step x ``slow`` (measured after its first minute), pausing for each periodic save (the plan's
    interval, ``planned_interval_s``). (moves, hours on-demand)."""
    from lightning_srifty.provision.launcher.spot_guard import guard_for

    i, check = plan.chosen, 300.0
    e = plan.entries[i]
    g = guard_for("srifty", plan, i, plan, i, started_unix=0.0, global_batch=e.global_batch, check_s=check)
    assert g is not None
    tau, save = dl.planned_interval_s(plan, i) or math.inf, e.checkpoint_s or 0.0
    step_s, restart = e.iteration_time_s * slow, (e.startup_s or 0.0) + save + (plan.checkpoint_s or 0.0)
    now, trained, running, busy, moves, on_demand = 0.0, 0.0, "spot", e.startup_s or 0.0, 0, 0.0
    while trained < g.steps * step_s and now < 100 * 3600:
        g.progress(int(trained / step_s), step_s if trained > 60 else None)
        d = g.decide(now, running, True)
        act = {"spot": "spot", "on-demand": "on-demand", "wait": None}[d.action]
        if act != running:
            moves, running, busy = moves + 1, act, restart
        on_demand += check / 3600 if running == "on-demand" else 0.0
        left = check - min(busy, check)
        busy = max(0.0, busy - check)
        trained += left * tau / (tau + save) if running == "spot" and math.isfinite(tau) else left
        now += check
    return moves, on_demand


def test_a_spot_start_the_hard_rule_would_cut_short_is_made_on_demand() -> None:
    """A spot fleet pays its restart before it trains. Started where the hard rule would send the run to on-demand
    before its first tick of training, it only added a restart: a trial's p3 plan replayed spot, on-demand a tick
    later, then spot again (3 starts, $12.44 against the entry's $6.43), and a looser deadline cost more."""
    always = trace_of([1] * 60)
    tight = job(10, 16, planned_work_s=14 * 600.0)  # the belief leaves one restart and a tick of slack
    o = dl.replay(tight, always, dl.policy("srifty"), record=True)
    assert o.market is not None and o.market[0] == dl.ON_DEMAND and o.starts == 2  # on-demand, then spot once
    s = dl.State(0, 0, None, 0, np.array([True]), np.zeros((1, 0), bool))
    j = dl.Ticks.of(tight, 600.0).seen(0, 0)[0]
    assert not dl.must_run_on_demand(s, j) and dl.start_cut_short(s, j)  # allowed by the rule, cut short by it
    assert all(dl.policy(name).decide(s, j) == dl.ON_DEMAND for name in dl.POLICIES)


def test_a_looser_deadline_never_replays_dearer_near_the_edge(catalog) -> None:
    """The trial's ResNet-50 plans on one p3.2xlarge at deadlines just past the 90 % quantile, replayed on a trace
    where spot is always there (600 s ticks): $9.24, $7.45, $12.44, $12.44, $6.49 before."""
    profile = load_profile(json.loads((ROOT / "examples/profiles/resnet50-v100.json").read_text()))
    always = traces.Trace(gap_s=600.0, available=np.ones((1, 400), bool))
    costs = []
    for deadline_h in (18.7, 18.9, 19.0, 19.1, 19.2):
        asked = Constraints(steps=200_000, market="spot", allow=("p3.2xlarge",), max_instances=1, deadline_h=deadline_h)
        run = dl.job_from_plan(rank(profile, asked, catalog=catalog), catalog=catalog)
        costs.append(dl.replay(run.job, always, dl.policy("srifty")).cost_usd)
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(costs)), costs
