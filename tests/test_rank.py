"""rank(): candidates, constraints, spot risk, Pareto front, infeasibility; the plan document; srifty recommend."""

from __future__ import annotations

import copy
import itertools
import json
import math

import numpy as np
import pytest

from lightning_srifty.cli import main
from predictor.exceptions import ConfigError, NoFeasibleConfigError
from predictor.plan import load_plan
from predictor.predict import predict
from predictor.profile import load_profile
from predictor.rank import Constraints, rank
from predictor.spot import REPROVISION_S, RESTART_S, spot_cost
from test_profile_schema import MINIMAL


@pytest.fixture
def profile():
    return load_profile(copy.deepcopy(MINIMAL))


def test_ranked_by_cost_with_times_and_costs_that_add_up(profile, catalog) -> None:
    plan = rank(profile, Constraints(steps=100_000, market="on-demand"), catalog=catalog)
    costs = [e.cost_usd for e in plan.entries]
    assert costs == sorted(costs) and len(plan.entries) == 10
    best = plan.entries[0]
    one = predict(profile, best.fleet, catalog=catalog)
    samples = 100_000 * 256
    assert best.time_h == pytest.approx(samples / one.throughput_samples_s / 3600)
    assert best.cost_usd == pytest.approx(best.time_h * best.usd_per_hour)
    assert best.usd_per_hour == pytest.approx(catalog.get(best.instance_type).price_usd_hr("us-east-1") * best.count)
    assert best.risk == "none" and best.expected_interruptions == 0
    assert plan.considered > 500 and plan.excluded["GPU without specs (B200-SXM)"] == 16


def test_deadline_binds_and_is_explained(profile, catalog) -> None:
    free = rank(profile, Constraints(steps=1_000_000, market="on-demand"), catalog=catalog)
    deadline = free.entries[0].time_h / 4
    plan = rank(profile, Constraints(steps=1_000_000, market="on-demand", deadline_h=deadline), catalog=catalog)
    assert all(e.time_h <= deadline for e in plan.entries)
    assert plan.entries[0].cost_usd >= free.entries[0].cost_usd
    assert "deadline binds" in plan.why and plan.excluded["over the deadline"] > 0
    fastest = rank(profile, Constraints(steps=1_000_000, objective="time", market="on-demand"), catalog=catalog)
    assert [e.time_h for e in fastest.entries] == sorted(e.time_h for e in fastest.entries)


def test_pareto_front_is_not_dominated(profile, catalog) -> None:
    plan = rank(profile, Constraints(steps=1_000_000), catalog=catalog)
    front = plan.pareto
    assert [e.time_h for e in front] == sorted(e.time_h for e in front)
    assert all(a.cost_usd > b.cost_usd for a, b in itertools.pairwise(front))  # faster costs more along the front


def test_infeasible_names_the_binding_constraint_and_the_best_achievable(profile, catalog) -> None:
    with pytest.raises(NoFeasibleConfigError) as info:
        rank(profile, Constraints(steps=10_000_000, deadline_h=0.01, budget_usd=1), catalog=catalog)
    text = str(info.value)
    assert "deadline of 0.01 h binds" in text and "budget of $1 binds" in text and "Hints" in text
    big = copy.deepcopy(MINIMAL)
    big["model"]["parameters"] = 200_000_000_000
    with pytest.raises(NoFeasibleConfigError, match="No fleet fits the model in GPU memory"):
        rank(load_profile(big), Constraints(steps=10), catalog=catalog)


def test_spot_economics_follow_young_daly() -> None:
    rate = 0.01  # per instance-hour
    cost = spot_cost(np.array([36_000.0]), np.array([4]), np.array([rate]), checkpoint_s=60)
    mtbi = 3600 / (4 * rate)
    tau = math.sqrt(2 * 60 * mtbi)
    assert cost.checkpoint_interval_s[0] == pytest.approx(tau)
    running = 36_000 * (1 + 60 / tau)
    assert cost.expected_interruptions[0] == pytest.approx(running / mtbi)
    per = REPROVISION_S + RESTART_S + 60 + tau / 2
    assert cost.expected_time_s[0] == pytest.approx(running + running / mtbi * per)
    on_demand = spot_cost(np.array([36_000.0]), np.array([4]), np.array([0.0]))
    assert on_demand.expected_time_s[0] == 36_000 and on_demand.expected_interruptions[0] == 0


def test_allow_deny_and_bad_constraints(profile, catalog) -> None:
    plan = rank(profile, Constraints(steps=1000, allow=("g5",), deny=("g5.48xlarge",)), catalog=catalog)
    assert {e.instance_type.split(".")[0] for e in plan.entries} == {"g5"}
    assert all(e.instance_type != "g5.48xlarge" for e in plan.entries)
    with pytest.raises(ConfigError, match="exactly one of 'steps' or 'samples'"):
        rank(profile, Constraints(), catalog=catalog)
    with pytest.raises(ConfigError, match="Did you mean 'cost'"):
        rank(profile, Constraints(steps=10, objective="cots"), catalog=catalog)


def test_plan_round_trips_and_recommend_cli(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(MINIMAL))
    out = tmp_path / "plan.json"
    report = tmp_path / "report.html"
    assert (
        main(
            [
                "recommend",
                "--profile",
                str(path),
                "--steps",
                "100000",
                "--deadline",
                "2h",
                "--out",
                str(out),
                "--report",
                str(report),
            ]
        )
        == 0
    )
    page = report.read_text()
    assert page.startswith("<!doctype html>") and "data:image/png;base64," in page and "class=chosen" in page
    assert report.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "Fleets for resnet50" in printed and "candidate fleets considered" in printed
    plan = load_plan(out)
    assert plan.schema == "srifty.plan/v1" and plan.constraints.deadline_h == 2 and plan.entries[plan.chosen].rank == 1
    assert load_plan(plan.to_dict()) == plan
    assert main(["recommend", "--profile", str(path), "--steps", "100000000", "--deadline", "1m", "--budget", "1"]) == 2
    assert "No fleet meets the constraints" in capsys.readouterr().err
