"""Leave-one-GPU-out evaluation of the per-operator kernel latency model (issue #11).

    python bench/kernel_logo.py [--data ../shared/data/kernels] [--gpus H100-SXM,L4,A100-PCIe-80GB] [--figure]
    python bench/kernel_logo.py --train-split [--classes gemm]   # model selection: test GPUs never seen

For each GPU of NeuSight's data: train the model without it (scripts/train_kernel_model.py), predict every measured
kernel of that GPU, and report the mean absolute percentage error per operator class, next to a plain roofline
baseline ``max(FLOPs / peak, bytes / bandwidth)`` from the same datasheet numbers. Prints a table, writes
``bench/results/kernel_logo.json`` (git-ignored) and, with ``--figure``, ``bench/results/kernel_logo.png``
(predicted vs measured on the held-out test GPUs H100, L4 and A100-80GB).

``--train-split`` is the protocol for choosing model changes: hold out each of NeuSight's five training GPUs in turn
and train on the other four only, so the test GPUs (H100, L4, A100-80GB) are neither trained on nor scored; score
them once, for the record, after a change is chosen.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.documents.atomic import atomic_write_json  # noqa: E402
from predictor.model.kernels import DIMS, TRAINED_CLASSES, features  # noqa: E402

_spec = importlib.util.spec_from_file_location("train_kernel_model", ROOT / "scripts" / "train_kernel_model.py")
tk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tk)

ALL_GPUS = ("P4", "P100-PCIe-16GB", "T4", "V100-PCIe-32GB", "A100-PCIe-40GB", "H100-SXM", "L4", "A100-PCIe-80GB")
TEST_GPUS = ("H100-SXM", "L4", "A100-PCIe-80GB")  # NeuSight's unseen GPUs
TRAIN_GPUS = tuple(key for key in ALL_GPUS if key not in TEST_GPUS)


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    return float(np.mean(np.abs(pred - true) / true) * 100)


def time_weighted(pred: np.ndarray, true: np.ndarray) -> float:
    """Time-weighted per-kernel error, in percent: sum |pred - true| / sum true (a long kernel counts for its time)."""
    return float(np.sum(np.abs(pred - true)) / np.sum(true) * 100)


def sum_error(pred: np.ndarray, true: np.ndarray) -> float:
    """Error of the class's summed time, in percent: |sum pred - sum true| / sum true (what a step adds up)."""
    return float(abs(np.sum(pred) - np.sum(true)) / np.sum(true) * 100)


def roofline(cls: str, rows: dict[str, np.ndarray], gpu) -> np.ndarray:
    """The plain roofline bound, max(FLOPs / peak, bytes / bandwidth), seconds (floor 0 so nothing is learned)."""
    _, t_roof, _ = features(cls, rows, gpu, floor=1e-5)
    return t_roof


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "kernels")
    parser.add_argument("--gpus", default=None, help="GPUs to hold out, comma-separated (default: all eight)")
    parser.add_argument(
        "--train-split",
        action="store_true",
        help="hold out each training-split GPU and train on the other training-split GPUs only (model selection)",
    )
    parser.add_argument("--classes", default=",".join(TRAINED_CLASSES), help="classes to train and score")
    parser.add_argument("--max-iter", type=int, default=60)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "kernel_logo.json")
    parser.add_argument("--figure", action="store_true", help="also write a PNG of predicted vs measured")
    args = parser.parse_args(argv)
    kernels = tk.read_kernels(args.data)
    held_out = args.gpus.split(",") if args.gpus else list(TRAIN_GPUS if args.train_split else ALL_GPUS)
    if args.train_split and set(held_out) & set(TEST_GPUS):
        parser.error(f"--train-split never scores the test GPUs {', '.join(TEST_GPUS)}")
    never_trained = set(TEST_GPUS) if args.train_split else set()
    classes = tuple(args.classes.split(","))
    results: dict[str, dict[str, dict[str, float]]] = {}
    scatter: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    for key in held_out:
        start = time.perf_counter()
        samples = tk.training_samples(kernels, {key} | never_trained, classes=classes)
        model = tk.KernelModel(max_iter=args.max_iter).fit(samples)
        gpu = tk.gpu_of(key)
        results[key] = {}
        for cls in classes:
            rows = tk.select(kernels[cls], kernels[cls]["gpu"] == key)
            if not len(rows["latency_s"]):
                continue
            dims = {d: rows[d] for d in DIMS[cls]}
            pred = model.latency(cls, dims, gpu)
            true = rows["latency_s"]
            base = roofline(cls, dims, gpu)
            results[key][cls] = {
                "n": len(true),
                "model_mape": round(mape(pred, true), 2),
                "roofline_mape": round(mape(base, true), 2),
                "time_weighted": round(time_weighted(pred, true), 2),
                "sum_error": round(sum_error(pred, true), 2),
                "median_pred_over_true": round(float(np.median(pred / true)), 3),
            }
            scatter.setdefault(key, []).append((cls, true, pred))
        took = time.perf_counter() - start
        line = "  ".join(
            f"{c} {v['model_mape']:.1f}% tw {v['time_weighted']:.1f}% sum {v['sum_error']:.1f}% "
            f"x{v['median_pred_over_true']:.2f} (roof {v['roofline_mape']:.0f}%)"
            for c, v in results[key].items()
        )
        mean = np.mean([v["model_mape"] for v in results[key].values()])
        print(f"{key:16s} mean {mean:5.1f}%  {line}  [{took:.0f} s]", flush=True)
    classes = [c for c in TRAINED_CLASSES if any(c in r for r in results.values())]
    print("\nMAPE % (model / roofline), GPU held out of training")
    print("| GPU | " + " | ".join(classes) + " | mean over classes |")
    print("|---" * (len(classes) + 2) + "|")
    for key, res in results.items():
        cells = [f"{res[c]['model_mape']:.1f} / {res[c]['roofline_mape']:.0f}" if c in res else "-" for c in classes]
        mean_m = np.mean([v["model_mape"] for v in res.values()])
        mean_r = np.mean([v["roofline_mape"] for v in res.values()])
        print(f"| {key} | " + " | ".join(cells) + f" | {mean_m:.1f} / {mean_r:.0f} |")
    print("\ntime-weighted per-kernel error / error of the class's summed time, %")
    print("| GPU | " + " | ".join(classes) + " |")
    print("|---" * (len(classes) + 1) + "|")
    for key, res in results.items():
        cells = [f"{res[c]['time_weighted']:.1f} / {res[c]['sum_error']:.1f}" if c in res else "-" for c in classes]
        print(f"| {key} | " + " | ".join(cells) + " |")
    protocol = "train-split" if args.train_split else "all-gpus"
    atomic_write_json(args.out, {"max_iter": args.max_iter, "protocol": protocol, "results": results})
    print(f"wrote {args.out}")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        shown = [k for k in TEST_GPUS if k in scatter]
        fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 4.6), squeeze=False)
        for ax, key in zip(axes[0], shown, strict=True):
            for cls, true, pred in scatter[key]:
                ax.loglog(true * 1e3, pred * 1e3, ".", ms=2, alpha=0.4, label=cls)
            lo, hi = ax.get_xlim()
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.set(title=f"{key} (held out)", xlabel="measured ms", ylabel="predicted ms")
            ax.legend(markerscale=6, fontsize=8)
        fig.tight_layout()
        png = args.out.with_suffix(".png")
        fig.savefig(png, dpi=110)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
