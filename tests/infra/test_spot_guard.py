"""The launcher's deadline-aware spot policy (issue #25 item 1): the guard's decisions on scripted states and clocks
(the hard rule above all), the on-demand twin of a spot fleet, and srifty launch with a recording provisioner: a spot
notice answered by waiting and then on-demand, and a spot fleet moved to on-demand as the deadline nears."""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time

import numpy as np
import pytest

from _support import LosingNodes, Recorder
from lightning_srifty import protocol, store
from lightning_srifty.protocol import Failed, Finished, Leave, Preempted, write_record
from lightning_srifty.provision.launcher.launch import launch
from lightning_srifty.provision.launcher.spot_guard import SpotGuard, on_demand_fleet, policy_for
from lightning_srifty.provision.terraform.money import check_entry
from predictor.exceptions import ConfigError
from predictor.runs import deadline
from predictor.runs.spot import on_demand_time_s

LID = "L1"
T0 = 1_000_000.0  # the scripted clock's start (unix seconds)


@pytest.fixture(scope="module")
def spot_plan(catalog):
    """g4dn.xlarge / g5.xlarge fleets on spot, a 10 h deadline; 1000 steps of 8 samples."""
    from _support import MINIMAL
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    profile = load_profile({**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}})
    c = Constraints(steps=1000, market="spot", allow=("g4dn.xlarge", "g5.xlarge"), max_instances=2, deadline_h=10)
    return rank(profile, c, catalog=catalog)


def guard(policy: deadline.Policy | None = None, **kw) -> SpotGuard:
    """1000 steps of 36 s (10 h of work) by a 24 h deadline, restart 30 min, a check every 15 min."""
    settings = dict(started_unix=T0, deadline_h=24.0, steps=1000, step_s=36.0, restart_s=1800.0, check_s=900.0,
                    spot_usd_hr=1.0, od_usd_hr=3.0)  # fmt: skip
    return SpotGuard(policy or deadline.Greedy(), **{**settings, **kw})


class AlwaysWait(deadline.Policy):
    """A policy that would miss any deadline: only the guard's hard rule can save it."""

    name = "always-wait"

    def decide(self, s, j) -> int:
        return deadline.WAIT


# --- the guard, pure ------------------------------------------------------------------------------------------------


def test_with_slack_to_spare_spot_gone_means_waiting_and_the_words_say_the_slack() -> None:
    g = guard()
    g.observe(False, now=T0)
    d = g.decide(T0 + 3600, None)
    assert (d.action, d.forced) == ("wait", False)
    assert d.time_left_h == pytest.approx(23.0) and d.work_left_h == pytest.approx(10.0)
    assert d.describe() == "slack 13.00 h > the 0.50 h an on-demand finish needs: waiting for spot"
    short = dataclasses.replace(d, time_left_h=0.1, work_left_h=0.05, restart_h=0.3 / 3600)
    assert short.describe() == "slack 3 min > the 0.3 s an on-demand finish needs: waiting for spot"
    # a trial read "slack -68.90 h, within a check of the 0.10 h an on-demand finish needs (the hard rule)"
    late = dataclasses.replace(d, action="on-demand", forced=True, time_left_h=2.0, work_left_h=70.9, restart_h=0.1)
    assert late.describe() == (
        "slack -68.90 h: the deadline is out of reach even on-demand (the work left takes 70.90 h at the step time "
        "in use, 2.00 h are left): on-demand, the soonest finish"
    )
    tight = dataclasses.replace(late, work_left_h=1.85)
    assert tight.describe().startswith("slack 0.15 h, within a check of the 0.10 h an on-demand finish needs")
    assert g.decide(T0 + 3600, None, available=True).action == "spot"  # spot there: start it


