"""Local migration timings: a 1-process run gets SIGTERM (the spot notice's stand-in), checkpoints at the next step
and exits; the run resumes on 2 processes with unequal batches (tests/scripts/migrate_run.py). Medians of N runs.

python bench/migration_timing.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "migrate_run.py"


def leg(out: Path, *args: str) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--max-steps", "30", *args], check=True, capture_output=True)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {
        "notice to checkpoint durable": [],
        "checkpoint save": [],
        "resume: process start to first step (2 processes)": [],
        "resume leg in all (19 steps, 2 processes)": [],
    }
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            leg(out, "--batch-sizes", "8", "--sigterm-at", "10")
            pre = json.loads((out / "preempted.json").read_text())
            rows["notice to checkpoint durable"].append(pre["notice_to_durable_s"])
            rows["checkpoint save"].append(pre["save_s"])
            rows["resume leg in all (19 steps, 2 processes)"].append(leg(out, "--batch-sizes", "5,3", "--resume"))
            rows["resume: process start to first step (2 processes)"].append(
                json.loads((out / "first-step.json").read_text())["s_from_start"]
            )
    print(f"| what | median of {args.runs} |")
    print("|---|---|")
    for what, values in rows.items():
        print(f"| {what} | {statistics.median(values):.2f} s |")


if __name__ == "__main__":
    main()
