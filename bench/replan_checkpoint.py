"""What a re-ranking's checkpoint cost does to a move: ``decide_move`` before and after it kept the plan's figure.

A plan ranked with a caller's checkpoint cost (``rank(checkpoint_s=...)``: 900 s and 1,800 s) for the minimal profile
(tests/_support.py), 200,000 steps on spot, up to 4 instances; the job measures half the predicted speed halfway
through (a drift). Before the sixty-third session ``decide_move`` re-ranked with the profile's own figure (30 s: the
``checkpoint_s=30`` row reproduces it); it now re-ranks, and prices the move's save and load, with the plan's.

python bench/replan_checkpoint.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    from _support import MINIMAL
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank
    from predictor.ranking.replan import decide_move

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    profile = load_profile(copy.deepcopy(MINIMAL))
    for given in (900.0, 1800.0):
        plan = rank(profile, Constraints(steps=200_000, market="spot", max_instances=4), catalog=catalog,
                    checkpoint_s=given)  # fmt: skip
        e = plan.entries[0]
        half, slow = plan.constraints.work_samples / 2, 0.5 * e.throughput_samples_s
        for label, kw in (("before (the profile's 30 s)", dict(checkpoint_s=30.0)), ("now (the plan's)", {})):
            d = decide_move(profile, plan, 0, half, why="drift", measured_throughput=slow, catalog=catalog, **kw)
            t = d.target
            print(
                f"plan's checkpoint {given:5.0f} s, {label:28s} {e.fleet} -> {t.fleet if t else '-'} "
                f"({t.market if t else ''}): re-ranked checkpoint {d.plan.checkpoint_s if d.plan else '-'} s, "
                f"one interruption {t.interruption_overhead_s if t else 0:,.0f} s, move ${d.migration_cost_usd:.2f} "
                f"and {d.migration_downtime_s:,.0f} s down, saving {d.savings:+.1%}: "
                f"{'move' if d.savings > 0.10 else 'stay'} at a 10 % threshold"
            )


if __name__ == "__main__":
    main()
