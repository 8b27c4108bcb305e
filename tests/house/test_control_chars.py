"""Issue #36 L6: terminal escape sequences in a model's or an instance's name reached the terminal raw (`srifty
profile show`, `srifty recommend`): "\\x1b]0;PWN\\x07" retitles the terminal, others move the cursor or hide text.
Every string a document carries is refused at the boundary when it holds a control character, naming the field."""

from __future__ import annotations

import json

import pytest

from _support import MINIMAL
from lightning_srifty.cli import main
from predictor.documents.profile import load_profile
from predictor.exceptions import ProfileSchemaError

ESCAPES = ["\x1b]0;PWN\x07", "\x1b[2J", "a\x9b31mb", "nul\x00", "del\x7f"]


@pytest.mark.parametrize("name", ESCAPES)
def test_a_name_with_a_control_character_is_refused_by_field(name) -> None:
    with pytest.raises(ProfileSchemaError, match=r"model\.name: expected text without control characters") as info:
        load_profile({**MINIMAL, "model": {**MINIMAL["model"], "name": f"resnet{name}"}})
    assert info.value.field == "model.name"
    assert "\x1b" not in str(info.value) and "\x9b" not in str(info.value)  # the message itself is safe to print


def test_tabs_and_newlines_are_text(tmp_path) -> None:
    assert load_profile({**MINIMAL, "model": {**MINIMAL["model"], "name": "two\twords"}}).model.name == "two\twords"


def test_the_cli_says_one_line_and_prints_no_escape(tmp_path, capsys) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**MINIMAL, "model": {**MINIMAL["model"], "name": "x\x1b]0;PWN\x07"}}))
    assert main(["profile", "show", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "model.name" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--out", "r.png", "--report", "r.html"], "--out and --report's plot"),
        (["--out", "x.html", "--report", "x.html"], "--out and --report are the same file"),
        (["--out", "PROFILE"], "--out is the file --profile reads"),
    ],
)
def test_recommend_refuses_outputs_that_are_one_file(tmp_path, capsys, monkeypatch, args, said) -> None:
    """Issue #36 L1: `--out r.png --report r.html` said the plan was written, then the plot replaced it; `--out X
    --report X` and `--out` = the profile replaced each other silently. Refused before anything is ranked or written."""
    monkeypatch.chdir(tmp_path)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(MINIMAL))
    argv = [
        "recommend",
        "--profile",
        str(profile),
        "--steps",
        "100",
        *[str(profile) if a == "PROFILE" else a for a in args],
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and ("Give each its own path" in err or "Give the output another path" in err), err
    assert json.loads(profile.read_text()) == MINIMAL and not (tmp_path / "r.png").exists()
