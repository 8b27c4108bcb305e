"""NeuSight's H100 GEMM shapes timed again on a lent GPU: how well its published kernel latencies reproduce on today's
PyTorch and cuBLAS, the floor under any kernel model scored on them (issue #21 item 2).

    python bench/kernel_replay.py measure --out DIR [--rows 300] [--budget-s 90]   # on a CUDA machine
    python bench/kernel_replay.py score DIR|CSV                                     # here, no GPU
    python bench/kernel_replay.py score bench/data/h100_kernel_replay_2026-11-27.csv  # the H100 session's

``measure``: a fixed-seed sample of the ``test``-split H100 rows of ``linear.csv`` (``F.linear(x[b,m,k], w[n,k])``)
and ``bmm.csv`` (``torch.bmm(a[b,m,k], c[b,k,n])``), FP32 with TF32 off as NeuSight measured them; each shape timed
with CUDA events around single launches after two warm-ups, the median of up to 25 (fewer where a launch is long).
Writes ``DIR/kernel_replay.csv``.

``score``: per operator, the measured latency against NeuSight's (mean absolute percentage difference, the median
ratio), and the shipped kernel model's leave-H100-out prediction against both: if the model is nearer to the GPU
timed here than NeuSight's figures are, the published figures carry their own error.
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


def measure(out: Path, rows: int, budget_s: float, data: Path) -> int:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = 0
    with (out / "kernel_replay.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["op", "b", "m", "n", "k", "neusight_ms", "measured_ms", "reps", "device"])
        for r in sample(data, rows):
            if time.perf_counter() - started > budget_s:
                print(f"budget spent after {done} shapes", flush=True)
                break
            b, m, n, k = (int(r[c]) for c in "bmnk")
            if 4 * (b * m * k + (b if r["op"] == "bmm" else 1) * k * n + b * m * n) > 40e9:
                continue
            if r["op"] == "linear":
                x, w = torch.randn(b, m, k, device="cuda"), torch.randn(n, k, device="cuda")

                def run(x=x, w=w):
                    return torch.nn.functional.linear(x, w)
            else:
                x, w = torch.randn(b, m, k, device="cuda"), torch.randn(b, k, n, device="cuda")

                def run(x=x, w=w):
                    return torch.bmm(x, w)

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
            writer.writerow([r["op"], b, m, n, k, r["latency_ms"], f"{statistics.median(times):.6g}", reps,
                             torch.cuda.get_device_name()])  # fmt: skip
            done += 1
            del x, w
    print(f"{done} shapes in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / true - 1)))


def score(folder: Path, data: Path) -> int:
    import ops_validation as ov

    from predictor.catalog.gpus import get_gpu

    with (folder if folder.is_file() else folder / "kernel_replay.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    model = ov.kernel_model(("H100-SXM",), str(data))  # trained without every H100 row
    gpu = get_gpu("H100-SXM")
    print(f"device: {rows[0]['device']}; {len(rows)} shapes")
    for op in ("linear", "bmm"):
        rs = [r for r in rows if r["op"] == op]
        if not rs:
            continue
        neu = np.array([float(r["neusight_ms"]) for r in rs])
        here = np.array([float(r["measured_ms"]) for r in rs])
        d = {c: np.array([float(r[c]) for r in rs]) for c in "bmnk"}
        if op == "linear":  # one [B*M,K] @ [K,N] GEMM, as scripts/train_kernel_model.py reads it
            d = {"b": np.ones_like(d["b"]), "m": d["b"] * d["m"], "n": d["n"], "k": d["k"]}
        pred = model.latency("gemm", d, gpu) * 1e3
        print(f"{op} ({len(rs)}): here vs NeuSight {mape(here, neu):.1%} (median ratio {np.median(here / neu):.3f}); "
              f"model (H100 held out) vs NeuSight {mape(pred, neu):.1%}, vs here {mape(pred, here):.1%}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    def measure_options(m: argparse.ArgumentParser) -> None:
        m.add_argument("--rows", type=int, default=300, help="shapes per operator")
        m.add_argument("--data", type=Path, default=DATA)

    def score_options(s: argparse.ArgumentParser) -> None:
        s.add_argument("--data", type=Path, default=DATA)

    args = devicecli.parse(__doc__ or "", argv, 90.0, measure_options, score_options)
    if args.cmd == "measure":
        return measure(args.out, args.rows, args.budget_s, args.data)
    return score(args.path, args.data)


if __name__ == "__main__":
    sys.exit(main())
