"""What the validation sets (``bench/mpt_fsdp.py``, ``bench/mlperf.py``, ``bench/llama_fsdp.py``) share: captures
through the CLI in process, the summary line of a group of scored rows, and the predicted-vs-measured figure
(log-log, the diagonal and +-10 % lines)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def cli_in_process(args: list[str]) -> tuple[float, str]:
    """Run ``srifty ARGS`` through the CLI's ``main`` in this process (no interpreter and import start-up per call),
    its output swallowed: (seconds, the last line of its errors or "" when it succeeded)."""
    import contextlib
    import io
    import time

    from lightning_srifty.cli import main as cli

    t0 = time.perf_counter()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli(args)
    took = time.perf_counter() - t0
    return took, "" if code == 0 else (err.getvalue().strip().splitlines() or ["?"])[-1]


def save_scores(out: Path, scores: list[dict], text: str) -> None:
    """``out/scores.csv`` (every key of every row, sorted) and ``out/summary.txt`` (``text``)."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for s in scores for k in s})
    with (out / "scores.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, keys)
        w.writeheader()
        w.writerows(scores)
    (out / "summary.txt").write_text(text + "\n")


def summary_line(name: str, group: list[dict]) -> str:
    """``name: n, MAPE, median APE, median predicted / measured, 80 % interval coverage`` of scored rows (each with
    ``ape``, ``ratio`` and ``inside``)."""
    if not group:
        return f"{name}: -"
    apes = [s["ape"] for s in group]
    ratios = [s["ratio"] for s in group]
    cover = sum(bool(s["inside"]) for s in group) / len(group)
    return (
        f"{name}: n={len(group)} MAPE {100 * statistics.mean(apes):.1f}% median APE "
        f"{100 * statistics.median(apes):.1f}% median pred/meas {statistics.median(ratios):.2f} "
        f"80%-interval coverage {100 * cover:.0f}%"
    )


def predicted_vs_measured(
    groups: Sequence[tuple[str, list[dict], dict[str, Any]]],
    path: Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    legend_size: float = 8,
    dpi: int = 110,
) -> None:
    """One scatter per ``(label, rows, style)`` (rows carry ``measured`` and ``predicted``; ``style`` goes to
    ``Axes.scatter``), empty groups left out; written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    shown = [row for _, rows, _ in groups for row in rows]
    for label, rows, style in groups:
        if rows:
            ax.scatter(
                [s["measured"] for s in rows],
                [s["predicted"] for s in rows],
                label=f"{label} ({len(rows)})",
                **style,
            )
    lo = min(min(s["measured"], s["predicted"]) for s in shown) * 0.8
    hi = max(max(s["measured"], s["predicted"]) for s in shown) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=legend_size, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
