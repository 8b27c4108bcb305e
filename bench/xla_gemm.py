"""The GEMM model's 16-bit and TF32 paths against XLA's measured H100 and B200 dot throughputs.

    python bench/xla_gemm.py [--plot docs/img/xla_gemm.png]

XLA ships measured dot throughputs (``bench/data/xla_matmul_rates.csv``, ``scripts/build_xla_gemm_data.py``: b 1-4,
m/n/k 256-4096, k the contraction) on H100 SXM (sm_90) and B200: nothing in the predictor is fitted on them but the
6 us ramp of the 16-bit waves (each GPU's rows choose the same value). Each row is priced as a capture is
(``path="absolute"``), as in-stream time (XLA's table is kernel time from its profiler, no launch), two ways:
``FP32-util``, the FP32-learned utilisation of the kernel model against the tensor-core peak times the path's
tensor-core efficiency (every GEMM until 2026-11-29; TF32 GEMMs still), and ``shipped``,
:func:`predictor.model.ops.gemm_step_time` (16-bit GEMMs by waves of tiles at the GPU's measured ceiling,
:mod:`predictor.model.tensor_gemm`). Scored as predicted / measured time: per-GEMM MAPE, time-weighted error
(sum |pred - meas| / sum meas), the error of the sum, by size band (FLOPs) and by dtype.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "data" / "xla_matmul_rates.csv"
OUT = ROOT / "bench" / "results" / "xla_gemm.csv"
DTYPES = {"bf16": ("bf16_flops", True, "bf16-mixed", None, 2.0), "tf32": ("f32_flops", False, "32-true", "high", 4.0)}
BANDS = ((0, 1e9, "< 1 GFLOP"), (1e9, 2e10, "1-20 GFLOP"), (2e10, 1e13, ">= 20 GFLOP"))


def load(gpus: tuple[str, ...]) -> list[dict]:
    with DATA.open() as fh:
        return [r for r in csv.DictReader(fh) if r["gpu"] in gpus]


def score(rows: list[dict], *, legacy: bool = False) -> list[dict]:
    from predictor.catalog.gpus import bundled_gpus
    from predictor.model.kernels import load_kernel_model
    from predictor.model.ops import _tensor_peak, gemm_step_time

    model, gpus = load_kernel_model(), bundled_gpus()
    out = []
    for gpu_key in sorted({r["gpu"] for r in rows}):
        gpu = gpus.get(gpu_key)
        mine = [r for r in rows if r["gpu"] == gpu_key]
        for dtype, (col, half, precision, matmul, eb) in DTYPES.items():
            have = [r for r in mine if r[col]]
            dims = {d: np.array([float(r[d]) for r in have]) for d in "bmnk"}
            flops = 2 * dims["b"] * dims["m"] * dims["n"] * dims["k"]
            if legacy:  # the FP32-learned utilisation against the tensor-core peak (the model before 2026-11-29)
                peak = _tensor_peak(gpu, half, precision, matmul, "absolute")
                pred = model.step_time("gemm", dims, gpu, peak_tflops=peak, element_bytes=eb)
            else:
                pred = gemm_step_time(dims, gpu, half, precision, matmul, eb, "absolute")
            meas = flops / np.array([float(r[col]) for r in have])
            for r, f, p, m in zip(have, flops, pred, meas):
                out.append(
                    {
                        "gpu": gpu_key,
                        "dtype": dtype,
                        **{d: int(r[d]) for d in "bmnk"},
                        "flops": f,
                        "measured_s": m,
                        "predicted_s": p,
                        "ratio": p / m,
                    }
                )
    return out


def summarise(scored: list[dict], label: str) -> list[str]:
    lines = []
    for gpu in sorted({s["gpu"] for s in scored}):
        for dtype in DTYPES:
            for lo, hi, band in ((0, 1e99, "all"), *BANDS):
                g = [s for s in scored if s["gpu"] == gpu and s["dtype"] == dtype and lo <= s["flops"] < hi]
                if not g:
                    continue
                meas = sum(s["measured_s"] for s in g)
                lines.append(
                    f"{label:10} {gpu:9} {dtype:5} {band:12} n={len(g):3d} "
                    f"MAPE {100 * statistics.mean(abs(s['ratio'] - 1) for s in g):5.1f}%  "
                    f"time-weighted {100 * sum(abs(s['predicted_s'] - s['measured_s']) for s in g) / meas:5.1f}%  "
                    f"sum {100 * (sum(s['predicted_s'] for s in g) / meas - 1):+6.1f}%  "
                    f"median pred/meas {statistics.median(s['ratio'] for s in g):.2f}"
                )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="H100-SXM,B200-SXM")
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    rows = load(tuple(args.gpus.split(",")))
    before = score(rows, legacy=True)
    scored = score(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as fh:
        w = csv.DictWriter(fh, list(scored[0]))
        w.writeheader()
        w.writerows(scored)
    print("\n".join(summarise(before, "FP32-util")))
    print("\n".join(summarise(scored, "shipped")))
    if args.plot:
        plot(scored, args.plot)
        print(f"plot: {args.plot}")


def plot(scored: list[dict], path: Path) -> None:
    """Achieved share of the dense tensor-core peak against FLOPs: measured (XLA) and predicted, per GPU and dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from predictor.catalog.gpus import bundled_gpus

    gpus = sorted({s["gpu"] for s in scored})
    fig, axes = plt.subplots(1, len(gpus), figsize=(6 * len(gpus), 4.5), squeeze=False)
    for ax, gpu_key in zip(axes[0], gpus):
        gpu = bundled_gpus().get(gpu_key)
        for dtype, colour in (("bf16", "tab:red"), ("tf32", "tab:blue")):
            g = [s for s in scored if s["gpu"] == gpu_key and s["dtype"] == dtype]
            dense = (gpu.bf16_tflops if dtype == "bf16" else gpu.tf32_tflops) * 1e12
            x = [s["flops"] for s in g]
            ax.scatter(x, [s["flops"] / s["measured_s"] / dense for s in g], s=8, c=colour, label=f"{dtype} measured")
            ax.scatter(
                x,
                [s["flops"] / s["predicted_s"] / dense for s in g],
                s=8,
                c=colour,
                marker="x",
                alpha=0.5,
                label=f"{dtype} predicted",
            )
        ax.set(
            xscale="log",
            ylim=(0, 1),
            xlabel="GEMM FLOPs",
            ylabel="share of the dense tensor-core peak",
            title=f"{gpu_key}: XLA's measured dots vs the kernel model",
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