@pytest.mark.parametrize("policy", [AlwaysWait(), deadline.Greedy(), deadline.Srifty(), deadline.UniformProgress()])
def test_the_hard_rule_forces_on_demand_in_time_whatever_the_policy(policy) -> None:
    """Spot never comes back and no progress is made: at the last check where waiting one more tick is still safe the
    guard may wait; from then on it says on-demand, and an on-demand fleet started then finishes by the deadline."""
    g = guard(policy)
    g.observe(False, now=T0)
    first_on_demand = None
    for k in range(0, 24 * 4 + 1):
        now = T0 + k * g.check_s
        d = g.decide(now, None)
        finish = now + g.restart_s + (g.steps - g.step) * g.step_s  # an on-demand fleet started now
        if d.action != "on-demand":
            # waiting one more check must leave an on-demand finish in time
            assert finish + g.check_s <= T0 + g.deadline_s, f"{policy.name} waited at check {k}"
        else:
            first_on_demand = k
            assert finish <= T0 + g.deadline_s
            break
    assert first_on_demand is not None
    if policy.name in ("always-wait", "greedy"):  # only the hard rule sends these to on-demand
        # 24 h - 10 h of work - 0.5 h restart: the last safe start is 13.5 h in, the check where the rule fires
        assert g.decide(T0 + first_on_demand * g.check_s, None).forced and first_on_demand == 13.5 * 4


def test_progress_and_measured_times_move_the_point_of_no_return() -> None:
    g = guard(AlwaysWait())
    now = T0 + 13.5 * 3600  # forced with no progress
    assert g.decide(now, None).forced
    g.progress(500)  # half the work done: 5 h left
    assert not g.decide(now, None).forced
    g.progress(100)  # never backwards (a resume from an older checkpoint)
    assert g.step == 500
    g.progress(None, step_time_s=90.0)  # measured: 2.5x slower than predicted -> 12.5 h left
    assert g.step_s == 90.0 and g.decide(now, None).forced
    g.progress(None, step_time_s=36.0)
    g.restarted(4 * 3600.0)  # a measured restart of 4 h
    assert g.restart_s == 4 * 3600.0 and g.decide(T0 + 15 * 3600, None).forced


def test_the_hard_rule_keeps_in_hand_the_training_a_preemption_would_undo() -> None:
    """Where the fleet's save misses the spot notice a preemption loses the training since the last periodic save
    (up to the plan's interval); the guard sees the steps done, not the steps saved, so its hard rule keeps that
    training in hand beside the restart (never more than the steps done)."""
    now = T0 + 16 * 3600  # 5 h of work left: 8 h to the deadline less 0.5 h restart, 2.5 h of slack
    for at_risk_h, forced in ((0.0, False), (2.0, False), (3.0, True), (math.inf, True)):
        g = guard(AlwaysWait(), at_risk_s=at_risk_h * 3600)
        g.progress(500)
        assert g.decide(now, None).forced is forced, at_risk_h
    # the words say what the rule keeps in hand: 2.5 h of the 5 h done at risk binds with 3 h of slack (15 min checks)
    g = guard(AlwaysWait(), at_risk_s=2.5 * 3600)
    g.progress(500)
    assert g.decide(now, None).describe() == (
        "slack 3.00 h, within a check of the 3.00 h an on-demand finish needs after a preemption (0.50 h to "
        "restart, 2.50 h of training to redo: the save misses the spot notice) (the hard rule): on-demand"
    )
    assert g.decide(now - 3600, None).describe().startswith("slack 4.00 h > the 3.00 h an on-demand finish needs after")
    # nothing done, nothing at risk: the point of no return is the one without it (13.5 h in)
    g = guard(AlwaysWait(), at_risk_s=math.inf)
    assert not g.decide(T0 + 13.25 * 3600, None).forced and g.decide(T0 + 13.5 * 3600, None).forced


