"""Re-planning a running job: drift (a measurement off the prediction) and price (a refreshed catalog) triggers."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from _support import MINIMAL
from predictor.catalog.catalog import Catalog
from predictor.catalog.instances import with_prices
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError
from predictor.ranking import Constraints, rank
from predictor.ranking.replan import decide_move, drift, given_checkpoint_s, late
from predictor.runs.spot import RESTART_S


@pytest.fixture(scope="module")
def setting(catalog):
    profile = load_profile(copy.deepcopy(MINIMAL))
    plan = rank(profile, Constraints(steps=200_000, market="on-demand", max_instances=4), catalog=catalog)
    return profile, plan


def test_a_run_on_prediction_stays(setting, catalog) -> None:
    profile, plan = setting
    entry = plan.entries[0]
    half = plan.constraints.work_samples / 2
    measured = entry.throughput_samples_s
    d = decide_move(profile, plan, 0, half, why="drift", measured_throughput=measured, catalog=catalog)
    assert not d.move and d.target is None and "still the best" in d.reason
    assert d.stay == pytest.approx(entry.cost_usd / 2, rel=1e-9)  # half the work at the predicted speed
    json.dumps(d.to_dict())  # what the job writes into its move request


def test_a_much_slower_gpu_than_predicted_moves_to_another_gpu(setting, catalog) -> None:
    profile, plan = setting
    entry = plan.entries[0]
    half = plan.constraints.work_samples / 2
    slow = 0.25 * entry.throughput_samples_s
    assert drift(slow, entry.throughput_samples_s) == pytest.approx(-0.75)
    d = decide_move(profile, plan, 0, half, why="drift", measured_throughput=slow, catalog=catalog)
    assert d.move and d.why == "drift" and d.reason.startswith("move: ")
    assert d.target is not None and d.target.groups[0].gpu != entry.groups[0].gpu
    assert d.stay == pytest.approx(entry.cost_usd / 2 * 4, rel=1e-9)  # 4x the time at the same price
    assert d.go == pytest.approx(d.target.cost_usd + d.migration_cost_usd) and d.migration_cost_usd > 0
    assert d.savings == pytest.approx(1 - d.go / d.stay) and d.savings > 0.15
    # the re-ranking is for the remaining work, measured against the current fleet, with the measurement applied
    assert d.plan.constraints.work_samples == half and d.plan.constraints.current_fleet == entry.fleet
    assert d.plan.calibration[0].gpu == entry.groups[0].gpu and d.plan.calibration[0].factor == pytest.approx(0.25)
    # the same numbers under a threshold higher than the saving: stay, and say why
    strict = decide_move(
        profile, plan, 0, half, why="drift", measured_throughput=slow, catalog=catalog, threshold=d.savings + 0.01
    )
    assert not strict.move and "under the" in strict.reason and strict.target == d.target


def test_a_price_rise_of_the_current_type_moves_to_a_cheaper_fleet(setting, catalog) -> None:
    profile, plan = setting
    entry = plan.entries[0]
    itype = entry.groups[0].instance_type
    old = catalog.get(itype)
    dearer = [replace(p, usd_hr=p.usd_hr * 5) for p in old.prices]
    instances = {it.name: (with_prices(it, dearer) if it.name == itype else it) for it in catalog}
    refreshed = Catalog(instances, catalog.gpus, catalog.info)
    # staying costs 5x what the plan said; the re-ranking sees the new prices too and prefers another fleet
    d = decide_move(profile, plan, 0, plan.constraints.work_samples * 0.9, why="price", catalog=refreshed)
    assert d.stay == pytest.approx(entry.cost_usd * 0.9 * 5, rel=1e-6)
    assert d.move and d.why == "price" and d.target is not None and d.target.fleet != entry.fleet
    assert all(g.instance_type != itype for g in d.target.groups)
    unchanged = decide_move(profile, plan, 0, plan.constraints.work_samples * 0.9, why="price", catalog=catalog)
    assert not unchanged.move


def test_no_move_once_the_deadline_is_spent_and_bad_input_is_named(setting, catalog) -> None:
    profile, plan = setting
    timed = replace(plan, constraints=replace(plan.constraints, deadline_h=1.0))
    d = decide_move(profile, timed, 0, 100.0, why="drift", measured_throughput=1.0, catalog=catalog, elapsed_h=2.0)
    assert not d.move and "used up" in d.reason
    with pytest.raises(ConfigError, match="current one must be an index"):
        decide_move(profile, plan, len(plan.entries), 100.0, why="drift", catalog=catalog)
    with pytest.raises(ConfigError, match="measured_throughput must be > 0"):
        decide_move(profile, plan, 0, 100.0, why="drift", measured_throughput=0.0, catalog=catalog)
    with pytest.raises(ConfigError, match="remaining_samples"):
        decide_move(profile, plan, 0, 0.0, why="drift", catalog=catalog)


def test_a_fleet_that_would_finish_after_the_deadline_moves_whatever_the_move_costs(catalog) -> None:
    """The deadline is a promise and the cost a preference: a drift that leaves the current fleet finishing after the
    deadline moves to a fleet the re-ranking found for what is left of it, even a dearer one (before: "stay (under the
    15% threshold)", and the deadline missed)."""
    profile = load_profile(copy.deepcopy(MINIMAL))
    c = dict(steps=200_000, market="on-demand", max_instances=4, allow=("g4dn.xlarge", "p3.2xlarge"))
    free = rank(profile, Constraints(**c), catalog=catalog).entries[0]
    plan = rank(profile, Constraints(**c, deadline_h=free.time_h * 1.25), catalog=catalog)
    entry = plan.entries[0]
    half = plan.constraints.work_samples / 2
    slow = 0.4 * entry.throughput_samples_s  # the first half took 2.5x the prediction
    elapsed = half / slow / 3600
    behind = late(plan, entry, half, slow, elapsed)
    assert behind is not None and behind.stay_h > behind.left_h > 0
    d = decide_move(profile, plan, 0, half, why="drift", measured_throughput=slow, catalog=catalog, elapsed_h=elapsed)
    assert d.move and d.reason.startswith(f"move: {behind}") and "are left of the deadline" in d.reason
    assert d.target is not None and d.target.fleet != entry.fleet
    assert d.target.time_h <= behind.left_h  # the target meets what is left of the deadline
    assert d.savings < 0.15  # not worth it by cost alone: the rule of savings would have stayed
    # the same drift with time to spare: the savings decide, as before
    roomy = replace(plan, constraints=replace(plan.constraints, deadline_h=plan.constraints.deadline_h * 3))
    assert late(roomy, entry, half, slow, elapsed) is None
    kept = decide_move(
        profile, roomy, 0, half, why="drift", measured_throughput=slow, catalog=catalog, elapsed_h=elapsed
    )
    assert kept.move == (kept.savings > 0.15)
    # no fleet meets what is left: staying, and the miss said
    tight = replace(plan, constraints=replace(plan.constraints, deadline_h=elapsed + 0.01))
    stuck = decide_move(
        profile, tight, 0, half, why="drift", measured_throughput=slow, catalog=catalog, elapsed_h=elapsed
    )
    assert not stuck.move and "are left of the deadline, and no fleet meets" in stuck.reason


