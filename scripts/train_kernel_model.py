"""Train the per-operator GPU latency model (predictor/model/kernels.py) from NeuSight's measured kernels.

    python scripts/train_kernel_model.py                       # all 8 GPUs -> predictor/data/kernel_model.json
    python scripts/train_kernel_model.py --exclude-gpu L4 --out /tmp/no-l4.json

Reads ``--data`` (default ``../shared/data/kernels`` from the repository root; see its README.md): linear/bmm ->
gemm, conv, elementwise, ln -> norm, softmax. Deterministic: fixed seeds for the per-GPU subsample and the networks.
Writes the artefact atomically, with the data's sha256, the training GPUs and the numpy / scikit-learn versions.
Needs scikit-learn (training only; the package evaluates the artefact with numpy).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog.gpus import GPU, get_gpu  # noqa: E402
from predictor.documents.atomic import atomic_write_json  # noqa: E402
from predictor.model.kernels import TRAINED_CLASSES, KernelModel  # noqa: E402

SCRIPT_VERSION = "3"
FILES = ("linear", "bmm", "conv", "elementwise", "ln", "softmax")
# NeuSight device name -> catalog key; P4 is not in the catalog (see P4 below)
DEVICES = {
    "Tesla P4": "P4",
    "Tesla P100-PCIE-16GB": "P100-PCIe-16GB",
    "Tesla T4": "T4",
    "Tesla V100-PCIE-32GB": "V100-PCIe-32GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB",
    "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB",
    "NVIDIA H100 80GB HBM3": "H100-SXM",
    "NVIDIA L4": "L4",
}
# Tesla P4 datasheet (NVIDIA, 2016): 2560 CUDA cores, boost 1063 MHz, 5.5 TFLOPS FP32, 192 GB/s, 8 GB GDDR5; a GP104
# SM has 128 FP32 cores (GeForce GTX 1080 whitepaper: 2560 cores = 20 SMs, L2 2 MB), so 20 SMs (NeuSight's
# devices.csv says 40 SMs of 64, the GP100 layout); compute capability 6.1
P4 = GPU(
    key="P4",
    arch="Pascal",
    memory_gb=8,
    memory_bw_gbps=192,
    fp32_tflops=5.5,
    tf32_tflops=None,
    fp16_tflops=None,
    bf16_tflops=None,
    nvlink_gbps=None,
    pcie="PCIe Gen3",
    aliases=("Tesla P4",),
    source="NVIDIA Tesla P4 datasheet; GP104 L2 from the GTX 1080 whitepaper",
    sms=20,
    clock_mhz=1063,
    l2_mb=2,
    compute_capability="6.1",
)
ROWS_PER_GPU = {"gemm": 5000, "conv": 4000, "elementwise": 3000, "norm": 3000, "softmax": 3000}
BINARY = {"add", "div", "mul", "pow"}  # tensor-tensor: two inputs read, one output written


def gpu_of(key: str) -> GPU:
    """The catalog GPU of a training key (P4 from its datasheet)."""
    return P4 if key == "P4" else get_gpu(key)


def _read(path: Path) -> dict[str, np.ndarray]:
    with path.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    out: dict[str, np.ndarray] = {}
    for col in rows[0]:
        values = [r[col] for r in rows]
        try:
            out[col] = np.array(values, dtype=float)
        except ValueError:
            out[col] = np.array(values)
    return out


def data_sha256(data: Path) -> str:
    """sha256 over the kernel CSV files (name and bytes, in a fixed order)."""
    digest = hashlib.sha256()
    for name in (*FILES, "devices"):
        digest.update(name.encode())
        digest.update((data / f"{name}.csv").read_bytes())
    return digest.hexdigest()


def read_kernels(data: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per class: ``gpu`` (catalog key), ``op``, ``latency_s`` and the class's dimensions (kernels.DIMS)."""
    if not (data / "bmm.csv").exists():
        raise SystemExit(f"{data} has no bmm.csv: pass --data with the NeuSight kernel folder (../shared/data/kernels)")
    raw = {name: _read(data / f"{name}.csv") for name in FILES}
    out: dict[str, dict[str, np.ndarray]] = {}

    def common(d: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        unknown = sorted(set(d["device"]) - set(DEVICES))
        if unknown:
            raise SystemExit(f"unknown devices {unknown}: add them to DEVICES in {Path(__file__).name}")
        return {"gpu": np.array([DEVICES[x] for x in d["device"]]), "op": d["op"], "latency_s": d["latency_ms"] * 1e-3}

    lin, bmm = raw["linear"], raw["bmm"]
    out["gemm"] = {
        key: np.concatenate([a, b])
        for key, a, b in [
            *[(k, common(lin)[k], common(bmm)[k]) for k in ("gpu", "op", "latency_s")],
            ("b", np.ones_like(lin["b"]), bmm["b"]),
            # NeuSight's rows: n is the contraction, k the output (its collector: torch.nn.Linear(n, k) on x[b, m, n];
            # torch.bmm([b, m, n], [b, n, k])); the model's names are ATen's, [m, k] @ [k, n]: n the output
            ("m", lin["b"] * lin["m"], bmm["m"]),  # linear: x[B,M,N] @ W[N,K] is one [B*M,N] @ [N,K]
            ("n", lin["k"], bmm["k"]),
            ("k", lin["n"], bmm["n"]),
        ]
    }
    c = raw["conv"]
    out["conv"] = {
        **common(c),
        "b": c["b"],
        "cin": c["input_channel"],
        "cout": c["output_channel"],
        "kh": c["kernel_size"],
        "kw": c["kernel_size"],
        "h": c["input_size"],
        "w": c["input_size"],
        "stride": c["stride"],
        "padding": c["padding"],
        "groups": np.ones_like(c["b"]),
    }
    e = raw["elementwise"]
    n = e["b"] * e["h"]
    out["elementwise"] = {
        **common(e),
        "n": n,
        "bytes": 4.0 * n * np.where(np.isin(e["op"], list(BINARY)), 3, 2),
        "flops": n,  # one operation per element; every measured op is bandwidth-bound, so the count hardly matters
    }
    ln, sm = raw["ln"], raw["softmax"]
    out["norm"] = {**common(ln), "rows": ln["b"], "cols": ln["h"], "bytes": 4.0 * (2 * ln["b"] * ln["h"] + 2 * ln["h"])}
    out["softmax"] = {**common(sm), "rows": sm["b"], "cols": sm["h"], "bytes": 4.0 * 2 * sm["b"] * sm["h"]}
    return out


def select(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of ``mask``."""
    return {key: value[mask] for key, value in cols.items()}


def training_samples(
    kernels: dict[str, dict[str, np.ndarray]],
    exclude: set[str],
    seed: int = 0,
    classes: tuple[str, ...] = TRAINED_CLASSES,
) -> dict[str, list[tuple[dict[str, np.ndarray], GPU, np.ndarray]]]:
    """Per class, one (dims, GPU, seconds) group per training GPU, subsampled to ROWS_PER_GPU with a fixed seed."""
    rng = np.random.default_rng(seed)
    samples: dict[str, list[tuple[dict[str, np.ndarray], GPU, np.ndarray]]] = {}
    for cls in classes:
        cols = kernels[cls]
        groups = []
        for key in sorted(set(cols["gpu"]) - exclude):
            idx = np.flatnonzero(cols["gpu"] == key)
            if len(idx) > ROWS_PER_GPU[cls]:
                idx = np.sort(rng.choice(idx, ROWS_PER_GPU[cls], replace=False))
            rows = select(cols, idx)
            groups.append((rows, gpu_of(key), rows["latency_s"]))
        if groups:
            samples[cls] = groups
    return samples


def train(data: Path, exclude: set[str], max_iter: int = 60, seed: int = 0) -> KernelModel:
    """A KernelModel fitted on every GPU of ``data`` except ``exclude`` (catalog keys)."""
    import sklearn

    kernels = read_kernels(data)
    known = set(DEVICES.values())
    if exclude - known:
        raise SystemExit(f"--exclude-gpu {sorted(exclude - known)}: not a GPU of the data; known: {sorted(known)}")
    samples = training_samples(kernels, exclude, seed)
    gpus = sorted({gpu.key for groups in samples.values() for _, gpu, _ in groups})
    by_class = {cls: sorted(gpu.key for _, gpu, _ in groups) for cls, groups in samples.items()}
    meta = {
        "data": "NeuSight (ASPLOS'25) measured FP32 kernel latencies, sitar-lab/NeuSight @ 6945927 (MIT)",
        "data_sha256": data_sha256(data),
        "training_gpus": gpus,
        "training_gpus_by_class": by_class,  # a GPU's twin prices a class only where it has rows of it
        "excluded_gpus": sorted(exclude),
        "rows_per_gpu": ROWS_PER_GPU,
        "numpy": np.__version__,
        "scikit_learn": sklearn.__version__,
        "script": f"scripts/train_kernel_model.py v{SCRIPT_VERSION}",
        "seed": seed,
    }
    return KernelModel(max_iter=max_iter, seed=seed).fit(samples, **meta)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=ROOT.parent / "shared" / "data" / "kernels", help="NeuSight kernel folder"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "predictor" / "data" / "kernel_model.json", help="artefact to write"
    )
    parser.add_argument(
        "--exclude-gpu", action="append", default=[], metavar="NAME", help="leave a GPU out (repeatable)"
    )
    parser.add_argument("--max-iter", type=int, default=60, help="training epochs per class (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    exclude = {P4.key if name.upper() in ("P4", "TESLA P4") else get_gpu(name).key for name in args.exclude_gpu}
    start = time.perf_counter()
    model = train(args.data, exclude, args.max_iter, args.seed)
    model.meta_["train_seconds"] = round(time.perf_counter() - start, 1)
    atomic_write_json(args.out, model.to_json())
    print(f"wrote {args.out} ({model.meta_['train_seconds']} s; GPUs {', '.join(model.meta_['training_gpus'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
