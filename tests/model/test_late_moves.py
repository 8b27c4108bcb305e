"""A deadline met by moving when late (issue #38 item 1, ``move_if_late``): an on-demand fleet under the confidence
on its own is ranked with the move MigrationTriggers' deadline trigger makes when its measured speed is late. Its
chance is a lower bound whatever the two predictions' errors share; the filter and the chance agree; the plan says
which fleet it moves to; the job's own re-ranking at the check counts no second move."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from _support import MINIMAL
from predictor.documents.plan import load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import NoFeasibleConfigError
from predictor.model.uncertainty import normal_cdf
from predictor.ranking import Constraints, rank
from predictor.ranking.replan import decide_move, late, remaining_constraints
from predictor.runs.odds import LATE_CHECK_S, LATE_MOVE_GAIN, _cheapest_within, deadline_odds, late_moves

# a fleet whose predicted time is the deadline (its own chance 50 %) and a dearer, faster, surer one
SAVE_S, RESUME_S = 30.0, 150.0


def _two(deadline_s: float = 36_000.0, sd=(0.3, 0.1), train=(35_000.0, 20_000.0), usd_hr=(1.0, 2.0), cap=np.inf):
    startup = np.array([300.0, 300.0])
    train_s, sd_a = np.array(train), np.array(sd)
    wall = startup + train_s
    cost = np.array(usd_hr) * wall / 3600
    odds = deadline_odds(deadline_s, 0.9, sd_a, startup, train_s, np.array([False, False]), None)
    moves = late_moves(
        deadline_s, 0.9, odds, sd=sd_a, startup_s=startup, train_s=train_s, wall_s=wall, cost_usd=cost,
        usd_hr=np.array(usd_hr), movable=np.array([True, True]), group=np.zeros(2, int), save_s=SAVE_S,
        resume_s=RESUME_S, by_time=False, cost_cap=cap,
    )  # fmt: skip
    return odds, moves, startup, train_s, sd_a, cost


def test_the_cheap_fleet_is_tried_first_and_its_figures_are_the_expectation_of_the_two_ways() -> None:
    deadline = 36_000.0
    odds, moves, _, train, sd, cost = _two(deadline)
    p_own = float(odds.probability[0])
    assert 0.4 < p_own < 0.9  # under the confidence on its own
    assert moves.target.tolist() == [1, -1]  # the surer fleet needs no move
    lead = 300 + LATE_CHECK_S + SAVE_S + RESUME_S
    p_target = float(normal_cdf(np.log((deadline - lead - 300) / train[1]) / sd[1]))
    assert p_target >= 0.9  # the named target meets what is left at the confidence
    # the fleet's own chance, and when late the job's re-ranking moves to a fleet that meets the rest at 0.9
    assert moves.probability[0] == pytest.approx(p_own + (1 - p_own) * 0.9) and moves.probability[0] >= 0.9
    assert moves.move_p[0] == pytest.approx(1 - p_own)
    moved_cost = 1.0 * (300 + LATE_CHECK_S + 300 + SAVE_S) / 3600 + cost[1]
    assert moves.cost_usd[0] == pytest.approx(p_own * cost[0] + (1 - p_own) * moved_cost)
    assert moves.cost_usd[0] < cost[1] * (1 - LATE_MOVE_GAIN)
    assert moves.time_s[0] == pytest.approx(p_own * (300 + train[0]) + (1 - p_own) * (lead + 300 + train[1]))
    # the surer fleet is as it was
    assert moves.probability[1] == odds.probability[1] and moves.cost_usd[1] == cost[1]


def test_no_move_is_counted_where_it_is_not_worth_it_or_no_fleet_can_take_the_rest() -> None:
    # a hopeless first fleet: its expected cost is the target's and more
    _, hopeless, *_ = _two(sd=(0.3, 0.1), train=(80_000.0, 20_000.0))
    assert hopeless.target[0] == -1
    # no room after the check for the surer one
    _, tight, *_ = _two(deadline_s=21_000.0)
    assert (tight.target == -1).all()
    # under a budget the move's own cost must fit it (not only the expectation)
    _, counted, *_ = _two()
    moved = 1.0 * (300 + LATE_CHECK_S + 300 + SAVE_S) / 3600 + 2.0 * 20_300 / 3600
    assert counted.target[0] == 1 and counted.cost_usd[0] < moved
    _, capped, *_ = _two(cap=0.5 * (counted.cost_usd[0] + moved))
    assert capped.target[0] == -1


def test_the_chance_is_a_lower_bound_whatever_the_errors_share() -> None:
    """Simulated runs of the policy (the fleet meets the deadline, else at the check the job moves to the named
    target and runs all of the work there): the share in time is at least the chance counted, and the interval holds
    at least 80 % of the runs, with the two fleets' errors the same, independent, or opposite."""
    deadline = 36_000.0
    _, moves, startup, train, sd, _ = _two(deadline)
    lead = 300 + LATE_CHECK_S + SAVE_S + RESUME_S
    z = np.random.default_rng(7).standard_normal((2, 200_000))
    lo, hi = moves.time_range_s[0]
    assert np.isnan(moves.time_range_s[1]).all()  # no move counted: the fleet's own interval stands
    for shared in (z[0], z[1], -z[0]):
        own = startup[0] + train[0] * np.exp(sd[0] * z[0])
        moved = lead + startup[1] + train[1] * np.exp(sd[1] * shared)
        in_time = (own <= deadline) | (moved <= deadline)
        assert in_time.mean() >= moves.probability[0] - 0.005
        run = np.where(own <= deadline, own, moved)  # the policy's time
        # an interval that holds at least 80 % of the runs: at most 10 % beyond each end
        assert np.mean(run > hi) <= 0.1 + 0.005 and np.mean(run < lo) <= 0.1 + 0.005
        assert lo <= moves.time_s[0] <= hi


