"""``srifty eval --data measurements.csv``: validate the performance model on published measurements (torch-free)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lightning_srifty.cli_catalog import _console


def run_eval(data: str) -> dict[str, Any]:
    """Every validation figure: analytic same-GPU scaling; cross-GPU analytic, and corrected under LOMO and LOGO."""
    from predictor.catalog.gpus import bundled_gpus
    from predictor.evaluation import (
        FLOPS_PER_ITEM,
        build_cases,
        case_catalog,
        cross_validate,
        load_points,
        predict_scaling_case,
        scaling_leave_one_model_out,
    )
    from predictor.evaluation import summarize_cases as summary

    gpus = bundled_gpus()
    cases = build_cases(load_points(data, gpus), gpus)
    catalog = case_catalog(cases)
    cross = [c for c in cases if c.kind == "cross"]
    cross_analytic = [_analytic_cross(c, gpus) for c in cross]
    flops_cases = [_analytic_cross(c, gpus, with_flops=True) for c in cross if c.model in FLOPS_PER_ITEM]
    scaling_cases = [c for c in cases if c.kind == "scaling"]
    scaling = [predict_scaling_case(c, catalog) for c in scaling_cases]
    scaling_lomo = scaling_leave_one_model_out(scaling_cases, catalog)
    lomo = cross_validate(cases, lambda c: [c.model], gpus)
    logo = cross_validate(cases, lambda c: [c.src.gpu, c.dst.gpu], gpus)
    return {
        "rows": {
            "same-GPU scaling, default link constants": summary(scaling),
            "same-GPU scaling, intra-node constants fitted leave-one-model-out": summary(scaling_lomo),
            "cross-GPU, analytic compute/bandwidth split only": summary(cross_analytic),
            "cross-GPU, split from FLOPs per sample (ResNet-50, BERT-base, BERT-large)": summary(flops_cases),
            "cross-GPU + learned correction, leave-one-model-out": summary(lomo),
            "cross-GPU + learned correction, leave-one-GPU-out": summary(logo),
        },
        "cases": {"scaling": scaling, "lomo": lomo, "logo": logo},
    }


def _analytic_cross(case: Any, gpus: Any, with_flops: bool = False) -> Any:
    """The analytic compute/bandwidth split alone (no learned correction, which predict() would apply); with
    ``with_flops`` the compute-bound share comes from the model's FLOPs, as from a profile that counted them."""
    import math
    from dataclasses import replace

    from predictor.evaluation import FLOPS_PER_ITEM
    from predictor.perf.compute import compute_ratio
    from predictor.predict import MODEL_ERROR, Z80

    src, dst = gpus.gpus[case.src.gpu], gpus.gpus[case.dst.gpu]
    matmul = "high" if case.src.precision == "32-true" else None
    achieved = FLOPS_PER_ITEM[case.model] * case.src.throughput / 1e12 if with_flops else None
    pred = case.src.throughput / compute_ratio(src, dst, case.src.precision, matmul, achieved).ratio
    sd = math.hypot(MODEL_ERROR["cross-flops" if with_flops else "cross"], case.src.cv)
    return replace(case, predicted=pred, lo=pred * math.exp(-Z80 * sd), hi=pred * math.exp(Z80 * sd))


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    panels = (
        ("same-GPU scaling (1 GPU -> 2/4/8)", result["cases"]["scaling"], "scaling"),
        ("cross-GPU, leave-one-GPU-out", result["cases"]["logo"], "logo"),
    )
    for ax, (title, cases, _) in zip(axes, panels):
        # normalise by the source figure so that every model and unit shares one axis
        xs = [c.dst.throughput / c.src.throughput for c in cases]
        ys = [c.predicted / c.src.throughput for c in cases]
        ax.scatter(xs, ys, s=8, alpha=0.5)
        lo, hi = min(xs + ys), max(xs + ys)
        ax.plot([lo, hi], [lo, hi], color="black", lw=1)
        ax.plot([lo, hi], [lo * 1.1, hi * 1.1], color="gray", lw=0.8, ls="--")
        ax.plot([lo, hi], [lo / 1.1, hi / 1.1], color="gray", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured throughput / profiled throughput")
        ax.set_ylabel("predicted throughput / profiled throughput")
        mape = sum(abs(c.predicted - c.dst.throughput) / c.dst.throughput for c in cases) / max(1, len(cases))
        ax.set_title(f"{title}\n{len(cases)} cases, MAPE {mape:.1%} (dashed: +-10%)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cmd_eval(args: argparse.Namespace) -> int:
    result = run_eval(args.data)
    rows = result["rows"]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"Performance model validation on {args.data}")
        for col in ("cases", "MAPE", "median APE", "p90 APE", "80% interval coverage"):
            table.add_column(col, justify="right")
        table.add_column("what", justify="left")
        for name, r in rows.items():
            table.add_row(
                str(r["cases"]),
                f"{r.get('mape', 0):.1%}",
                f"{r.get('median_ape', 0):.1%}",
                f"{r.get('p90_ape', 0):.1%}",
                f"{r.get('coverage_80', 0):.0%}",
                name,
            )
        _console().print(table)
    if args.plot:
        print(f"figure: {plot(result, Path(args.plot))}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="validate the performance model on published measurements")
    p.add_argument("--data", required=True, help="measurements CSV (e.g. predictor/data/measurements.csv)")
    p.add_argument("--plot", help="write a predicted-vs-measured PNG here")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_eval)