def test_the_hard_rule_leaves_room_for_an_on_demand_finishs_node_failures_and_saves(spot_plan, catalog) -> None:
    """64 GPUs and a 120 s save: the on-demand finish of 10 h of steps takes its periodic saves and its node failures
    (OPT-175B's rate, 1 / (7.5 h x 992 GPUs)) on top, worked out here by hand in expectation, so the hard rule fires
    two checks before it would for the bare work, and an on-demand fleet started then still finishes in time. At a
    confidence, the failures are held at its quantile. The guard srifty launch builds prices the fleet's own GPUs,
    the plan's save and its confidence."""
    g, bare = guard(AlwaysWait(), gpus=64.0, checkpoint_s=120.0), guard(AlwaysWait())
    rate = 64 / (7.5 * 992) / 3600  # failures per second
    tau = math.sqrt(2 * 120 / rate)  # Young-Daly, under the run's 36,000 s: periodic
    saves = 36_000 * 120 / tau
    failures = rate * (36_000 + saves)
    finish_s = 36_000 + saves + failures * (1800 + 120 + tau / 2)  # each: the restart, a load, half an interval lost
    assert g.decide(T0, None).work_left_h == pytest.approx(finish_s / 3600)
    assert bare.decide(T0, None).work_left_h == pytest.approx(10.0)

    def first_forced(x: SpotGuard) -> int:
        x.observe(False, now=T0)
        return next(k for k in range(24 * 4) if x.decide(T0 + k * x.check_s, None).forced)

    k_bare, k = first_forced(bare), first_forced(g)
    assert (k_bare, k) == (54, 54 - (math.ceil(finish_s / 900) - 40))
    assert k < k_bare and T0 + k * 900 + 1800 + finish_s <= T0 + 24 * 3600
    # the room is the hard rule's alone: the policy's line is drawn on the steps, as before
    assert g.ticks(T0).work == bare.ticks(T0).work == 40 and g.ticks(T0).finish_extra == math.ceil(finish_s / 900) - 40
    # at a confidence: the failures' expectation while the step is predicted (the step is at the confidence then),
    # their quantile once the job has measured it (no room for them at 0.9, where none comes 92 times in 100; more
    # than their expectation at 0.95), as the steps are done
    for confidence, room in ((0.9, 36_000 + saves), (0.95, on_demand_time_s(36_000, 120.0, 1800.0, 64.0, 0.95))):
        held = guard(AlwaysWait(), gpus=64.0, checkpoint_s=120.0, confidence=confidence)
        assert held.decide(T0, None).work_left_h == pytest.approx(finish_s / 3600)
        held.progress(None, step_time_s=36.0)
        assert held.decide(T0, None).work_left_h == pytest.approx(room / 3600)
    assert on_demand_time_s(36_000, 120.0, 1800.0, 64.0, 0.95) > finish_s
    held.progress(900)
    assert held.work_left_s == pytest.approx(on_demand_time_s(3600, 120.0, 1800.0, 64.0, 0.95))

    from lightning_srifty.provision.launcher.spot_guard import guard_for

    od_plan, i = on_demand_fleet(spot_plan, 0, catalog)
    built = guard_for("srifty", spot_plan, 0, od_plan, i, started_unix=T0, global_batch=8, check_s=300.0)
    expected = (od_plan.entries[i].gpus, spot_plan.checkpoint_s, spot_plan.constraints.confidence)
    assert built is not None and (built.gpus, built.checkpoint_s, built.confidence) == expected


