"""Achieved share of the FP32 peak against kernel duration, per GPU, in NeuSight's measured GEMMs: where a GPU's
power limit holds its clock below the boost clock the datasheet peak assumes, long kernels (a GPU busy for
hundreds of milliseconds, as in a training step) run slower than short ones of the same kind.

    python bench/kernel_duration.py [--min-gflop 10]

Data: ``../shared/data/kernels/linear.csv`` and ``bmm.csv`` (every split; FP32, TF32 off), GEMMs of at least
``--min-gflop`` GFLOP so the share reflects the compute pipe, not launch or memory; peaks from NeuSight's
``devices.csv`` (``SingleFLOPs``, boost clock x FP32 lanes). Each GPU's median share in duration bands, and the
ratio of its sustained share (kernels >= 256 ms) to its burst share (8-128 ms).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT.parent / "shared" / "data" / "kernels"
BANDS = (
    (0.0, 2.0, "<2 ms"),
    (2.0, 8.0, "2-8"),
    (8.0, 128.0, "8-128"),
    (128.0, 256.0, "128-256"),
    (256.0, 1024.0, "256-1024"),
    (1024.0, 1e9, ">=1024"),
)


def shares(min_gflop: float) -> dict[str, list[tuple[float, float]]]:
    """device -> [(latency ms, share of FP32 peak)]."""
    with (KERNELS / "devices.csv").open() as fh:
        peak = {
            r["Device"]: float(r["SingleFLOPs"])
            for r in csv.DictReader(fh)
            if r["SingleFLOPs"] and "TP" not in r["file"]
        }
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for name in ("linear", "bmm"):
        with (KERNELS / f"{name}.csv").open() as fh:
            for r in csv.DictReader(fh):
                if r["device"] not in peak:
                    continue
                flops = 2.0 * int(r["b"]) * int(r["m"]) * int(r["n"]) * int(r["k"])
                ms = float(r["latency_ms"])
                if flops >= min_gflop * 1e9 and ms > 0:
                    out[r["device"]].append((ms, flops / (ms * 1e-3) / (peak[r["device"]] * 1e9)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-gflop", type=float, default=10.0)
    args = ap.parse_args()
    if not KERNELS.exists():
        sys.exit(f"no kernel data at {KERNELS} (the shared/ folder beside the project)")
    print(f"{'GPU':24} " + " ".join(f"{b[2]:>9}" for b in BANDS) + "  sustained/burst")
    for device, rows in sorted(shares(args.min_gflop).items()):
        med = {}
        for lo, hi, label in BANDS:
            got = [s for ms, s in rows if lo <= ms < hi]
            med[label] = (statistics.median(got), len(got)) if got else None
        cells = " ".join(f"{m[0]:5.2f}({m[1]:>3})" if m else f"{'-':>9}" for m in med.values())
        burst = [s for ms, s in rows if 8 <= ms < 128]
        long = [s for ms, s in rows if ms >= 256]
        ratio = statistics.median(long) / statistics.median(burst) if burst and long else float("nan")
        print(f"{device[:24]:24} {cells}  {ratio:.2f}")


if __name__ == "__main__":
    main()
