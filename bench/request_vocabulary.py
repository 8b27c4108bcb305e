"""The request vocabulary across the library, the service and the plan (a read-only audit, sixty-fifth session): each
finding run as a user meets it, one line each ("ok: ..." where it was taken, the error's type and words where it was
refused).

    python bench/request_vocabulary.py                                   # this checkout, about 10 s
    cd <a tree before the fix> && PYTHONPATH=. python <this file>       # the same lines before
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, "tests")


def said(f: Callable[[], Any]) -> str:
    try:
        return f"ok: {f()}"
    except Exception as exc:  # noqa: BLE001 - a refusal is a result here
        return f"{type(exc).__name__}: {str(exc)[:150]}"


def main() -> None:
    from _support import MINIMAL
    from predictor.documents.plan import load_plan
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank
    from predictor.service.app import background_server, create_app
    from predictor.service.client import ServiceClient

    app = create_app(observations=Path(tempfile.mkdtemp()) / "obs.sqlite")
    with background_server(app) as url:
        for market in ("spot", "on-demand", "any"):
            asked = Constraints(steps=1000, market=market, max_instances=4)
            print(f"library constraints through ServiceClient, market {market}:",
                  said(lambda asked=asked: ServiceClient(url).rank(MINIMAL, asked).entries[0].fleet))  # fmt: skip
    llama = load_profile(json.loads(Path("examples/profiles/llama-1b-meta.json").read_text()))

    def base() -> tuple:
        plan = rank(llama, Constraints(steps=1000, market="spot", on_demand_base=5, max_instances=2))
        return plan.constraints.market, plan.constraints.on_demand_base

    print("market spot with on_demand_base 5:", said(base))

    def weak() -> str:
        plan = rank(llama, Constraints(steps=1000, scaling="weak", market="on-demand", objective="time"))
        e, work = plan.entries[0], plan.constraints.work_samples
        return f"{e.fleet}: {work:g} samples, {work / e.global_batch:.1f} steps of its batch of {e.global_batch} priced"

    print("steps 1000 under weak scaling:", said(weak))
    plan = rank(llama, Constraints(steps=1000, max_instances=2)).to_dict()
    plan["constraints"]["min_memory_headroom"] = 0.95

    def replan() -> None:
        return Constraints.from_plan(load_plan(plan).constraints).validate()

    print("a plan with a headroom of 0.95, ranked again:", said(replan))


if __name__ == "__main__":
    main()
