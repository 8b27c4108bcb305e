"""How well can any model that learns from other GPUs predict a GPU it never saw? Two optimistic oracles on NeuSight's
kernel data (issue #21 item 2: per-kernel leave-one-GPU-out <= 10 % on H100, L4 and A100-80GB).

    python bench/kernel_oracle.py [--data ../shared/data/kernels]

NeuSight measured its test-split shapes on every GPU, so for a held-out GPU the very same kernels are measured on the
others. Both oracles predict each kernel of the held-out GPU from those measurements and are *fitted on the held-out
GPU itself* (in-sample, so they are bounds on what transfer can reach, not results):

- **best single GPU**: the same shape's latency on one other GPU times one constant, the constant that minimises the
  held-out GPU's MAPE (grid search), for the other GPU that does best;
- **all GPUs, log-linear**: ``log t = a + sum_g w_g log t_g`` over every other GPU that measured (nearly) all the
  held-out GPU's shapes, least squares on the held-out GPU's own kernels.

A model that sees only datasheet numbers and shapes (what ``predictor/model/kernels.py`` does, leave-one-GPU-out in
``bench/kernel_logo.py``) has strictly less to go on than the first oracle's source GPU has for the exact shape, and
it cannot fit its weights on the GPU it is scored on. Where the oracles miss 10 %, the target is not reachable from
this data by transfer: the held-out GPU's kernel selection (cuBLAS's FP32 tile and split choice per shape) is its own.
Prints a table; writes nothing. About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.model.kernels import DIMS, TRAINED_CLASSES  # noqa: E402

_spec = importlib.util.spec_from_file_location("train_kernel_model", ROOT / "scripts" / "train_kernel_model.py")
tk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tk)

TEST_GPUS = ("H100-SXM", "L4", "A100-PCIe-80GB")
# a source GPU must have measured at least this share of the held-out GPU's shapes
MIN_COMMON = 0.8


def by_shape(cols: dict[str, np.ndarray], cls: str) -> dict[str, dict[tuple, float]]:
    """GPU -> {(op, dims...): latency seconds}."""
    keys = list(zip(cols["op"], *(cols[d] for d in DIMS[cls]), strict=True))
    out: dict[str, dict[tuple, float]] = {}
    for gpu, key, lat in zip(cols["gpu"], keys, cols["latency_s"], strict=True):
        out.setdefault(str(gpu), {})[key] = float(lat)
    return out


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / true) * 100)


def best_single(tables: dict[str, dict[tuple, float]], held: str) -> tuple[float, str, int] | None:
    """(MAPE %, source GPU, kernels) of the best other GPU times its best constant."""
    best = None
    for src, table in tables.items():
        common = [k for k in tables[held] if k in table]
        if src == held or len(common) < MIN_COMMON * len(tables[held]):
            continue
        true = np.array([tables[held][k] for k in common])
        other = np.array([table[k] for k in common])
        grid = np.exp(np.linspace(*np.log(np.percentile(true / other, [1, 99])), 400))
        err = min(mape(a * other, true) for a in grid)
        if best is None or err < best[0]:
            best = (err, src, len(common))
    return best


def log_linear(tables: dict[str, dict[tuple, float]], held: str) -> tuple[float, list[str], int] | None:
    """(MAPE %, source GPUs, kernels) of the in-sample least-squares log-linear combination of the other GPUs."""
    need = MIN_COMMON * len(tables[held])
    sources = [g for g, t in tables.items() if g != held and sum(k in t for k in tables[held]) >= need]
    if not sources:
        return None
    common = [k for k in tables[held] if all(k in tables[g] for g in sources)]
    y = np.log([tables[held][k] for k in common])
    x = np.column_stack([np.log([tables[g][k] for k in common]) for g in sources] + [np.ones(len(common))])
    w, *_ = np.linalg.lstsq(x, y, rcond=None)
    return mape(np.exp(x @ w), np.exp(y)), sources, len(common)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "kernels")
    args = parser.parse_args(argv)
    kernels = tk.read_kernels(args.data)
    print("| held-out GPU | class | kernels | best single GPU x best constant | all other GPUs, log-linear |")
    print("|---|---|---|---|---|")
    for held in TEST_GPUS:
        for cls in TRAINED_CLASSES:
            tables = by_shape(kernels[cls], cls)
            if held not in tables:
                continue
            single = best_single(tables, held)
            combo = log_linear(tables, held)
            one = f"{single[0]:.1f} % ({single[1]})" if single else "-"
            many = f"{combo[0]:.1f} % ({len(combo[1])} GPUs, {combo[2]} kernels)" if combo else "-"
            print(f"| {held} | {cls} | {len(tables[held])} | {one} | {many} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