def test_a_node_failure_under_the_guard_restarts_as_the_ranking_prices_it(spot_plan, catalog) -> None:
    """A move's restart holds the start-up, the leaving fleet's save and the load; a node failure gives no notice
    to save on and loads once. The on-demand finish the hard rule leaves room for is the ranking's on-demand twin:
    each failure the start-up and one load (before, the save and a second load besides)."""
    from lightning_srifty.provision.launcher.spot_guard import guard_for
    from predictor.runs.spot import on_demand_cost, planned_save_s

    od_plan, i = on_demand_fleet(spot_plan, 0, catalog)
    built = guard_for("srifty", spot_plan, 0, od_plan, i, started_unix=T0, global_batch=8, check_s=300.0)
    assert built is not None
    entry, od = spot_plan.entries[0], od_plan.entries[i]
    start, save, load = entry.startup_s, planned_save_s(spot_plan, entry), spot_plan.checkpoint_s
    assert built.restart_s == pytest.approx(start + save + load) and built.failure_restart_s == pytest.approx(start)
    built.gpus = 992.0  # OPT-175B's cluster: failures the finish must hold (a few GPUs' are lost in rounding)
    left = built.steps * built.step_s
    twin = on_demand_cost(left, planned_save_s(spot_plan, od), restart_s=od.startup_s, gpus=992.0, load_s=load)
    assert built.work_left_s == pytest.approx(float(twin.expected_time_s[0]), rel=1e-12)
    # a measured move 100 s slower than predicted: a failure's start-up is 100 s slower too; a faster one says
    # nothing of a failure's (never faster than predicted)
    built.restarted(start + save + load + 100.0)
    assert built.failure_restart_s == pytest.approx(start + 100.0)
    built.restarted(10.0)
    assert built.failure_restart_s == pytest.approx(start)
    # a review: a move whose save took 20 s of a predicted 600 and whose start took 250 s more made failures free
    # (its whole was 330 s under the prediction); without the saves, it was 250 s slow, and so is a failure
    slow = guard(AlwaysWait(), restart_s=300.0 + 600.0 + 600.0, save_s=600.0, startup_s=300.0, checkpoint_s=600.0)
    slow.restarted(20.0 + 500.0 + 650.0, 20.0)  # the save, the fleet up, its start and load to the first step
    assert slow.restart_s == 1170.0 and slow.failure_restart_s == pytest.approx(550.0)
    slow.restarted(1170.0)  # the save not measured: the predicted one is taken out
    assert slow.failure_restart_s == pytest.approx(300.0)


def test_on_demand_stays_under_greedy_and_returns_to_spot_under_srifty_when_it_pays() -> None:
    greedy, srifty = guard(deadline.Greedy()), guard(deadline.Srifty())
    for g in (greedy, srifty):
        g.observe(True, now=T0)
    assert greedy.decide(T0 + 1800, "on-demand", available=True).action == "on-demand"
    assert srifty.decide(T0 + 1800, "on-demand", available=True).action == "spot"
    # spot running and there: both stay
    assert greedy.decide(T0 + 1800, "spot").action == srifty.decide(T0 + 1800, "spot").action == "spot"


def test_srifty_falls_back_to_on_demand_before_the_hard_rule_when_spot_stays_away() -> None:
    """Spot seen away for hours: the expected spot progress no longer covers the work, so it runs on-demand while the
    hard rule would still let it wait."""
    g = guard(deadline.Srifty(), deadline_h=16.0)
    g.observe(False, now=T0)
    d = g.decide(T0 + 3 * 3600, None)
    assert (d.action, d.forced) == ("on-demand", False)
    greedy = guard(deadline.Greedy(), deadline_h=16.0)
    greedy.observe(False, now=T0)
    assert greedy.decide(T0 + 3 * 3600, None).action == "wait"


