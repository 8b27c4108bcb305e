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

Lambda ran the A100 and H100 at 5-8x the V100's per-GPU batch, so those truths are of another training than the one
the ranking keeps. ``--same-batch`` is the set without that: a profile of the one-A100 figure, candidates
p4de.24xlarge (8 A100), p5.48xlarge (8 H100) and p5.4xlarge (1 H100), all measured at that per-GPU batch.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog import Catalog  # noqa: E402
from predictor.documents.profile import profile_from_dict  # noqa: E402
from predictor.exceptions import NoFeasibleConfigError  # noqa: E402
from predictor.ranking import Constraints, rank  # noqa: E402
from predictor.ranking.replan import decide_move, drift, late  # noqa: E402
from predictor.runs.spot import DEFAULT_CHECKPOINT_S, REPROVISION_S  # noqa: E402
from predictor.runs.spot import RESTART_S as RESTART_S_  # noqa: E402
from predictor.validation import (  # noqa: E402
    FLOPS_PER_ITEM,
    PARAMETERS,
    SUPERLINEAR_LIMIT,
    load_points,
    published_matmul_precision,
)


def table_for(model: str, precision: str, batch: int) -> dict:
    """The operator table of one step of ``model``, captured on the meta device (cached; needs torch and
    transformers)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    import ops_validation

    return ops_validation.table_for(model, precision, batch)


# the models whose published architecture bench/ops_validation.py captures
TABLE_MODELS = ("ResNet-50", "BERT-base finetune-SQuAD", "BERT-large finetune-SQuAD")


@dataclass(frozen=True)
class Setup:
    """One decision set: the GPU whose one-GPU figure the profile is built from, the candidates (instance type ->
    (GPU key in the measurements, GPUs)) and the naive picks to compare with (label -> instance type)."""

    source: str
    candidates: dict[str, tuple[str, int]]
    naive: dict[str, str]


# the V100 set: the candidates' published figures ran the A100 / H100 at 5-8x the V100's per-GPU batch, the A10 at
# 1.5-3x, so the truths of those candidates are of another training than the one the ranking keeps (BENCHMARKS)
V100_SET = Setup(
    "V100-SXM2-16GB",
    {
        "p3.2xlarge": ("V100-SXM2-16GB", 1),
        "p3.8xlarge": ("V100-SXM2-16GB", 4),
        "p3.16xlarge": ("V100-SXM2-16GB", 8),
        "p4de.24xlarge": ("A100-SXM-80GB", 8),
        "p5.48xlarge": ("H100-SXM", 8),
        "g5.xlarge": ("A10", 1),
    },
    {
        "fastest GPU (p5.48xlarge)": "p5.48xlarge",
        "cheapest $/h (g5.xlarge)": "g5.xlarge",
        "A100:8 (p4de.24xlarge)": "p4de.24xlarge",
    },
)
# the same-batch set: Lambda ran its A100 and H100 servers at one per-GPU batch, so a profile of the one-A100 figure
# and these candidates price the same training as their truths
A100_SET = Setup(
    "A100-SXM-80GB",
    {"p4de.24xlarge": ("A100-SXM-80GB", 8), "p5.48xlarge": ("H100-SXM", 8), "p5.4xlarge": ("H100-SXM", 1)},
    {"fastest GPU (p5.48xlarge)": "p5.48xlarge", "A100:8 (p4de.24xlarge)": "p4de.24xlarge"},
)


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
    parser.add_argument(
        "--tables",
        action="store_true",
        help="profiles as SriftyCallback records them by default: with the operator table of one step (captured on "
        "the meta device from the published architecture, bench/ops_validation.py's) for ResNet-50, BERT-base and "
        "BERT-large; the other models as without",
    )
    parser.add_argument(
        "--same-batch",
        action="store_true",
        help="the set whose truths ran at the profile's per-GPU batch: a profile of the one-A100 figure, candidates "
        "p4de.24xlarge, p5.48xlarge and p5.4xlarge (Lambda's A100 and H100 runs share their batch)",
    )
    args = parser.parse_args(argv)
    setup = A100_SET if args.same_batch else V100_SET
    if args.sweep:
        sweep(args.tables, setup)
        return
    rows = scenarios(args.confidence, ((None, 1.5),), say=print, tables=args.tables, setup=setup)
    summary(rows, setup)


def sweep(tables: bool = False, setup: Setup = V100_SET) -> None:
    """Misses and cost at each confidence, over the deadline scenarios of every model and precision: the chosen fleet
    run as planned, and run with MigrationTriggers (:func:`with_triggers`: measured at its check, moved when
    ``decide_move`` says so), ranked without and with ``move_if_late`` (the ranking counting that move)."""
    print("| ranked | confidence | deadline scenarios | no fleet found | as planned: missed | cost over the oracle's "
          "(mean) | within 5% of the oracle | worst | with MigrationTriggers: missed | moved | cost over the oracle's "
          "(mean) | within 5% | worst |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for moving in (False, True):
        for q in (0.5, 0.8, 0.9, 0.95):
            ranked = scenarios(q, deadlines(setup), move_if_late=moving, tables=tables, setup=setup)
            rows = [r for r in ranked if r["scenario"].startswith("cheapest, deadline")]
            chosen = [r for r in rows if r["chosen"]]
            regrets = [r["regret"] for r in chosen]
            steered = [r["triggers_regret"] for r in chosen]
            print(
                f"| {'move_if_late' if moving else 'as planned'} | {q:g} | {len(rows)} | {len(rows) - len(chosen)} | "
                f"{sum(r['missed_deadline'] for r in rows)} | {statistics.fmean(regrets):.1%} | "
                f"{sum(x <= 0.05 + 1e-9 for x in regrets)} | x{1 + max(regrets):.2f} | "
                f"{sum(r['triggers_missed'] for r in chosen)} | {sum(bool(r['moved_to']) for r in chosen)} | "
                f"{statistics.fmean(steered):.1%} | {sum(x <= 0.05 + 1e-9 for x in steered)} | "
                f"x{1 + max(steered):.2f} |",
                flush=True,
            )


# the sweep's deadlines, each a factor of one candidate's true time: every candidate in turn is just inside (1.05x)
# or comfortably inside (1.25x) the deadline, so whether the ranking keeps it is decided by the model's error
def deadlines(setup: Setup) -> tuple[tuple[str | None, float], ...]:
    return tuple((it, f) for it in setup.candidates for f in (1.05, 1.25))


def scenarios(
    confidence: float | None,
    deadlines: tuple[tuple[str | None, float], ...],
    say=lambda line: None,
    move_if_late: bool = False,
    tables: bool = False,
    setup: Setup = V100_SET,
) -> list[dict]:
    """Every model and precision's scenarios: cheapest, cheapest under each deadline (``(candidate, factor)``: the
    factor times that candidate's true time; candidate None: the true fastest time), fastest; ``confidence`` None:
    the ranking's default."""
    catalog = Catalog.load(use_refreshed=False, use_env=False)
    points = [p for p in load_points(ROOT / "predictor" / "data" / "measurements.csv") if p.source == "lambdal"]
    truth: dict[tuple[str, str], dict[str, float]] = {}
    for p in points:
        for it, (gpu, n) in setup.candidates.items():
            # tokens/s and mels/s have no fixed size per batch item
            if p.gpu == gpu and p.gpus == n and p.items_per_s is not None:
                truth.setdefault((p.model, p.precision), {})[it] = p.items_per_s
    single = {(p.model, p.precision, p.gpu): p.items_per_s for p in points if p.gpus == 1 and p.items_per_s}
    rows = []
    for (model, precision), tput in sorted(truth.items()):
        if set(tput) != set(setup.candidates) or model not in PARAMETERS:
            continue
        # the rule of `srifty eval`: a server above 1.25x linear of its own 1-GPU figure is inconsistent data (NCF)
        if any(
            tput[it] > SUPERLINEAR_LIMIT * n * single.get((model, precision, gpu), float("inf"))
            for it, (gpu, n) in setup.candidates.items()
        ):
            print(f"{model} {precision}: left out (multi-GPU figures above {SUPERLINEAR_LIMIT}x linear)")
            continue
        src = next(
            p for p in points if p.model == model and p.precision == precision and p.gpu == setup.source and p.gpus == 1
        )
        profile = profile_from_dict(
            {
                "schema": "srifty.profile/v1",
                "model": {
                    "name": model,
                    "parameters": int(PARAMETERS[model]),
                    "precision": precision,
                    # as Lambda ran them, as `srifty eval`'s profiles say (until 2026-11-30 this bench's said nothing)
                    "float32_matmul_precision": published_matmul_precision(precision),
                    **({"flops": {"per_sample": FLOPS_PER_ITEM[model]}} if model in FLOPS_PER_ITEM else {}),
                },
                "batch": {"per_device": src.batch},
                "hardware": {"gpu": setup.source},
                "timing": {"step_time_s": {"p50": src.batch / src.items_per_s}},
            }
        )
        if tables and model in TABLE_MODELS:  # the step's operator table, as the callback records it
            profile = profile_from_dict({**profile.to_dict(), "ops": table_for(model, precision, src.batch)})
        work = 3600 * src.items_per_s * 10  # batch items: ten hours of one GPU of the source
        price = {it: catalog.get(it).price_usd_hr("us-east-1") for it in setup.candidates}
        true_h = {it: work / tput[it] / 3600 for it in setup.candidates}
        true_cost = {it: true_h[it] * price[it] for it in setup.candidates}
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
            ok = [it for it in setup.candidates if deadline is None or true_h[it] <= deadline]
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
                        allow=tuple(setup.candidates),
                        # the published server figures keep the per-GPU batch: rank the same training they measured
                        scaling="weak",
                        # the truth is the training alone (published throughput): rank it without the start-up a
                        # new fleet pays, or every short scenario's deadline is missed by the start-up alone
                        startup_s=0,
                        move_if_late=move_if_late,
                        **({} if confidence is None else {"confidence": confidence}),
                    ),
                    catalog=catalog,
                )
                chosen = plan.entries[0].groups[0].instance_type
            except NoFeasibleConfigError:
                chosen, plan = None, None  # predicted: no fleet meets the deadline
            row = {
                "model": f"{model} {precision}",
                "scenario": scenario,
                "oracle": oracle,
                "chosen": chosen,
                "regret": (score[chosen] / score[oracle] - 1) if chosen else float("nan"),
                "missed_deadline": bool(chosen and deadline is not None and true_h[chosen] > deadline),
            }
            if chosen and deadline is not None:  # the run as MigrationTriggers' first check would steer it
                h, usd, row["moved_to"] = with_triggers(profile, plan, chosen, tput, price, work, catalog)
                row["triggers_missed"], row["triggers_regret"] = h > deadline, usd / score[oracle] - 1
            for label, it in setup.naive.items():
                row[label] = score[it] / score[oracle] - 1
                row[label + " misses"] = bool(deadline is not None and true_h[it] > deadline)
            rows.append(row)
            say(
                f"{row['model']:>36} {scenario:>19}: chosen {chosen or '-':>14} oracle {oracle:>14} "
                f"regret {row['regret']:6.1%}" + ("  (misses the deadline)" if row["missed_deadline"] else "")
            )
    return rows


