"""A voluntary (drift) move under srifty launch, local provisioner: what it costs the training, medians of N runs.

The job (tests/scripts/migrate_run.py with MigrationTriggers, 1 process) measures its throughput after 8 steps; CPU
processes are far slower than the plan's GPU prediction, so it re-ranks and asks to move; the launcher brings the new
fleet up (locally: nothing to provision) and says leave; the job checkpoints at the next step and exits; the new fleet
(1 process, another instance type) resumes from the checkpoint. Reported: steps trained between the request and the
leave (the new fleet comes up while the old trains), leave -> checkpoint durable, old job exited -> new job started (the
launcher), durable -> first step on the new fleet (process start, imports, rendezvous, checkpoint load), and the
lost / repeated steps (0 by construction, checked).

python bench/voluntary_move.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def one(tmp: Path) -> dict[str, float]:
    from _support import drift_plan, seen_samples
    from predictor.catalog import Catalog

    plan = drift_plan(Catalog.load(use_refreshed=False, use_env=False), tmp)
    plan.save(tmp / "plan.json")
    script = [str(ROOT / "tests" / "scripts" / "migrate_run.py"), str(tmp / "run"), "--max-steps", "40", "--from-env"]
    script += ["--step-sleep", "0.15", "--triggers-profile", str(tmp / "profile.json"), "--triggers-after", "8"]
    env = {**os.environ, "SRIFTY_SPOT_POLL_S": "0.05", "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true"}
    cmd = [sys.executable, "-m", "lightning_srifty.cli", "launch", "--plan", str(tmp / "plan.json")]
    cmd += ["--workdir", str(tmp / "w"), "--max-migrations", "1", "--", *script]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=600)
    (move,) = [json.loads(line) for line in (tmp / "w" / "migrations.jsonl").read_text().splitlines()]
    first = json.loads((tmp / "run" / "first-step.json").read_text())
    seen = seen_samples(tmp / "run")
    lines = (tmp / "run" / "seen-rank0.txt").read_text().splitlines()
    steps = [int(line.split()[1]) for line in lines]
    return {
        "leave -> checkpoint durable (s)": move["notice_to_durable_s"],
        "old job exited -> new job started (s)": move["downtime_s"],
        "durable -> first step on the new fleet (s)": first["unix"] - move["durable_unix"],
        "steps lost or repeated": float(len(steps) - len(set(steps)) + (40 - len(seen))),
        "step of the move": float(move["step"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            for key, value in one(Path(tmp)).items():
                rows.setdefault(key, []).append(value)
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
    print(f"| what | median of {args.runs} | all |")
    print("|---|---|---|")
    for key, values in rows.items():
        print(f"| {key} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