def test_the_time_at_the_confidence_meets_the_deadline_exactly_when_the_chance_does() -> None:
    rng = np.random.default_rng(3)
    n = 3000
    startup = rng.uniform(0, 1200, n)
    train = rng.uniform(1000, 40_000, n)
    sd = rng.uniform(0.0, 0.5, n)
    usd = 4e8 / train**2 * rng.uniform(0.8, 1.2, n)  # the faster, the dearer, per hour and in all
    wall = startup + train
    cost = usd * wall / 3600
    for q in (0.5, 0.8, 0.9, 0.95):
        deadline = 20_000.0
        odds = deadline_odds(deadline, q, sd, startup, train, np.zeros(n, bool), None)
        moves = late_moves(
            deadline, q, odds, sd=sd, startup_s=startup, train_s=train, wall_s=wall, cost_usd=cost, usd_hr=usd,
            movable=rng.random(n) < 0.8, group=rng.integers(0, 2, n), save_s=SAVE_S, resume_s=RESUME_S, by_time=False,
        )  # fmt: skip
        counted = moves.target >= 0
        assert counted.any()
        assert np.array_equal(moves.confident_time_s <= deadline + 1e-6, moves.probability >= q - 1e-9)
        assert (moves.probability[counted] >= q - 1e-9).all()  # a counted move always meets the confidence
        assert (moves.probability >= odds.probability).all()


def test_cheapest_within_is_the_brute_force_answer() -> None:
    rng = np.random.default_rng(5)
    n = 500
    room, need, key = rng.uniform(0, 10, n), rng.uniform(0, 10, n), rng.uniform(0, 1, n)
    movable, group = rng.random(n) < 0.6, rng.integers(0, 3, n)
    got = _cheapest_within(room, need, key, movable, group)
    for i in range(n):
        pool = np.flatnonzero(movable & (group == group[i]) & (need <= room[i]))
        assert got[i] == (pool[np.argmin(key[pool])] if len(pool) else -1)


@pytest.fixture(scope="module")
def plans(catalog):
    profile = load_profile(copy.deepcopy(MINIMAL))
    c = dict(steps=200_000, market="on-demand", max_instances=4, allow=("g4dn.xlarge", "p3.2xlarge"))
    free = rank(profile, Constraints(**c), catalog=catalog).entries[0]
    deadline = free.time_h  # the cheapest fleet's predicted time: its own chance 50 %
    plain = rank(profile, Constraints(**c, deadline_h=deadline), catalog=catalog)
    moving = rank(profile, Constraints(**c, deadline_h=deadline, move_if_late=True), catalog=catalog)
    return profile, free, plain, moving


def test_the_ranking_tries_the_cheap_fleet_first_and_the_plan_names_the_move(plans) -> None:
    _, free, plain, moving = plans
    chosen, sure = moving.entries[0], plain.entries[0]
    assert sure.fleet != free.fleet and sure.late_move_to is None  # without the move: the surer, dearer fleet
    assert chosen.fleet == free.fleet and chosen.late_move_to == sure.fleet
    assert chosen.late_move_chance == pytest.approx(0.5, abs=0.01)
    assert chosen.deadline_probability >= 0.9 and chosen.cost_usd < sure.cost_usd
    # the run's interval, the move counted: by the deadline at its p90 (the fleet's own p90 is past it)
    assert (
        chosen.time_interval_h[0]
        < chosen.time_h
        < chosen.time_interval_h[1]
        == pytest.approx(plain.constraints.deadline_h)
    )
    assert moving.constraints.move_if_late is True and plain.constraints.move_if_late is None
    note = next(n for n in moving.notes if n.startswith("move_if_late:"))
    assert (
        f"at the 90% asked ({sure.fleet} does)" in note
        and "MigrationTriggers()" in note
        and "at 50% on its own" in note
    )
    back = load_plan(json.loads(json.dumps(moving.to_dict())))  # the plan's record, read back
    assert back.entries[0].late_move_to == sure.fleet and back.constraints.move_if_late is True
    assert "--move-if-late" in next(n for n in plain.notes if n.startswith("left out for risk"))