@pytest.mark.parametrize("name", ["greedy", "uniform", "srifty"])
def test_replayed_through_the_guard_every_policy_meets_the_deadline(name) -> None:
    """Random availability (spells of spot and none), the launcher's view: progress only on a fleet past its restart;
    a notice loses nothing (the save fits it). Every run finishes by the deadline."""
    rng = np.random.default_rng(7)
    for _ in range(8):
        g = guard(deadline.policy(name), deadline_h=14.0)
        there, running, restart_left, done_s = True, None, 0.0, 0.0
        for k in range(14 * 4):
            now = T0 + k * g.check_s
            if rng.random() < 0.15:
                there = not there
            if running == "spot" and not there:
                running = None  # a notice
            g.observe(there, now=now)
            g.progress(int(done_s // g.step_s))
            d = g.decide(now, running)
            want = {"spot": "spot", "on-demand": "on-demand", "wait": None}[d.action]
            if want != running:
                running, restart_left = want, g.restart_s
            if running is not None:
                train = max(0.0, g.check_s - restart_left)
                restart_left = max(0.0, restart_left - g.check_s)
                done_s += train
            if done_s >= g.steps * g.step_s:
                assert now + g.check_s <= T0 + g.deadline_s
                break
        else:
            pytest.fail(f"{name} did not finish by the deadline")


def test_the_policy_is_srifty_for_spot_under_a_deadline_and_refused_where_it_cannot_work(spot_plan, catalog) -> None:
    entry = spot_plan.entries[0]
    assert policy_for(None, entry, spot_plan) == "srifty"
    no_deadline = dataclasses.replace(
        spot_plan, constraints=dataclasses.replace(spot_plan.constraints, deadline_h=None)
    )
    assert policy_for(None, entry, no_deadline) == "off"
    od_plan, od = on_demand_fleet(spot_plan, 0, catalog)
    assert policy_for(None, od_plan.entries[od], od_plan) == "off"
    with pytest.raises(ConfigError, match=r"must be one of \{srifty, greedy, uniform, off\}. Got 'cheap'") as bad:
        policy_for("cheap", entry, spot_plan)
    assert (bad.value.parameter, bad.value.value) == ("spot_policy", "cheap")
    with pytest.raises(ConfigError, match=r"the plan has none .*srifty recommend --deadline H"):
        policy_for("greedy", entry, no_deadline)
    with pytest.raises(ConfigError, match="is on-demand: choose a spot or mixed entry"):
        policy_for("srifty", od_plan.entries[od], od_plan)
    assert policy_for("off", od_plan.entries[od], od_plan) == "off"


def test_the_on_demand_fallback_is_the_same_fleet_priced_from_the_catalog(spot_plan, catalog) -> None:
    od_plan, i = on_demand_fleet(spot_plan, 1, catalog)
    spot, od = spot_plan.entries[1], od_plan.entries[i]
    assert i == len(spot_plan.entries) and list(od_plan.entries[:i]) == list(spot_plan.entries)  # appended only
    assert [(g.instance_type, g.count) for g in od.groups] == [(g.instance_type, g.count) for g in spot.groups]
    assert (od.market, od.spot_share, od.expected_interruptions, od.risk) == ("on-demand", 0, 0, "none")
    # the same work without spot's interruptions but with its node failures (a trial: the fallback had no periodic
    # checkpoint, so a node lost on it cost everything since the leg began): Young-Daly's interval for them, the
    # replacement's start-up, a load and the unsaved work in expectation
    work_s = spot_plan.constraints.work_samples / spot.throughput_samples_s
    rate_s, c = od.gpus / (7.5 * 992) / 3600, spot_plan.checkpoint_s or 30.0
    tau = math.sqrt(2 * c / rate_s)
    periodic = tau < work_s
    assert od.checkpoint_interval_s == (pytest.approx(tau) if periodic else None)
    running = work_s * (1 + c / tau) if periodic else work_s
    failures = rate_s * running * (od.startup_s + c + (tau if periodic else work_s) / 2)
    assert od.time_h == pytest.approx((od.startup_s + running + failures) / 3600)
    assert od.usd_per_hour == pytest.approx(2 * catalog.get("g4dn.xlarge").price_usd_hr("us-east-1"))
    assert check_entry(od_plan, i, catalog) == pytest.approx(od.usd_per_hour)  # what srifty terraform will accept
    # its intervals by the plan's one rule (the start-up fixed), around its own time and cost
    t_lo, t_hi = od.time_interval_h
    c_lo, c_hi = od.cost_interval_usd
    assert od.startup_s / 3600 <= t_lo <= od.time_h <= t_hi and c_lo <= od.cost_usd <= c_hi
    assert c_lo == pytest.approx(od.usd_per_hour * t_lo) and c_hi == pytest.approx(od.usd_per_hour * t_hi)
    assert on_demand_fleet(od_plan, i, catalog) == (od_plan, i)  # on-demand already
    again, j = on_demand_fleet(od_plan, 1, catalog)  # the plan has the fleet on-demand now: that entry
    assert (again, j) == (od_plan, i)


def test_a_long_runs_on_demand_fallback_checkpoints_for_its_node_failures(catalog) -> None:
    """The fallback of a day-long spot run on 8 GPUs runs longer than Young-Daly's interval for its node failures:
    it checkpoints at that interval, which srifty launch gives its leg's job."""
    from _support import MINIMAL
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    c = Constraints(steps=2_000_000, market="spot", allow=("p3.16xlarge",), max_instances=1)
    plan = rank(load_profile(copy.deepcopy(MINIMAL)), c, catalog=catalog)
    od_plan, i = on_demand_fleet(plan, 0, catalog)
    od = od_plan.entries[i]
    tau = math.sqrt(2 * (plan.checkpoint_s or 30.0) / (8 / (7.5 * 992) / 3600))
    assert od.gpus == 8 and od.time_h > tau / 3600 and od.checkpoint_interval_s == pytest.approx(tau)


# --- srifty launch with a recording provisioner ---------------------------------------------------------------------


def _until(predicate, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _tight(plan, deadline_s: float, steps: int = 1):
    """The plan with a deadline of seconds, ``steps`` steps of work, a start-up of 0.2 s and saves of 0.05 s."""
    entries = [dataclasses.replace(e, startup_s=0.2, checkpoint_s=0.05) for e in plan.entries]
    gb = plan.entries[0].global_batch or 8
    c = dataclasses.replace(plan.constraints, deadline_h=deadline_s / 3600, work_samples=float(steps * gb))
    return dataclasses.replace(plan, constraints=c, entries=entries, checkpoint_s=0.05)


def _launch(plan, tmp_path, recorder, job, catalog, **kwargs):
    result: dict = {"echo": []}
    ckpt = str(tmp_path / "ckpt")

    def go() -> None:
        try:
            result["moves"] = launch(
                plan, provisioner=recorder, workdir=tmp_path, checkpoint_dir=ckpt, poll_s=0.01, name="f",
                launch_id=LID, echo=result["echo"].append, catalog=catalog, **kwargs,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    try:
        job(ckpt, recorder)
    except AssertionError:
        thread.join(5)
        raise AssertionError(f"{result}\n{recorder.calls}") from None
    thread.join(30)
    assert not thread.is_alive()
    assert "error" not in result, result
    return result


def test_a_spot_notice_waits_for_spot_then_the_hard_rule_starts_the_same_fleet_on_demand(
    spot_plan, tmp_path, catalog
) -> None:
    plan = _tight(spot_plan, deadline_s=6.0)  # 1 step of 0.73 s, restart 0.3 s: seconds of slack to wait with
    rec = Recorder()
    began = time.time()

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        rec.spot_refusals = 10**6  # spot is gone from now on
        write_record(ckpt, Preempted(launch_id=LID, step=0, checkpoint="c0", why="spot interruption notice"))
        _until(lambda: any(m == "on-demand" and ("start", n) in rec.calls for n, m in rec.markets.items()))
        write_record(ckpt, Finished(launch_id=LID, step=1))

    result = _launch(plan, tmp_path, rec, job, catalog, spot_check_s=0.2)
    echo = "\n".join(result["echo"])
    assert "spot policy srifty against the 0.00166667 h deadline" in echo and "on-demand fallback g4dn.xlarge:1" in echo
    assert "srifty launch: spot gone at step 0; slack" in echo and "waiting for spot" in echo
    od = next(name for name, market in rec.markets.items() if market == "on-demand")
    assert rec.calls.index(("down", "f-1")) < rec.calls.index(("up", od))  # waited with no fleet
    assert sum(1 for c in rec.calls if c[0] == "refused") >= 2  # spot tried at once and at each check
    assert rec.envs[od]["SRIFTY_RESUME"] == "c0" and rec.envs[od]["SRIFTY_FLEET"] == plan.entries[0].fleet
    od_plan = store.read(str(tmp_path / "ckpt"), rec.envs[od]["SRIFTY_PLAN"].rsplit("/ckpt/", 1)[1])
    assert od_plan["entries"][int(rec.envs[od]["SRIFTY_CHOICE"])]["market"] == "on-demand"
    # the deadline keeps counting from the launch's start on the on-demand fleet's plan too
    assert rec.envs[od]["SRIFTY_PLAN_STARTED_UNIX"] == rec.envs["f-1"]["SRIFTY_PLAN_STARTED_UNIX"]
    # started in time for an on-demand finish: restart (0.2 + 2 x 0.05 s) and the step (0.73 s) by the deadline
    work_s = 8 / plan.entries[0].throughput_samples_s
    assert rec.started_unix[od] + 0.3 + work_s <= began + 6.0 + 0.1
    (move,) = result["moves"]
    assert (move.trigger, move.voluntary, move.from_fleet, move.to_fleet) == ("spot", False, "g4dn.xlarge:1",
                                                                               "g4dn.xlarge:1")  # fmt: skip


@pytest.mark.parametrize("fault", [True, False], ids=["its-gpu-failed", "gone-without-a-notice"])
def test_a_node_whose_gpu_failed_under_the_guards_spot_fleet_is_not_spot_gone(
    spot_plan, tmp_path, catalog, fault
) -> None:
    """A node of the spot fleet whose GPU failed (its exit record says so; its nodes' verdict 75, rank 0's
    FAILED.json) says nothing of spot's capacity. It was read as a spot notice, so the guard marked spot gone and
    waited or went on-demand; now it decides with spot there and starts spot again, at once. A spot node gone
    without a notice and without a fault is most likely a reclaim whose notice did not come: spot gone, as before."""
    plan = _tight(spot_plan, deadline_s=60.0)
    rec = LosingNodes()

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        if fault:
            rec.faults["f-1"] = ["logged Xid (PCI:0000:00:1e): 79"]
        else:
            rec.spot_refusals = 1  # the reclaim's market: the first spot start again is refused
        rec.verdicts["f-1"] = [75]
        write_record(ckpt, Failed(launch_id=LID, step=0, error="RuntimeError: CUDA error: unknown error"))
        _until(lambda: ("start", "f-2") in rec.calls or ("start", "f-3") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=1))

    result = _launch(plan, tmp_path, rec, job, catalog, spot_check_s=0.2)
    echo = "\n".join(result["echo"])
    (move,) = result["moves"]
    if fault:
        said = "srifty launch: a machine's fault (a node lost without a notice, or a hung job) at step 0; slack"
        assert said in echo and ": spot" in echo
        assert rec.markets["f-2"] != "on-demand" and not any(c[0] == "refused" for c in rec.calls)
        assert (move.trigger, move.from_fleet, move.to_fleet) == ("node", "g4dn.xlarge:1", "g4dn.xlarge:1")
    else:
        assert "srifty launch: spot gone at step 0; slack" in echo and move.trigger == "spot"


def test_as_the_deadline_nears_a_spot_fleet_is_moved_to_on_demand_up_first(spot_plan, tmp_path, catalog) -> None:
    plan = _tight(spot_plan, deadline_s=3.0, steps=2)  # 1.5 s of work, 0.3 s restart: forced about 1 s in
    rec = Recorder()

    def job(ckpt, rec) -> None:
        _until(lambda: store.exists(ckpt, protocol.LEAVE))
        assert rec.calls == [("up", "f-1"), ("start", "f-1"), ("up", "f-2")]  # up, nothing started or released
        assert protocol.read_record(ckpt, Leave, LID).to_fleet == plan.entries[0].fleet
        write_record(ckpt, Preempted(launch_id=LID, step=0, checkpoint="c0", why="left", trigger="leave", move=True))
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=2))

    result = _launch(plan, tmp_path, rec, job, catalog, spot_check_s=0.1, spot_policy="greedy")
    assert rec.markets == {"f-1": "spot", "f-2": "on-demand"}
    assert rec.calls[:5] == [("up", "f-1"), ("start", "f-1"), ("up", "f-2"), ("start", "f-2"), ("down", "f-1")]
    (move,) = result["moves"]
    assert (move.trigger, move.voluntary) == ("deadline", True)
    assert "a deadline check (the spot policy's" in move.describe()
    assert any("(the hard rule): on-demand" in line for line in result["echo"]), result["echo"]


def test_spot_check_s_that_cannot_work_is_refused(spot_plan, tmp_path) -> None:
    said = r"The 'spot_check_s' parameter of launch\(\) must be a number > 0. Got 0"
    with pytest.raises(ConfigError, match=said) as bad:
        launch(spot_plan, provisioner=Recorder(), workdir=tmp_path, spot_check_s=0)
    assert bad.value.parameter == "spot_check_s"
    assert bad.value.in_words("cli", {"spot_check_s": "--spot-check-s"}.get).startswith("--spot-check-s must be")


# --- the job's side ------------------------------------------------------------------------------------------------


def test_the_job_reports_progress_at_most_every_progress_s_and_leaves_on_a_leave_it_did_not_ask_for(
    tmp_path, monkeypatch
) -> None:
    from lightning_srifty.migrate.preemption import SpotPreemption
    from lightning_srifty.protocol import LaunchEnv, Progress, read_record

    env = LaunchEnv(launch_id=LID, checkpoint_uri=str(tmp_path), fleet="g4dn.xlarge:1").to_env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cb = SpotPreemption(progress_s=60.0)
    assert cb.watch.report_progress(10, 1000.0, now=0.0)  # the leg's first step: written, no step time yet
    assert read_record(str(tmp_path), Progress, LID).step_time_s is None
    assert not cb.watch.report_progress(20, 1005.0, now=30.0)  # too soon
    assert cb.watch.report_progress(30, 1010.0, now=61.0)
    got = read_record(str(tmp_path), Progress, LID)
    assert (got.step, got.fleet, got.step_time_s) == (30, "g4dn.xlarge:1", pytest.approx(0.5))

    assert not cb.watch.says_leave()
    write_record(str(tmp_path), Leave(launch_id=LID, to_fleet="g4dn.xlarge:1"))
    assert cb.watch.says_leave() and cb._stop.is_set()
    assert (cb._trigger, cb._leave_details) == ("leave", {"move": True, "to_fleet": "g4dn.xlarge:1"})


def test_progress_is_written_by_the_watch_thread_not_in_the_step(tmp_path, monkeypatch) -> None:
    """The step hook only notes (step, time); the launcher-watch thread writes PROGRESS.json, so a slow checkpoint
    store never holds a training step."""
    from lightning_srifty.migrate.preemption import SpotPreemption
    from lightning_srifty.protocol import LaunchEnv, Progress, read_record

    env = LaunchEnv(launch_id=LID, checkpoint_uri=str(tmp_path), fleet="g4dn.xlarge:1").to_env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cb = SpotPreemption(progress_s=60.0, interval_s=0.05)
    cb.watch.note_progress(10, 1000.0)
    assert not (tmp_path / protocol.PROGRESS).exists()  # noted, not written, by the step
    watch = threading.Thread(target=cb.watch.run, args=(False, True), daemon=True)
    watch.start()
    try:
        _until(lambda: (tmp_path / protocol.PROGRESS).exists(), timeout=10)
    finally:
        cb.watch.stop()
        watch.join(5)
    assert read_record(str(tmp_path), Progress, LID).step == 10
