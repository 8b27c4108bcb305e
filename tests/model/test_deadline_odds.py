"""A deadline is a probability (issue #38 item 1): each fleet's chance of finishing in time, the filter at the
confidence asked, and what the plan, the table and the errors say of it."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from _support import MINIMAL
from predictor.documents.plan import load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import NoFeasibleConfigError
from predictor.model.uncertainty import normal_cdf, z_of
from predictor.ranking import Constraints, rank
from predictor.ranking.constraints import Constraints as C
from predictor.runs.odds import deadline_odds, expected_with_fallback


@pytest.fixture
def profile():
    return load_profile(copy.deepcopy(MINIMAL))


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_normal_cdf_and_quantile() -> None:
    x = np.linspace(-7, 7, 2001)
    assert np.max(np.abs(normal_cdf(x) - np.array([_phi(v) for v in x]))) < 2e-7
    assert z_of(0.9) == pytest.approx(1.28155, abs=1e-5) and z_of(0.5) == pytest.approx(0.0, abs=1e-12)


def test_odds_of_an_unguarded_run_are_its_log_normal_tail() -> None:
    startup, work, sd, deadline = np.array([600.0]), np.array([3000.0]), np.array([0.2]), 4000.0
    odds = deadline_odds(deadline, 0.9, sd, startup, work, np.array([False]), None)
    assert odds.probability[0] == pytest.approx(_phi(math.log((4000 - 600) / 3000) / 0.2), abs=1e-6)
    assert odds.time_s[0] == pytest.approx(600 + 3000 * math.exp(z_of(0.9) * 0.2))
    # no room after the start-up: no chance; no spread: a certainty either way
    none = deadline_odds(500.0, 0.9, sd, startup, work, np.array([False]), None)
    assert none.probability[0] == 0
    sure = deadline_odds(deadline, 0.9, np.array([0.0]), startup, work, np.array([False]), None)
    late = deadline_odds(3500.0, 0.9, np.array([0.0]), startup, work, np.array([False]), None)
    assert sure.probability[0] == 1 and late.probability[0] == 0


def test_the_time_at_the_confidence_meets_the_deadline_exactly_when_the_chance_does() -> None:
    """The filter (the time at the quantile) and the figure shown (the chance) never disagree, guarded or not."""
    rng = np.random.default_rng(1)
    n = 4000
    startup = rng.uniform(0, 2000, n)
    work = rng.uniform(100, 20000, n)
    wall = work * rng.uniform(1.0, 1.6, n)
    interruptions = rng.uniform(0, 3, n)
    guarded = rng.random(n) < 0.5
    sd = rng.uniform(0.0, 0.5, n)
    deadline = 12000.0
    restart = startup + 60

    def fallback_at(factor):
        return expected_with_fallback(wall * factor, work * factor, interruptions * factor, deadline, startup,
                                      restart, np.full(n, 3.0), np.full(n, 10.0))  # fmt: skip

    for q in (0.5, 0.8, 0.9, 0.95):
        odds = deadline_odds(deadline, q, sd, startup, np.where(guarded, work, wall), guarded, fallback_at)
        meets = odds.time_s <= deadline * (1 + 1e-12)
        sure = odds.probability >= q - 1e-6
        borderline = np.abs(odds.probability - q) < 1e-5
        assert np.all((meets == sure) | borderline), q


def test_every_listed_fleet_meets_the_deadline_at_the_confidence_asked(profile, catalog) -> None:
    free = rank(profile, Constraints(steps=1_000_000, market="on-demand"), catalog=catalog)
    assert all(e.deadline_probability is None for e in free.entries)  # no deadline, no chance to state
    deadline = free.entries[0].time_h * 1.05
    plans = {q: rank(profile, Constraints(steps=1_000_000, market="on-demand", deadline_h=deadline, confidence=q),
                     catalog=catalog) for q in (0.5, 0.9, 0.99)}  # fmt: skip
    for q, plan in plans.items():
        assert plan.constraints.confidence == q
        assert all(e.deadline_probability >= q - 1e-4 for e in plan.entries)
        assert all(e.time_h <= deadline for e in plan.entries)
    # 0.5 holds the predicted (median) time to the deadline: the ranking before confidence existed
    assert plans[0.5].entries[0].fleet == free.entries[0].fleet
    # more confidence costs: the choice at 0.99 is never cheaper than at 0.5, and a fleet left out says why
    assert plans[0.99].entries[0].cost_usd >= plans[0.5].entries[0].cost_usd
    risk = [n for n in plans[0.99].notes if n.startswith("left out for risk")]
    assert risk and free.entries[0].fleet in risk[0] and "at " in risk[0]


def test_a_deadline_nothing_meets_surely_says_the_best_chance(profile, catalog) -> None:
    free = rank(profile, Constraints(steps=1_000_000, market="on-demand"), catalog=catalog)
    fastest = min(e.time_h for e in free.pareto)
    with pytest.raises(NoFeasibleConfigError) as info:
        rank(profile, Constraints(steps=1_000_000, market="on-demand", deadline_h=fastest * 1.01, confidence=0.99),
             catalog=catalog)  # fmt: skip
    text = str(info.value)
    assert "at 99% confidence" in text and "the surest meets the deadline at" in text and "lower confidence" in text
    assert 0.5 < info.value.best["deadline_probability"] < 0.99
    assert info.value.best["time_h"] > fastest * 1.01


def test_the_plan_records_the_confidence_and_an_old_plan_keeps_the_median(tmp_path, profile, catalog) -> None:
    plan = rank(profile, Constraints(steps=1000, deadline_h=100, confidence=0.8), catalog=catalog)
    again = load_plan(plan.to_dict())
    assert again.constraints.confidence == 0.8 and again.entries[0].deadline_probability is not None
    assert C.from_plan(again.constraints).confidence == 0.8
    old = plan.to_dict()
    del old["constraints"]["confidence"]
    assert C.from_plan(load_plan(old).constraints).confidence == 0.5


@pytest.mark.parametrize("bad", [0.3, 1.0, 1.5])
def test_a_confidence_out_of_range_is_refused_naming_it(bad) -> None:
    from predictor.exceptions import ConfigError

    with pytest.raises(ConfigError, match="confidence"):
        Constraints(steps=1, deadline_h=1, confidence=bad).validate()


def test_the_replay_and_the_launch_guard_plan_for_the_rankings_quantile(profile, catalog) -> None:
    from lightning_srifty.provision.launcher.spot_guard import guard_for
    from predictor.model.uncertainty import Z80
    from predictor.runs.deadline import job_from_plan
    from predictor.runs.odds import confidence_factor

    plan = rank(profile, Constraints(steps=100_000, market="spot", deadline_h=500, confidence=0.9), catalog=catalog)
    entry = plan.entries[0]
    sd = math.log(entry.iteration_time_interval_s[1] / entry.iteration_time_s) / Z80
    factor = confidence_factor(entry, 0.9)
    assert sd > 0 and factor == pytest.approx(math.exp(z_of(0.9) * sd)) and confidence_factor(entry, 0.5) == 1.0
    old_doc = plan.to_dict()
    del old_doc["constraints"]["confidence"]  # a plan made before: its deadline held the predicted time
    old = load_plan(old_doc)
    run, run_old = job_from_plan(plan, catalog=catalog), job_from_plan(old, catalog=catalog)
    # the run is the predicted one (what the entry's cost prices); the policy plans for the quantile until it has
    # measured the step, as the launch's guard does; an old plan's policy knows the work from the start
    assert run.job.work_s == pytest.approx(run_old.job.work_s) and run_old.job.planned_work_s is None
    assert run.job.planned_work_s == pytest.approx(run_old.job.work_s * factor)
    assert any("90% confidence" in n for n in run.notes) and not any("confidence" in n for n in run_old.notes)
    slow = job_from_plan(plan, catalog=catalog, step_quantile=0.9)  # the step come out at the plan's quantile
    assert slow.job.work_s == pytest.approx(run.job.planned_work_s) and any("90% quantile" in n for n in slow.notes)
    kwargs = {"started_unix": 0.0, "global_batch": entry.global_batch, "check_s": 60.0}
    guard, guard_old = guard_for("srifty", plan, 0, plan, 0, **kwargs), guard_for("srifty", old, 0, old, 0, **kwargs)
    assert guard.predicted_step_s == pytest.approx(guard_old.predicted_step_s * factor)
    guard.measured_step_s = 1.234  # once the job reports its step, the measured one rules
    assert guard.step_s == 1.234


def test_the_report_shows_each_fleets_chance_of_meeting_the_deadline(tmp_path, profile, catalog) -> None:
    from predictor.ranking.report import write_report

    plan = rank(profile, Constraints(steps=100_000, market="on-demand", deadline_h=100), catalog=catalog)
    page, _ = write_report(plan, tmp_path / "r.html")
    text = page.read_text()
    assert "in time (chance of meeting the deadline)" in text
    chance = plan.entries[0].deadline_probability
    assert (">99%" if chance >= 0.995 else f"{chance:.0%}") in text


def test_a_deadline_no_fleet_has_a_chance_of_is_not_told_to_lower_the_confidence(profile, catalog) -> None:
    """A trial's 1-minute deadline read "raise --deadline or lower --confidence 0.9" where every fleet's chance was
    0 %: no confidence makes such a deadline, so the hint says to raise it only."""
    free = rank(profile, Constraints(steps=1_000_000, market="on-demand"), catalog=catalog)
    fastest = min(e.time_h for e in free.pareto)
    with pytest.raises(NoFeasibleConfigError) as info:
        rank(profile, Constraints(steps=1_000_000, market="on-demand", deadline_h=fastest * 0.3), catalog=catalog)
    assert info.value.best["deadline_probability"] < 0.01
    (deadline_hint,) = [h for h in info.value.hints if h.startswith("raise deadline_h")]
    assert "confidence" not in deadline_hint, deadline_hint
