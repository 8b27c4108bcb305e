"""checkov on the Terraform module and on the root modules generated for the three example fleets.

python bench/checkov_scan.py [--checkov PATH]

checkov lives in its own virtual environment (it pins an older boto3): by default
~/.cache/srifty/checkov-venv, created on first use with `pip install checkov`. Runs with --skip-download (offline).
Prints passed / failed / skipped per target and every skip with its inline justification.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def checkov_binary(explicit: str | None) -> Path:
    explicit = explicit or os.environ.get("SRIFTY_CHECKOV")  # what .ci/run and the test use
    if explicit:
        return Path(explicit)
    env = Path(os.environ.get("SRIFTY_CACHE_DIR", Path.home() / ".cache" / "srifty")) / "checkov-venv"
    binary = env / "bin" / "checkov"
    if not binary.exists():
        print(f"creating {env} and installing checkov (once)...", flush=True)
        venv.create(env, with_pip=True)
        subprocess.run([str(env / "bin" / "pip"), "install", "-q", "checkov"], check=True)
    return binary


def scan(binary: Path, folder: Path) -> dict:
    run = subprocess.run(
        [str(binary), "-d", str(folder), "--framework", "terraform", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    data = json.loads(run.stdout)
    return data[0] if isinstance(data, list) else data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkov", help="path of the checkov executable")
    args = parser.parse_args()
    binary = checkov_binary(args.checkov)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    from lightning_srifty.provision.terraform.generate import Options, generate
    from predictor.documents.plan import load_plan

    targets = {"module terraform/modules/training_fleet": ROOT / "terraform" / "modules" / "training_fleet"}
    with tempfile.TemporaryDirectory() as tmp:
        for folder in sorted((ROOT / "terraform" / "examples").iterdir()):
            spec = json.loads((folder / "choice.json").read_text())
            opts = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
            out = Path(tmp) / folder.name
            generate(load_plan(folder / "plan.json"), out, choice=spec["choice"], options=Options(**opts))
            targets[f"generated root: {folder.name}"] = out
        print(f"checkov {version}, --skip-download\n")
        print("| target | passed | failed | skipped | parsing errors |")
        print("|---|---|---|---|---|")
        skipped: dict[str, str] = {}
        failed = 0
        for label, folder in targets.items():
            result = scan(binary, folder)
            summary = result.get("summary", {})
            failed += summary.get("failed", 0) + summary.get("parsing_errors", 0)  # a file not parsed is not scanned
            print(
                f"| {label} | {summary.get('passed', 0)} | {summary.get('failed', 0)} | {summary.get('skipped', 0)} "
                f"| {summary.get('parsing_errors', 0)} |"
            )
            for path in result.get("results", {}).get("parsing_errors", []):
                print(f"  NOT PARSED {path}")
            for check in result.get("results", {}).get("skipped_checks", []):
                skipped[check["check_id"]] = check.get("check_result", {}).get("suppress_comment", "")
            for check in result.get("results", {}).get("failed_checks", []):
                print(f"  FAILED {check['check_id']} {check['check_name']} ({check['resource']})")
    print("\nskipped checks and their inline justifications:")
    for check_id, why in sorted(skipped.items()):
        print(f"- {check_id}: {why}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
