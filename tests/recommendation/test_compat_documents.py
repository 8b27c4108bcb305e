"""Plans and profiles across releases: an older plan loads, a newer one's extra fields are ignored with a warning."""

from __future__ import annotations

import copy
import json
import warnings

import pytest

from conftest import ROOT
from predictor.documents.plan import load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import NewerDocumentWarning, ProfileSchemaError

PREVIOUS_PLAN = ROOT / "tests" / "data" / "plan-0.1.0.json"  # written by lightning-srifty 0.1.0 (srifty recommend)


def test_a_plan_written_by_the_previous_release_loads_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = load_plan(PREVIOUS_PLAN)
    assert plan.schema == "srifty.plan/v1" and plan.written_by is None  # 0.1.0 did not record itself
    chosen = plan.entries[plan.chosen]
    assert chosen.fleet == "g5.xlarge:1" and chosen.groups[0].count == 1
    assert load_plan(plan.to_dict()) == plan  # and it round-trips unchanged
    # the time's interval, recorded since: derived by the same rule for a plan that has none (table, report)
    for e in plan.entries:
        lo, hi = e.time_range_h()
        assert e.time_interval_h is None and lo <= e.time_h <= hi


def test_fields_of_a_newer_minor_release_are_ignored_with_one_warning_naming_them() -> None:
    data = json.loads(PREVIOUS_PLAN.read_text())
    data["carbon"] = {"kg_co2": 12.5}
    data["entries"][0]["groups"][0]["placement_group"] = "cluster"
    with pytest.warns(NewerDocumentWarning) as caught:
        plan = load_plan(data)
    assert len(caught) == 1
    assert caught[0].message.fields == ["carbon", "entries[0].groups[0].placement_group"]
    assert "carbon" in str(caught[0].message) and "newer release" in str(caught[0].message)
    assert plan.entries[0].groups[0].count == 1


def test_a_typo_of_a_field_left_out_is_still_refused() -> None:
    data = json.loads(PREVIOUS_PLAN.read_text())
    data["modle"] = data.pop("model")  # 'model' is absent and 'modle' is a near miss of it
    with pytest.raises(ProfileSchemaError, match=r"modle: unknown field\. Did you mean 'model'"):
        load_plan(data)
    data = json.loads(PREVIOUS_PLAN.read_text())
    data["entries"][0]["fleets"] = "x"  # one letter from 'fleet', which is there: still a typo
    with pytest.raises(ProfileSchemaError, match=r"entries\[0\]\.fleets: unknown field. Did you mean 'fleet'"):
        load_plan(data)


def test_a_new_plan_records_the_release_that_made_it() -> None:
    from predictor.ranking import Constraints, rank

    profile = load_profile(ROOT / "examples" / "profiles" / "resnet50-v100.json")
    plan = rank(profile, Constraints(steps=100, allow=("g5.xlarge",)))
    assert plan.written_by and plan.written_by.startswith("lightning-srifty ")
    assert load_plan(plan.to_dict()).written_by == plan.written_by


def test_a_plan_of_another_major_version_is_refused_naming_the_writer() -> None:
    data = json.loads(PREVIOUS_PLAN.read_text())
    data["schema"], data["written_by"] = "srifty.plan/v2", "lightning-srifty 1.0.0"
    with pytest.raises(
        ProfileSchemaError, match=r"reads 'srifty.plan/v1', got 'srifty.plan/v2'.*lightning-srifty 1.0.0"
    ):
        load_plan(data)


def test_a_profile_with_newer_fields_loads_and_the_service_schema_still_refuses_garbage() -> None:
    base = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())
    newer = copy.deepcopy(base)
    newer["timing"]["energy_j"] = {"p50": 3.1}
    with pytest.warns(NewerDocumentWarning, match=r"timing\.energy_j"):
        profile = load_profile(newer)
    assert profile.timing.step_time_s.p50 == load_profile(base).timing.step_time_s.p50
    bad = copy.deepcopy(base)
    bad["timing"]["step_time_s"] = "fast"
    with pytest.raises(ProfileSchemaError, match=r"timing\.step_time_s"):
        load_profile(bad)


def test_a_profile_of_0_2_with_batch_global_batch_reads_it_as_all_devices() -> None:
    """One name per meaning (issue #24 item 2): a profile's batch over all devices is ``batch.all_devices``; the
    plan's ``global_batch`` is an optimizer step. 0.2 wrote the former as ``batch.global_batch``: it still reads,
    without a warning, into ``all_devices``; both are written until 0.3, so that older readers still find theirs."""
    from _support import MINIMAL
    from predictor.documents.work import global_batch

    old = copy.deepcopy(MINIMAL)
    old["hardware"] = {**old.get("hardware", {}), "devices": 4}
    old["batch"] = {"per_device": 8, "global_batch": 30, "accumulate_grad_batches": 2}  # unequal ranks: 30, not 32
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = load_profile(old)
    assert profile.batch.all_devices == 30
    assert global_batch(profile) == 60  # an optimizer step: two batches over all devices
    written = profile.to_dict()["batch"]
    assert written["all_devices"] == 30 and written["global_batch"] == 30  # mirrored for readers before 0.3
    assert load_profile(profile.to_dict()) == profile
    new = {**old, "batch": {"per_device": 8, "all_devices": 30}}
    assert load_profile(new).to_dict()["batch"]["global_batch"] == 30
    with pytest.raises(ProfileSchemaError, match="all_devices 30 and its old name global_batch 31 differ"):
        load_profile({**old, "batch": {"per_device": 8, "all_devices": 30, "global_batch": 31}})
