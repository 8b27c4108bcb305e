"""What spot interruptions cost a data-parallel run, in expectation (numpy, vectorised over candidates).

A fleet of n instances, each interrupted at rate r per hour, is interrupted at rate n r (any loss stops synchronous
DDP). With a checkpoint every tau seconds costing C seconds, Young-Daly's interval tau = sqrt(2 C M) (M = mean time
between interruptions) minimises the expected overhead; each interruption costs re-provisioning + restart +
checkpoint load, and either a save on the interruption notice, where the save fits EC2's two-minute notice
(:func:`saves_on_notice`: what SpotPreemption does; nothing trained is lost), or the work lost since the last
checkpoint (tau / 2 on average). The replay of a run (:mod:`predictor.runs.deadline`) reads the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REPROVISION_S = 300.0  # new spot capacity found and booted
RESTART_S = 120.0  # processes started, rendezvous, data loaders warm
DEFAULT_CHECKPOINT_S = 30.0  # checkpoint save (and load) time when the profile has not measured it
# EC2's spot interruption notice ("Spot Instance interruption notices", Amazon EC2 User Guide: "two minutes before")
NOTICE_S = 120.0
NOTICE_MARGIN_S = 10.0  # what the leaving job needs of the notice besides its save (the step in flight, the record)


def saves_on_notice(checkpoint_s: float) -> bool:
    """Whether a checkpoint save fits the spot notice (SpotPreemption saves on it): then an interruption loses
    nothing trained, else the work since the last periodic checkpoint."""
    return float(checkpoint_s) <= NOTICE_S - NOTICE_MARGIN_S


@dataclass(frozen=True)
class SpotCost:
    """Arrays aligned with the candidates."""

    expected_interruptions: np.ndarray
    checkpoint_interval_s: np.ndarray
    overhead_s: np.ndarray  # checkpoint writes + interruptions, in expectation
    expected_time_s: np.ndarray
    # re-provision + restart + checkpoint load, and the save on the notice or half an interval of lost work
    per_interruption_s: np.ndarray


SHUTDOWN_GRACE_S = (60, 900)  # torchrun's wait for workers to leave, bounds (its own default is 30 s)


def shutdown_grace_s(checkpoint_s: float | None) -> int:
    """How long torchrun lets workers finish after SIGTERM before SIGKILL: twice the checkpoint save plus 30 s (the
    save of a leaving job must never be cut), within :data:`SHUTDOWN_GRACE_S`. 30 s, torchrun's default, killed a
    worker in a 40 s save."""
    save = DEFAULT_CHECKPOINT_S if checkpoint_s is None else float(checkpoint_s)
    low, high = SHUTDOWN_GRACE_S
    return int(min(high, max(low, math.ceil(2 * save + 30))))


def spot_cost(
    work_s: np.ndarray,
    instances: np.ndarray,
    rate_per_hr: np.ndarray,
    checkpoint_s: float = DEFAULT_CHECKPOINT_S,
    restart_s: np.ndarray | float = REPROVISION_S + RESTART_S,
) -> SpotCost:
    """Expected interruptions and total time of ``work_s`` seconds of training on spot capacity.

    ``rate_per_hr`` is each instance's interruption rate (0 for on-demand); ``restart_s`` what bringing the fleet
    back costs after an interruption (its start-up: :mod:`predictor.runs.startup`). The Young-Daly interval is capped
    by the run: a run shorter than the interval takes no periodic checkpoint and loses, on average, half of itself.
    """
    work_s = np.asarray(work_s, dtype=float)
    fleet_rate = np.asarray(instances, dtype=float) * np.asarray(rate_per_hr, dtype=float) / 3600.0  # per second
    with np.errstate(divide="ignore", invalid="ignore"):
        mtbi = np.where(fleet_rate > 0, 1.0 / fleet_rate, np.inf)
        tau = np.where(np.isfinite(mtbi), np.sqrt(2.0 * checkpoint_s * mtbi), np.inf)
        periodic = np.isfinite(tau) & (tau < work_s)
        tau = np.where(periodic, tau, np.inf)
        # checkpoints slow the run by C / tau (kept where the save fits the notice too: a notice can come late or
        # not at all); each interruption costs the restart + a checkpoint load + the save on the notice, or, where
        # the save does not fit it, the work lost since the last checkpoint (half an interval, or half the run)
        checkpoint_time = np.where(periodic, work_s * checkpoint_s / tau, 0.0)
        lost = checkpoint_s if saves_on_notice(checkpoint_s) else np.where(periodic, tau, work_s) / 2.0
        per_interruption = restart_s + checkpoint_s + lost
    running = work_s + checkpoint_time
    interruptions = fleet_rate * running
    overhead = checkpoint_time + interruptions * per_interruption
    return SpotCost(interruptions, tau, overhead, work_s + overhead, np.where(fleet_rate > 0, per_interruption, 0.0))


def risk_label(expected_interruptions: np.ndarray) -> np.ndarray:
    """'none' (on-demand), 'low' (< 0.5 expected), 'medium' (< 2), 'high'."""
    e = np.asarray(expected_interruptions, dtype=float)
    return np.where(e == 0, "none", np.where(e < 0.5, "low", np.where(e < 2, "medium", "high")))
