"""Spot under a deadline on the capacity AWS had (issue #25): every policy of :mod:`predictor.runs.deadline` and the
hindsight optimum replayed on skypilot-org/spot-traces (commit 221da1a, copied to bench/data/spot-traces).

Jobs: 10-200 hours of training on p3.2xlarge (the traces' instance type), deadlines 1.1-2x the on-demand time,
three start points per zone spread over the trace (a job whose deadline does not fit after a start point is left
out). Each new fleet costs the start-up the ranking predicts for p3.2xlarge (predictor.runs.startup) plus a 30 s
checkpoint save and load; spot costs what the traces recorded ($0.918/h, 30% of the $3.06 on-demand price).

- *development* (tuning allowed): the single-node traces, availability 2022-10-26 (2 zones, 600 s ticks) and
  2023-02-15 (9 zones, 195 s ticks, replayed at 390 s), preemption 2023-04-22 (4 zones, 32 s ticks, replayed at
  320 s: a coarse tick has spot only when every tick in it had);
- *held out* (never tuned on): the multi-node traces, availability 16 nodes 2023-08-27 (3 zones) and preemption
  4 nodes 2023-08-03 (3 zones), 300 s ticks; the fleet is 16 (or 4) p3.2xlarge and needs that many available.

The single-node files hold 0/1; the Can't Be Late simulator reads them as *preempted* flags (``not trace[tick]``,
its ``sky_spot/env.py``), the repository's README as instances available. The figures use the simulator's reading
and repeat the development set under the README's (``available``) as a robustness check.

python bench/spot_replay.py [--grid] [--out bench/results/spot_replay.json] [--plot docs/img/spot_progress.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from predictor.runs import deadline as dl  # noqa: E402
from predictor.runs import odds  # noqa: E402
from predictor.runs import traces as tr  # noqa: E402

DATA = ROOT / "bench" / "data" / "spot-traces"
SETS = {  # name: (glob, values, nodes, resample factor)
    "availability 2022-10-26": ("availability/1-node/aws-10-26-2022/*_v100_1.json", "preempted", 1, 1),
    "availability 2023-02-15": ("availability/1-node/aws-02-15-2023/*.json", "preempted", 1, 2),
    "preemption 2023-04-22": ("preemption/1-node/aws-04-22-2023/*.json", "preempted", 1, 10),
}
HELD_OUT = {
    "availability 16-node 2023-08-27": ("availability/16-node/aws-08-27-2023/*.json", "available", 16, 1),
    "preemption 4-node 2023-08-03": ("preemption/4-node/aws-08-03-2023/*.json", "available", 4, 1),
}
WORK_H = (10, 25, 50, 100, 200)
FACTORS = (1.1, 1.25, 1.5, 2.0)
LONG_FACTORS = (3.0, 5.0, 10.0)  # beyond the range: deadlines with slack to spare
STARTS = 3
OD_USD, SPOT_USD = 3.06, 0.918  # p3.2xlarge us-east-1 on-demand; the spot price the preemption traces recorded
CHECKPOINT_S = 30.0


def restart_s() -> float:
    from predictor.catalog.catalog import Catalog
    from predictor.runs.startup import fleet_startup_s

    it = Catalog.load(use_refreshed=False, use_env=False).get("p3.2xlarge")
    return float(fleet_startup_s([it], np.array([[0]]), np.array([[1]]), 0.0, {})[0]) + 2 * CHECKPOINT_S


def traces(spec: tuple[str, str, int, int], values: str | None = None) -> list[tr.Trace]:
    pattern, how, nodes, factor = spec
    out = []
    for path in sorted(DATA.glob(pattern)):
        t, _ = tr.read_trace(path, nodes=nodes, values=values or how)  # type: ignore[arg-type]
        out.append(t.resample(factor))
    return out


def region_traces(values: str | None = None) -> list[tr.Trace]:
    """The 2023-02-15 zones grouped by region (us-east-1: 4 zones, us-east-2: 2, us-west-2: 3): a run may move
    between the zones of its region."""
    spec = SETS["availability 2023-02-15"]
    by_region: dict[str, list[tr.Trace]] = {}
    for t in traces(spec, values):
        by_region.setdefault(t.names[0][:9], []).append(t)
    return [tr.combine_traces(group) for group in by_region.values()]


def jobs(trace: tr.Trace, restart: float, nodes: int, factors: tuple[float, ...] = FACTORS,
         work_h: tuple[float, ...] = WORK_H, starts: int = STARTS):  # fmt: skip
    """(job, start tick, work h, deadline factor) for the jobs that fit in the trace (bench/capacity_width.py's too)."""
    for w in work_h:
        for f in factors:
            deadline_s = f * (w * 3600 + restart)
            need = int(np.ceil(deadline_s / trace.gap_s)) + 1
            if need > trace.ticks:
                continue
            span = trace.ticks - need
            for i in range(starts):
                start = int(span * i / max(1, starts - 1)) if starts > 1 else 0
                yield dl.Job(w * 3600, deadline_s, restart, SPOT_USD * nodes, OD_USD * nodes), start, w, f


def run_set(spec, restart: float, policies, values: str | None = None, fallback: bool = False,
            given: list[tr.Trace] | None = None, factors: tuple[float, ...] = FACTORS) -> dict:  # fmt: skip
    rows = []
    for trace in given if given is not None else traces(spec, values):
        for job, start, w, f in jobs(trace, restart, spec[2], factors):
            window = trace.window(start, trace.ticks - start)
            best = dl.optimum(job, window)
            row = {"zone": trace.names[0], "work_h": w, "factor": f, "start": start, "optimum": best.cost_usd}
            for make in policies:
                o = dl.replay(job, window, make())
                row[o.policy] = {"cost": o.cost_usd, "met": o.deadline_met, "preemptions": o.preemptions}
            if fallback:
                row["expected"] = expected_cost(job, window)
                row["expected_whole"] = expected_cost(job, window, whole=trace)
            rows.append(row)
    return summarise(rows, [m().name for m in policies]) | {"rows": rows}


def summarise(rows: list[dict], names: list[str]) -> dict:
    out = {"jobs": len(rows)}
    for n in names:
        ratio = [r[n]["cost"] / r["optimum"] for r in rows]
        out[n] = {
            "deadline_met": float(np.mean([r[n]["met"] for r in rows])),
            "cost_over_optimum": float(np.mean(ratio)) - 1,
            "cost_over_optimum_p90": float(np.percentile(ratio, 90)) - 1,
            "vs_uniform": float(np.mean([r[n]["cost"] / r["uniform"]["cost"] for r in rows])) - 1,
            "saving_vs_on_demand": 1 - float(np.mean([r[n]["cost"] / r["on-demand"]["cost"] for r in rows])),
        }
    return out


def spells(trace: tr.Trace) -> tuple[float, float, float]:
    """(availability, mean spell with spot h, mean spell without h), any zone counting."""
    a = trace.available.any(axis=0)
    up, down = (x * trace.gap_s / 3600 for x in tr.spells(a))
    return float(a.mean()), float(up.mean()) if up.size else 0.0, float(down.mean()) if down.size else 0.0


def expected_cost(job: dl.Job, trace: tr.Trace, whole: tr.Trace | None = None) -> float:
    """The ranking's first-order expectation (predictor.runs.odds.expected_with_fallback) with the window's own
    spell statistics in place of the catalog's; with ``whole``, the whole trace's (what --spot-trace gives a user)."""
    from predictor.runs.spot import spot_cost

    _, up_h, down_h = spells(whole if whole is not None else trace)
    if up_h == 0:  # no spot in the window: the ranking refuses spot on such traces (SpotStats.of); on-demand runs
        return (job.work_s + job.restart_s) * job.od_usd_hr / 3600
    rate = 1.0 / up_h
    sc = spot_cost(np.array([job.work_s]), np.ones(1), np.array([rate]), CHECKPOINT_S, restart_s=job.restart_s)
    fb = odds.expected_with_fallback(
        sc.expected_time_s, np.array([job.work_s]), sc.expected_interruptions, job.deadline_s,
        np.array([0.0]), np.array([job.restart_s]), np.array([job.spot_usd_hr]), np.array([job.od_usd_hr]),
        down_s=down_h * 3600,
    )  # fmt: skip
    return float(fb.cost_usd[0])


def whole_trace(rows: list[dict]) -> dict:
    """The expectation a user gets (each trace's whole statistics, --spot-trace) against the replays: its error, the
    10th / 90th percentiles of ln(replayed / expected) (odds.CAPACITY_LOG_WIDTH is the development set's) and how
    many replays that width holds."""
    ratio = np.array([r["srifty"]["cost"] / r["expected_whole"] for r in rows])
    lo, hi = odds.CAPACITY_LOG_WIDTH
    inside = float(np.mean((np.log(ratio) >= lo - 1e-12) & (np.log(ratio) <= hi + 1e-12)))
    out = {
        "mape": float(np.mean(np.abs(1 / ratio - 1))),
        "bias": float(np.mean(1 / ratio - 1)),
        "log_p10": float(np.percentile(np.log(ratio), 10)),
        "log_p90": float(np.percentile(np.log(ratio), 90)),
        "inside_capacity_width": inside,
    }
    print(f"  the same from each whole trace's statistics (--spot-trace): MAPE {out['mape']:.1%}, bias "
          f"{out['bias']:+.1%}; ln(replayed / expected) p10 {out['log_p10']:+.3f}, p90 {out['log_p90']:+.3f}; "
          f"inside CAPACITY_LOG_WIDTH {lo:+.3f}..{hi:+.3f}: {inside:.0%}")  # fmt: skip
    return out


def grid(restart: float) -> list[dict]:
    out = []
    for hs in (0.0, 0.15, 0.25, 0.35, 0.5):
        for hy in (0.0, 0.5, 1.0):
            fields = {"name": "tuned", "head_start": hs, "hysteresis": hy, "tail": dl.Srifty.tail}
            cls = type("Tuned", (dl.UniformProgress,), fields)
            ratios = []
            for spec in SETS.values():
                res = run_set(spec, restart, [cls, dl.UniformProgress, dl.OnDemand])
                ratios.append((res["tuned"]["cost_over_optimum"], res["jobs"]))
            mean = sum(r * n for r, n in ratios) / sum(n for _, n in ratios)
            out.append({"head_start": hs, "hysteresis": hy, "cost_over_optimum": mean})
            print(f"  head_start {hs:.2f} hysteresis {hy:.1f}: +{mean:.1%} over the optimum", flush=True)
    return out


def plot(restart: float, path: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # a case where the policies part ways (srifty is not the cheapest everywhere: 2022-10-26 us-west-2b, 50 h at
    # 1.5x, costs $78 with uniform progress and $90 with srifty)
    spec = SETS["preemption 2023-04-22"]
    trace = next(t for t in traces(spec) if t.names[0] == "us-east-1c_v100_1")
    job = dl.Job(50 * 3600, 1.5 * (50 * 3600 + restart), restart, SPOT_USD, OD_USD)
    window = trace.window(0, trace.ticks)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [4, 1]})
    h = window.gap_s / 3600
    best = dl.optimum(job, window)
    for name in dl.POLICIES:
        o = dl.replay(job, window, dl.policy(name), record=True)
        t = np.arange(1, len(o.progress) + 1) * h
        ax.plot(t, o.progress, label=f"{name}: ${o.cost_usd:,.0f}, done at {o.finished_h:.0f} h")
    ax.axvline(job.deadline_s / 3600, color="k", ls="--", lw=1, label=f"deadline (optimum ${best.cost_usd:,.0f})")
    ax.set_ylabel("training done (h)")
    ax.set_title("50 h job, deadline 1.5x on-demand, us-east-1c preemption trace of 2023-04-22 (p3.2xlarge)")
    ax.legend(loc="upper left", fontsize=8)
    n = int(job.deadline_s / window.gap_s) + 2
    bx.fill_between(np.arange(n) * h, window.available[0, :n].astype(float), step="post", alpha=0.5)
    bx.set_ylabel("spot there")
    bx.set_xlabel("hours since the start")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return {"zone": "us-east-1c", "work_h": 50, "factor": 1.5, "optimum": best.cost_usd}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/spot_replay.json"))
    ap.add_argument("--plot", default=str(ROOT / "docs/img/spot_progress.png"))
    ap.add_argument("--grid", action="store_true", help="the head-start x hysteresis grid on the development set")
    args = ap.parse_args()
    restart = restart_s()
    policies = [dl.OnDemand, dl.Greedy, dl.UniformProgress, dl.Srifty]
    t0 = time.time()
    result: dict = {"restart_s": restart, "spot_usd_hr": SPOT_USD, "on_demand_usd_hr": OD_USD, "sets": {}}
    print(f"restart {restart:.0f} s per new fleet; spot ${SPOT_USD}/h, on-demand ${OD_USD}/h per node")
    stats = {}
    for label, spec in {**SETS, **HELD_OUT}.items():
        for t in traces(spec):
            a, up, down = spells(t)
            stats[f"{label} {t.names[0]}"] = {"availability": a, "up_h": up, "down_h": down}
    result["spells"] = stats
    dev_down = [v["down_h"] for k, v in stats.items() if any(k.startswith(s) for s in SETS)]
    print(f"single-node: mean spell without spot, zone median {statistics.median(dev_down):.2f} h")
    for group, sets, values in (("development", SETS, None), ("held out", HELD_OUT, None),
                                ("development, README reading", SETS, "available")):  # fmt: skip
        for label, spec in sets.items():
            res = run_set(spec, restart, policies, values, fallback=values is None)
            res["group"] = group
            result["sets"][f"{label} ({group})" if values else label] = res
            line = ", ".join(
                f"{n} met {res[n]['deadline_met']:.0%} +{res[n]['cost_over_optimum']:.1%}" for n in
                ("greedy", "uniform", "srifty")
            )  # fmt: skip
            print(f"[{time.time() - t0:5.0f} s] {group}: {label}: {res['jobs']} jobs: {line}", flush=True)
    zones = run_set(SETS["availability 2023-02-15"], restart, policies, given=region_traces())
    zones["group"] = "zones of a region"
    result["sets"]["availability 2023-02-15, any zone of the region"] = zones
    print(f"[{time.time() - t0:5.0f} s] 2023-02-15, any zone of its region: {zones['jobs']} jobs", flush=True)
    for label, spec in SETS.items():
        res = run_set(spec, restart, policies, fallback=True, factors=LONG_FACTORS)
        res["group"] = "long slack"
        result["sets"][f"{label} (deadline 3-10x)"] = res
    print(f"[{time.time() - t0:5.0f} s] single-node, deadlines 3-10x the on-demand time", flush=True)
    for group in ("development", "held out", "development, README reading", "zones of a region", "long slack"):
        rows = [r for s in result["sets"].values() if s["group"] == group for r in s["rows"]]
        summary = summarise(rows, [p().name for p in policies])
        result[group] = summary
        print(f"\n{group}: {len(rows)} jobs")
        for n in ("on-demand", "greedy", "uniform", "srifty"):
            s = summary[n]
            print(
                f"  {n:10s} deadlines met {s['deadline_met']:.1%}  cost over optimum +{s['cost_over_optimum']:.1%} "
                f"(p90 +{s['cost_over_optimum_p90']:.1%})  vs uniform {s['vs_uniform']:+.1%}  "
                f"saving vs on-demand {s['saving_vs_on_demand']:.1%}"
            )
        with_exp = [r for r in rows if "expected" in r]
        if with_exp:
            err = [abs(r["expected"] / r["srifty"]["cost"] - 1) for r in with_exp]
            bias = [r["expected"] / r["srifty"]["cost"] - 1 for r in with_exp]
            result[group]["ranking_expectation"] = {"mape": float(np.mean(err)), "bias": float(np.mean(bias))}
            print(f"  ranking's expected cost vs srifty's replayed cost: MAPE {np.mean(err):.1%}, bias "
                  f"{np.mean(bias):+.1%}")  # fmt: skip
            result[group]["whole_trace"] = whole_trace(with_exp)
    if args.grid:
        print("\ngrid on the development set (srifty's constants):")
        result["grid"] = grid(restart)
    if args.plot:
        result["plot"] = plot(restart, Path(args.plot))
        print(f"wrote {args.plot}")
    for s in result["sets"].values():
        s.pop("rows")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
