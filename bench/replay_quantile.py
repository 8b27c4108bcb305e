"""The replay of a plan whose choice meets its deadline at the edge of the confidence, against the entry's cost.

``srifty launch``'s guard plans for the plan's quantile (``--confidence``, 0.9 by default) until the job reports its
measured step (its second PROGRESS.json, after a minute of training), then for the step measured. Until the
sixty-second session ``srifty replay`` planned for the quantile throughout and ran the work at it; it now runs the
predicted step (or ``--step-quantile``'s) with the policy learning the step as the launch does.

For each deadline, on a trace where spot never goes away (in the traces' 600 s ticks, and in the guard's 300 s) and on
the single-node V100 spot traces in bench/data (every start a week apart), the ``srifty`` policy's cost:

- the entry's (the ranking's expected cost with its on-demand fallback, at the predicted step);
- the replay now (the predicted step, the quantile until measured);
- the replay before (the quantile throughout: today's ``--step-quantile <confidence>``, which is also the run whose
  step really came out that slow);
- ``srifty launch``'s spot guard over the same run (checked every 5 min, its first decision asked as the launch asks
  it, the job pausing for each periodic save).

Plans: the minimal profile (tests/_support.py) on p3.2xlarge:1 spot (90 % quantile x1.07 the prediction), the
captured Llama-2 7B on p4d.24xlarge:1 spot (x1.12; its 617 s save misses the spot notice) and on 8 of them (64 GPUs,
100,000 steps, 77 s saves), under deadlines of 1.08-1.62x the fastest fleet's time without one (those no fleet meets
at the 90 % confidence left out). The entry's
on-demand share is its ranking's; the replays' is the share of billed hours.

Since the sixty-fourth session the replay pauses the training on spot for each periodic save, its first start pays
the start-up alone, and its policy keeps in hand what the guard does (the whole interval at risk, at most the steps
done, and an on-demand finish's saves and node failures); the summary lines per plan are the replay's cost against
the guard's, in 600 s and 300 s ticks (median and largest |difference|).

python bench/replay_quantile.py [--out bench/results/replay_quantile.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def plans(catalog):
    from _support import MINIMAL
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    llama = load_profile(json.loads((ROOT / "examples/profiles/llama-7b-bf16-captured.json").read_text()))
    cases = (
        ("minimal, p3.2xlarge:1", load_profile(MINIMAL), dict(steps=200_000, allow=("p3.2xlarge",), max_instances=1)),
        ("Llama-2 7B, p4d:1", llama, dict(steps=20_000, allow=("p4d.24xlarge",), max_instances=1)),
        ("Llama-2 7B, p4d:8", llama, dict(steps=100_000, allow=("p4d.24xlarge",), max_instances=8)),
    )
    for name, profile, kw in cases:
        # the fastest fleet's time (one instance: the one fleet), the deadlines from just below its quantile
        base = min(rank(profile, Constraints(market="spot", **kw), catalog=catalog).entries, key=lambda e: e.time_h)
        quantile_h = None
        for x in (1.0, 1.01, 1.02, 1.04, 1.07, 1.1, 1.15, 1.2, 1.3, 1.5):
            deadline = base.time_h * x * 1.08  # from below the 90 % quantile's finish to well past it
            try:
                plan = rank(profile, Constraints(market="spot", deadline_h=deadline, confidence=0.9, **kw),
                            catalog=catalog)  # fmt: skip
            except Exception:  # noqa: BLE001 - no fleet meets it at the confidence: below the quantile
                continue
            quantile_h = quantile_h or deadline
            yield name, deadline, plan


def replays(plan, catalog, trace_set):
    from predictor.runs import deadline as dl

    out = {}
    for label, q in (("now", None), ("quantile_throughout", plan.constraints.confidence)):
        run = dl.job_from_plan(plan, catalog=catalog, step_quantile=q)
        costs, ods, starts, saving = [], [], [], []
        for trace in trace_set:
            o = dl.replay(run.job, trace, dl.policy("srifty"))
            costs.append(o.cost_usd if o.finished else np.nan)
            ods.append(o.hours["on-demand"] / max(1e-9, o.hours["on-demand"] + o.hours["spot"]))
            starts.append(o.starts)
            saving.append(o.hours.get("saving", 0.0))
        out[label] = {"cost_usd": float(np.nanmean(costs)), "on_demand_share": float(np.mean(ods)),
                      "starts": float(np.mean(starts)), "saving_h": float(np.mean(saving))}  # fmt: skip
    return out


def guarded(plan, catalog) -> dict:
    """srifty launch's spot guard over the run where spot never goes away, checked every 5 min: its first decision
    as the launch asks it (no fleet yet: spot, or the on-demand twin), the job's steps at the predicted step
    (measured after its first minute), pausing for each periodic save; the first start its start-up alone, each later
    one a restart; its moves (the first start not counted), hours on-demand and cost (the fleet's spot and on-demand
    prices)."""
    import math

    from lightning_srifty.provision.launcher.spot_guard import guard_for, on_demand_fleet
    from predictor.runs.deadline import planned_interval_s

    i, check = plan.chosen, 300.0
    e = plan.entries[i]
    od_plan, od_i = on_demand_fleet(plan, i, catalog)
    g = guard_for("srifty", plan, i, od_plan, od_i, started_unix=0.0, global_batch=e.global_batch, check_s=check)
    tau, save = planned_interval_s(plan, i) or math.inf, e.checkpoint_s or 0.0
    step_s, restart = e.iteration_time_s, (e.startup_s or 0.0) + save + (plan.checkpoint_s or 0.0)
    now, trained, running, busy, moves, cost = 0.0, 0.0, None, 0.0, -1, 0.0
    hours = {"spot": 0.0, "on-demand": 0.0}
    while trained < g.steps * step_s and now < 200 * 3600:
        g.progress(int(trained / step_s), step_s if trained > 60 else None)
        act = {"spot": "spot", "on-demand": "on-demand", "wait": None}[g.decide(now, running, True).action]
        if act != running:
            moves, running, busy = moves + 1, act, restart if trained > 0 else (e.startup_s or 0.0)
        if running is not None:
            hours[running] += check / 3600
            cost += check / 3600 * (e.usd_per_hour if running == "spot" else od_plan.entries[od_i].usd_per_hour)
        left = check - min(busy, check)
        busy = max(0.0, busy - check)
        trained += left * tau / (tau + save) if running == "spot" and math.isfinite(tau) else left
        now += check
    return {"moves": moves, "on_demand_h": hours["on-demand"], "cost_usd": cost, "finished_h": now / 3600}


def windows(deadline_h: float) -> list:
    """The single-node V100 availability traces of 2022-10-26 (skypilot-org/spot-traces, bench/data), each from
    every week's start that leaves the deadline and a margin inside the trace."""
    from predictor.runs import traces

    out = []
    need = int(np.ceil(deadline_h * 3600 / 600.0)) + 50
    for path in sorted((ROOT / "bench/data/spot-traces/availability/1-node/aws-10-26-2022").glob("*_v100_1.json")):
        t, _ = traces.read_trace(path, nodes=1, values="preempted")
        for start in range(0, t.ticks - need, 7 * 24 * 6):
            out.append(traces.Trace(t.gap_s, t.available[:, start:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from predictor.catalog import Catalog
    from predictor.runs import traces

    catalog = Catalog.load()
    rows = []
    for name, deadline, plan in plans(catalog):
        e = plan.entries[plan.chosen]
        always = [traces.Trace(gap_s=600.0, available=np.ones((1, int(deadline * 6) + 200), bool))]
        row = {"plan": name, "fleet": e.fleet, "deadline_h": round(deadline, 2), "predicted_h": round(e.time_h, 2),
               "in_time": e.deadline_probability, "entry_cost_usd": round(e.cost_usd, 2),
               "entry_on_demand_share": round(e.on_demand_fallback or 0.0, 3)}  # fmt: skip
        for label, r in replays(plan, catalog, always).items():
            row[f"{label}_cost_usd"] = round(r["cost_usd"], 2)
            row[f"{label}_on_demand_share"] = round(r["on_demand_share"], 3)
            row[f"{label}_starts"] = r["starts"]
            row[f"{label}_saving_h"] = round(r["saving_h"], 3)
        # the same in the guard's own 300 s checks (a trace's gap is 600 s: the replay's tick)
        fine = [traces.Trace(gap_s=300.0, available=np.ones((1, int(deadline * 12) + 400), bool))]
        r = replays(plan, catalog, fine)["now"]
        row["now_300s_cost_usd"], row["now_300s_starts"] = round(r["cost_usd"], 2), r["starts"]
        gd = guarded(plan, catalog)
        row.update({f"guard_{k}": round(v, 2) for k, v in gd.items()})
        row["interval_h"] = round((e.checkpoint_interval_s or float("nan")) / 3600, 2)
        for label, r in replays(plan, catalog, windows(deadline)).items():
            row[f"v100_traces_{label}_cost_usd"] = round(r["cost_usd"], 2)
            row[f"v100_traces_{label}_on_demand_share"] = round(r["on_demand_share"], 3)
        rows.append(row)
        print(
            f"{name:22s} {e.fleet:16s} deadline {deadline:6.2f} h (predicted {e.time_h:6.2f} h, in time "
            f"{e.deadline_probability:.0%}): entry ${e.cost_usd:8.2f} ({row['entry_on_demand_share']:.0%} od)  "
            f"replay now ${row['now_cost_usd']:8.2f} ({row['now_on_demand_share']:.0%} od, {row['now_starts']:.0f} "
            "starts)  before "
            f"${row['quantile_throughout_cost_usd']:8.2f} ({row['quantile_throughout_on_demand_share']:.0%} od)"
            f" | 300 s ticks ${row['now_300s_cost_usd']:8.2f} | guard ${gd['cost_usd']:7.2f} ({gd['moves']} moves, "
            f"{gd['on_demand_h']:.1f} h od) | interval "
            f"{row['interval_h']:.2f} h | V100 traces: now ${row['v100_traces_now_cost_usd']:8.2f} before "
            f"${row['v100_traces_quantile_throughout_cost_usd']:8.2f}"
        )
    for name in dict.fromkeys(r["plan"] for r in rows):
        for key, tick in (("now_cost_usd", "600 s"), ("now_300s_cost_usd", "300 s")):
            err = [abs(r[key] / r["guard_cost_usd"] - 1) for r in rows if r["plan"] == name]
            print(f"{name}: replay in {tick} ticks against the guard, |cost difference| median {np.median(err):.1%}, "
                  f"largest {max(err):.1%} over {len(err)} deadlines")  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
