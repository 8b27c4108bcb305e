"""What spot interruptions and hardware failures cost a data-parallel run, in expectation (numpy, vectorised over
candidates).

A fleet of n instances, each interrupted at rate r per hour, is interrupted at rate n r (any loss stops synchronous
DDP). Every fleet, on-demand too, also loses a node without a notice at the hardware failure rate of its GPUs
(:data:`FAILURES_PER_GPU_HR` x its GPUs). With a checkpoint every tau seconds costing C seconds, Young-Daly's interval
tau = sqrt(2 C M) (M = mean time between interruptions and failures) minimises the expected overhead; each
interruption costs re-provisioning + restart + checkpoint load, and either a save on the interruption notice, where
the save fits EC2's two-minute notice (:func:`saves_on_notice`: what SpotPreemption does; nothing trained is lost),
or the work lost since the last checkpoint (tau / 2 on average); a failure always loses that work. The replay of a
run (:mod:`predictor.runs.deadline`) reads the same rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

REPROVISION_S = 300.0  # new spot capacity found and booted
RESTART_S = 120.0  # processes started, rendezvous, data loaders warm
DEFAULT_CHECKPOINT_S = 30.0  # checkpoint save (and load) time when the profile has not measured it: its floor
# An unmeasured checkpoint's write rate: the fleet's root volume is gp3 (terraform/modules/training_fleet), whose
# baseline throughput is 125 MiB/s ("Amazon EBS General Purpose SSD volumes", Amazon EBS User Guide: 3,000 IOPS and
# 125 MiB/s included); a sharded checkpoint is saved to it before its upload, a file read back from it on a resume.
# Bounds of the estimate: DEFAULT_CHECKPOINT_S below it, a save never priced under the volume's baseline.
ROOT_VOLUME_BYTES_S = 125 * 2**20


def estimated_checkpoint_s(state_bytes: float) -> float:
    """What saving ``state_bytes`` costs where no profile measured it: written at the root volume's baseline, at
    least :data:`DEFAULT_CHECKPOINT_S` (a bf16-mixed 7B model's 81 GB of weights and Adam state: 10 min, not 30 s).
    It is also what loading it costs on any fleet: each node brings the whole checkpoint onto its disk first
    (:func:`lightning_srifty.migrate.checkpoints.on_this_node`)."""
    return max(DEFAULT_CHECKPOINT_S, float(state_bytes) / ROOT_VOLUME_BYTES_S)


def sharded_save_s(checkpoint_s: float, share: np.ndarray | float) -> np.ndarray:
    """An unmeasured checkpoint's save on a fleet whose busiest node writes ``share`` of it, each node at once at its
    own root volume's baseline (:func:`busiest_node_share`). Bounds: the whole save on one node above,
    :data:`DEFAULT_CHECKPOINT_S` below (a small checkpoint's save is not sped up)."""
    whole = float(checkpoint_s)
    part = np.clip(np.asarray(share, dtype=float), 0.0, 1.0)
    return np.where(whole > DEFAULT_CHECKPOINT_S, np.maximum(DEFAULT_CHECKPOINT_S, whole * part), whole)


def busiest_node_share(group_gpus: np.ndarray, counts: np.ndarray, sharded: np.ndarray | bool) -> np.ndarray:
    """The share of a checkpoint the busiest node of each fleet writes: (N, K) GPUs and instances of each group.
    A sharded state dict (FSDP's, every layout's ``state_dict_type="sharded"``) is written by every rank at once, an
    equal part each (replicated items spread over the ranks holding them: torch.distributed.checkpoint's default
    planner gives each to the smallest plan, ``dedup_save_plans``), so the node with the most GPUs writes its GPUs'
    share; DDP's rank 0 writes it all (1)."""
    group_gpus, counts = np.atleast_2d(group_gpus).astype(float), np.atleast_2d(counts).astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_node = np.where(counts > 0, group_gpus / counts, 0.0).max(axis=1)
        share = per_node / group_gpus.sum(axis=1)
    return np.where(np.asarray(sharded) & np.isfinite(share), share, 1.0)


def planned_save_s(plan: Any, entry: Any) -> float:
    """One checkpoint save on ``entry``'s fleet as the plan priced it: the entry's own (``checkpoint_s``: an
    unmeasured save spread over a sharded fleet's nodes), else the plan's, else :data:`DEFAULT_CHECKPOINT_S`."""
    for seconds in (entry.checkpoint_s, plan.checkpoint_s):
        if seconds is not None:
            return float(seconds)
    return DEFAULT_CHECKPOINT_S


# EC2's spot interruption notice ("Spot Instance interruption notices", Amazon EC2 User Guide: "two minutes before")
NOTICE_S = 120.0
NOTICE_MARGIN_S = 10.0  # what the leaving job needs of the notice besides its save (the step in flight, the record)
# Failures without a notice (a GPU, its memory, a host, a link), per GPU-hour, on-demand and spot alike: Meta's
# OPT-175B run on 992 cloud A100s was interrupted every 7.5 h (its logbook; G. Lockwood's table of job interruption
# rates, glennklockwood.com/garden/job-reliability): 1 / (7.5 x 992). Held out, Llama 3 405B's 419 unexpected
# interruptions in 54 days on 16,384 H100s ("The Llama 3 Herd of Models", Table 5) are 2.0e-5 per GPU-hour, 6.8x
# fewer; tau follows 1/sqrt(rate), and an interval set for a rate k x off costs (sqrt(k) + 1/sqrt(k)) / 2 of the
# optimum's overhead: 1.5x there (BENCHMARKS.md, "On-demand fleets checkpoint too"). Bounds: a rate per GPU-hour in
# [1e-6, 1e-2] (a GPU-century to a failure every 100 h of one GPU).
FAILURES_PER_GPU_HR = 1.0 / (7.5 * 992)
FAILURE_RATE_BOUNDS = (1e-6, 1e-2)


def saves_on_notice(checkpoint_s: np.ndarray | float) -> np.ndarray:
    """Whether a checkpoint save fits the spot notice (SpotPreemption saves on it), per save given: then an
    interruption loses nothing trained, else the work since the last periodic checkpoint."""
    return np.asarray(checkpoint_s, dtype=float) <= NOTICE_S - NOTICE_MARGIN_S


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
    checkpoint_s: np.ndarray | float = DEFAULT_CHECKPOINT_S,
    restart_s: np.ndarray | float = REPROVISION_S + RESTART_S,
    gpus: np.ndarray | float = 0.0,
    load_s: np.ndarray | float | None = None,
    max_interval_s: np.ndarray | float = math.inf,
) -> SpotCost:
    """Expected interruptions and total time of ``work_s`` seconds of training on spot capacity.

    ``rate_per_hr`` is each instance's interruption rate (0 for on-demand); ``checkpoint_s`` each fleet's save and
    ``load_s`` its load after an interruption (default: the save's); ``restart_s`` what bringing the fleet
    back costs after an interruption (its start-up: :mod:`predictor.runs.startup`); ``gpus`` the fleet's GPUs, which
    fail without a notice at :data:`FAILURES_PER_GPU_HR` each (0: failures left out). The Young-Daly interval is
    capped by the run: a run shorter than the interval takes no periodic checkpoint and loses, on average, half of
    itself, and by ``max_interval_s`` (a deadline's: :func:`deadline_interval_s`). ``expected_interruptions`` counts
    spot interruptions only (0 on-demand); failures are in the overhead.
    """
    work_s = np.asarray(work_s, dtype=float)
    checkpoint_s = np.asarray(checkpoint_s, dtype=float)
    load = checkpoint_s if load_s is None else np.asarray(load_s, dtype=float)
    fleet_rate = np.asarray(instances, dtype=float) * np.asarray(rate_per_hr, dtype=float) / 3600.0  # per second
    failure_rate = np.asarray(gpus, dtype=float) * FAILURES_PER_GPU_HR / 3600.0
    with np.errstate(divide="ignore", invalid="ignore"):
        both = fleet_rate + failure_rate
        mtbi = np.where(both > 0, 1.0 / both, np.inf)
        tau = np.minimum(np.where(np.isfinite(mtbi), np.sqrt(2.0 * checkpoint_s * mtbi), np.inf), max_interval_s)
        periodic = np.isfinite(tau) & (tau < work_s)
        tau = np.where(periodic, tau, np.inf)
        # checkpoints slow the run by C / tau (kept where the save fits the notice too: a notice can come late or
        # not at all); each interruption costs the restart + a checkpoint load + the save on the notice, or, where
        # the save does not fit it, the work lost since the last checkpoint (half an interval, or half the run),
        # which a failure (no notice) always loses
        checkpoint_time = np.where(periodic, work_s * checkpoint_s / tau, 0.0)
        unsaved = np.where(periodic, tau, work_s) / 2.0
        lost = np.where(saves_on_notice(checkpoint_s), checkpoint_s, unsaved)
        per_interruption = restart_s + load + lost
        per_failure = restart_s + load + unsaved
    running = work_s + checkpoint_time
    interruptions = fleet_rate * running
    overhead = checkpoint_time + interruptions * per_interruption + failure_rate * running * per_failure
    return SpotCost(interruptions, tau, overhead, work_s + overhead, np.where(fleet_rate > 0, per_interruption, 0.0))


def deadline_interval_s(slack_s: np.ndarray, work_s: np.ndarray, save_s: np.ndarray) -> np.ndarray:
    """The longest periodic checkpoint interval a spot fleet whose save does not fit the notice may keep under a
    deadline (:func:`predictor.runs.deadline.must_run_on_demand` counts only the work a preemption cannot lose).

    Between saves the work since the last one (up to an interval, ``tau``) is at risk, and the saves themselves take
    ``work x save / tau``: both must fit in the ``slack_s`` the deadline leaves once the run, its start-up and one
    restart are taken out, or the hard rule sends a fleet spot never interrupts to on-demand to commit its work, and
    back (a replay of a 7B on one p4d under a 36.6 h deadline: 16 starts, 7.2 h restarting, $150 against the $72.68
    priced). ``tau + W C / tau <= S``: the larger root, ``(S + sqrt(S^2 - 4 W C)) / 2`` (the fewest saves); where
    none fits (``S^2 < 4 W C``), ``sqrt(W C)``, the interval that spends the least slack (the run then finishes
    on-demand when it must). Never shorter than a save. Bounds: ``[save, inf)``."""
    slack = np.asarray(slack_s, dtype=float)
    wc = np.maximum(np.asarray(work_s, dtype=float), 0.0) * np.asarray(save_s, dtype=float)
    disc = slack * slack - 4.0 * wc
    with np.errstate(invalid="ignore"):
        tau = np.where((slack > 0) & (disc >= 0), (slack + np.sqrt(np.maximum(disc, 0.0))) / 2.0, np.sqrt(wc))
    return np.maximum(tau, np.asarray(save_s, dtype=float))


# What the deadline's checkpoint interval leaves beside the work at risk and the saves: two decisions of the traces'
# 600 s (the hard rule acts a decision early, and the replay rounds the work and each restart up to whole decisions).
DECISION_MARGIN_S = 1200.0


def deadline_interval_cap_s(
    deadline_s: float,
    startup_s: np.ndarray | float,
    save_s: np.ndarray | float,
    load_s: float,
    run_s: np.ndarray | float,
    gpus: np.ndarray | float,
    factor: np.ndarray | float,
) -> np.ndarray:
    """The periodic checkpoint interval a guarded fleet whose save misses the spot notice keeps under a deadline
    (:func:`deadline_interval_s`), from its slack: the deadline less a first start and one restart kept in hand (each
    the start-up, a save and a load: the replay prices every start so), the work as an on-demand finish takes it
    (its node failures and saves, :func:`on_demand_cost`) at the plan's confidence (``factor``: its quantile over
    the prediction) and :data:`DECISION_MARGIN_S`. The ranking, the replay, the launch's guard and the job's
    periodic save all take it from here."""
    run = np.atleast_1d(np.asarray(run_s, dtype=float) * factor)
    save = np.asarray(save_s, dtype=float)
    work = on_demand_cost(run, save, restart_s=startup_s, gpus=gpus, load_s=load_s).expected_time_s
    slack = deadline_s - 2.0 * (np.asarray(startup_s, dtype=float) + save + load_s) - work - DECISION_MARGIN_S
    return deadline_interval_s(slack, run, save)


def on_demand_cost(
    work_s: np.ndarray | float,
    checkpoint_s: np.ndarray | float | None,
    restart_s: np.ndarray | float,
    gpus: np.ndarray | float,
    load_s: np.ndarray | float | None = None,
) -> SpotCost:
    """``work_s`` seconds of training on an on-demand fleet of ``gpus`` GPUs: no spot interruptions, its node failures
    (:data:`FAILURES_PER_GPU_HR`) and the periodic checkpoints they call for, each failure costing ``restart_s`` and
    a load (``load_s``, default the save's). ``checkpoint_s`` None is a plan that measured no save
    (:data:`DEFAULT_CHECKPOINT_S`). The one rule the ranking, the deadline's on-demand spells, the current fleet, the
    runtime replan and srifty launch's fallback share."""
    work = np.atleast_1d(np.asarray(work_s, dtype=float))
    none = np.zeros(work.shape)
    save = DEFAULT_CHECKPOINT_S if checkpoint_s is None else checkpoint_s
    return spot_cost(work, none + 1.0, none, save, restart_s=restart_s, gpus=gpus, load_s=load_s)


def on_demand_time_s(
    work_s: float,
    checkpoint_s: float | None,
    restart_s: float,
    gpus: float,
    confidence: float | None = None,
    load_s: float | None = None,
) -> float:
    """An on-demand finish of ``work_s`` seconds of training (:func:`on_demand_cost`'s fleet): its expected wall time
    when ``confidence`` is None, else the time it stays within with probability ``confidence`` (``load_s``: a
    checkpoint's load, default its save's).

    The same run as :func:`on_demand_cost` prices, drawn: the training and its periodic saves take a fixed time; node
    failures arrive as a Poisson process over it (mean: the fleet's failure rate x that time), and each costs the
    restart, a checkpoint load and the training since the last save, uniform over the interval (the whole run where
    it takes no periodic save). The extra time's distribution is a Poisson mixture of Irwin-Hall sums, exact up to 12
    failures and normal beyond, its quantile found by bisection. Its mean is :func:`on_demand_cost`'s overhead.
    """
    priced = on_demand_cost(work_s, checkpoint_s, restart_s=restart_s, gpus=gpus, load_s=load_s)
    expected = float(priced.expected_time_s[0])
    if confidence is None:
        return expected
    work = float(work_s)
    save = DEFAULT_CHECKPOINT_S if checkpoint_s is None else float(checkpoint_s)
    tau = float(priced.checkpoint_interval_s[0])
    window = tau if math.isfinite(tau) else work  # the training a failure can lose: up to an interval, or the run
    running = work + (work * save / tau if math.isfinite(tau) else 0.0)
    mean_failures = float(gpus) * FAILURES_PER_GPU_HR / 3600.0 * running
    if mean_failures <= 0 or window <= 0:
        return running
    fixed = float(restart_s) + (save if load_s is None else float(load_s))  # each failure's restart and load
    spread = 12 * math.sqrt(mean_failures) + 12  # the Poisson tails beyond it are below 1e-9
    first, last = max(0, int(mean_failures - spread)), int(mean_failures + spread)
    # each count's probability in log space: exp(-mean) alone underflows past about 745 failures
    pmf = [math.exp(n * math.log(mean_failures) - mean_failures - math.lgamma(n + 1)) for n in range(first, last + 1)]

    def below(extra: float) -> float:  # P(the failures' extra time <= extra)
        return sum(p * _irwin_hall_cdf(n, (extra - n * fixed) / window) for n, p in enumerate(pmf, start=first))

    lo, hi = 0.0, last * (fixed + window)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if below(mid) >= confidence else (mid, hi)
    return running + hi


def _irwin_hall_cdf(n: int, x: float) -> float:
    """P(the sum of ``n`` independent uniforms on [0, 1] <= ``x``): exact to 12 terms, normal beyond."""
    if n == 0 or x >= n:
        return 1.0 if x >= 0 else 0.0
    if x <= 0:
        return 0.0
    if n > 12:
        return NormalDist(n / 2, math.sqrt(n / 12)).cdf(x)
    return sum((-1) ** k * math.comb(n, k) * (x - k) ** n for k in range(int(x) + 1)) / math.factorial(n)


def risk_label(expected_interruptions: np.ndarray) -> np.ndarray:
    """'none' (on-demand), 'low' (< 0.5 expected), 'medium' (< 2), 'high'."""
    e = np.asarray(expected_interruptions, dtype=float)
    return np.where(e == 0, "none", np.where(e < 0.5, "low", np.where(e < 2, "medium", "high")))
