"""Decision quality: does `rank()` pick well where the truth is known?

    python bench/decision_quality.py

Candidates: single instances whose whole-server throughput is in the published measurements (Lambda, one server):
p3.2xlarge / p3.8xlarge / p3.16xlarge (1 / 4 / 8 V100), p4de.24xlarge (8 A100-SXM-80GB), p5.48xlarge (8 H100-SXM),
g5.xlarge (one A10G, measured as the A10). The ranker sees only a profile built from the 1-GPU V100 figure of the
model (with FLOPs per sample where they are known; models measured in tokens/s or mels/s are left out, their step time
in batch items being unknown) and us-east-1 on-demand prices. For every model and precision,
three scenarios: cheapest (no deadline), cheapest meeting a deadline of 1.5x the true fastest time, fastest.
Regret = the chosen fleet's true cost (or time) / the oracle's - 1; deadline misses are counted. Naive picks for
comparison: the fastest GPU (p5.48xlarge), the cheapest $/h (g5.xlarge), and "A100:8" (p4de.24xlarge).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import profile_from_dict  # noqa: E402
from predictor.exceptions import NoFeasibleConfigError  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402
from predictor.validation import FLOPS_PER_ITEM, PARAMETERS, SUPERLINEAR_LIMIT, load_points  # noqa: E402

# instance type -> (GPU key in the measurements, GPUs)
CANDIDATES = {
    "p3.2xlarge": ("V100-SXM2-16GB", 1),
    "p3.8xlarge": ("V100-SXM2-16GB", 4),
    "p3.16xlarge": ("V100-SXM2-16GB", 8),
    "p4de.24xlarge": ("A100-SXM-80GB", 8),
    "p5.48xlarge": ("H100-SXM", 8),
    "g5.xlarge": ("A10", 1),
}
NAIVE = {
    "fastest GPU (p5.48xlarge)": "p5.48xlarge",
    "cheapest $/h (g5.xlarge)": "g5.xlarge",
    "A100:8 (p4de.24xlarge)": "p4de.24xlarge",
}


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--confidence", type=float, default=None, help="the ranking's confidence (default: its own)")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="the cost of confidence: deadline scenarios at 1.1 / 1.25 / 1.5 x the true fastest time, ranked at "
        "confidence 0.5 / 0.8 / 0.9 / 0.95 (misses, cost over the oracle's, no fleet found)",
    )
    args = parser.parse_args(argv)
    if args.sweep:
        sweep()
        return
    rows = scenarios(args.confidence, ((None, 1.5),), say=print)
    summary(rows)


def sweep() -> None:
    """Misses and cost at each confidence, over the deadline scenarios of every model and precision."""
    print("| confidence | deadline scenarios | deadline missed | no fleet found | cost over the oracle's (mean) "
          "| within 5% of the oracle | worst |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for q in (0.5, 0.8, 0.9, 0.95):
        rows = [r for r in scenarios(q, SWEEP) if r["scenario"].startswith("cheapest, deadline")]
        chosen = [r for r in rows if r["chosen"]]
        regrets = [r["regret"] for r in chosen]
        print(
            f"| {q:g} | {len(rows)} | {sum(r['missed_deadline'] for r in rows)} | {len(rows) - len(chosen)} | "
            f"{statistics.fmean(regrets):.1%} | {sum(x <= 0.05 + 1e-9 for x in regrets)} | x{1 + max(regrets):.2f} |",
            flush=True,
        )


# the sweep's deadlines, each a factor of one candidate's true time: every candidate in turn is just inside (1.05x)
# or comfortably inside (1.25x) the deadline, so whether the ranking keeps it is decided by the model's error
SWEEP = tuple((it, f) for it in CANDIDATES for f in (1.05, 1.25))


def scenarios(
    confidence: float | None, deadlines: tuple[tuple[str | None, float], ...], say=lambda line: None
) -> list[dict]:
    """Every model and precision's scenarios: cheapest, cheapest under each deadline (``(candidate, factor)``: the
    factor times that candidate's true time; candidate None: the true fastest time), fastest; ``confidence`` None:
    the ranking's default."""
    catalog = Catalog.load(use_refreshed=False, use_env=False)
    points = [p for p in load_points(ROOT / "predictor" / "data" / "measurements.csv") if p.source == "lambdal"]
    truth: dict[tuple[str, str], dict[str, float]] = {}
    for p in points:
        for it, (gpu, n) in CANDIDATES.items():
            # tokens/s and mels/s have no fixed size per batch item
            if p.gpu == gpu and p.gpus == n and p.items_per_s is not None:
                truth.setdefault((p.model, p.precision), {})[it] = p.items_per_s
    single = {(p.model, p.precision, p.gpu): p.items_per_s for p in points if p.gpus == 1 and p.items_per_s}
    rows = []
    for (model, precision), tput in sorted(truth.items()):
        if set(tput) != set(CANDIDATES) or model not in PARAMETERS:
            continue
        # the rule of `srifty eval`: a server above 1.25x linear of its own 1-GPU figure is inconsistent data (NCF)
        if any(
            tput[it] > SUPERLINEAR_LIMIT * n * single.get((model, precision, gpu), float("inf"))
            for it, (gpu, n) in CANDIDATES.items()
        ):
            print(f"{model} {precision}: left out (multi-GPU figures above {SUPERLINEAR_LIMIT}x linear)")
            continue
        src = next(
            p
            for p in points
            if p.model == model and p.precision == precision and p.gpu == "V100-SXM2-16GB" and p.gpus == 1
        )
        profile = profile_from_dict(
            {
                "schema": "srifty.profile/v1",
                "model": {
                    "name": model,
                    "parameters": int(PARAMETERS[model]),
                    "precision": precision,
                    **({"flops": {"per_sample": FLOPS_PER_ITEM[model]}} if model in FLOPS_PER_ITEM else {}),
                },
                "batch": {"per_device": src.batch},
                "hardware": {"gpu": "V100-SXM2-16GB"},
                "timing": {"step_time_s": {"p50": src.batch / src.items_per_s}},
            }
        )
        work = 3600 * tput["p3.2xlarge"] * 10  # batch items: ten hours of one V100
        price = {it: catalog.get(it).price_usd_hr("us-east-1") for it in CANDIDATES}
        true_h = {it: work / tput[it] / 3600 for it in CANDIDATES}
        true_cost = {it: true_h[it] * price[it] for it in CANDIDATES}
        fastest = min(true_h.values())
        limits = [
            (
                f"cheapest, deadline {f:g}x {it}" if it else "cheapest, deadline",
                "cost",
                f * (true_h[it] if it else fastest),
            )
            for it, f in deadlines
        ]
        for scenario, objective, deadline in (("cheapest", "cost", None), *limits, ("fastest", "time", None)):
            ok = [it for it in CANDIDATES if deadline is None or true_h[it] <= deadline]
            score = true_h if objective == "time" else true_cost
            oracle = min(ok, key=lambda it: score[it])
            try:
                plan = rank(
                    profile,
                    Constraints(
                        samples=work,
                        objective=objective,
                        deadline_h=deadline,
                        market="on-demand",
                        max_instances=1,
                        allow=tuple(CANDIDATES),
                        # the published server figures keep the per-GPU batch: rank the same training they measured
                        scaling="weak",
                        # the truth is the training alone (published throughput): rank it without the start-up a
                        # new fleet pays, or every short scenario's deadline is missed by the start-up alone
                        startup_s=0,
                        **({} if confidence is None else {"confidence": confidence}),
                    ),
                    catalog=catalog,
                )
                chosen = plan.entries[0].groups[0].instance_type
            except NoFeasibleConfigError:
                chosen = None  # predicted: no fleet meets the deadline
            row = {
                "model": f"{model} {precision}",
                "scenario": scenario,
                "oracle": oracle,
                "chosen": chosen,
                "regret": (score[chosen] / score[oracle] - 1) if chosen else float("nan"),
                "missed_deadline": bool(chosen and deadline is not None and true_h[chosen] > deadline),
            }
            for label, it in NAIVE.items():
                row[label] = score[it] / score[oracle] - 1
                row[label + " misses"] = bool(deadline is not None and true_h[it] > deadline)
            rows.append(row)
            say(
                f"{row['model']:>36} {scenario:>19}: chosen {chosen or '-':>14} oracle {oracle:>14} "
                f"regret {row['regret']:6.1%}" + ("  (misses the deadline)" if row["missed_deadline"] else "")
            )
    return rows


def summary(rows: list[dict]) -> None:
    print(f"\n{len(rows)} scenarios over {len(rows) // 3} models x precisions")
    infeasible = sum(1 for r in rows if r["chosen"] is None)
    print(f"rank() found no fleet predicted to meet the deadline in {infeasible} scenario(s) (a feasible one existed)")
    print("| pick | mean regret | median regret | same as oracle | deadline misses |")
    print("|---|---|---|---|---|")
    picks = {"rank()": "regret", **{label: label for label in NAIVE}}
    for label, key in picks.items():
        regrets = [r[key] for r in rows if r[key] == r[key]]
        same = sum(1 for r in rows if (r["chosen"] == r["oracle"] if key == "regret" else NAIVE[key] == r["oracle"]))
        misses = sum(1 for r in rows if r["missed_deadline" if key == "regret" else key + " misses"])
        print(
            f"| {label} | {statistics.fmean(regrets):.1%} | {statistics.median(regrets):.1%} | {same}/{len(rows)} | "
            f"{misses}/{sum(1 for r in rows if r['scenario'] == 'cheapest, deadline')} |"
        )


if __name__ == "__main__":
    main()
