"""``srifty eval --data measurements.csv``: validate the performance model on published measurements (torch-free)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lightning_srifty.cli._common import console


def run_eval(data: str | None = None) -> dict[str, Any]:
    """Every held-out validation figure (:func:`predictor.validation.validate`) on ``data``, by default the
    measurements bundled with the package (wherever it is installed, whatever the working directory)."""
    from predictor.validation import data_path, validate

    return validate(data or data_path(), progress=lambda what: print(f"... {what}", file=sys.stderr))


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    panels = (
        ("same-GPU scaling (1 GPU -> 2/4/8), leave-one-model-out", result["cases"]["scaling"], "scaling"),
        ("cross-GPU, leave-one-GPU-out", result["cases"]["logo"], "logo"),
        ("cross-GPU from FLOPs per sample\n(red: FP32 across the TF32 line)", result["cases"]["cross-flops"], "flops"),
    )
    across = {id(c) for c in result["cases"].get("cross-flops-tf32", [])}
    for ax, (title, cases, _) in zip(axes, panels):
        # normalise by the source figure so that every model and unit shares one axis
        xs = [c.dst.throughput / c.src.throughput for c in cases]
        ys = [c.predicted / c.src.throughput for c in cases]
        ax.scatter(xs, ys, s=8, alpha=0.5, c=["tab:red" if id(c) in across else "tab:blue" for c in cases])
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
    from predictor.documents.atomic import write_png

    try:
        return write_png(fig, path)
    finally:
        plt.close(fig)


def cmd_eval(args: argparse.Namespace) -> int:
    from predictor.documents.atomic import check_distinct_outputs, check_writable

    check_distinct_outputs({"--plot": args.plot}, inputs={"--data": args.data})  # issue #36 L1
    if args.plot:
        check_writable(args.plot)  # before the minutes of validation, not after
    result = run_eval(args.data)
    rows = result["rows"]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"Performance model validation on {args.data or 'the bundled measurements'}")
        for col in ("cases", "MAPE", "median APE", "p90 APE", "80% coverage", "held-out width"):
            table.add_column(col, justify="right")
        table.add_column("what", justify="left")
        for name, r in rows.items():
            table.add_row(
                str(r["cases"]),
                f"{r.get('mape', 0):.1%}",
                f"{r.get('median_ape', 0):.1%}",
                f"{r.get('p90_ape', 0):.1%}",
                f"{r.get('coverage_80', 0):.0%}",
                f"{r['coverage_80_nested']:.0%}" if "coverage_80_nested" in r else "-",
                name,
            )
        console().print(table)
    if args.plot:
        print(f"figure: {plot(result, Path(args.plot))}")
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("eval", help="validate the performance model on published measurements")
    p.add_argument("--data", help="measurements CSV (default: the copy bundled with the package)")
    p.add_argument("--plot", help="write a predicted-vs-measured PNG here")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_eval)
