"""How sure a prediction is: the model's error by kind of prediction, and the one interval formula.

A prediction's relative sd combines the profile's own run-to-run CV with the model's error for the kind of
prediction it is (same GPU, data-parallel scaling, cross-GPU with or without an operator table, from a CPU
profile). The model errors are the standard deviations of held-out log residuals (leave-one-model-out and
leave-one-GPU-out, never in-sample), written by ``scripts/fit_model.py`` into ``predictor/data/model_v3.json``;
the 80% interval is ``t x exp(+-1.2816 sd)``.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import overload

import numpy as np

from predictor.model.artefact import model_artefact

Z80 = 1.2816  # p10/p90 of a normal
# judgement, used when the artefact has no held-out figure for a kind (never measured here): "same" is one GPU as
# profiled (run-to-run only); "from_cpu" is a profile without a GPU and without an operator table
DEFAULT_ERRORS = {
    "same": 0.05,
    "scaling": 0.12,
    "cross": 0.32,
    "cross-tf32": 0.55,
    "cross-flops": 0.15,
    "cross-flops-tf32": 0.3,
    "cross-corrected": 0.27,
    "cross-corrected-tf32": 0.7,
    "cross-ops": 0.15,
    "ops-absolute": 0.3,
    "ops-absolute-sharded": 0.3,
    "from_cpu": 0.5,
    "net-host-staged": 0.55,
}
# a kind whose width was also calibrated on whole sharded (FSDP) multi-GPU steps, under its own name: under a sharded
# layout that width is the prediction's, in place of the kind's (one GPU, DDP) width and the DDP-calibrated "scaling"
# floor, neither of which was validated on sharded steps (issue #21: no constant of one regime in another)
SHARDED_KINDS = {"ops-absolute": "ops-absolute-sharded"}


def sharded_error(kind: str, gpu: str | None = None) -> float:
    """The width of ``kind`` on whole sharded multi-GPU steps on ``gpu`` (NaN: none was calibrated for that kind, or
    not on that GPU: the artefact's ``errors_gpus`` names the GPUs a width was calibrated on, and a GPU outside them
    keeps the one-GPU width and the scaling floor, as wide or wider; none named: any GPU)."""
    if kind not in SHARDED_KINDS:
        return float("nan")
    sharded = SHARDED_KINDS[kind]
    gpus = model_artefact().get("errors_gpus", {}).get(sharded)
    if gpu is not None and gpus is not None and gpu not in gpus:
        return float("nan")
    return model_error(sharded)


def model_error(kind: str) -> float:
    """Relative sd of the model for a kind of prediction (held-out residual sd where measured)."""
    measured = model_artefact().get("errors", {})
    if kind in measured:
        return float(measured[kind])
    return DEFAULT_ERRORS[kind]


@overload
def combined_sd(cv: float, model_sd: float) -> float: ...
@overload
def combined_sd(cv: float | np.ndarray, model_sd: np.ndarray) -> np.ndarray: ...
@overload
def combined_sd(cv: np.ndarray, model_sd: float | np.ndarray) -> np.ndarray: ...
def combined_sd(cv: float | np.ndarray, model_sd: float | np.ndarray) -> float | np.ndarray:
    """The prediction's relative sd from the profile's CV and the model's error."""
    return np.hypot(cv, model_sd)


MAX_SD = 3.0  # a relative sd beyond this (a factor of ~47 either way) says nothing more: the interval stops widening


def interval(value: float | np.ndarray, sd: float | np.ndarray) -> tuple:
    """The 80% interval of a positive quantity with relative sd ``sd`` (log-normal); scalars in, floats out. An sd
    past ``MAX_SD`` (a profile whose spread is absurd) is capped, so the bounds stay finite."""
    factor = np.exp(Z80 * np.minimum(np.nan_to_num(sd, nan=MAX_SD), MAX_SD))
    low, high = value / factor, value * factor
    if np.ndim(low) == 0:
        return float(low), float(high)
    return low, high


def z_of(confidence: float) -> float:
    """The standard normal quantile of ``confidence`` (0.9 -> 1.2816): a log-normal time's ``confidence``-quantile is
    ``t x exp(z sd)``."""
    return NormalDist().inv_cdf(confidence)


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF, vectorised (erf by Abramowitz and Stegun 7.1.26, absolute error under 1.5e-7);
    +-inf give 1 and 0."""
    x = np.asarray(x, dtype=float)
    z = np.abs(x) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return np.where(x >= 0, 0.5 * (1.0 + erf), 0.5 * (1.0 - erf))