# MigrationTriggers' check after its first steps (``check_every_s``'s default, 600 s: the first check comes after 30
# steps, the next 600 s on; a step here is well under a second, so the check that matters is 600 s in) and what a
# voluntary move costs (predictor.runs.spot: the new fleet up while the old trains, then a save, a restart, a load)
CHECK_S, UP_S, SAVE_S, RESTART_S = 600.0, REPROVISION_S, DEFAULT_CHECKPOINT_S, RESTART_S_
DRIFT_THRESHOLD = 0.2  # MigrationTriggers' default drift_threshold


def with_triggers(
    profile, plan, chosen: str, tput: dict, price: dict, work: float, catalog
) -> tuple[float, float, str]:
    """(hours, USD, the fleet moved to or "") of the chosen fleet's run as the product steers it when the job carries
    MigrationTriggers: at the check ``CHECK_S`` in, the true speed is measured and, where the triggers would re-plan
    (a drift over their threshold, or a finish after the deadline), ``decide_move`` (the same function the job calls)
    weighs staying against the re-ranked remaining work; a move brings the new fleet up while the old
    trains, then saves, restarts and loads; the new fleet trains the rest at its true speed. One move, as the job asks
    one; the truth is the published throughput."""
    speed = tput[chosen]
    true_s = work / speed
    stay = (true_s / 3600, true_s * price[chosen] / 3600, "")
    if true_s <= CHECK_S:
        return stay
    remaining = work - speed * CHECK_S
    # MigrationTriggers' gate: a re-plan only on a drift over its threshold or a finish after the deadline (prices
    # are the plan's here)
    off = drift(speed, plan.entries[0].throughput_samples_s)
    behind = late(plan, plan.entries[0], remaining, speed, CHECK_S / 3600)
    if abs(off) <= DRIFT_THRESHOLD and behind is None:
        return stay
    d = decide_move(profile, plan, 0, remaining, why="drift" if abs(off) > DRIFT_THRESHOLD else "deadline",
                    measured_throughput=speed, catalog=catalog, elapsed_h=CHECK_S / 3600)  # fmt: skip
    if not d.move or d.target is None:
        return stay
    to = d.target.groups[0].instance_type
    left = max(0.0, remaining - speed * UP_S)  # trained while the new fleet comes up
    new_s = SAVE_S + RESTART_S + SAVE_S + left / tput[to]  # save, restart, load, the rest
    old_s = CHECK_S + UP_S + SAVE_S
    hours = (CHECK_S + UP_S + new_s) / 3600
    return hours, (old_s * price[chosen] + (UP_S + new_s) * price[to]) / 3600, to


def summary(rows: list[dict], setup: Setup = V100_SET) -> None:
    print(f"\n{len(rows)} scenarios over {len(rows) // 3} models x precisions")
    infeasible = sum(1 for r in rows if r["chosen"] is None)
    print(f"rank() found no fleet predicted to meet the deadline in {infeasible} scenario(s) (a feasible one existed)")
    print("| pick | mean regret | median regret | same as oracle | deadline misses |")
    print("|---|---|---|---|---|")
    picks = {"rank()": "regret", **{label: label for label in setup.naive}}
    for label, key in picks.items():
        regrets = [r[key] for r in rows if r[key] == r[key]]
        same = sum(
            1 for r in rows if (r["chosen"] == r["oracle"] if key == "regret" else setup.naive[key] == r["oracle"])
        )
        misses = sum(1 for r in rows if r["missed_deadline" if key == "regret" else key + " misses"])
        print(
            f"| {label} | {statistics.fmean(regrets):.1%} | {statistics.median(regrets):.1%} | {same}/{len(rows)} | "
            f"{misses}/{sum(1 for r in rows if r['scenario'] == 'cheapest, deadline')} |"
        )


if __name__ == "__main__":
    main()
