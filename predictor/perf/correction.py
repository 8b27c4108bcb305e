"""A learned cross-GPU correction on top of the analytic compute/bandwidth split, trained on published measurements.

Target: the residual log(measured time ratio) - log(analytic ratio with a neutral compute-bound share of 0.5), per
sample, dst over src. Features describe the pair by specs only (never GPU identity), so it applies to GPUs absent
from the training data: log ratios of the precision's peak FLOPS, of memory bandwidth, of FP32 (CUDA-core) FLOPS, of
the batch, and the peak and bandwidth ratios again for mixed precision. Ridge regression without intercept (the same
GPU at the same batch needs no correction).

The artefact ``predictor/data/correction.json`` records the training data's sha256 and the scikit-learn version;
:func:`load_correction` retrains (in well under a second) rather than trusting an artefact that does not match.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from predictor.catalog.gpus import GPU
from predictor.exceptions import PredictionError
from predictor.perf.compute import peak_tflops

FEATURES = (
    "log_peak_ratio",
    "log_bw_ratio",
    "log_fp32_ratio",
    "log_batch_ratio",
    "amp_log_peak_ratio",
    "amp_log_bw_ratio",
)
SCHEMA = "srifty.correction/v1"


class NotFittedError(PredictionError, AttributeError):
    """predict() before fit()."""


def features(src: GPU, dst: GPU, precision: str, matmul_precision: str | None, batch_ratio: float) -> list[float]:
    """The feature vector of a (source GPU, target GPU) pair; ValueError when a spec is missing."""
    p_src, p_dst = peak_tflops(src, precision, matmul_precision), peak_tflops(dst, precision, matmul_precision)
    needed = (p_src, p_dst, src.memory_bw_gbps, dst.memory_bw_gbps, src.fp32_tflops, dst.fp32_tflops)
    if not all(needed):
        raise ValueError(f"missing specs for {src.key} or {dst.key}")
    amp = 0.0 if precision in ("32-true", "64-true") else 1.0
    log_peak = math.log(p_src / p_dst)
    log_bw = math.log(src.memory_bw_gbps / dst.memory_bw_gbps)
    return [
        log_peak,
        log_bw,
        math.log(src.fp32_tflops / dst.fp32_tflops),
        math.log(batch_ratio),
        amp * log_peak,
        amp * log_bw,
    ]


class CrossGpuCorrection:
    """Estimator: ``fit(X, y)`` returns self; learned attributes end in ``_``."""

    def __init__(self, *, alpha: float = 1.0) -> None:
        self.alpha = alpha

    def fit(self, X: list[list[float]], y: list[float]) -> CrossGpuCorrection:
        import numpy as np
        from sklearn.linear_model import Ridge

        model = Ridge(alpha=self.alpha, fit_intercept=False).fit(np.asarray(X), np.asarray(y))
        residuals = np.asarray(y) - model.predict(np.asarray(X))
        self.coef_ = [float(c) for c in model.coef_]
        self.residual_sd_ = float(np.std(residuals))
        self.n_samples_ = len(y)
        return self

    def predict_one(self, x: list[float]) -> float:
        """Predicted log(time ratio) for one feature vector."""
        if not hasattr(self, "coef_"):
            raise NotFittedError("This CrossGpuCorrection is not fitted yet: call fit(X, y) first.")
        return sum(c * v for c, v in zip(self.coef_, x))

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "coef": self.coef_,
            "residual_sd": self.residual_sd_,
            "n_samples": self.n_samples_,
            "gpus": sorted(getattr(self, "gpus_", [])),
        }

    def covers(self, *gpu_keys: str) -> bool:
        """True when every GPU was in the training data (leave-one-GPU-out validation shows the correction does
        not transfer to unseen GPUs, so it is applied only to seen ones)."""
        return all(k in getattr(self, "gpus_", ()) for k in gpu_keys)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CrossGpuCorrection:
        obj = cls(alpha=data["alpha"])
        obj.coef_, obj.residual_sd_, obj.n_samples_ = list(data["coef"]), data["residual_sd"], data["n_samples"]
        obj.gpus_ = list(data.get("gpus", []))
        return obj


def analytic_log_ratio(src: GPU, dst: GPU, precision: str, matmul: str | None) -> float:
    from predictor.perf.compute import compute_ratio

    return math.log(compute_ratio(src, dst, precision, matmul, None).ratio)


def training_set(cases: list[Any], gpus: Any) -> tuple[list[list[float]], list[float], list[Any]]:
    """(X, y, kept cases) from cross-GPU evaluation cases."""
    X, y, kept = [], [], []
    for c in cases:
        if c.kind != "cross":
            continue
        src, dst = gpus.gpus[c.src.gpu], gpus.gpus[c.dst.gpu]
        matmul = "high" if c.src.precision == "32-true" else None
        try:
            x = features(src, dst, c.src.precision, matmul, c.dst.batch / c.src.batch)
        except ValueError:
            continue
        X.append(x)
        y.append(math.log(c.src.throughput / c.dst.throughput) - analytic_log_ratio(src, dst, c.src.precision, matmul))
        kept.append(c)
    return X, y, kept


def data_path() -> Path:
    return Path(str(resources.files("predictor.data").joinpath("measurements.csv")))


def data_sha256() -> str:
    return hashlib.sha256(data_path().read_bytes()).hexdigest()


def train(path: Path | None = None) -> tuple[CrossGpuCorrection, dict[str, Any]]:
    """Train on every cross-GPU case of the bundled measurements; returns the model and the artefact."""
    from predictor.catalog.gpus import bundled_gpus
    from predictor.evaluation import build_cases, load_points

    path = path or data_path()
    gpus = bundled_gpus()
    X, y, kept = training_set(build_cases(load_points(path, gpus), gpus), gpus)
    model = CrossGpuCorrection().fit(X, y)
    model.gpus_ = sorted({g for c in kept for g in (c.src.gpu, c.dst.gpu)})
    artefact = {
        "schema": SCHEMA,
        "features": list(FEATURES),
        "sklearn_version": sklearn_version(),
        "data_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
        **model.to_dict(),
    }
    return model, artefact


def sklearn_version() -> str:
    from importlib.metadata import version  # no need to import scikit-learn itself to read its version

    return version("scikit-learn")


@functools.cache
def load_correction() -> CrossGpuCorrection:
    """The bundled correction, retrained when its data hash or scikit-learn version does not match."""
    try:
        artefact = json.loads(resources.files("predictor.data").joinpath("correction.json").read_text("utf-8"))
    except FileNotFoundError:
        artefact = {}
    if (
        artefact.get("schema") == SCHEMA
        and artefact.get("sklearn_version") == sklearn_version()
        and artefact.get("data_sha256") == data_sha256()
        and artefact.get("features") == list(FEATURES)
    ):
        return CrossGpuCorrection.from_dict(artefact)
    return train()[0]
