"""A signal to ``srifty launch`` at any point of a fleet's bring-up leaves nothing running (issue #23 item 2).

The real launcher against moto's server (bench/launcher_signals.py runs the whole matrix: SIGTERM, SIGINT and SIGHUP
at every phase its output marks): two representative cases here. And the two windows between "the fleet is up" and
"the launcher knows it is up", where an interruption used to lose the fleet: the "is up" line itself (a print to a
blocked pipe or terminal) and the start-up time's record after ``provisioner.up`` returned."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from _support import bench_module
from lightning_srifty.provision.base import LaunchedFleet
from lightning_srifty.provision.launcher import launch as launch_mod
from lightning_srifty.provision.launcher import terraform_fleet
from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
from predictor.documents.plan import load_plan
from predictor.exceptions import LaunchInterrupted

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"


def test_an_interruption_on_the_is_up_line_destroys_the_fleet(tmp_path, monkeypatch) -> None:
    """The apply and the wait are done; SIGTERM arrives while the "is up" line is printed: up() raised and returned
    no fleet, so nobody destroyed it (the launcher's list of fleets never got it)."""
    destroyed: list[Path] = []
    monkeypatch.setattr(terraform_fleet, "generate", lambda plan, folder, **kw: Path(folder).mkdir(parents=True))
    monkeypatch.setattr(terraform_fleet, "apply", lambda folder, **kw: {"fleet": {}})
    monkeypatch.setattr(terraform_fleet, "destroy", lambda folder, **kw: destroyed.append(Path(folder)))

    def echo(line: str) -> None:
        if " is up; " in line:
            raise LaunchInterrupted(signal.SIGTERM)

    prov = TerraformProvisioner(tmp_path, "s3://bucket/runs/a", echo=echo)
    with pytest.raises(LaunchInterrupted):
        prov.up(load_plan(PLAN), 0, "sig-1")
    assert destroyed == [tmp_path / "fleets" / "sig-1"]


class _Fake:
    kind = "terraform"

    def __init__(self) -> None:
        self.downs: list[str] = []

    def up(self, plan, index, name, zone=None) -> LaunchedFleet:
        return LaunchedFleet(plan, index, name)

    def stop(self, fleet) -> None:
        pass

    def down(self, fleet) -> None:
        self.downs.append(fleet.name)


def test_an_interruption_right_after_the_bring_up_releases_the_fleet(tmp_path, monkeypatch) -> None:
    """SIGTERM while the bring-up's time is recorded (after provisioner.up returned, before the launcher had the
    fleet in its list): the fleet is released all the same."""
    from predictor.runs import startup

    def record(types, seconds) -> None:
        raise LaunchInterrupted(signal.SIGTERM)

    monkeypatch.setattr(startup, "record", record)
    prov = _Fake()
    with pytest.raises(LaunchInterrupted) as info:
        launch_mod.launch(load_plan(PLAN), provisioner=prov, workdir=tmp_path, echo=lambda line: None, name="sig")
    assert prov.downs == ["sig-1"]
    assert info.value.released == ["sig-1"]


def _case(sig: str, phase: str, tmp_path: Path) -> dict:

    run_case = bench_module("launcher_signals").run_case

    from conftest import write_terraformrc

    if write_terraformrc(tmp_path) is None:
        pytest.skip("needs the terraform CLI and a filesystem mirror of the AWS provider (SRIFTY_TF_PLUGIN_MIRROR)")
    return run_case(sig, phase, tmp_path / f"{sig}-{phase}", exit_timeout_s=150, echo=lambda line: None)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_during_terraform_apply_leaves_no_instance_and_no_group(tmp_path) -> None:
    result = _case("TERM", "apply", tmp_path)
    assert "error" not in result, result
    assert result["exit"] == 128 + signal.SIGTERM, result
    assert (result["instances"], result["asgs"]) == (0, 0), result


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ctrl_c_to_the_group_once_the_apply_ended_leaves_no_instance_and_no_group(tmp_path) -> None:
    """SIGINT to the launcher's process group (a terminal's Ctrl-C) after the apply: while the launcher reads the
    outputs and waits for the group's instances."""
    result = _case("INT", "applied", tmp_path)
    assert "error" not in result, result
    assert result["exit"] not in (0, None), result
    assert (result["instances"], result["asgs"]) == (0, 0), result
