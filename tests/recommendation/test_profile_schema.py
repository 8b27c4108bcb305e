"""The srifty.profile/v1 schema: hand-written profiles load, bad ones fail naming the field."""

from __future__ import annotations

import copy
import json
import os
import re

import pytest

from _support import MINIMAL
from conftest import ROOT
from predictor.documents.profile import SCHEMA, Profile, Stats, load_profile, profile_json_schema
from predictor.documents.schema import iter_field_paths, markdown_reference
from predictor.exceptions import ConfigError, ProfileError, ProfileSchemaError


def test_minimal_hand_written_profile_is_accepted() -> None:
    profile = load_profile(copy.deepcopy(MINIMAL))
    assert profile.model.parameters == 25557032
    assert profile.model.precision == "16-mixed"
    assert profile.batch.per_device == 256
    assert profile.hardware.gpu == "V100-SXM2-16GB"
    assert profile.timing.step_time_s.p50 == pytest.approx(0.31)
    assert profile.timing.step_time_s.p90 is None
    assert profile.communication is None


def test_round_trip_through_a_file(tmp_path) -> None:
    profile = load_profile(copy.deepcopy(MINIMAL))
    path = profile.save(tmp_path / "sub" / "p.json")
    assert json.loads(path.read_text()) == MINIMAL
    assert load_profile(path) == profile
    assert not list(path.parent.glob(".*tmp")), "temporary files must not be left behind"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda d: d["timing"]["step_time_s"].pop("p50"), "timing.step_time_s.p50", "missing"),
        (lambda d: d["timing"]["step_time_s"].update(p50=-1), "timing.step_time_s.p50", ">= 0"),
        (lambda d: d["timing"]["step_time_s"].update(p50="fast"), "timing.step_time_s.p50", "'fast'"),
        (lambda d: d["batch"].update(per_device=0), "batch.per_device", ">= 1"),
        (lambda d: d["batch"].update(per_device=2.5), "batch.per_device", "an integer"),
        (lambda d: d["model"].update(precision="fp16"), "model.precision", "one of"),
        (lambda d: d["model"].update(precision="16-mixd"), "model.precision", "Did you mean '16-mixed'"),
        (lambda d: d["batch"].update(per_devce=3), "batch.per_devce", "Did you mean 'per_device'"),
        (lambda d: d.pop("model"), "model", "missing"),
        (lambda d: d["hardware"].update(devices=True), "hardware.devices", "an integer"),
        (lambda d: d.update(ranks=[{"rank": 0}]), "ranks[0].step_time_s", "missing"),
    ],
)
def test_bad_fields_are_named(mutate, field: str, words: str) -> None:
    data = copy.deepcopy(MINIMAL)
    mutate(data)
    with pytest.raises(ProfileSchemaError) as info:
        load_profile(data)
    assert info.value.field == field
    assert str(info.value).startswith(field)
    assert words in str(info.value)


def test_other_schema_versions_are_refused_naming_both() -> None:
    with pytest.raises(ProfileSchemaError, match=r"reads 'srifty.profile/v1', the profile is 'srifty.profile/v2'"):
        load_profile({**MINIMAL, "schema": "srifty.profile/v2"})
    with pytest.raises(ProfileSchemaError, match="not a srifty profile"):
        load_profile({**MINIMAL, "schema": "something/v1"})
    with pytest.raises(ProfileSchemaError, match='Add "schema"'):
        load_profile({k: v for k, v in MINIMAL.items() if k != "schema"})


def test_unreadable_files_give_clear_errors(tmp_path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "srifty.profile/v1",\n  "model": }')
    with pytest.raises(ProfileError, match=r"not valid JSON.*line 2"):
        load_profile(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ProfileSchemaError, match="expected a JSON object"):
        load_profile(bad)


def test_published_json_schema_is_current_and_accepts_the_minimal_profile() -> None:
    published = json.loads((ROOT / "predictor" / "schemas" / "profile.v1.schema.json").read_text())
    assert published == profile_json_schema(), "regenerate with: srifty schema profile > predictor/schemas/..."
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(MINIMAL, published)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**MINIMAL, "batch": {"per_device": 0}}, published)
    assert published["title"] == SCHEMA


def test_every_field_is_documented_and_the_reference_is_current() -> None:
    doc = (ROOT / "docs" / "profile-schema.md").read_text()
    documented = set(re.findall(r"`([a-z_0-9.\[\]<>]+)`", doc))
    missing = [p for p in iter_field_paths(Profile, shared=(Stats,)) if p not in documented]
    assert not missing, f"docs/profile-schema.md does not describe: {missing}"
    assert markdown_reference(Profile, shared=(Stats,)) in doc, (
        "regenerate the reference: srifty schema profile --format markdown"
    )


def test_a_long_model_name_still_loads_and_the_service_says_its_limit(tmp_path) -> None:
    """A trial's model name had no length limit. v1 only grows, so a profile with a long name still loads (a bound on
    the field would refuse a document it read before); the service, which keeps the name in its observations, takes
    at most 200 characters and says so (the fleet's tag takes it as AWS does: tests/infra/test_rehearse.py)."""
    from predictor.service.observations import ObservationStore

    named = lambda name: load_profile({**MINIMAL, "model": {**MINIMAL["model"], "name": name}})  # noqa: E731
    assert named("m" * 1000).model.name == "m" * 1000
    store = ObservationStore(tmp_path / "o.sqlite")
    assert store.add(named("m" * 200), "p3.2xlarge:1", 100.0).model == "m" * 200
    with pytest.raises(ConfigError, match=r"model\.name is 201 characters; observations keep at most 200"):
        store.add(named("m" * 201), "p3.2xlarge:1", 100.0)
