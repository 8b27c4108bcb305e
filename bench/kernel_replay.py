"""NeuSight's H100 GEMM shapes timed again on a lent GPU, in NeuSight's orientation and transposed: which reading of
its columns its latencies follow, how well they reproduce on today's PyTorch and cuBLAS (issue #38 item 2), and the
kernel model's error on a GPU it was not trained on.

    python bench/kernel_replay.py measure --out DIR [--rows 200] [--budget-s 90]   # on a CUDA machine
    python bench/kernel_replay.py score DIR|CSV                                     # here, no GPU
    python bench/kernel_replay.py score bench/data/h100_kernel_replay_2026-11-27.csv  # the H100 session's (transposed)

``measure``: a fixed-seed sample of the ``test``-split H100 rows of ``linear.csv`` and ``bmm.csv``, FP32 with TF32 off
as NeuSight measured them, each shape timed two ways: NeuSight's orientation (its collector: ``nn.Linear(n, k)`` on
``x[b, m, n]``, i.e. ``F.linear(x[b,m,n], w[k,n])``; ``torch.bmm([b,m,n], [b,n,k])``: ``n`` the contraction, ``k`` the
output) and the transposed one the 2026-11-27 session timed (``k`` the contraction). CUDA events around single
launches after two warm-ups, the median of up to 25 (fewer where a launch is long). Writes ``DIR/kernel_replay.csv``
(one row per shape and orientation). ``--data`` is the folder holding NeuSight's ``linear.csv`` and ``bmm.csv`` (on the
GPU machine, a copy carried with the tree: ``../shared`` does not travel).

``score``: per operator and orientation, the measured latency against NeuSight's (mean absolute percentage difference,
the median ratio), and the kernel model trained without NeuSight's H100 rows (the same GH100 chip as an H200)
predicting the GPU timed here, in the orientation timed: per-kernel error unweighted and time-weighted (sum |pred -
measured| / sum measured), issue #38's two kernel measures. A CSV without an ``orientation`` column is the
2026-11-27 session's, which timed the transposed problem.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import devicecli  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "kernels"
H100 = "NVIDIA H100 80GB HBM3"


def sample(data: Path, rows: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for op in ("linear", "bmm"):
        with (data / f"{op}.csv").open() as fh:
            pool = [r for r in csv.DictReader(fh) if r["device"] == H100]
        pick = rng.choice(len(pool), size=min(rows, len(pool)), replace=False)
        out += [pool[i] for i in sorted(pick)]
    return out


ORIENTATIONS = ("neusight", "transposed")


def operands(op: str, orientation: str, b: int, m: int, n: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The two operands' shapes of one row timed in one orientation. NeuSight's: ``F.linear(x[b,m,n], w[k,n])``,
    ``bmm([b,m,n], [b,n,k])`` (``n`` the contraction); transposed: ``k`` the contraction."""
    c, o = (n, k) if orientation == "neusight" else (k, n)
    if op == "linear":
        return (b, m, c), (o, c)
    return (b, m, c), (b, c, o)


