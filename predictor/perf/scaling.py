"""Data-parallel losses beyond the all-reduce model: stragglers and communication contending with compute.

Published one-server figures lose a median 6% at 4 GPUs, 9% at 8 and 13% at 16 even on NVSwitch, where the ring
all-reduce of the gradients is fully hidden behind backward. Two mechanisms explain most of it, and both are
measured quantities or fitted constants here, never a per-model fudge:

- **Stragglers.** Every step waits for the slowest of n ranks. With step-to-step jitter of relative sd ``sigma``
  that costs ``sigma x E[max of n standard normals]`` of the compute (0.56 sigma at 2 ranks, 1.4 at 8, 1.8 at 16).
  The profile's own world size is already in its measured step, so only the difference is added. A profile from
  ``srifty_ddp`` with 2 or more ranks gives ``sigma`` directly (its ranks' compute-phase CV); otherwise the
  fitted constant is used.
- **Contention.** All-reduce kernels hidden behind backward still take SMs and memory bandwidth from it: a share
  ``kappa`` of the hidden communication time shows up as slower compute.
- **Bucket copies.** DDP copies every gradient into its bucket and the reduced bucket back, on the compute stream:
  ``copies`` passes over the gradient bytes at the GPU's memory bandwidth.

``sigma``, ``kappa`` and ``copies`` are fitted by ``scripts/fit_model.py`` on the same-GPU scaling figures of the
bundled measurements and validated leave-one-model-out (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from predictor.perf.artefact import model_artefact
from predictor.profile import Profile

DEFAULT_SIGMA = 0.06
DEFAULT_KAPPA = 0.2
DEFAULT_COPIES = 4.0  # gradient -> bucket and back, each a read and a write
_TABLE = 4096


@functools.cache
def _max_table() -> np.ndarray:
    """E[max of n standard normals] for n = 0.._TABLE (Blom's approximation, within 5% of the exact values)."""
    inv = statistics.NormalDist().inv_cdf
    return np.array([0.0, 0.0] + [inv((n - 0.375) / (n + 0.25)) for n in range(2, _TABLE + 1)])


def expected_max_normal(n: np.ndarray | float) -> np.ndarray:
    """E[max of n iid standard normals] (0 for n <= 1); vectorised, asymptotic beyond 4096."""
    arr = np.asarray(n, dtype=float)
    idx = np.clip(arr, 0, _TABLE).astype(int)
    out = _max_table()[idx]
    big = arr > _TABLE
    if np.any(big):
        ln = np.log(arr[big])
        out = np.array(out, dtype=float)  # a copy, and a 0-d array for a scalar n (a numpy scalar cannot be assigned)
        out[big] = np.sqrt(2 * ln) - (np.log(ln) + math.log(4 * math.pi)) / (2 * np.sqrt(2 * ln))
    return out


@dataclass(frozen=True)
class ScalingModel:
    """The data-parallel loss constants (see the module docstring)."""

    sigma: float = DEFAULT_SIGMA
    kappa: float = DEFAULT_KAPPA
    copies: float = DEFAULT_COPIES

    def loss(
        self,
        compute_s: np.ndarray,
        ranks: np.ndarray,
        hidden_comm_s: np.ndarray,
        grad_pass_s: np.ndarray | float = 0.0,
        *,
        source_ranks: int = 1,
        sigma: float | None = None,
    ) -> np.ndarray:
        """Seconds added to a step of ``ranks`` data-parallel ranks (0 for one rank)."""
        s = self.sigma if sigma is None else sigma
        extra = np.maximum(0.0, expected_max_normal(ranks) - float(expected_max_normal(source_ranks)))
        return np.where(ranks > 1, compute_s * s * extra + self.kappa * hidden_comm_s + self.copies * grad_pass_s, 0.0)


def scaling_model() -> ScalingModel:
    """The fitted constants from the model artefact (the defaults when it has none)."""
    fitted = model_artefact().get("scaling", {})
    return ScalingModel(
        float(fitted.get("sigma", DEFAULT_SIGMA)),
        float(fitted.get("kappa", DEFAULT_KAPPA)),
        float(fitted.get("copies", DEFAULT_COPIES)),
    )


def measured_sigma(profile: Profile) -> float | None:
    """The ranks' step-to-step jitter of compute (median forward+backward CV over ranks) when the profile comes from
    two or more ranks that recorded their phases; None otherwise."""
    ranks = profile.ranks or []
    cvs = []
    for r in ranks:
        phases = r.phases_s or {}
        parts = [phases.get(p) for p in ("forward", "backward")]
        if all(p is not None and p.cv is not None and p.mean for p in parts):
            total = sum(p.mean for p in parts)  # type: ignore[union-attr]
            var = sum((p.cv * p.mean) ** 2 for p in parts)  # type: ignore[union-attr]
            cvs.append(math.sqrt(var) / total)
    return statistics.median(cvs) if len(cvs) >= 2 else None
