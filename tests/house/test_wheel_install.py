"""Installed like a library: a wheel built from this checkout, installed into a fresh virtual environment (no
download: --no-deps, the dependencies come from the running environment through a .pth file), runs `srifty
terraform` and `srifty launch --provisioner terraform` from a folder outside the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "terraform" / "examples" / "multi-node-spot" / "plan.json"


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know which files a build sees")
    tmp = tmp_path_factory.mktemp("wheel")
    files = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT).stdout
    src = tmp / "src"
    for rel in filter(None, files.split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"), "."],
        cwd=src,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("lightning_srifty-*.whl")
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the dependencies (torch, boto3, ...) of the running environment, after the wheel's own files
    (site / "zz_srifty_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])
    assert installed.returncode == 0, installed.stderr
    return venv


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}  # no terraform on PATH


@pytest.mark.slow
def test_srifty_terraform_from_a_wheel_outside_the_repository(wheel_venv, tmp_path) -> None:
    env = _env(wheel_venv)
    where = _run(
        [str(wheel_venv / "bin" / "python"), "-c", "import lightning_srifty; print(lightning_srifty.__file__)"],
        cwd=tmp_path,
        env=env,
    )
    assert where.stdout.startswith(str(wheel_venv)), where.stdout + where.stderr  # the wheel, not the checkout
    typed = _run(
        [str(wheel_venv / "bin" / "python"), "-c", "import predictor, pathlib; "
         "print((pathlib.Path(predictor.__file__).parent / 'py.typed').is_file())"],
        cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert typed.stdout.strip() == "True", typed.stdout + typed.stderr  # users' type checkers read the predictor
    shutil.copy(PLAN, tmp_path / "plan.json")
    (tmp_path / "train.py").write_text("import lightning_srifty\n")  # the user's project: this folder
    run = _run(
        [
            str(wheel_venv / "bin" / "srifty"),
            "terraform",
            "--plan",
            "plan.json",
            "--out",
            "infra",
            "--name",
            "wheel-run",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "written" in run.stdout
    module = tmp_path / "infra" / "modules" / "training_fleet"
    reviewed = ROOT / "terraform" / "modules" / "training_fleet"
    shipped = sorted(p.relative_to(module) for p in module.rglob("*") if p.is_file())
    assert shipped == sorted(p.relative_to(reviewed) for p in reviewed.rglob("*") if p.is_file())
    assert all((module / rel).read_bytes() == (reviewed / rel).read_bytes() for rel in shipped)
    assert (tmp_path / "infra" / "main.tf").read_bytes() == (ROOT / "terraform" / "root" / "main.tf").read_bytes()
    values = json.loads((tmp_path / "infra" / "srifty.auto.tfvars.json").read_text())
    assert values["name"] == "wheel-run"
    # the code snapshot carries this installation (the wheel's own metadata) repacked for the nodes
    import tarfile
    import zipfile

    archive = tmp_path / "infra" / values["train"]["code"]["source"]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        (wheel,) = [n for n in names if n.startswith(".srifty/wheels/")]
        with zipfile.ZipFile(tar.extractfile(wheel)) as repacked:
            metadata = repacked.read(next(n for n in repacked.namelist() if n.endswith("METADATA"))).decode()
    assert "train.py" in names and "plan.json" in names and "Requires-Dist: lightning" in metadata
    assert "What every node runs:" in run.stdout and f"sha256 {values['train']['code']['sha256'][:16]}" in run.stdout


@pytest.mark.slow
def test_srifty_launch_with_terraform_from_a_wheel_writes_the_fleet_then_asks_for_terraform(
    wheel_venv, tmp_path, moto_endpoint
) -> None:
    """The launcher reads its markers in S3 (moto's server here) and writes the first fleet's root module from the
    packaged Terraform; without a terraform binary it stops there, saying so."""
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="runs")
    shutil.copy(PLAN, tmp_path / "plan.json")
    (tmp_path / "train.py").write_text("import lightning_srifty\n")
    run = _run(
        [
            str(wheel_venv / "bin" / "srifty"),
            "launch",
            "--plan",
            "plan.json",
            "--provisioner",
            "terraform",
            "--checkpoint-uri",
            "s3://runs/job-1",
            "--workdir",
            "w",
            "--name",
            "wheel",
            "--aws-endpoint",
            moto_endpoint,
            "--",
            "train.py",
        ],
        cwd=tmp_path,
        env={**_env(wheel_venv), "AWS_ENDPOINT_URL": moto_endpoint},
    )
    assert run.returncode == 2 and "terraform binary is not on PATH" in run.stderr, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert (tmp_path / "w" / "fleets" / "wheel-1" / "modules" / "training_fleet" / "main.tf").is_file()
    assert "srifty launch: code" in run.stdout and list((tmp_path / "w" / "code").glob("*.tar.gz"))  # packed once
