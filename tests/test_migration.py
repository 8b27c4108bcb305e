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

ROOT = Path(__file__).resolve().parents[1]


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
