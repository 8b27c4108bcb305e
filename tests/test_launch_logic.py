"""srifty launch's state machine with a provisioner that records what it is asked (no processes, no cloud): the
order of up / start / down on a spot move, a voluntary move, a failure and a declined request. The test plays the
job by writing its markers, as a job on a remote fleet would."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lightning_srifty import protocol as markers
from lightning_srifty.provision.base import LaunchedFleet
from lightning_srifty.provision.launch import launch
from predictor.exceptions import MigrationError
from predictor.rank import Constraints, rank


class Recorder:
    kind = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.envs: dict[str, dict[str, str]] = {}

    def up(self, plan, index, name) -> LaunchedFleet:
        self.calls.append(("up", name))
        return LaunchedFleet(plan, index, name)

    def start(self, fleet, env) -> None:
        self.calls.append(("start", fleet.name))
        self.envs[fleet.name] = env

    def poll(self, fleet):
        return None

    def stop(self, fleet) -> None:
        self.calls.append(("stop", fleet.name))

    def down(self, fleet) -> None:
        self.calls.append(("down", fleet.name))


@pytest.fixture
def plan(catalog, tmp_path_factory):
    from _support import drift_plan as _plan

    return _plan(catalog, tmp_path_factory.mktemp("plan"))


def _run(plan, tmp_path: Path, job, **kwargs):
    recorder = Recorder()
    result: dict = {}
    ckpt = str(tmp_path / "ckpt")

    def go() -> None:
        try:
            result["moves"] = launch(
                plan, provisioner=recorder, workdir=tmp_path, checkpoint_dir=ckpt, poll_s=0.02, name="f", **kwargs
            )
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    job(ckpt, recorder)
    thread.join(30)
    assert not thread.is_alive()
    return recorder, result


def _until(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_a_spot_notice_moves_to_the_next_fleet_of_the_plan(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        markers.write(ckpt, markers.PREEMPTED, {"step": 7, "checkpoint": "c7", "why": "spot interruption notice"})
        _until(lambda: ("start", "f-2") in rec.calls)
        markers.write(ckpt, markers.FINISHED, {"step": 20})

    rec, result = _run(plan, tmp_path, job)
    (move,) = result["moves"]
    assert (move.trigger, move.voluntary, move.step) == ("spot", False, 7)
    assert (move.from_fleet, move.to_fleet) == (plan.entries[0].fleet, plan.entries[1].fleet)
    assert rec.calls == [("up", "f-1"), ("start", "f-1"), ("up", "f-2"), ("start", "f-2"), ("down", "f-1"),
                         ("stop", "f-2"), ("down", "f-2")]  # fmt: skip
    assert rec.envs["f-2"]["SRIFTY_RESUME"] == "c7" and rec.envs["f-2"]["SRIFTY_CHOICE"] == "1"
    assert sum(map(int, rec.envs["f-2"]["SRIFTY_BATCH_SIZES"].split(","))) == 8  # the global batch is kept
    # a spot move keeps the plan, and the deadline keeps counting from when the run began on it
    assert rec.envs["f-2"]["SRIFTY_PLAN_STARTED_UNIX"] == rec.envs["f-1"]["SRIFTY_PLAN_STARTED_UNIX"]


def test_a_voluntary_move_has_the_new_fleet_up_before_the_job_is_told_to_leave(plan, tmp_path, catalog) -> None:
    other = rank(
        plan_profile(),
        Constraints(steps=1000, market="on-demand", allow=("g5.xlarge",), max_instances=1),
        catalog=catalog,
    )

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        request = {"why": "price", "reason": "cheaper", "to_fleet": other.entries[0].fleet, "plan": other.to_dict()}
        markers.write(ckpt, markers.MOVE_REQUEST, request)
        _until(lambda: markers.exists(ckpt, markers.LEAVE))
        assert rec.calls[-1] == ("up", "f-2")  # up, and nothing released or started yet
        markers.write(ckpt, markers.PREEMPTED, {"step": 11, "checkpoint": "c11", "why": "price", "move": True})
        _until(lambda: ("start", "f-2") in rec.calls)
        markers.write(ckpt, markers.FINISHED, {"step": 20})

    rec, result = _run(plan, tmp_path, job)
    (move,) = result["moves"]
    assert (move.trigger, move.voluntary, move.to_fleet) == ("price", True, other.entries[0].fleet)
    assert rec.calls[:5] == [("up", "f-1"), ("start", "f-1"), ("up", "f-2"), ("start", "f-2"), ("down", "f-1")]
    assert rec.envs["f-2"]["SRIFTY_PLAN"].endswith("plans/plan-2.json") and rec.envs["f-2"]["SRIFTY_RESUME"] == "c11"
    # the re-ranked plan's deadline is what was left at the move: it counts from then
    assert float(rec.envs["f-2"]["SRIFTY_PLAN_STARTED_UNIX"]) > float(rec.envs["f-1"]["SRIFTY_PLAN_STARTED_UNIX"])


def test_a_failed_job_stops_the_launch_and_releases_every_fleet(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        markers.write(ckpt, markers.FAILED, {"step": 3, "error": "RuntimeError: CUDA out of memory"})

    rec, result = _run(plan, tmp_path, job)
    assert isinstance(result["error"], MigrationError) and "step 3: RuntimeError: CUDA out of memory" in str(
        result["error"]
    )
    assert rec.calls[-2:] == [("stop", "f-1"), ("down", "f-1")]


def test_a_request_beyond_max_migrations_is_declined_and_the_job_trains_on(plan, tmp_path, catalog) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        markers.write(ckpt, markers.MOVE_REQUEST, {"why": "drift", "to_fleet": "x", "plan": plan.to_dict()})
        _until(lambda: not markers.exists(ckpt, markers.MOVE_REQUEST))
        markers.write(ckpt, markers.FINISHED, {"step": 20})

    rec, result = _run(plan, tmp_path, job, max_migrations=0)
    assert result["moves"] == [] and ("up", "f-2") not in rec.calls
    assert not markers.exists(str(tmp_path / "ckpt"), markers.LEAVE)


def plan_profile():
    import copy

    from _support import MINIMAL
    from predictor.profile import load_profile

    return load_profile({**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}})


def test_the_terraform_provisioner_needs_an_s3_prefix_and_says_so(plan, tmp_path, capsys) -> None:
    from lightning_srifty.cli import main
    from lightning_srifty.provision.terraform_fleet import TerraformProvisioner
    from predictor.exceptions import ConfigError

    plan.save(tmp_path / "plan.json")
    base = ["launch", "--plan", str(tmp_path / "plan.json"), "--provisioner", "terraform"]
    assert main([*base, "--", "train.py"]) == 2
    assert "needs --checkpoint-uri s3://bucket/prefix" in capsys.readouterr().err
    assert main([*base, "--checkpoint-uri", "/local/dir", "--", "train.py"]) == 2
    assert "keeps checkpoints in S3" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="a prefix inside the bucket"):
        TerraformProvisioner(tmp_path, "s3://bucket")
    provisioner = TerraformProvisioner(tmp_path, "s3://bucket/runs/a/")
    assert provisioner.checkpoint_uri == "s3://bucket/runs/a"
    assert (provisioner.options.bucket, provisioner.options.checkpoint_prefix) == ("bucket", "runs/a/")
    assert provisioner.options.handover


def test_fleet_names_stay_unique_across_several_moves(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        for n in (1, 2):
            _until(lambda n=n: ("start", f"f-{n}") in rec.calls)
            markers.write(ckpt, markers.PREEMPTED, {"step": n, "checkpoint": f"c{n}", "why": "notice"})
        _until(lambda: ("start", "f-3") in rec.calls)
        markers.write(ckpt, markers.FINISHED, {"step": 20})

    rec, result = _run(plan, tmp_path, job)
    assert len(result["moves"]) == 2
    assert [name for call, name in rec.calls if call == "up"] == ["f-1", "f-2", "f-3"]
