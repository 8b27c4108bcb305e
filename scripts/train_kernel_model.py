"""Train the per-operator latency model on NeuSight's kernel measurements and write predictor/data/kernel_model.json.

    python scripts/train_kernel_model.py [--data ../shared/data/kernels] [--out PATH] [--exclude-gpu NAME ...]

Deterministic (fixed seeds); the artefact records the data's sha256, the GPUs it was trained on and the library
versions. ``--exclude-gpu`` leaves GPUs out (leave-one-GPU-out validation: ``bench/kernel_logo.py``).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor._io import atomic_write_text  # noqa: E402
from predictor.perf.kernels import SCHEMA, GpuSpec, KernelModel, spec_from_neusight  # noqa: E402

FILES = {"linear": "gemm", "bmm": "gemm", "conv": "conv", "elementwise": "elementwise", "ln": "norm",
         "softmax": "softmax"}  # fmt: skip
BINARY = {"add", "div", "mul", "pow"}  # tensor-tensor: two inputs read, one written; the rest one read, one written
VERSION = 1


def load_specs(folder: Path) -> dict[str, GpuSpec]:
    specs = {}
    with open(folder / "devices.csv", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["SingleFLOPs"] and row["Device"] not in specs and row["Device"].startswith(("NVIDIA", "Tesla")):
                specs[row["Device"]] = spec_from_neusight(row)
    return specs


def load_data(folder: Path) -> dict[str, list[tuple[str, dict[str, float], float]]]:
    """class -> [(device, dims, latency seconds)]."""
    out: dict[str, list[tuple[str, dict[str, float], float]]] = defaultdict(list)
    for name, cls in FILES.items():
        with open(folder / f"{name}.csv", encoding="utf-8") as handle:
            for r in csv.DictReader(handle):
                lat = float(r["latency_ms"]) / 1e3
                if cls == "gemm":
                    dims = {k: float(r[k]) for k in ("b", "m", "n", "k")}
                elif cls == "conv":
                    ks, size = float(r["kernel_size"]), float(r["input_size"])
                    dims = {
                        "b": float(r["b"]),
                        "cin": float(r["input_channel"]),
                        "cout": float(r["output_channel"]),
                        "kh": ks,
                        "kw": ks,
                        "h": size,
                        "w": size,
                        "stride": float(r["stride"]),
                        "padding": float(r["padding"]),
                        "groups": 1.0,
                    }
                else:
                    n = float(r["b"]) * float(r["h"])
                    tensors = 3 if r["op"] in BINARY else 2
                    dims = {"n": n, "bytes": 4 * n * tensors, "flops": 0.0}
                    if cls != "elementwise":
                        dims = {"rows": float(r["b"]), "cols": float(r["h"]), "bytes": 4 * n * 2}
                out[cls].append((r["device"], dims, lat))
    return out


def arrays(rows: list[tuple[str, dict[str, float], float]], specs: dict[str, GpuSpec]):
    keys = rows[0][1].keys()
    dims = {k: np.array([r[1][k] for r in rows]) for k in keys}
    return dims, [specs[r[0]] for r in rows], np.array([r[2] for r in rows])


def data_sha256(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in [*sorted(FILES), "devices"]:
        digest.update((folder / f"{name}.csv").read_bytes())
    return digest.hexdigest()


def train(folder: Path, exclude: set[str] = frozenset(), max_rows: int = 40000) -> tuple[KernelModel, dict]:
    specs = load_specs(folder)
    data = load_data(folder)
    fit_data = {}
    gpus = set()
    for cls, rows in data.items():
        kept = [r for r in rows if r[0] not in exclude and r[0] in specs]
        gpus |= {r[0] for r in kept}
        fit_data[cls] = arrays(kept, specs)
    model = KernelModel(max_rows=max_rows).fit(fit_data)
    import sklearn

    artefact = {
        "schema": SCHEMA,
        "script_version": VERSION,
        "data_sha256": data_sha256(folder),
        "trained_on": sorted(gpus),
        "fitted_with": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scikit-learn": sklearn.__version__,
        },
        **model.to_dict(),
    }
    return model, artefact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "kernels"))
    parser.add_argument("--out", default=str(ROOT / "predictor" / "data" / "kernel_model.json"))
    parser.add_argument("--exclude-gpu", action="append", default=[], help="a device name as in devices.csv")
    args = parser.parse_args()
    t = time.perf_counter()
    _, artefact = train(Path(args.data), set(args.exclude_gpu))
    atomic_write_text(args.out, json.dumps(artefact) + "\n")
    print(f"wrote {args.out} ({time.perf_counter() - t:.0f} s, trained on {', '.join(artefact['trained_on'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
