"""srifty launch's voluntary moves: a drift the job measures moves it (local provisioner, real processes), and the
terraform provisioner brings a new fleet up before the old one goes (apply/destroy against moto's server)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from _support import SCRIPTS
from _support import drift_plan as _plan
from _support import params_by_step as _params
from _support import seen_samples as _seen

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ddp
def test_a_drifting_run_asks_to_move_and_finishes_exactly_on_the_new_fleet(tmp_path, subprocess_env, catalog) -> None:
    """The job measures its throughput (CPU processes: far below the plan's GPU prediction), re-ranks the remaining
    work with that measurement, asks to move; the launcher brings the new fleet up, says leave; the job checkpoints
    and leaves; the run finishes on the new fleet with every step once and the parameters of an uninterrupted run."""
    import subprocess

    plan = _plan(catalog, tmp_path)
    first = plan.entries[0]
    plan.save(tmp_path / "plan.json")
    _leg_ref = [sys.executable, str(SCRIPTS / "migrate_run.py"), str(tmp_path / "ref"), "--max-steps", "40"]
    ref_global = sum(int(b) for b in ["8"])  # the first fleet's global batch, one rank
    assert first.gpus == 1 and round(first.groups[0].per_device_batch) == ref_global
    subprocess.run([*_leg_ref, "--batch-sizes", "8"], check=True, env=subprocess_env, capture_output=True, timeout=300)
    script = [str(SCRIPTS / "migrate_run.py"), str(tmp_path / "run"), "--max-steps", "40", "--from-env"]
    script += ["--step-sleep", "0.15", "--triggers-profile", str(tmp_path / "profile.json"), "--triggers-after", "8"]
    env = {**subprocess_env, "SRIFTY_SPOT_POLL_S": "0.05"}
    cmd = [sys.executable, "-m", "lightning_srifty.cli", "launch", "--plan", str(tmp_path / "plan.json")]
    cmd += ["--workdir", str(tmp_path / "w"), "--max-migrations", "1", "--", *script]
    launched = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-3000:]
    assert "move requested (drift)" in launched.stdout
    (move,) = [json.loads(line) for line in (tmp_path / "w" / "migrations.jsonl").read_text().splitlines()]
    assert move["trigger"] == "drift" and move["voluntary"] and move["from_fleet"] == first.fleet
    assert move["to_fleet"] != first.fleet and 8 <= move["step"] < 40
    request_plan = sorted((tmp_path / "w" / "checkpoints" / "plans").glob("plan-*.json"))[-1]
    replanned = json.loads(request_plan.read_text())
    assert replanned["entries"][replanned["chosen"]]["fleet"] == move["to_fleet"]
    assert replanned["calibration"][0]["factor"] < 0.5  # CPU processes are far slower than the GPU predicted
    assert "drift" in move["why"] and "measured" in move["why"]
    # the new fleet kept the global batch: the same samples at every step, none lost or repeated, same parameters
    ref, run = _seen(tmp_path / "ref"), _seen(tmp_path / "run")
    assert sorted(run) == sorted(ref) and len(ref) == 40
    assert all(sorted(run[k]) == sorted(ref[k]) for k in ref)
    p_ref, p_run = _params(tmp_path / "ref"), _params(tmp_path / "run")
    assert max(abs(a - b) for s in p_ref for a, b in zip(p_ref[s], p_run[s])) < 1e-5


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc), whatever session it started."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _start_launch(tmp_path, subprocess_env, catalog, *extra: str, python: bool = False):
    """`srifty launch` of the migration script on the local provisioner; ``python``: the command written as one runs
    it by hand (``python migrate_run.py ...``: torchrun starts Python itself and must not open a file "python")."""
    import subprocess
    import time

    plan = _plan(catalog, tmp_path)
    plan.save(tmp_path / "plan.json")
    script = [str(SCRIPTS / "migrate_run.py"), str(tmp_path / "run"), "--max-steps", "100000", "--from-env"]
    script = ["python", *script] if python else script
    cmd = [sys.executable, "-m", "lightning_srifty.cli", "launch", "--plan", str(tmp_path / "plan.json")]
    cmd += ["--workdir", str(tmp_path / "w"), *extra, "--", *script, "--step-sleep", "0.1"]
    env = {**subprocess_env, "SRIFTY_SPOT_POLL_S": "0.1"}
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:  # the child keeps them
        launcher = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
    end = time.monotonic() + 240
    while not (tmp_path / "run" / "params.txt").exists():  # the job trains
        assert launcher.poll() is None and time.monotonic() < end, (tmp_path / "stderr.txt").read_text()[-3000:]
        time.sleep(0.2)
    job = _descendants(launcher.pid)
    assert job, "the job's processes"
    return launcher, job


def _wait_gone(pids: set[int], timeout: float) -> float:
    import time

    t0 = time.monotonic()
    while _alive(pids) and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    return time.monotonic() - t0


@pytest.mark.ddp
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the job's processes")
def test_a_launcher_killed_outright_leaves_nothing_running_and_a_checkpoint(tmp_path, subprocess_env, catalog) -> None:
    """kill -9 of `srifty launch` (no handler runs): the job sees the heartbeat age past its max age, checkpoints
    and leaves; every job process is gone within max age + a check + the save."""
    import os
    import signal

    from lightning_srifty.protocol import Preempted, read_record

    launcher, job = _start_launch(
        tmp_path, subprocess_env, catalog, "--heartbeat-s", "0.5", "--heartbeat-max-age", "3", python=True
    )
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        took = _wait_gone(job, 60)
        assert not _alive(job), f"still running {took:.1f} s after the launcher was killed"
        assert took < 3 + 15, took  # max age, one check, the save and the exit
        left = read_record(str(tmp_path / "w" / "checkpoints"), Preempted)
        assert left is not None and left.trigger == "heartbeat", (tmp_path / "stderr.txt").read_text()[-3000:]
        assert Path(left.checkpoint).exists() and "launcher heartbeat lost" in left.why
        print(f"kill -9 of the launcher -> job processes gone in {took:.1f} s (max age 3 s)")
    finally:
        for pid in _alive(job):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.ddp
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the job's processes")
@pytest.mark.parametrize("signum", [2, 15])
def test_sigint_or_sigterm_to_the_launcher_releases_the_fleet_in_one_line(
    tmp_path, subprocess_env, catalog, signum
) -> None:
    import os
    import signal

    launcher, job = _start_launch(tmp_path, subprocess_env, catalog)
    try:
        os.kill(launcher.pid, signum)
        assert launcher.wait(120) == 128 + signum
        assert not _alive(job)  # the local fleet released: its processes stopped (after their checkpoint)
        stderr = (tmp_path / "stderr.txt").read_text()
        assert "Traceback" not in stderr, stderr[-3000:]
        name = signal.Signals(signum).name
        assert f"srifty launch: stopped by {name}; released 1 fleet(s) (srifty-1)" in stderr
        assert list((tmp_path / "w" / "checkpoints").glob("preempt-step=*.ckpt"))  # SIGTERM made the job save
    finally:
        for pid in _alive(job):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.ddp
@pytest.mark.timeout(400)
def test_a_job_that_hangs_is_restarted_from_its_newest_checkpoint_and_finishes(tmp_path, subprocess_env, catalog):
    """srifty launch, the local provisioner, a real Lightning job whose step 15 never ends on its first leg (rank 0
    sleeps in it for good, SIGTERM cannot end it: a GPU that stopped answering; its progress thread goes on). Past
    --stall-timeout-min the launcher kills it, and the job restarts on the same entry from the newest periodic
    checkpoint and finishes at step 40, once, with the parameters of a run that never hung."""
    import subprocess

    plan = _plan(catalog, tmp_path)
    first = plan.entries[0]
    plan.save(tmp_path / "plan.json")
    ref = [sys.executable, str(SCRIPTS / "migrate_run.py"), str(tmp_path / "ref"), "--max-steps", "40"]
    subprocess.run([*ref, "--batch-sizes", "8"], check=True, env=subprocess_env, capture_output=True, timeout=300)
    script = [str(SCRIPTS / "migrate_run.py"), str(tmp_path / "run"), "--max-steps", "40", "--from-env"]
    script += ["--hang-at", "15", "--progress-s", "0.5", "--every-s", "0"]  # a checkpoint at every step
    cmd = [sys.executable, "-m", "lightning_srifty.cli", "launch", "--plan", str(tmp_path / "plan.json")]
    cmd += ["--workdir", str(tmp_path / "w"), "--max-migrations", "1", "--stall-timeout-min", "0.1", "--", *script]
    launched = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=380)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    assert "has shown no progress past step 15" in launched.stdout, launched.stdout[-3000:]
    (move,) = [json.loads(line) for line in (tmp_path / "w" / "migrations.jsonl").read_text().splitlines()]
    assert (move["trigger"], move["step"]) == ("stall", 15) and move["from_fleet"] == move["to_fleet"] == first.fleet
    assert move["downtime_s"] is not None  # the new leg stepped
    # the newest checkpoint was step 15's: steps 1-15 once, then 16-40 on the new leg, each once
    run = _seen(tmp_path / "run")
    assert sorted(run) == sorted(_seen(tmp_path / "ref")) and len(run) == 40
    p_ref, p_run = _params(tmp_path / "ref"), _params(tmp_path / "run")
    assert max(abs(a - b) for s in p_ref for a, b in zip(p_ref[s], p_run[s])) < 1e-5
