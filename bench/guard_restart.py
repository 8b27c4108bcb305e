"""A node failure's restart in srifty launch's spot guard: the finish its hard rule keeps room for.

Two figures (BENCHMARKS.md, "What two new users' trials and a review found", sixty-first session):

1. A captured Llama-2 7B (``examples/profiles/llama-7b-bf16-captured.json``, 20,000 steps, spot on p4d and p5, a
   400 h deadline) ranked, and each fleet of 16 GPUs or more given the guard ``srifty launch`` builds for it
   (``guard_for``): the on-demand finish of the whole run it keeps room for, each node failure priced as the ranking
   prices it (the start-up and one load), against the same guard pricing it as a move (the leaving save, the
   start-up and two loads: before the sixty-first session).
2. The review's measured move (start-up 300 s, save and load 600 s as predicted, 992 GPUs, 300,000 s of steps at
   the 0.9 confidence): a move that saved in 20 s, came up in 500 s and started in 650 s. A failure's restart and
   the finish, as predicted, after the move, and with the restart that move shows a failure really has (550 s).

python bench/guard_restart.py [--out bench/results/guard_restart.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def llama_fleets() -> list[dict]:
    from lightning_srifty.provision.launcher.spot_guard import guard_for, on_demand_fleet
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    catalog = Catalog.load()
    profile = load_profile(json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text()))
    constraints = Constraints(steps=20000, market="spot", allow=("p4d", "p5"), deadline_h=400, top=60)
    plan = rank(profile, constraints, catalog=catalog)
    rows = []
    for i, e in enumerate(plan.entries):
        if e.gpus < 16:
            continue
        od, j = on_demand_fleet(plan, i, catalog)
        batch = e.global_batch or 1
        g = guard_for("srifty", plan, i, od, j, started_unix=0.0, global_batch=batch, check_s=300.0)
        assert g is not None
        now = g.work_left_s
        g.startup_s, g.save_s = g.predicted_restart_s, 0.0  # a failure priced as a move (the whole restart)
        before = g.work_left_s
        rows.append({"fleet": e.fleet, "gpus": e.gpus, "finish_h_before": before / 3600, "finish_h_now": now / 3600})
    return rows


def measured_move() -> dict:
    from lightning_srifty.provision.launcher.spot_guard import SpotGuard
    from predictor.runs import deadline
    from predictor.runs.spot import on_demand_time_s

    kw = dict(started_unix=0.0, deadline_h=100.0, steps=30000, step_s=10.0, check_s=300.0, spot_usd_hr=1.0,
              od_usd_hr=3.0, gpus=992.0, checkpoint_s=600.0, confidence=0.9, load_s=600.0)  # fmt: skip
    g = SpotGuard(deadline.Srifty(), restart_s=300 + 600 + 600, save_s=600.0, startup_s=300.0, **kw)
    g.progress(0, step_time_s=10.0)
    predicted = (g.failure_restart_s, g.work_left_s / 3600)
    g.restarted(20 + 500 + 650, 20.0)
    measured = (g.failure_restart_s, g.work_left_s / 3600)
    truth = on_demand_time_s(30000 * 10.0, 600.0, 550.0, 992.0, 0.9, 600.0) / 3600
    return {"predicted": predicted, "after_the_move": measured, "true_restart_finish_h": truth}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    fleets, move = llama_fleets(), measured_move()
    for r in fleets:
        saved = (r["finish_h_before"] - r["finish_h_now"]) * 60
        was, now = r["finish_h_before"], r["finish_h_now"]
        print(f"{r['fleet']:20s} {r['gpus']:3d} GPUs  finish {was:7.2f} h -> {now:7.2f} h  ({saved:.1f} min)")
    (r0, f0), (r1, f1) = move["predicted"], move["after_the_move"]
    print(
        f"the review's move: failure restart {r0:.0f} s, finish {f0:.2f} h predicted; {r1:.0f} s, {f1:.2f} h after "
        f"the move; {move['true_restart_finish_h']:.2f} h with the true restart"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"llama_7b_fleets": fleets, "measured_move": move}, indent=1) + "\n")


if __name__ == "__main__":
    main()
