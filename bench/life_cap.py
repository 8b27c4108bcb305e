"""The default life cap against the plan's own time distribution: how often would it stop a run that is still inside
its prediction? (twenty-ninth session; a trial's fleet predicted at 1.41 h, 0.50-4.4 h, was capped at 3.1 h)

For every entry of plans ranked for the project's example profiles, the time is read as a log-normal whose 80 %
interval is the entry's (``PlanEntry.time_range_h``; the intervals' held-out coverage is in BENCHMARKS.md, 73-81 %
by regime), and the chance that a run outlasts the cap is 1 - Phi(ln(cap / time) / sigma). The old cap is the
predicted hours x 1.5 + 1; the new one (``PlanEntry.life_cap_h``) the later of that and the 99th percentile, + 1 h.
Model-implied chances, not measured runs: no data here has a run's whole time beside its plan.

    python bench/life_cap.py
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import load_profile  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402

CASES = {  # profile -> the work asked (as a user would: steps of the profiled global batch)
    "resnet50-v100.json": dict(steps=450_450),  # 90 epochs of 5,005 steps
    "llama-1b-meta.json": dict(steps=20_000),
    "llama-7b-bf16-captured.json": dict(steps=20_000),
}
MARKETS = ("on-demand", "spot")


def chance_past(cap: float, time_h: float, high: float) -> float:
    if high <= time_h or time_h <= 0:
        return 0.0 if cap >= time_h else 1.0
    sigma = math.log(high / time_h) / 1.2816
    return 0.5 * math.erfc(math.log(cap / time_h) / sigma / math.sqrt(2))


def main() -> None:
    catalog = Catalog.load(use_refreshed=False, use_env=False)
    rows = []
    for name, work in CASES.items():
        profile = load_profile(json.loads((ROOT / "examples" / "profiles" / name).read_text()))
        for market in MARKETS:
            plan = rank(profile, Constraints(**work, market=market, top=200, max_instances=16), catalog=catalog)
            for e in plan.entries:
                high = e.time_range_h()[1]
                old = e.life_basis_h() * 1.5 + 1
                new = e.life_cap_h()
                rows.append((name, market, e.time_h, high, old, new, chance_past(old, e.time_h, high),
                             chance_past(new, e.time_h, high)))  # fmt: skip
    print(f"{len(rows)} plan entries ({', '.join(CASES)}; {' and '.join(MARKETS)}; up to 200 each)")
    print("| cap | entries whose cap is below the interval's end | chance a run outlasts it: median | p90 | max |")
    print("|---|---|---|---|---|")
    for label, cap_i, p_i in (("old: time x 1.5 + 1 h", 4, 6), ("new: max(time x 1.5, p99) + 1 h", 5, 7)):
        below = sum(r[cap_i] < r[3] for r in rows)
        ps = sorted(r[p_i] for r in rows)
        p90 = ps[int(0.9 * (len(ps) - 1))]
        print(f"| {label} | {below} of {len(rows)} | {statistics.median(ps):.2%} | {p90:.2%} | {max(ps):.2%} |")
    ratio = sorted(r[5] / r[4] for r in rows)
    print(f"new cap / old cap: median x{statistics.median(ratio):.2f}, max x{max(ratio):.2f}")
    widest = max(rows, key=lambda r: r[3] / r[2])
    print(f"widest interval: {widest[0]} {widest[1]}: {widest[2]:.2f} h ({widest[2]:.2f}-{widest[3]:.2f}), "
          f"old cap {widest[4]:.1f} h ({widest[6]:.1%} past it), new {widest[5]:.1f} h ({widest[7]:.2%})")  # fmt: skip


if __name__ == "__main__":
    main()
