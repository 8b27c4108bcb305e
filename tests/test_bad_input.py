"""No traceback for bad input, anywhere on the command line: exit 2 and one line naming the file or field, the value
and the fix (issue #13, reliability item 4)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import ROOT
from lightning_srifty.cli import main

PROFILE = ROOT / "examples" / "profiles" / "resnet50-v100.json"


def _profile(tmp_path, change) -> str:
    data = json.loads(PROFILE.read_text())
    change(data)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def _run(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("srifty: error: "), err
    return lines[0]


def test_json_nested_100000_deep(tmp_path, capsys) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for argv in (["profile", "show", str(deep)], ["recommend", "--profile", str(deep), "--steps", "10"]):
        line = _run(capsys, argv)
        assert "deep.json" in line and "100,000 deep" in line and "not a profile" in line


def test_a_profile_that_is_not_utf8(tmp_path, capsys) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes('{"schema": "srifty.profile/v1", "model": {"name": "caf\u00e9"}}'.encode("latin-1"))
    assert "latin1.json" in _run(capsys, ["profile", "show", str(bad)])


def test_a_parameter_count_of_1e300(tmp_path, capsys) -> None:
    path = _profile(tmp_path, lambda d: d["model"].update(parameters=10**300))
    line = _run(capsys, ["predict", "--profile", path, "--fleet", "p3.2xlarge:1"])
    assert "model.parameters" in line


def test_a_spread_that_would_overflow_the_interval_gives_finite_bounds(tmp_path, capsys) -> None:
    huge = _profile(tmp_path, lambda d: d["timing"]["step_time_s"].update(cv=1e300))
    line = _run(capsys, ["predict", "--profile", huge, "--fleet", "p3.2xlarge:1"])
    assert "timing.step_time_s.cv" in line and "<= 100" in line
    # the largest spread allowed: exp(1.28 x 100) would be a bound of 1e55 x the time; the interval is capped instead
    path = _profile(tmp_path, lambda d: d["timing"]["step_time_s"].update(cv=100))
    assert main(["predict", "--profile", path, "--fleet", "p3.2xlarge:1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    low, high = out["interval"]["iteration_time_s"]
    assert 0 < low < out["iteration_time_s"] < high < 100 * out["iteration_time_s"]


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("gpus: 5\n", "gpus: expected a list of entries"),
        ("instance_types: {a: 1}\n", "instance_types: expected a list of entries"),
        ("gpus:\n  - name: X\n    memory_gb: .nan\n", "NaN or infinite"),
        ("a: &x [*x]\n", "alias"),
    ],
)
def test_bad_catalog_yaml(tmp_path, capsys, yaml_text: str, expected: str) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml_text)
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", "--catalog-extra", str(extra)])
    assert expected in line and "extra.yaml" in line


def test_a_folder_given_as_the_yaml(tmp_path, capsys) -> None:
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", "--catalog-extra", str(tmp_path)])
    assert str(tmp_path) in line


@pytest.mark.parametrize("flag", ["--out", "--report"])
def test_an_unwritable_output_names_the_path_not_the_temporary_file(tmp_path, capsys, flag: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / ("plan.json" if flag == "--out" else "report.html")
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", flag, str(target)])
    assert f"cannot write {blocker}/" in line and ".tmp" not in line and "folder you can write" in line
    assert blocker.read_text() == "not a folder"  # nothing half-written


def test_every_output_is_checked_before_any_is_written(tmp_path, capsys) -> None:
    """--report X wrote X.png beside a target it then refused (issue #23 item 8): a FIFO as the report (as root,
    /dev/full would have made /dev/full.png) leaves no PNG and no plan behind."""
    fifo = tmp_path / "report.html"
    os.mkfifo(fifo)
    plan = tmp_path / "plan.json"
    line = _run(
        capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", "--out", str(plan), "--report", str(fifo)]
    )
    assert "is a FIFO, not a regular file" in line and str(fifo) in line
    assert not (tmp_path / "report.png").exists() and not plan.exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--deny", "p4d.24xlarg"], "'deny' constraint names 'p4d.24xlarg'"),
        (["--allow", "g5.xlarg"], "Did you mean 'g5.xlarge'"),
        (["--allow", "g5,g6x"], "'allow' constraint names 'g6x'"),  # a comma list: each name checked on its own
        (["--regions", "us-east1"], "did you mean 'us-east-1'"),
        (["--regions", "eu-west-3"], "no prices in region 'eu-west-3'. Regions with prices: us-east-1"),
    ],
)
def test_a_typo_in_allow_deny_or_regions_is_named_not_silently_ignored(capsys, flags, expected) -> None:
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", *flags])
    assert expected in line
