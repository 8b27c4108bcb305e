"""What one Auto Scaling group buys of a mixed fleet (twenty-ninth session; an infra team's trial): the ranking's
mixes in the mixed market, how many it now leaves out because their on-demand part spans two types (a group gives its
whole on-demand base to its first type), and for those it keeps, the worst fill of the spot units AWS may choose
(ceil(spot units / the smallest weight) instances of one type) against the plan's counts and $/h, which
``srifty terraform`` checks against ``max_instances`` and ``max_hourly_usd``.

    python bench/mixed_groups.py
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_srifty.provision.terraform.generate import weights  # noqa: E402
from lightning_srifty.provision.terraform.money import group_usd_per_hour  # noqa: E402
from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import load_profile  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402


def main() -> None:
    catalog = Catalog.load(use_refreshed=False, use_env=False)
    profile = load_profile(json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text()))
    asked = dict(steps=2_000_000, market="mixed", max_types=2, max_instances=4, allow=("g5", "g6"), top=200)
    plan = rank(profile, Constraints(**asked), catalog=catalog)
    spans = sum(n for reason, n in plan.excluded.items() if "on-demand part over two types" in reason)
    mixes = [e for e in plan.entries if len(e.groups) > 1]
    print(f"resnet50-v100, mixed market, g5/g6 mixes of up to 4 instances: {spans:,} candidate mixes left out (the "
          f"on-demand part over two types); {len(mixes)} mixes among the {len(plan.entries)} listed")  # fmt: skip
    extra_nodes, extra_usd = [], []
    for e in mixes:
        w, _ = weights(e)
        spot_units = sum(g.spot * wi for g, wi in zip(e.groups, w))
        od = sum(g.on_demand for g in e.groups)
        od_usd = sum(group_usd_per_hour(catalog, g.instance_type, e.region, g.on_demand, 0) for g in e.groups)
        fills = [(math.ceil(spot_units / wi), g.instance_type) for g, wi in zip(e.groups, w)]
        worst = max(group_usd_per_hour(catalog, t, e.region, 0, n) for n, t in fills)
        extra_nodes.append(od + max(n for n, _ in fills) - e.nodes)
        extra_usd.append((od_usd + worst) / e.usd_per_hour - 1)
    print(f"worst fill over the plan: +{statistics.median(extra_nodes):g} instances median, +{max(extra_nodes)} max; "
          f"$/h +{statistics.median(extra_usd):.0%} median, +{max(extra_usd):.0%} max; "
          f"{sum(n > 0 for n in extra_nodes)} of {len(mixes)} mixes may launch more than planned")  # fmt: skip


if __name__ == "__main__":
    main()
