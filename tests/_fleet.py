"""What the fleet tests share (not a test module): the module's paths, fake commands, the example plans, user_data
rendered by ``terraform console`` and run under bash with fakes on PATH."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from lightning_srifty.provision.terraform.generate import Options
from predictor.documents.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "terraform" / "modules" / "training_fleet"
WATCHDOG = MODULE / "templates" / "watchdog.sh"
EXAMPLES = ROOT / "terraform" / "examples"

FAKE_CURL = """#!/bin/bash
case "$*" in
  *api/token*) echo token ;;
  *placement/region*) echo us-east-1 ;;
  *instance-id*) echo i-0abc ;;
  *) exit 22 ;;
esac
"""

FAKE_TORCHRUN = """#!{python}
import json, os, sys
kept = ("SRIFTY_", "PL_TRAINER_", "LT_")
env = {{k: v for k, v in os.environ.items() if k.startswith(kept) or k == "AWS_DEFAULT_REGION"}}
json.dump({{"argv": sys.argv[1:], "env": env}}, open(os.environ["FAKE_DIR"] + "/torchrun.json", "w"))
"""


def exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def example(name: str):
    folder = EXAMPLES / name
    spec = json.loads((folder / "choice.json").read_text())
    opts = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    return load_plan(folder / "plan.json"), spec["choice"], Options(**opts)


def template_values(**overrides: object) -> dict:
    """Every variable the module's user_data template takes, for a one-node job with no code snapshot, no container
    and no secrets (the image and the setup command); ``overrides`` replace any of them."""
    import base64

    values = {
        "name": "job",
        "setup_command": "true",
        "argv": "'train.py'",
        "nnodes": 1,
        "nproc_per_node": 1,
        "group": "g5.xlarge",
        "weights_json": "{}",
        "units": 1,
        "efa": False,
        "rdzv_port": 29400,
        "rendezvous_timeout_s": 1800,
        "checkpoint_uri_b64": base64.b64encode(b"s3://b/checkpoints/").decode(),
        "code_sha256": "",  # test_terraform_boot runs a code snapshot and a container image
        "code_uri_b64": "",
        "image_b64": "",
        "resume_from": "",
        "handover": False,
        "env_count": 0,
        "env_b64": base64.b64encode(b"{}").decode(),
        "max_life_s": 5400,
        "max_life_min": 90,
        "heartbeat": False,
        "watchdog_b64": base64.b64encode(WATCHDOG.read_bytes()).decode(),
        "watchdog_interval_s": 60,
        "watchdog_grace_s": 5,
        "watchdog_max_age_s": 300,
        "watchdog_asg": 0,
        "secrets": [],
    }
    unknown = set(overrides) - set(values)
    assert not unknown, f"not template variables: {unknown}"
    return {**values, **overrides}


def render(env: dict[str, str], folder: Path, values: dict, template_name: str = "user_data.sh.tftpl") -> str:
    """templatefile() of the module's user_data (or another of its templates), by `terraform console` (no provider,
    no cloud)."""
    folder.mkdir(parents=True, exist_ok=True)
    template = json.dumps(str(MODULE / "templates" / template_name))
    expr = f"templatefile({template}, jsondecode({json.dumps(json.dumps(values))}))"
    run = subprocess.run(
        ["terraform", f"-chdir={folder}", "console"], input=expr, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout.strip()
    assert out.startswith("<<EOT") and out.endswith("EOT"), out[:200]
    return out[len("<<EOT") :].rsplit("EOT", 1)[0].lstrip("\n")


def run_user_data(
    tmp_path: Path, script: str, fakes: dict[str, str], *, cwd: Path | None = None, extra_env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the rendered ``script`` with bash, the ``fakes`` (command name -> script text) first on PATH, the logs and
    state under ``tmp_path`` and the watchdog polling every second."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in fakes.items():
        exe(bin_dir / name, text)
    (tmp_path / "user_data.sh").write_text(script)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "SRIFTY_USER_DATA_LOG": str(tmp_path / "user-data.log"),
        "SRIFTY_STATE_DIR": str(tmp_path / "state"),
        "SRIFTY_PER_BOOT_DIR": str(tmp_path / "per-boot"),  # never this machine's cloud-init
        "SRIFTY_CLOUD_INSTANCE_ID_FILE": str(tmp_path / "cloud-instance-id"),
        "SRIFTY_WATCHDOG_LOG": str(tmp_path / "watchdog.log"),
        "SRIFTY_WATCHDOG_INTERVAL_S": "1",
        **(extra_env or {}),
    }
    return subprocess.run(
        ["bash", str(tmp_path / "user_data.sh")], cwd=cwd or tmp_path, env=env, capture_output=True, timeout=60
    )
