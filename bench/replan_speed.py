"""How long a trigger's check takes (predictor.ranking.replan.decide_move: a re-ranking of the remaining work with the
measurement), for homogeneous plans and plans with 2-type mixes. Medians of N calls, one core.

python bench/replan_speed.py [--calls 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    from _support import MINIMAL
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank
    from predictor.ranking.replan import decide_move

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    catalog = Catalog.load(use_refreshed=False, use_env=False)
    profile = load_profile(copy.deepcopy(MINIMAL))
    print(f"| plan | candidates | decide_move median of {args.calls} |")
    print("|---|---|---|")
    for label, c in (
        ("homogeneous, any market, up to 16 instances", Constraints(steps=200_000, max_instances=16)),
        ("2-type mixes, any market, up to 8 instances", Constraints(steps=200_000, max_types=2, max_instances=8)),
    ):
        plan = rank(profile, c, catalog=catalog)
        measured = 0.5 * plan.entries[0].throughput_samples_s
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            d = decide_move(
                profile,
                plan,
                0,
                plan.constraints.work_samples / 2,
                why="drift",
                measured_throughput=measured,
                catalog=catalog,
            )
            times.append(time.perf_counter() - start)
        print(f"| {label} | {d.plan.considered:,} | {1000 * statistics.median(times):.1f} ms |")


if __name__ == "__main__":
    main()
