"""Speed of rank(): candidates ranked per second on one core (issue #5 target: 1e6 candidates in < 1 s).

OMP_NUM_THREADS=1 python bench/rank_speed.py   (the script pins numpy's threads to one itself)
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import load_profile  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402

PROFILE = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())  # hand-written

CASES = [
    ("homogeneous, 1-16 instances, us-east-1, on-demand/spot/mixed", Constraints(steps=100_000)),
    ("+ 2-type mixes", Constraints(steps=100_000, max_types=2)),
    ("+ 2-type mixes, 1-22 instances", Constraints(steps=100_000, max_types=2, max_instances=22)),
    (
        "+ 2-type mixes, 1-24 instances, 2 regions",
        Constraints(steps=100_000, max_types=2, max_instances=24, regions=("us-east-1", "us-west-2")),
    ),
    (
        "the same under a deadline (each candidate's chance at confidence 0.9, spot fallback priced)",
        Constraints(steps=100_000, max_types=2, max_instances=24, regions=("us-east-1", "us-west-2"), deadline_h=2.0),
    ),
    (
        "the same, moves when late counted (move_if_late)",
        Constraints(
            steps=100_000,
            max_types=2,
            max_instances=24,
            regions=("us-east-1", "us-west-2"),
            deadline_h=2.0,
            move_if_late=True,
        ),
    ),
    (
        "3-type mixes (12 most cost-efficient types), 1-8 instances",
        Constraints(steps=100_000, max_types=3, max_instances=8),
    ),
]


def main(repeats: int = 5) -> None:
    catalog = Catalog.load(use_refreshed=False)
    profile = load_profile(PROFILE)
    print("| candidates | what | median | per candidate |")
    print("|---|---|---|---|")
    for label, constraints in CASES:
        times, plan = [], None
        for _ in range(repeats):
            t = time.perf_counter()
            plan = rank(profile, constraints, catalog=catalog)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        print(f"| {plan.considered:,} | {label} | {med * 1e3:.0f} ms | {med / plan.considered * 1e9:.0f} ns |")


if __name__ == "__main__":
    main()
