"""How often a refusal's "fastest fleet" ties with a cheaper one: every GPU family of the catalog, the minimal profile.

For each family (its instance types allowed), on-demand and spot, up to 1 and 4 instances, 2,000 and 200,000 steps
(a short run's time is mostly the fleet's start-up): deadlines of 0.5x and 0.95x the fastest fleet's time, which no
fleet meets. Counts the refusals and those that name the cheapest of the
fleets within 1 % of the fastest (``predictor.ranking.explain.TIE``) rather than the fastest itself.

python bench/refusal_ties.py
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
    from predictor.exceptions import NoFeasibleConfigError
    from predictor.ranking import Constraints, rank

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    profile = load_profile(copy.deepcopy(MINIMAL))
    families: dict[str, list[str]] = {}
    for it in catalog:
        if it.gpus:
            families.setdefault(it.name.split(".")[0], []).append(it.name)
    refusals, ties = 0, []
    for family, names in sorted(families.items()):
        for market in ("on-demand", "spot"):
            for most, steps in ((1, 2_000), (4, 2_000), (1, 200_000), (4, 200_000)):
                kw = dict(steps=steps, market=market, allow=tuple(names), max_instances=most)
                try:
                    fastest = min(e.time_h for e in rank(profile, Constraints(**kw), catalog=catalog).entries)
                except NoFeasibleConfigError:
                    continue
                for share in (0.5, 0.95):
                    try:
                        rank(profile, Constraints(**kw, deadline_h=fastest * share), catalog=catalog)
                        continue
                    except NoFeasibleConfigError as e:
                        refusals += 1
                        if "of the fleets within" in str(e):
                            ties.append(f"{family} {market} {steps} steps x{most} at {share}: {str(e)[:260]}")
    print(f"{refusals} refusals over {len(families)} GPU families; {len(ties)} name a cheaper fleet that ties")
    print("\n".join(ties))


if __name__ == "__main__":
    main()
