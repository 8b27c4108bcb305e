"""The catalog extra's fields, declared once (predictor.catalog.extra.GPU_FIELDS / INSTANCE_FIELDS): the loader and
the JSON Schema (``srifty catalog schema``) read the same declarations, and every declared field has its negative
case, refused by both with the field named."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from conftest import ROOT
from predictor.catalog.extra import GPU_FIELDS, INSTANCE_FIELDS, SECTIONS, YamlField, extra_schema, load_extra
from predictor.exceptions import CatalogError

VALID = {
    "gpus": {"name": "X1", "memory_gb": 80},
    "instance_types": {
        "name": "x1.big",
        "gpu": "A100-SXM-40GB",
        "gpus": 8,
        "vcpus": 96,
        "memory_gib": 1152,
        "network_gbps": 400,
    },
}


def _bad_values(declared: YamlField) -> list[object]:
    """Values the declaration refuses: another kind, below its floor, above its bound, outside its choices or
    pattern."""
    if declared.kind is bool:
        return ["yes"]
    if declared.kind is list:
        return ["a, b"]
    if declared.kind is str:
        bad: list[object] = [["a", "list"]]
        if declared.choices or declared.pattern:
            bad.append("no-such-value")
        if declared.required:
            bad.append("")
        return bad
    bad = ["12 GB", -1]
    if declared.kind is int:
        bad.append(2.5)
    if declared.positive:
        bad.append(0)
    if declared.most is not None:
        bad.append(declared.most * 10)
    return bad


CASES = [
    (section, name, value)
    for section, fields in SECTIONS.items()
    for name, declared in fields.items()
    for value in _bad_values(declared)
]


def _document(section: str, name: str, value: object) -> dict[str, list[dict[str, object]]]:
    entry = {**VALID[section], name: value}
    doc: dict[str, list[dict[str, object]]] = {"gpus": [dict(VALID["gpus"])]}
    if section == "gpus":
        doc["gpus"] = [entry]
    else:
        doc["instance_types"] = [entry]
    return doc


def test_the_schema_is_draft_2020_12_and_takes_the_documented_examples() -> None:
    schema = extra_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for text in [
        (ROOT / "tests" / "data" / "extra_example.yaml").read_text(),
        yaml.safe_dump(_document("gpus", "sms", 132)),
    ]:
        jsonschema.validate(yaml.safe_load(text), schema, cls=jsonschema.Draft202012Validator)
    assert set(schema["properties"]) == set(SECTIONS)
    for section, fields in SECTIONS.items():
        items = schema["properties"][section]["items"]
        assert set(items["properties"]) == set(fields) and items["additionalProperties"] is False
        assert items["required"] == [n for n, f in fields.items() if f.required]


def test_valid_entries_load_and_pass_the_schema(tmp_path) -> None:
    doc = {"gpus": [dict(VALID["gpus"])], "instance_types": [dict(VALID["instance_types"])]}
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(doc))
    extra = load_extra(path)
    assert [g.key for g in extra.gpus] == ["X1"] and extra.instances[0]["name"] == "x1.big"
    jsonschema.validate(doc, extra_schema(), cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize(("section", "name", "value"), CASES, ids=[f"{s}.{n}={v!r}" for s, n, v in CASES])
def test_every_declared_field_refuses_its_bad_values_in_the_loader_and_the_schema(
    tmp_path, section: str, name: str, value: object
) -> None:
    doc = _document(section, name, value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CatalogError) as caught:
        load_extra(path)
    assert f"{section}[0]" in str(caught.value) and f".{name}" in str(caught.value), str(caught.value)
    errors = list(jsonschema.Draft202012Validator(extra_schema()).iter_errors(doc))
    assert errors and any(name in e.absolute_path for e in errors), [e.message for e in errors]


def test_an_unknown_field_is_refused_by_both_with_the_closest_name(tmp_path) -> None:
    doc = {"instance_types": [{**VALID["instance_types"], "gpu_per_node": 8}]}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CatalogError, match=r"instance_types\[0\] \(x1.big\).gpu_per_node: unknown field. Did you mean"):
        load_extra(path)
    assert list(jsonschema.Draft202012Validator(extra_schema()).iter_errors(doc))


def test_srifty_catalog_schema_prints_the_generated_schema() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lightning_srifty.cli", "catalog", "schema"], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == extra_schema()


def test_every_field_is_documented_and_the_declarations_are_the_only_source() -> None:
    doc = (ROOT / "docs" / "catalog.md").read_text()
    for name in {*GPU_FIELDS, *INSTANCE_FIELDS}:
        assert f"`{name}`" in doc, name
    source = (ROOT / "predictor" / "catalog" / "extra.py").read_text()
    assert "RANGES" not in source and "INSTANCE_REQUIRED = (" not in source  # derived, never written twice
