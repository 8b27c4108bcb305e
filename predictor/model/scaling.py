"""Data-parallel losses beyond the communication model: stragglers, communication contending with compute, and the
gradient copies the framework makes. Every term is a physical quantity with a bound; two constants are fitted.

- **Stragglers.** Every step waits for the slowest of n ranks. With step-to-step jitter of relative sd ``sigma``
  that costs ``sigma x E[max of n standard normals]`` of the compute (0.56 sigma at 2 ranks, 1.4 at 8, 1.8 at 16,
  3.0 at 512). The profile's own world size is already in its measured step, so only the difference is added. A
  profile from ``srifty_ddp`` with 2 or more ranks gives ``sigma`` directly (its ranks' compute-phase CV); otherwise
  the fitted constant is used, bounded by :data:`SIGMA_MAX`.
- **Contention.** NCCL's kernels run on SMs of their own while compute goes on (one thread block per channel, at
  most :data:`NCCL_MAX_CHANNELS`): while a collective is hidden behind compute, compute loses at most the share of
  SMs NCCL holds, ``min(kappa, NCCL_MAX_CHANNELS / SMs)`` of the hidden communication time. ``kappa`` is fitted;
  the bound is the GPU's (0 where no NCCL kernels run: gloo, whose collectives the host CPU does).
- **Gradient copies.** DDP copies every gradient into its bucket and the reduced bucket back on the compute stream
  (``gradient_as_bucket_view=False``, Lightning's default): :data:`DDP_GRAD_PASSES` passes (a read and a write each
  way) over the gradient bytes at the GPU's memory bandwidth, once per optimizer step. FSDP reduce-scatters the
  unsharded flat gradient of each unit after dividing it in place (``gradient_predivide_factor``): a read and a write
  of the compute-dtype gradient, every micro-step (:data:`FSDP_GRAD_PASSES`). Counted, not fitted.

``sigma`` and ``kappa`` are fitted by ``scripts/fit_model.py`` on the same-GPU DDP scaling figures (1-16 GPUs in one
server) and validated leave-one-model-out there; the FSDP multi-node regime (8-512 GPUs, ``bench/mpt_fsdp.py``) is
scored with them untouched, never refitted on it (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from predictor.documents.profile import Profile
from predictor.model.artefact import model_artefact

DEFAULT_SIGMA = 0.04
DEFAULT_KAPPA = 0.2
SIGMA_MAX = 0.1  # step-to-step jitter above 10% of the compute is a sick host, not a property of data parallelism
NCCL_MAX_CHANNELS = 32  # NCCL's MAXCHANNELS: one thread block (one SM) per channel
DDP_GRAD_PASSES = 4.0  # gradient -> bucket and back, each a read and a write
FSDP_GRAD_PASSES = 2.0  # the in-place pre-divide of the unsharded gradient before its reduce-scatter
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
    """The fitted data-parallel loss constants (see the module docstring); each is clipped to its physical bound
    where it is used."""

    sigma: float = DEFAULT_SIGMA
    kappa: float = DEFAULT_KAPPA

    def loss(
        self,
        compute_s: np.ndarray,
        ranks: np.ndarray,
        hidden_comm_s: np.ndarray,
        copies_s: np.ndarray | float = 0.0,
        *,
        contention_bound: np.ndarray | float = 1.0,
        source_ranks: int = 1,
        sigma: float | None = None,
    ) -> np.ndarray:
        """Seconds added to a step of ``ranks`` data-parallel ranks (0 for one rank): stragglers, contention of
        ``hidden_comm_s`` bounded by ``contention_bound`` (NCCL's share of the GPU's SMs), and ``copies_s`` (the
        framework's gradient copies, already counted in passes)."""
        s = min(max(self.sigma if sigma is None else sigma, 0.0), SIGMA_MAX)
        extra = np.maximum(0.0, expected_max_normal(ranks) - float(expected_max_normal(source_ranks)))
        kappa = np.minimum(max(self.kappa, 0.0), contention_bound)
        return np.where(ranks > 1, compute_s * s * extra + kappa * hidden_comm_s + copies_s, 0.0)


def contention_bound(sms: int | None, blocking_collectives: bool) -> float:
    """The share of a GPU's SMs NCCL's kernels can hold (0 without NCCL kernels, or when the SM count is unknown:
    nothing to bound by)."""
    if blocking_collectives or not sms:
        return 0.0
    return min(1.0, NCCL_MAX_CHANNELS / sms)


def scaling_model() -> ScalingModel:
    """The fitted constants from the model artefact (the defaults when it has none)."""
    fitted = model_artefact().get("scaling", {})
    return ScalingModel(float(fitted.get("sigma", DEFAULT_SIGMA)), float(fitted.get("kappa", DEFAULT_KAPPA)))


def measured_sigma(profile: Profile) -> float | None:
    """The ranks' step-to-step jitter of compute (median forward+backward CV over ranks) when the profile comes from
    two or more ranks that recorded their phases; None otherwise."""
    ranks = profile.ranks or ()
    cvs = []
    for r in ranks:
        phases = r.phases_s or {}
        parts = [phases.get(p) for p in ("forward", "backward")]
        known = [(p.mean, p.cv) for p in parts if p is not None and p.cv is not None and p.mean]
        if len(known) == len(parts):
            total = sum(mean for mean, _ in known)
            var = sum((cv * mean) ** 2 for mean, cv in known)
            cvs.append(math.sqrt(var) / total)
    return statistics.median(cvs) if len(cvs) >= 2 else None
