"""Per-operator GPU latency from a spec sheet: a wave-quantised roofline with a learned utilisation.

For an operator of class ``cls`` on a GPU, the roofline bound is ``max(FLOPs / peak, bytes / bandwidth)``. What real
kernels reach of it depends on things that transfer across GPUs when expressed per SM: how many waves of thread
blocks the work makes on the GPU's SMs and how full the last wave is (tile quantisation), how long the reduction
dimension is, the compute and memory times at the roofline (their ratio is the distance from the GPU's ridge point),
and the fixed cost of launching a kernel. A small neural network per class (NeuSight's idea: predict utilisation,
not latency) maps those GPU-normalised features to ``log(latency / roofline bound)``; it was trained on NeuSight's
published FP32 kernel measurements (``scripts/train_kernel_model.py``; ``../shared/data/kernels``) and is evaluated
here with numpy from plain weights (``predictor/data/kernel_model.json``), never trained on load.

Classes and dims (numpy arrays): ``gemm`` (``b, m, n, k``), ``conv`` (``b, cin, cout, kh, kw, h, w, stride,
padding, groups``; an implicit GEMM of M = b x output pixels, N = cout, K = cin / groups x kh x kw), ``elementwise``
(``n, bytes, flops``), ``norm`` and ``softmax`` (``rows, cols, bytes``), ``reduction`` (``n, bytes``) and ``memory``
(``bytes``). The last two have no measurements of their own: they use the elementwise network on their bytes (a
bandwidth-bound pass with its launch floor), which is what a reduction or a copy is to the memory system.

Tensor cores: the training data are FP32; ``peak_tflops`` replaces the FP32 peak for GEMMs and convolutions that run
on tensor cores (TF32, FP16, BF16), and the utilisation learned at FP32 is applied to that peak.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from predictor.catalog.gpus import GPU
from predictor.exceptions import PredictionError

CLASSES = ("gemm", "conv", "elementwise", "norm", "softmax", "reduction", "memory")
TRAINED = ("gemm", "conv", "elementwise", "norm", "softmax")
SCHEMA = "srifty.kernels/v1"
TILE = 128  # output tile edge of the SIMT GEMM kernels cuBLAS picks for large FP32 problems
THREADS_PER_SM = 2048


@dataclass(frozen=True)
class GpuSpec:
    """What the latency model reads of a GPU."""

    name: str
    sms: float
    clock_mhz: float
    l2_mb: float
    bandwidth_gbps: float
    fp32_tflops: float


@functools.cache
def _arch_table() -> dict[str, dict[str, float]]:
    text = resources.files("predictor.data").joinpath("gpu_arch.csv").read_text("utf-8")
    rows = csv.DictReader(text.splitlines())
    return {
        r["key"]: {k: float(r[k]) for k in ("sms", "clock_mhz", "l2_mb", "compute_capability") if r[k]} for r in rows
    }


def gpu_spec(gpu: GPU) -> GpuSpec:
    """The spec of a catalog GPU; a missing figure names the GPU, the field and the fix."""
    arch = dict(_arch_table().get(gpu.key, {}))
    for name in ("sms", "clock_mhz", "l2_mb"):
        value = getattr(gpu, name, None)
        if value:
            arch[name] = float(value)
    needed = {
        "sms": arch.get("sms"),
        "clock_mhz": arch.get("clock_mhz"),
        "l2_mb": arch.get("l2_mb"),
        "memory_bw_gbps": gpu.memory_bw_gbps,
        "fp32_tflops": gpu.fp32_tflops,
    }
    missing = [k for k, v in needed.items() if not v]
    if missing:
        raise PredictionError(
            f"GPU {gpu.key!r} has no {', '.join(missing)}: the per-operator latency model needs them. Add them to "
            "its entry with --catalog-extra (docs/catalog.md)."
        )
    return GpuSpec(gpu.key, arch["sms"], arch["clock_mhz"], arch["l2_mb"], gpu.memory_bw_gbps, gpu.fp32_tflops)


def _log(x: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(x, 1e-30))


def features(
    cls: str, dims: Mapping[str, np.ndarray], spec: GpuSpec, peak_tflops: float | None, element_bytes: float
) -> tuple[np.ndarray, np.ndarray]:
    """(features, roofline bound in seconds) of operators of one class on one GPU."""
    d = {k: np.asarray(v, dtype=float) for k, v in dims.items()}
    peak = (peak_tflops or spec.fp32_tflops) * 1e12
    bw = spec.bandwidth_gbps * 1e9
    l2 = spec.l2_mb * 2**20
    if cls in ("gemm", "conv"):
        if cls == "gemm":
            b, m, n, k = d["b"], d["m"], d["n"], d["k"]
            moved = element_bytes * b * (m * k + k * n + m * n)
        else:
            stride, pad, groups = np.maximum(d["stride"], 1), d["padding"], np.maximum(d["groups"], 1)
            oh = np.maximum(np.floor((d["h"] + 2 * pad - d["kh"]) / stride) + 1, 1)
            ow = np.maximum(np.floor((d["w"] + 2 * pad - d["kw"]) / stride) + 1, 1)
            b, m, n, k = np.ones_like(oh), d["b"] * oh * ow, d["cout"], d["cin"] / groups * d["kh"] * d["kw"]
            moved = element_bytes * (d["b"] * d["cin"] * d["h"] * d["w"] + d["cout"] * k + m * n)
        flops = 2 * b * m * n * k
        t_c, t_m = flops / peak, moved / bw
        tiles = b * np.ceil(m / TILE) * np.ceil(n / TILE)
        waves = tiles / spec.sms
        fill = tiles / (np.ceil(np.maximum(waves, 1e-9)) * spec.sms)
        x = np.stack([_log(t_c), _log(t_m), _log(waves), fill, _log(k)], axis=1)
        return x, np.maximum(t_c, t_m)
    if cls in ("norm", "softmax"):
        rows, cols, moved = d["rows"], d["cols"], d["bytes"]
        t_m = moved / bw
        x = np.stack([_log(t_m), _log(rows / spec.sms), _log(cols), _log(moved / l2)], axis=1)
        return x, t_m
    # elementwise, and the bandwidth-bound classes that use its network
    moved = d["bytes"]
    n = d["n"] if "n" in d else moved / (2 * element_bytes)
    t_m = moved / bw
    x = np.stack([_log(t_m), _log(n / (spec.sms * THREADS_PER_SM)), _log(moved / l2)], axis=1)
    return x, t_m


@dataclass
class _Net:
    """A small MLP (ReLU hidden layers, linear output) on standardised features."""

    mean: np.ndarray
    scale: np.ndarray
    weights: list[np.ndarray]
    biases: list[np.ndarray]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = (x - self.mean) / self.scale
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "weights": [w.tolist() for w in self.weights],
            "biases": [b.tolist() for b in self.biases],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> _Net:
        return cls(
            np.asarray(data["mean"]),
            np.asarray(data["scale"]),
            [np.asarray(w) for w in data["weights"]],
            [np.asarray(b) for b in data["biases"]],
        )


class KernelModel:
    """The per-class utilisation networks. Estimator contract: ``fit`` returns self, learned attributes end in ``_``."""

    def __init__(self, *, hidden: tuple[int, ...] = (16,), alpha: float = 1e-3, max_rows: int = 40000) -> None:
        self.hidden = hidden
        self.alpha = alpha
        self.max_rows = max_rows

    def fit(self, data: Mapping[str, tuple[Mapping[str, np.ndarray], list[GpuSpec], np.ndarray]], seed: int = 0):
        """``data[cls] = (dims, spec per row, latency seconds)``: one network per trained class."""
        from sklearn.neural_network import MLPRegressor

        self.nets_: dict[str, _Net] = {}
        self.rows_: dict[str, int] = {}
        for cls, (dims, specs, latency) in data.items():
            x, bound = _features_rows(cls, dims, specs)
            y = np.log(latency) - np.log(bound)
            rng = np.random.default_rng(seed)
            take = rng.permutation(len(y))[: self.max_rows]
            mean, scale = x[take].mean(axis=0), x[take].std(axis=0) + 1e-9
            mlp = MLPRegressor(
                hidden_layer_sizes=self.hidden,
                alpha=self.alpha,
                max_iter=300,
                early_stopping=True,
                random_state=seed,
                learning_rate_init=3e-3,
            ).fit((x[take] - mean) / scale, y[take])
            self.nets_[cls] = _Net(mean, scale, list(mlp.coefs_), list(mlp.intercepts_))
            self.rows_[cls] = len(take)
        return self

    def latency(
        self,
        cls: str,
        dims: Mapping[str, np.ndarray],
        gpu: GPU | GpuSpec,
        *,
        peak_tflops: float | None = None,
        element_bytes: float = 4.0,
    ) -> np.ndarray:
        """Seconds per call of each operator described by ``dims`` on ``gpu``."""
        if not hasattr(self, "nets_"):
            from predictor.perf.correction import NotFittedError

            raise NotFittedError("This KernelModel is not fitted yet: call fit(data) or load_kernel_model() first.")
        if cls not in CLASSES:
            raise PredictionError(f"The 'cls' parameter of latency() must be one of {set(CLASSES)}. Got {cls!r}.")
        spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
        net_cls = cls if cls in self.nets_ else "elementwise"
        if cls not in TRAINED:  # a bandwidth-bound pass over its bytes, as an elementwise kernel sees it
            dims = {"bytes": np.asarray(dims["bytes"], dtype=float)}
        x, bound = features(cls if cls in TRAINED else "elementwise", dims, spec, peak_tflops, element_bytes)
        if len(bound) == 0:
            return bound
        return bound * np.exp(np.maximum(self.nets_[net_cls](x), 0.0))  # never faster than the roofline

    def to_dict(self) -> dict[str, Any]:
        return {
            "hidden": list(self.hidden),
            "alpha": self.alpha,
            "rows": self.rows_,
            "nets": {c: n.to_dict() for c, n in self.nets_.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelModel:
        obj = cls(hidden=tuple(data["hidden"]), alpha=data["alpha"])
        obj.nets_ = {c: _Net.from_dict(n) for c, n in data["nets"].items()}
        obj.rows_ = dict(data.get("rows", {}))
        return obj


def _features_rows(cls: str, dims: Mapping[str, np.ndarray], specs: list[GpuSpec]) -> tuple[np.ndarray, np.ndarray]:
    """Features of rows that may come from different GPUs (grouped by GPU)."""
    names = np.array([s.name for s in specs])
    xs, bounds = np.zeros((len(specs), 0)), np.zeros(len(specs))
    for name in dict.fromkeys(names):
        sel = names == name
        spec = specs[int(np.argmax(sel))]
        x, bound = features(cls, {k: np.asarray(v)[sel] for k, v in dims.items()}, spec, None, 4.0)
        if xs.shape[1] == 0:
            xs = np.zeros((len(specs), x.shape[1]))
        xs[sel], bounds[sel] = x, bound
    return xs, bounds


@functools.cache
def load_kernel_model() -> KernelModel:
    """The bundled model (``predictor/data/kernel_model.json``), as trained."""
    try:
        data = json.loads(resources.files("predictor.data").joinpath("kernel_model.json").read_text("utf-8"))
    except FileNotFoundError:
        raise PredictionError(
            "The kernel latency model is missing (predictor/data/kernel_model.json): reinstall lightning-srifty or "
            "run python scripts/train_kernel_model.py."
        ) from None
    if data.get("schema") != SCHEMA:
        raise PredictionError(
            f"predictor/data/kernel_model.json is {data.get('schema')!r}, this version reads {SCHEMA!r}: run "
            "python scripts/train_kernel_model.py."
        )
    return KernelModel.from_dict(data)


def spec_from_neusight(row: Mapping[str, str]) -> GpuSpec:
    """A GpuSpec from a row of NeuSight's devices.csv (training data)."""
    return GpuSpec(
        row["Device"],
        float(row["Num_Sm"]),
        float(row["Freq"]),
        float(row["L2Cache"]),
        float(row["Mem_Bw"]),
        float(row["SingleFLOPs"]) / 1e3,
    )


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured)) if len(measured) else math.nan
