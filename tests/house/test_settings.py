"""The configuration objects' settings, declared once (``SETTINGS``: predictor.documents.checks.Setting): every
declared setting refuses a value out of its bounds or choices when the object is made, naming the parameter of the
object (Python's words); the launcher's are refused by ``srifty launch`` naming the flag (the CLI's words)."""

from __future__ import annotations

import copy
import json

import pytest

from _support import MINIMAL
from predictor.documents.checks import Setting
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError


def _bad(setting: Setting) -> object:
    if setting.kind == "choice":
        return "nope"
    if setting.minimum is not None:
        return setting.minimum if setting.exclusive else setting.minimum - 1
    assert setting.maximum is not None, setting
    return setting.maximum + 1


def _owners() -> dict[str, type]:
    from lightning_srifty.migrate.preemption import SpotPreemption
    from lightning_srifty.migrate.triggers import MigrationTriggers
    from lightning_srifty.profiling.callback import SriftyCallback
    from lightning_srifty.provision.launcher.launch import LauncherSettings
    from lightning_srifty.provision.terraform.generate import Options

    return {
        "SriftyCallback": SriftyCallback,
        "SpotPreemption": SpotPreemption,
        "MigrationTriggers": MigrationTriggers,
        "LauncherSettings": LauncherSettings,
        "Options": Options,
    }


CASES = [
    ("SriftyCallback", "warmup_steps"), ("SriftyCallback", "profile_steps"), ("SriftyCallback", "max_series"),
    ("SpotPreemption", "interval_s"), ("SpotPreemption", "on_rebalance"), ("SpotPreemption", "every_s"),
    ("SpotPreemption", "keep"), ("SpotPreemption", "leave_deadline_s"), ("SpotPreemption", "periodic_deadline_s"),
    ("SpotPreemption", "progress_s"),
    ("MigrationTriggers", "current"), ("MigrationTriggers", "drift_threshold"),
    ("MigrationTriggers", "savings_threshold"), ("MigrationTriggers", "check_every_s"),
    ("MigrationTriggers", "first_check_steps"), ("MigrationTriggers", "work_from"),
    *(("LauncherSettings", name) for name in (
        "choice", "max_migrations", "max_local_processes", "simulate_notice_after", "poll_s", "heartbeat_s",
        "heartbeat_max_age_s", "max_life_h", "start_timeout_s", "stall_timeout_s", "after_fit_timeout_s", "spot_policy",
        "spot_check_s")),
    *(("Options", name) for name in (
        "mode", "root_volume_gb", "max_life_h", "max_instances", "max_hourly_usd", "max_code_mb", "aws_max_retries",
        "stall_timeout_s", "after_fit_timeout_s")),
]  # fmt: skip


def test_every_declared_setting_has_its_case() -> None:
    declared = {(owner, name) for owner, cls in _owners().items() for name in cls.SETTINGS}
    assert declared == set(CASES)


@pytest.fixture(scope="module")
def plan(catalog):
    from predictor.ranking import Constraints, rank

    return rank(load_profile(copy.deepcopy(MINIMAL)), Constraints(steps=1000, max_instances=2), catalog=catalog)


@pytest.mark.parametrize(("owner", "name"), CASES)
def test_a_refused_setting_names_the_parameter_when_the_object_is_made(owner, name, plan, tmp_path) -> None:
    cls = _owners()[owner]
    value = _bad(cls.SETTINGS[name])
    base = {"MigrationTriggers": {"plan": plan, "dirpath": str(tmp_path)}, "SpotPreemption": {"dirpath": str(tmp_path)}}
    with pytest.raises(ConfigError) as refused:
        cls(**{**base.get(owner, {}), name: value})
    said = str(refused.value)
    assert refused.value.parameter == name and f"The {name!r} parameter of" in said and "--" not in said, said


FLAGS = {"choice": "--choice", "max_migrations": "--max-migrations", "max_local_processes": "--max-local-processes",
         "simulate_notice_after": "--simulate-notice-after", "heartbeat_s": "--heartbeat-s",
         "heartbeat_max_age_s": "--heartbeat-max-age", "max_life_h": "--max-life-h", "spot_policy": "--spot-policy",
         "spot_check_s": "--spot-check-s"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_srifty_launch_names_the_flag(name, plan, tmp_path, capsys) -> None:
    """Refused by the flag's own type or choices, or by the settings' declaration through the error's parts: the
    flag named either way, never the parameter."""
    from lightning_srifty.cli import main
    from lightning_srifty.provision.launcher.launch import LauncherSettings

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    (tmp_path / "train.py").write_text("print('never run')\n")
    value = _bad(LauncherSettings.SETTINGS[name])
    argv = ["launch", "--plan", str(path), "--workdir", str(tmp_path / "w"), f"{FLAGS[name]}={value}"]
    try:
        code = main([*argv, "--", str(tmp_path / "train.py")])
    except SystemExit as refused_by_argparse:
        code = refused_by_argparse.code
    said = capsys.readouterr().err
    assert code == 2 and FLAGS[name] in said and f"'{name}'" not in said, said


TERRAFORM_FLAGS = {"mode": "--mode", "root_volume_gb": "--root-volume-gb", "max_life_h": "--max-life-h",
                   "max_instances": "--max-instances", "max_hourly_usd": "--max-hourly",
                   "max_code_mb": "--max-code-mb"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TERRAFORM_FLAGS))
def test_srifty_terraform_names_the_flag(name, tmp_path, capsys, monkeypatch) -> None:
    """The Terraform options' declarations refuse through the error's parts: srifty terraform names its flag, never
    the parameter, and writes nothing (aws_max_retries has no flag: the module's variable)."""
    from _support import ROOT
    from lightning_srifty.cli import main
    from lightning_srifty.provision.terraform.generate import Options

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('never run')\n")
    plan = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"
    value = _bad(Options.SETTINGS[name])
    argv = ["terraform", "--plan", str(plan), "--out", str(tmp_path / "infra"), f"{TERRAFORM_FLAGS[name]}={value}"]
    try:
        code = main(argv)
    except SystemExit as refused_by_argparse:
        code = refused_by_argparse.code
    said = capsys.readouterr().err
    assert code == 2 and TERRAFORM_FLAGS[name] in said and f"'{name}'" not in said, said
    assert not (tmp_path / "infra").exists()
