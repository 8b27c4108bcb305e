"""Leave-one-GPU-out validation of the per-operator latency model on NeuSight's kernel measurements.

    python bench/kernel_logo.py [--data ../shared/data/kernels] [--max-rows 40000]

For each of the 8 GPUs: train without it (scripts/train_kernel_model.py's training), predict every kernel measured on
it; MAPE per operator class and GPU, next to a plain roofline (max(FLOPs / peak, bytes / bandwidth)). Prints a
Markdown table, writes bench/results/kernel_logo.json and a predicted-vs-measured figure of the three GPUs the
NeuSight authors held out (H100, L4, A100-80GB).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import train_kernel_model as tk  # noqa: E402

from predictor.perf.kernels import features, mape  # noqa: E402

HELD_OUT = ("NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA A100 80GB PCIe")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "kernels"))
    parser.add_argument("--max-rows", type=int, default=40000)
    args = parser.parse_args()
    folder = Path(args.data)
    specs = tk.load_specs(folder)
    data = tk.load_data(folder)
    results: dict[str, dict[str, dict[str, float]]] = {}
    points: dict[str, list[tuple[float, float, str]]] = {}
    measured = {r[0] for rows in data.values() for r in rows}
    for gpu in [g for g in specs if g in measured]:
        t = time.perf_counter()
        model, _ = tk.train(folder, {gpu}, args.max_rows)
        results[gpu] = {}
        for cls, rows in data.items():
            mine = [r for r in rows if r[0] == gpu]
            if not mine:
                continue
            dims, gspecs, lat = tk.arrays(mine, specs)
            pred = model.latency(cls, dims, gspecs[0])
            _, bound = features(cls, dims, gspecs[0], None, 4.0)
            results[gpu][cls] = {"rows": len(mine), "mape": mape(pred, lat), "roofline_mape": mape(bound, lat)}
            if gpu in HELD_OUT:
                pick = np.random.default_rng(0).permutation(len(lat))[:400]
                points.setdefault(gpu, []).extend((float(lat[i]), float(pred[i]), cls) for i in pick)
        print(f"{gpu}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    classes = list(tk.FILES.values())
    classes = list(dict.fromkeys(classes))
    print("| GPU held out | " + " | ".join(classes) + " | mean over classes | roofline mean |")
    print("|---" * (len(classes) + 3) + "|")
    for gpu, by in results.items():
        cells = [f"{by[c]['mape']:.1%} ({by[c]['roofline_mape']:.0%})" if c in by else "-" for c in classes]
        mean = np.mean([v["mape"] for v in by.values()])
        roof = np.mean([v["roofline_mape"] for v in by.values()])
        results[gpu]["_mean"] = {"mape": float(mean), "roofline_mape": float(roof)}
        print(f"| {gpu} | " + " | ".join(cells) + f" | **{mean:.1%}** | {roof:.0%} |")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_logo.json").write_text(json.dumps(results, indent=2))
    _plot(points, out / "kernel_logo.png")
    print(f"\nwrote {out / 'kernel_logo.json'} and kernel_logo.png")
    return 0


def _plot(points: dict[str, list[tuple[float, float, str]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(points), figsize=(5 * len(points), 4.6), squeeze=False)
    for ax, (gpu, pts) in zip(axes[0], points.items()):
        for cls in dict.fromkeys(p[2] for p in pts):
            xs = [p[0] * 1e3 for p in pts if p[2] == cls]
            ys = [p[1] * 1e3 for p in pts if p[2] == cls]
            ax.scatter(xs, ys, s=5, alpha=0.5, label=cls)
        lo = min(min(p[0], p[1]) for p in pts) * 1e3
        hi = max(max(p[0], p[1]) for p in pts) * 1e3
        ax.plot([lo, hi], [lo, hi], color="black", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured ms")
        ax.set_ylabel("predicted ms (GPU never seen in training)")
        ax.set_title(gpu)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
