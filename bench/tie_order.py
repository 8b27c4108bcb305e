"""The ranking's tie rule: how often the first place changes, and what it saves and costs.

    python bench/tie_order.py

Each place of the ranking goes to the best by the other measure (cost for a time objective, time for cost) of the
fleets within ``TIE`` (1 %) of the best left by the objective and with no more of their instances on spot than it.
Over the bundled example profiles, three amounts of work, both objectives and two fleet sizes, this prints the strict
best by the objective (the earlier first place: the minimum of the key, the other measure breaking exact ties) beside
the tie rule's pick: how far the pick is from the strict best by the objective, and what it gains on the other
measure.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import load_profile  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402


def main() -> int:
    catalog = Catalog.load(use_refreshed=False, use_env=False)
    rows = []
    for path in sorted((ROOT / "examples" / "profiles").glob("*.json")):
        profile = load_profile(path)
        for steps in (1_000, 20_000, 200_000):
            for objective in ("time", "cost"):
                for most in (4, 8):
                    c = Constraints(steps=steps, objective=objective, max_instances=most, top=20)
                    plan = rank(profile, c, catalog=catalog)
                    key, other = ("time_h", "cost_usd") if objective == "time" else ("cost_usd", "time_h")
                    pick = plan.entries[0]
                    strict = min(plan.entries, key=lambda e: (getattr(e, key), getattr(e, other)))
                    loss = getattr(pick, key) / getattr(strict, key) - 1
                    gain = 1 - getattr(pick, other) / getattr(strict, other)
                    rows.append((path.stem, steps, objective, most, strict, pick, loss, gain))
    changed = [r for r in rows if r[4] is not r[5] and (r[4].fleet, r[4].market) != (r[5].fleet, r[5].market)]
    print(f"{len(rows)} rankings; the first place changed in {len(changed)}")
    print("| profile | steps | objective | max instances | strict best | tie pick | objective lost | other gained |")
    print("|---|---|---|---|---|---|---|---|")
    for name, steps, objective, most, strict, pick, loss, gain in changed:
        print(
            f"| {name} | {steps:,} | {objective} | {most} | {strict.fleet} {strict.market} | {pick.fleet} "
            f"{pick.market} | {loss:+.2%} | {gain:.1%} |"
        )
    for objective in ("time", "cost"):
        mine = [r for r in changed if r[2] == objective]
        if mine:
            lost, gained = [r[6] for r in mine], [r[7] for r in mine]
            print(
                f"objective {objective}: {len(mine)} changed; objective lost median {statistics.median(lost):.2%} "
                f"(max {max(lost):.2%}); other measure gained median {statistics.median(gained):.1%} "
                f"(max {max(gained):.1%})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
