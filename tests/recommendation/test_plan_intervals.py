"""Issue #36: an entry's 80% intervals contain its own estimate by construction. The report's plot fed a negative
error bar to matplotlib (3.11 refuses it) when a bound rounded past the estimate; an interval that excludes the
estimate is a defect of the interval, so the rule is held where intervals are made (``scaled_interval``), where a
plan is read (``PlanEntry``) and over real rankings (a property test)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import ROOT  # noqa: E402
from predictor.documents.plan import load_plan, scaled_interval  # noqa: E402
from predictor.documents.profile import load_profile  # noqa: E402
from predictor.exceptions import NoFeasibleConfigError, ProfileSchemaError  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402
from predictor.ranking.report import pareto_png  # noqa: E402

FINITE = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
RATIO = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False)
BOUNDED = settings(max_examples=400, deadline=None, derandomize=True, database=None)


@BOUNDED
@given(total=FINITE, fixed=FINITE, lo=RATIO, hi=RATIO)
def test_scaled_interval_contains_its_total(total, fixed, lo, hi) -> None:
    low, high = scaled_interval(total, fixed, lo, hi)
    assert low <= total <= high
    assert low >= min(max(fixed, 0.0), total)  # never below what is fixed


def test_a_bound_that_rounds_past_the_estimate_is_clamped() -> None:
    """0.1 + (0.3 - 0.1) is 0.30000000000000004: with a zero-width step interval the old rule put the low bound above
    the estimate, the error bar below zero."""
    low, high = scaled_interval(0.3, 0.1, 1.0, 1.0)
    assert low <= 0.3 <= high


def test_a_plan_whose_interval_excludes_its_estimate_is_refused_by_name(tmp_path) -> None:
    doc = json.loads((ROOT / "terraform" / "examples" / "heterogeneous-mixed" / "plan.json").read_text())
    entry = doc["entries"][0]
    entry["time_interval_h"] = [entry["time_h"] + 1.54, entry["time_h"] + 2.0]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileSchemaError, match=r"time_interval_h: expected an interval .* contains the entry"):
        load_plan(path)


PROFILES = ("resnet50-v100.json", "llama-7b-bf16-handwritten-lora.json")


@settings(max_examples=12, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(
    profile=st.sampled_from(PROFILES),
    market=st.sampled_from(["on-demand", "spot", "mixed", "any"]),
    objective=st.sampled_from(["cost", "time"]),
    steps=st.integers(min_value=1, max_value=10**7),
    deadline=st.one_of(st.none(), st.floats(min_value=0.05, max_value=500)),
)
def test_every_ranked_entry_contains_its_estimates(catalog, profile, market, objective, steps, deadline) -> None:
    """Over real rankings (markets, objectives, deadlines, tiny and huge work): each entry's step, time and cost
    intervals contain the estimate, and the plot takes them (matplotlib refuses a negative error bar)."""
    prof = load_profile(ROOT / "examples" / "profiles" / profile)
    constraints = Constraints(steps=steps, objective=objective, market=market, max_instances=4, deadline_h=deadline)
    try:
        plan = rank(prof, constraints, catalog=catalog)
    except NoFeasibleConfigError:  # a deadline no fleet meets is an answer, not this test's subject
        return
    for e in (*plan.entries, *plan.pareto):
        assert e.iteration_time_interval_s[0] <= e.iteration_time_s <= e.iteration_time_interval_s[1]
        low, high = e.time_range_h()
        assert low <= e.time_h <= high and math.isfinite(high)
        assert e.cost_interval_usd[0] <= e.cost_usd <= e.cost_interval_usd[1]
    assert pareto_png(dataclasses.replace(plan)).startswith(b"\x89PNG")
