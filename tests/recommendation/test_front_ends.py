"""Every refused constraint said in each front end's words (issue #39): Python names the parameter of ``rank()``,
``srifty recommend`` the flag (read off its own parser; no flag is written in the library), the service the JSON
field. One case per declared field (``predictor.ranking.constraints.SPECS``) whose value can be refused by a bound
or a choice, through each front end."""

from __future__ import annotations

import copy
import json

import pytest

from _support import MINIMAL
from lightning_srifty.cli import main
from predictor.exceptions import ConfigError
from predictor.ranking.constraints import SPECS, Constraints, Spec

ROOT_PROFILE = "examples/profiles/resnet50-v100.json"


def _bad(spec: Spec) -> object | None:
    """A value ``spec`` refuses, or None when only prose checks the field (texts, a work left out)."""
    if spec.kind == "choice":
        return "nope"
    if spec.kind == "bool":
        return "maybe"  # pydantic reads "yes" as True (lax mode), as a YAML or a form would
    if spec.kind in ("int", "number"):
        if spec.minimum is not None:
            low = spec.minimum if spec.exclusive else spec.minimum - (1 if spec.kind == "int" else 0.5)
            return int(low) if spec.kind == "int" else float(low)
        if spec.maximum is not None:
            return spec.maximum + 1
    return None


CASES = [(name, _bad(spec)) for name, spec in SPECS.items() if _bad(spec) is not None]


def _flag(name: str) -> str:
    flag = SPECS[name].flag
    return flag or "--" + name.replace("_", "-")


def _constraints(name: str, value: object) -> dict[str, object]:
    base: dict[str, object] = {"steps": 10} if name not in ("steps", "samples", "epochs", "steps_per_epoch") else {}
    if name == "epochs":
        base["steps_per_epoch"] = 10
    if name == "steps_per_epoch":  # it counts epochs: with steps it is refused for that (tests/.../test_constraints)
        base["epochs"] = 1
    return {**base, name: value}


def test_every_bounded_or_chosen_constraint_has_its_case() -> None:
    assert {n for n, _ in CASES} == {n for n, s in SPECS.items() if s.kind in ("int", "number", "choice", "bool")}


@pytest.mark.parametrize(("name", "value"), CASES)
def test_python_names_the_parameter(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as bad:
        Constraints(**_constraints(name, value)).validate()  # type: ignore[arg-type]
    assert bad.value.parameter == name
    assert str(bad.value).startswith(f"The {name!r} parameter of rank() must be"), str(bad.value)
    assert bad.value.in_words("python") == str(bad.value)


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, v in CASES if SPECS[n].kind != "bool"])
def test_srifty_recommend_names_the_flag(name: str, value: object, capsys) -> None:
    flag = _flag(name)
    text = f"{value}h" if SPECS[name].unit == "h" and not isinstance(value, str) else str(value)
    work = [] if name in ("steps", "samples", "epochs") else ["--steps", "10"]
    if name == "epochs":
        work = ["--steps-per-epoch", "10"]
    try:
        code = main(["recommend", "--profile", ROOT_PROFILE, *work, f"{flag}={text}"])
    except SystemExit as refused_by_argparse:  # a flag's own type or choices: argparse names the flag itself
        code = refused_by_argparse.code
    said = capsys.readouterr().err
    assert code == 2, said
    assert flag in said and f"'{name}'" not in said and "rank()" not in said, said


