"""The ranking's entry at the edge of the confidence: what it prices for the plans of bench/replay_quantile.py.

For each deadline, the chosen entry's cost and on-demand share with the catalog's Spot Advisor rates, and with the
spot statistics of a trace where spot never goes away (``rank(spot_stats=...)``: the trace bench/replay_quantile.py
replays and guards, so its entry compares with that replay and that guard). The sixty-third session scored a
change of the entry's fluid run with it (the launch's on-demand start under the belief, not shipped): ``git apply
bench/patches/2026-12-07-believed-start.diff`` and run this again for its figures.

python bench/edge_entry.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    from replay_quantile import plans

    from predictor.catalog import Catalog
    from predictor.ranking import rank
    from predictor.runs import traces
    from predictor.runs.odds import SpotStats

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    always = SpotStats.of([traces.Trace(gap_s=600.0, available=np.ones((1, 2000), bool))], "spot always there")
    print("plan                     deadline   catalog rates: entry (on-demand)   spot always there: entry (on-demand)")
    for name, deadline, plan in plans(catalog):
        e = plan.entries[plan.chosen]
        profile, constraints = plan_inputs(name)
        a = rank(profile, constraints(deadline), catalog=catalog, spot_stats=always)
        ea = a.entries[a.chosen]
        print(
            f"{name:24s} {deadline:6.2f} h   ${e.cost_usd:8.2f} ({e.on_demand_fallback or 0:4.0%})"
            f"                     ${ea.cost_usd:8.2f} ({ea.on_demand_fallback or 0:4.0%})"
        )


def plan_inputs(name: str):
    """The profile and the constraints (by deadline) of bench/replay_quantile.py's plan ``name``."""
    import json

    sys.path.insert(0, str(ROOT / "tests"))
    from _support import MINIMAL
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints

    if name.startswith("minimal"):
        profile, kw = load_profile(MINIMAL), dict(steps=200_000, allow=("p3.2xlarge",), max_instances=1)
    else:
        llama = json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text())
        profile, kw = load_profile(llama), dict(steps=20_000, allow=("p4d.24xlarge",), max_instances=1)
    return profile, lambda deadline: Constraints(market="spot", deadline_h=deadline, confidence=0.9, **kw)


if __name__ == "__main__":
    main()