def test_a_moves_save_on_a_sharded_fleet_is_its_entrys(catalog) -> None:
    """Unmeasured, a move's save on the current fleet was the whole estimate on one node's volume (a 7B model: 617
    s) even where the fleet's eight nodes each write their part; it is the entry's own save (77 s), the load on the
    target still the whole checkpoint. A save the caller gave the ranking is the move's save and load."""
    from pathlib import Path

    from predictor.ranking.replan import _migration
    from predictor.runs.spot import RESTART_S

    llama = Path(__file__).resolve().parents[2] / "examples" / "profiles" / "llama-7b-bf16-captured.json"
    profile = load_profile(json.loads(llama.read_text()))
    plan = rank(profile, Constraints(steps=2000, market="on-demand", allow=("p4d",), top=40), catalog=catalog)
    eight = next(e for e in plan.entries if e.nodes == 8 and e.layout is not None and e.layout.strategy == "fsdp")
    assert eight.checkpoint_s == pytest.approx(plan.checkpoint_s / 8)
    _, down_s = _migration(profile, plan, eight, plan.entries[0])
    assert down_s == pytest.approx(eight.checkpoint_s + RESTART_S + plan.checkpoint_s)
    # a save the caller gave is the save and the load, as the ranking priced the plan with it (not the size's 617 s)
    given = rank(profile, Constraints(steps=2000, market="on-demand", allow=("p4d",), top=40), catalog=catalog,
                 checkpoint_s=200.0)  # fmt: skip
    _, down_s = _migration(profile, given, given.entries[0], given.entries[1])
    assert given.checkpoint_s == given.entries[0].checkpoint_s == 200.0 and down_s == pytest.approx(400.0 + RESTART_S)