@pytest.mark.parametrize(("name", "value"), CASES)
def test_the_service_names_the_json_field(client, name: str, value: object) -> None:
    body = {"profile": copy.deepcopy(MINIMAL), "constraints": _constraints(name, value)}
    r = client.post("/v1/rank", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert name in [str(x) for x in detail["loc"]], detail
    assert "rank()" not in detail["msg"] and "--" not in detail["msg"], detail


@pytest.fixture
def client(tmp_path, catalog):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from predictor.service.app import create_app
    from predictor.service.guard import ServiceSettings

    token = "test-token-4b9f-" + "z" * 24
    settings = ServiceSettings(max_body_bytes=200_000, token=token, allowed_hosts=("testserver",))
    app = create_app(catalog=catalog, observations=tmp_path / "obs.sqlite", settings=settings)
    with TestClient(app, headers={"authorization": f"Bearer {token}"}) as c:
        yield c


def test_a_setting_refused_together_names_both_in_each_front_end() -> None:
    """The launcher's heartbeat pair: a template with both parameters, said in Python's, the CLI's and the
    service's words from one error."""
    error = ConfigError.between(
        "{heartbeat_max_age_s} (6 s) must be at least twice {heartbeat_s} (5 s).", parameter="heartbeat_max_age_s"
    )
    assert str(error) == "heartbeat_max_age_s (6 s) must be at least twice heartbeat_s (5 s)."
    flags = {"heartbeat_max_age_s": "--heartbeat-max-age", "heartbeat_s": "--heartbeat-s"}
    assert error.in_words("cli", flags.get) == "--heartbeat-max-age (6 s) must be at least twice --heartbeat-s (5 s)."
    assert error.in_words("service") == "'heartbeat_max_age_s' (6 s) must be at least twice 'heartbeat_s' (5 s)."
    assert json.loads(json.dumps({"msg": error.in_words("service")}))


def test_the_cli_says_a_refusal_as_raised_when_a_name_is_no_flag_of_the_command() -> None:
    """A parameter the command has no flag for is not given a made-up one: the library's words stand."""
    import argparse

    from lightning_srifty.cli import error_words

    parser = argparse.ArgumentParser()
    parser.add_argument("--heartbeat-s", dest="heartbeat_s")
    args = parser.parse_args([])
    error = ConfigError.between("{heartbeat_max_age_s} must be twice {heartbeat_s}.", parameter="heartbeat_max_age_s")
    assert error_words(error, parser, args) == "heartbeat_max_age_s must be twice heartbeat_s."
    parser.add_argument("--heartbeat-max-age", dest="heartbeat_max_age_s")
    assert error_words(error, parser, args) == "--heartbeat-max-age must be twice --heartbeat-s."


def test_a_template_shows_given_values_as_facts_the_same_in_every_front_end() -> None:
    """Values a refusal shows (a path with braces in it, a count) are facts: never read as a field, never renamed."""
    error = ConfigError.between(
        "{choice} {index} is not an entry of the plan in {path!r}.", parameter="choice", index=7, path="/tmp/{x}"
    )
    assert str(error) == "choice 7 is not an entry of the plan in '/tmp/{x}'."
    assert error.template_names() == ["choice"]
    assert error.in_words("cli", {"choice": "--choice"}.get) == "--choice 7 is not an entry of the plan in '/tmp/{x}'."
    assert error.in_words("service") == "'choice' 7 is not an entry of the plan in '/tmp/{x}'."


@pytest.mark.parametrize("template", ["{a.b} is wrong", "{a[0]} is wrong", "{0} is wrong", "{} is wrong"])
def test_a_template_field_that_is_not_a_name_is_refused_where_it_is_written(template: str) -> None:
    with pytest.raises(ValueError, match="fields are names"):
        ConfigError.between(template, parameter="a")


def test_srifty_recommend_prints_what_a_setting_without_its_deadline_did(capsys, tmp_path) -> None:
    """An audit: --confidence 0.99 without --deadline exited 0 and said nothing; the plan's note that it changed
    nothing was in its JSON only. The table's reader sees it, and the manual loop's caveat too."""
    assert main(["recommend", "--profile", ROOT_PROFILE, "--steps", "1000", "--confidence", "0.99", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: --confidence 0.99 acts through a deadline, and none was given: it changed nothing" in out
    assert main(["recommend", "--profile", ROOT_PROFILE, "--steps", "1000", "--top", "2"]) == 0
    assert "through a deadline" not in capsys.readouterr().out
    with open(ROOT_PROFILE) as f:
        doc = json.load(f)
    doc["batch"].update(manual_optimization=True, optimizer_steps_per_batch=2)
    (tmp_path / "gan.json").write_text(json.dumps(doc))
    assert main(["recommend", "--profile", str(tmp_path / "gan.json"), "--steps", "1000", "--top", "2"]) == 0
    assert "note: the module steps its own optimizers" in capsys.readouterr().out
