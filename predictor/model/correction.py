"""A learned cross-GPU correction on top of the analytic compute/bandwidth split, trained on published measurements.

Target: the residual log(measured time ratio) - log(analytic ratio with a neutral compute-bound share of 0.5), per
sample, dst over src. Features describe the pair by specs only (never GPU identity), so it applies to GPUs absent
from the training data: log ratios of the precision's peak FLOPS, of memory bandwidth, of FP32 (CUDA-core) FLOPS, of
the batch, and the peak and bandwidth ratios again for mixed precision. Ridge regression without intercept (the same
GPU at the same batch needs no correction).

The artefact ``predictor/data/correction.json`` (written by ``scripts/fit_model.py``, training in
:func:`predictor.validation.train_correction`) records the training data's sha256 and the scikit-learn version; its
coefficients are plain numbers, so :func:`load_correction` reads them under any library version and never trains.
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from typing import Any

from predictor.catalog.gpus import GPU
from predictor.exceptions import PredictionError
from predictor.model.compute import peak_tflops

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
    if not (p_src and p_dst and src.memory_bw_gbps and dst.memory_bw_gbps and src.fp32_tflops and dst.fp32_tflops):
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

    # learned: declared only (no class value), so an unfitted instance has none of them (predict_one checks)
    coef_: list[float]
    residual_sd_: float
    n_samples_: int
    gpus_: list[str]  # the GPUs of the training data (set by train_correction and from_dict)

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
    from predictor.model.compute import compute_ratio

    return math.log(compute_ratio(src, dst, precision, matmul, None).ratio)


def sklearn_version() -> str:
    from importlib.metadata import version  # no need to import scikit-learn itself to read its version

    return version("scikit-learn")


@functools.cache
def load_correction() -> CrossGpuCorrection:
    """The bundled correction as fitted (plain coefficients, read by any library version; never trained on load).

    A missing or foreign artefact gives a correction that covers no GPU, so the analytic split is used alone;
    ``python scripts/fit_model.py`` rebuilds it.
    """
    try:
        artefact = json.loads(resources.files("predictor.data").joinpath("correction.json").read_text("utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        artefact = {}
    if artefact.get("schema") == SCHEMA and artefact.get("features") == list(FEATURES):
        return CrossGpuCorrection.from_dict(artefact)
    empty = CrossGpuCorrection()
    empty.coef_, empty.residual_sd_, empty.n_samples_, empty.gpus_ = [0.0] * len(FEATURES), 0.0, 0, []
    return empty