@pytest.mark.parametrize("given", [None, 900.0], ids=["the-profiles", "the-callers"])
def test_the_re_ranking_and_the_move_price_the_checkpoint_the_plan_was_ranked_with(catalog, given) -> None:
    """A plan ranked with a caller's checkpoint cost (``rank(checkpoint_s=...)``) is re-ranked with it, and the move
    saves and loads it; before, decide_move dropped it and priced every spot fleet's interruptions with the profile's
    30 s. The plan says where its figure came from (``checkpoint_source``)."""
    profile = load_profile(copy.deepcopy(MINIMAL))
    c = Constraints(steps=200_000, market="spot", max_instances=2, allow=("g4dn.xlarge", "g5.xlarge"))
    plan = rank(profile, c, catalog=catalog, checkpoint_s=given)
    assert plan.checkpoint_source == ("estimated" if given is None else "given")
    assert given_checkpoint_s(plan) == given and (plan.checkpoint_s == 900.0) == (given is not None)
    half = plan.constraints.work_samples / 2
    slow = 0.25 * plan.entries[0].throughput_samples_s
    d = decide_move(profile, plan, 0, half, why="drift", measured_throughput=slow, catalog=catalog)
    assert d.move and d.plan is not None and d.plan.checkpoint_s == plan.checkpoint_s
    if given is not None:  # saved on the current fleet and loaded on the target, both at the plan's figure
        assert d.migration_downtime_s == 2 * given + RESTART_S and d.plan.checkpoint_source == "given"
    # a figure given to decide_move wins over the plan's
    own = decide_move(profile, plan, 0, half, why="drift", measured_throughput=slow, catalog=catalog, checkpoint_s=45.0)
    assert own.plan is not None and own.plan.checkpoint_s == 45.0 and own.migration_downtime_s == 90.0 + RESTART_S


def test_a_checkpoint_the_profile_gave_is_the_profiles_to_give_again(catalog) -> None:
    """The review of the first form, which took any plan figure the profile did not give for the caller's: the job's
    own profile (SriftyCallback's, a checkpoint measured in this run) differs from the plan's, as does a plan of an
    older release (an unmeasured checkpoint recorded at 30 s): neither is the caller's, and a sharded fleet's save
    must still spread over its nodes. Only ``checkpoint_source == "given"`` is kept."""
    measured = copy.deepcopy(MINIMAL)
    measured["checkpoint"] = {"save_s": 95.0, "load_s": 60.0, "bytes": 10**9}
    plan = rank(load_profile(measured), Constraints(steps=200_000, market="spot"), catalog=catalog)
    assert plan.checkpoint_source == "measured" and given_checkpoint_s(plan) is None
    older = replace(plan, checkpoint_s=30.0, checkpoint_source=None)  # a plan made before the field
    assert given_checkpoint_s(older) is None
    now = copy.deepcopy(measured)
    now["checkpoint"].update(save_s=40.0, load_s=20.0)  # the job's profile measured it again
    d = decide_move(load_profile(now), plan, 0, plan.constraints.work_samples / 2, why="price", catalog=catalog)
    assert d.plan is not None and d.plan.checkpoint_s == 40.0 and d.plan.checkpoint_source == "measured"
