"""Two kernel-model artefacts, each as the predictor uses it, on NeuSight's measured GEMM rows (issue #38 item 2).

    git show 39a073d:predictor/data/kernel_model.json > /tmp/kernel_model_v1.json
    python bench/kernel_convention.py --before /tmp/kernel_model_v1.json [--after predictor/data/kernel_model.json]

The predictor hands the kernel model ATen's dims (``n`` the output, ``k`` the contraction); the artefact before
2026-11-29 was trained with NeuSight's ``n`` (the contraction) in that slot, so in production it saw transposed
shapes. Both artefacts are scored here on the same rows with the same (ATen) dims: the time-weighted error (sum
|pred - measured| / sum measured) and the median predicted / measured of the kernels over 5 ms, per GPU. Both were
trained on all eight GPUs: this compares what ships, in-sample for both; the held-out figures are
``bench/kernel_logo.py``'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.model.kernels import DIMS, KernelModel  # noqa: E402

_spec = importlib.util.spec_from_file_location("train_kernel_model", ROOT / "scripts" / "train_kernel_model.py")
tk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tk)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the artefact before (JSON)")
    parser.add_argument("--after", type=Path, default=ROOT / "predictor" / "data" / "kernel_model.json")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "kernels")
    args = parser.parse_args(argv)
    models = {name: KernelModel.from_json(json.loads(path.read_text())) for name, path in
              (("before", args.before), ("after", args.after))}  # fmt: skip
    gemm = tk.read_kernels(args.data)["gemm"]  # ATen's dims: n the output, k the contraction
    print("| GPU | time-weighted error, before / after | median pred / measured over 5 ms, before / after |")
    print("|---|---|---|")
    for key in tk.DEVICES.values():
        rows = tk.select(gemm, gemm["gpu"] == key)
        true = rows["latency_s"]
        dims = {d: rows[d] for d in DIMS["gemm"]}
        long = true > 5e-3
        cells = []
        for name in ("before", "after"):
            pred = models[name].latency("gemm", dims, tk.gpu_of(key))
            cells.append((np.sum(np.abs(pred - true)) / np.sum(true) * 100, np.median(pred[long] / true[long])))
        (tb, mb), (ta, ma) = cells
        print(f"| {key} | {tb:.1f} / {ta:.1f} % | {mb:.3f} / {ma:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