def test_the_jobs_re_ranking_at_the_check_counts_no_second_move(plans) -> None:
    profile, free, _, moving = plans
    entry = moving.entries[0]
    assert entry.fleet == free.fleet  # the same fleet ranked without the deadline: its own figures
    assert remaining_constraints(moving, 1000.0).move_if_late is False
    # measured 20 % slow at the check, 10 minutes in: late, and the move goes to a fleet that meets what is left
    slow = 0.8 * entry.throughput_samples_s
    remaining = moving.constraints.work_samples - slow * LATE_CHECK_S
    elapsed = (entry.startup_s + LATE_CHECK_S) / 3600
    behind = late(moving, entry, remaining, slow, elapsed)
    # staying: the fleet's own training time (its node failures and checkpoints priced, as ranked without the
    # deadline), for what is left at the measured speed
    own_h = free.time_h - free.startup_s / 3600
    stay_h = own_h * remaining / moving.constraints.work_samples * entry.throughput_samples_s / slow
    assert behind is not None and behind.stay_h == pytest.approx(stay_h) and stay_h > remaining / slow / 3600
    d = decide_move(profile, moving, 0, remaining, why="deadline", measured_throughput=slow, elapsed_h=elapsed)
    assert d.move and d.target is not None and d.target.late_move_to is None and d.target.fleet != entry.fleet


def test_a_move_goes_only_to_a_fleet_the_ranking_could_choose(plans, catalog) -> None:
    """A target over the price per hour asked (or that cannot train the model) would be refused by the job's own
    re-ranking at the check, and the deadline missed: it is never counted. Under a price cap only the cheap fleet
    fits, and it meets the deadline at 50 %: no fleet is listed (before: it was, "97% (moves)", to a fleet over the
    cap)."""
    profile, free, plain, _ = plans
    cap = (free.usd_per_hour + plain.entries[0].usd_per_hour) / 2  # the surer fleet is over it
    c = dict(steps=200_000, market="on-demand", max_instances=4, allow=("g4dn.xlarge", "p3.2xlarge"))
    limits = dict(deadline_h=plain.constraints.deadline_h, max_hourly_usd=cap)
    with pytest.raises(NoFeasibleConfigError, match="the surest meets the deadline at 50%"):
        rank(profile, Constraints(**c, **limits, move_if_late=True), catalog=catalog)


def test_staying_on_a_fleet_that_moves_when_late_is_priced_at_its_own_figures(plans, catalog) -> None:
    """A late-move entry's time and cost are the expectation of a move; what staying costs is the fleet's own (a
    drift or price move compares against it), and its life cap is reckoned from at least the deadline."""
    profile, free, _, moving = plans
    entry = moving.entries[0]
    half = moving.constraints.work_samples / 2
    d = decide_move(profile, moving, 0, half, why="price", catalog=catalog)
    own_h = free.time_h  # the same fleet ranked without the deadline: start-up, work, its failures and checkpoints
    assert entry.fleet == free.fleet and d.stay == pytest.approx(own_h / 2 * entry.usd_per_hour, rel=1e-6)
    assert d.stay == pytest.approx(free.cost_usd / 2, rel=0.01)  # the fleet's own cost, not the expectation
    assert entry.life_basis_h() >= moving.constraints.deadline_h > entry.time_h


def test_a_fleet_left_out_for_risk_under_move_if_late_says_why_no_move_was_counted(plans, catalog) -> None:
    """All on-demand types: the cheap fleet at 50 % would move to one that costs 1 % more than its own figure, so
    the expected saving is under the least gain and no move is counted; the risk note says why, not "lowers it"
    alone."""
    profile, free, _, _ = plans
    c = dict(steps=200_000, market="on-demand", max_instances=4, deadline_h=free.time_h, move_if_late=True)
    plan = rank(profile, Constraints(**c), catalog=catalog)
    assert plan.entries[0].fleet != free.fleet and all(e.late_move_to is None for e in plan.entries)
    note = next(n for n in plan.notes if n.startswith("left out for risk"))
    assert f"{free.fleet} (on-demand" in note and "not expected to save 5% over that fleet" in note