def aten_dims(op: str, orientation: str, d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The kernel model's dims (ATen's ``[m, k] @ [k, n]``: ``k`` the contraction) of rows timed in ``orientation``;
    a linear row is one ``[b*m, k] @ [k, n]`` GEMM, as scripts/train_kernel_model.py reads it."""
    c, o = (d["n"], d["k"]) if orientation == "neusight" else (d["k"], d["n"])
    if op == "linear":
        return {"b": np.ones_like(d["b"]), "m": d["b"] * d["m"], "n": o, "k": c}
    return {"b": d["b"], "m": d["m"], "n": o, "k": c}


def measure(out: Path, rows: int, budget_s: float, data: Path) -> int:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = 0
    with (out / "kernel_replay.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["op", "orientation", "b", "m", "n", "k", "neusight_ms", "measured_ms", "reps", "device"])
        for r in sample(data, rows):
            if time.perf_counter() - started > budget_s:
                print(f"budget spent after {done} shapes", flush=True)
                break
            b, m, n, k = (int(r[c]) for c in "bmnk")
            if 4 * (b * m * k + (b if r["op"] == "bmm" else 1) * k * n + b * m * n) > 40e9:
                continue
            for orientation in ORIENTATIONS:
                xs, ws = operands(r["op"], orientation, b, m, n, k)
                x, w = torch.randn(*xs, device="cuda"), torch.randn(*ws, device="cuda")
                fn = torch.nn.functional.linear if r["op"] == "linear" else torch.bmm

                def run(x=x, w=w, fn=fn):
                    return fn(x, w)

                run()
                run()
                reps = int(max(3, min(25, 0.05 / max(float(r["latency_ms"]) * 1e-3, 1e-6))))
                times = []
                for _ in range(reps):
                    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    run()
                    z.record()
                    z.synchronize()
                    times.append(a.elapsed_time(z))
                writer.writerow([r["op"], orientation, b, m, n, k, r["latency_ms"], f"{statistics.median(times):.6g}",
                                 reps, torch.cuda.get_device_name()])  # fmt: skip
                del x, w
            fh.flush()
            done += 1
    print(f"{done} shapes in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / true - 1)))


def weighted(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.sum(np.abs(pred - true)) / np.sum(true))


def score(folder: Path, data: Path, png: Path | None = None) -> int:
    import ops_validation as ov

    from predictor.catalog.gpus import get_gpu

    with (folder if folder.is_file() else folder / "kernel_replay.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r.setdefault("orientation", "transposed")  # the 2026-11-27 CSV: the transposed problem, no column
    model = ov.kernel_model(("H100-SXM",), str(data))  # trained without every H100 row
    gpu = get_gpu(rows[0]["device"])
    print(f"device: {rows[0]['device']} (the model's {gpu.key}); {len({tuple(r[c] for c in 'bmnk') for r in rows})} "
          f"shapes; kernel model trained without NeuSight's H100 rows")  # fmt: skip
    panels: dict[tuple[str, str], tuple[np.ndarray, ...]] = {}
    for op in ("linear", "bmm"):
        for orientation in ORIENTATIONS:
            rs = [r for r in rows if r["op"] == op and r["orientation"] == orientation]
            if not rs:
                continue
            neu = np.array([float(r["neusight_ms"]) for r in rs])
            here = np.array([float(r["measured_ms"]) for r in rs])
            d = aten_dims(op, orientation, {c: np.array([float(r[c]) for r in rs]) for c in "bmnk"})
            pred = model.latency("gemm", d, gpu) * 1e3
            panels[(op, orientation)] = (here, neu, pred)
            print(f"{op} {orientation} ({len(rs)}): here vs NeuSight {mape(here, neu):.1%} (median ratio "
                  f"{np.median(here / neu):.3f}, time-weighted {weighted(here, neu):.1%}); model vs here "
                  f"{mape(pred, here):.1%} unweighted, {weighted(pred, here):.1%} time-weighted (median ratio "
                  f"{np.median(pred / here):.3f})")  # fmt: skip
    if png is not None and panels:
        plot(panels, rows[0]["device"], png)
    return 0


def plot(panels: dict[tuple[str, str], tuple[np.ndarray, ...]], device: str, png: Path) -> None:
    """Per operator: the GPU's time against NeuSight's H100 latency in both orientations (left), and the kernel model
    trained without the H100 against the same time (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for (op, orientation), (here, neu, pred) in panels.items():
        marker = "o" if op == "linear" else "^"
        axes[0].scatter(neu, here, s=9, marker=marker, alpha=0.6, label=f"{op}, {orientation}")
        if orientation == "neusight":
            axes[1].scatter(here, pred, s=9, marker=marker, alpha=0.6, label=f"{op} (NeuSight's orientation)")
    for ax, (xlabel, ylabel, title) in zip(axes, (
        ("NeuSight's H100 latency (ms)", f"{device} (ms)", "NeuSight's GEMM shapes timed again"),
        (f"{device} (ms)", "kernel model, H100 rows held out (ms)", "the model on a GPU it never saw"),
    ), strict=True):  # fmt: skip
        lo, hi = 1e-2, 1e3
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title, xlim=(lo, hi), ylim=(lo, hi))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    def measure_options(m: argparse.ArgumentParser) -> None:
        m.add_argument("--rows", type=int, default=200, help="shapes per operator")
        m.add_argument("--data", type=Path, default=DATA)

    def score_options(s: argparse.ArgumentParser) -> None:
        s.add_argument("--data", type=Path, default=DATA)
        s.add_argument("--plot", type=Path, default=None, help="write the figure here (e.g. docs/img/h200_gemms.png)")

    args = devicecli.parse(__doc__ or "", argv, 90.0, measure_options, score_options)
    if args.cmd == "measure":
        return measure(args.out, args.rows, args.budget_s, args.data)
    return score(args.path, args.data, args.plot)


if __name__ == "__main__":
    sys.exit(main())
