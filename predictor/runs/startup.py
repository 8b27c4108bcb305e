"""What a new fleet costs before its first useful step: start-up time, and the billing minimum.

A fleet's start-up is what passes from "launch" to the first step at the predicted speed:

- **provisioning** (per instance type): EC2 finds the capacity and the instance goes from ``pending`` to
  ``running``. Defaults below, by size class; replaced by the median of what ``srifty launch`` measured for that type
  on this machine (the provisioner's time to bring the fleet up: :func:`record`, :func:`measured`);
- **boot**: the image boots (NVIDIA driver, EFA) until ``user_data`` runs;
- **environment setup**: the setup command (e.g. ``pip install`` of the project into the Deep Learning AMI's
  PyTorch environment) and the image's first import of torch; boot, setup and warm-up together are replaced by the
  median of what ``srifty launch`` measured for the type from the fleet up to the job's first step
  (:func:`record_ready`: a node's own install of the profiled environment, from PyPI on a first boot and from the
  fleet's wheelhouse after);
- **data staging**: ``dataset_gb`` copied to each instance at the slower of its network and S3's per-instance rate;
- **warm-up**: process start, rendezvous, CUDA context, cuDNN autotuning and data-loader workers before the steady
  state (compilation with ``torch.compile`` takes longer: set ``startup_s``).

Instances start in parallel, so a fleet's start-up is its slowest group's. Everything here is overridable (one
number for the whole start-up: ``Constraints.startup_s``); the defaults are judgement, stated with their basis:

- AWS documents that an instance is ``pending`` while it is provisioned and ``running`` once booted; launches of
  GPU instances with the Deep Learning AMI take 2-3 minutes from request to SSH in AWS's DLAMI tutorials, and the
  large multi-card instances (p4d, p5: 4-32 network cards, EFA) take longer and more often wait for capacity;
- the setup and warm-up defaults are what this project's own launches against moto cannot measure; they are
  deliberately round and documented in docs/performance-model.md.

Billing: EC2 bills Linux instances per second with a 60-second minimum per instance (on-demand and spot), from
``running`` to termination; the boot is billed, the provisioning wait is not (counted here as billed: a small,
conservative error).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.catalog.catalog import cache_dir
from predictor.catalog.instances import InstanceType
from predictor.documents.atomic import atomic_write_json

BILLING_MINIMUM_S = 60.0  # per instance, per-second billing (Linux on-demand and spot)
SETUP_S = 120.0  # the setup command and the first import of torch
WARMUP_S = 60.0  # processes, rendezvous, CUDA context, autotuning, data loaders
S3_GBPS_PER_INSTANCE = 10.0  # a single instance's sustained S3 download with parallel requests (rough)
# An "up to" network's I/O credits, in seconds of its baseline: a published S3 download loop (2019,
# bench/data/ec2_network_baseline.csv) throttled c5.xlarge (up to 10, baseline 1.25 Gbit/s) after 13 minutes and
# c5.2xlarge (baseline 2.5) after 26: (10 - baseline) x burst / baseline = 5,460 and 4,680 s, a bucket in proportion
# to the baseline; their geometric mean. Bounds: a burst AWS says lasts "typically from 5 to 60 minutes" (EC2 User
# Guide, "Amazon EC2 instance network bandwidth"): 6.8 min for m5.large's 0.75 Gbit/s, 28 for g5.xlarge's 2.5.
UP_TO_CREDIT_S = (5460.0 * 4680.0) ** 0.5
LARGE_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "p6", "trn1", "trn2")  # multi-card, EFA, scarce capacity
PROVISION_S = {"large": 300.0, "default": 60.0}
BOOT_S = 120.0  # the Deep Learning AMI from running to user_data (driver and services)
MAX_MEASUREMENTS = 20  # per instance type, the newest kept


def default_provision_s(it: InstanceType) -> float:
    family = it.name.split(".", 1)[0]
    return PROVISION_S["large" if family in LARGE_FAMILIES else "default"]


def store_path() -> Path:
    """Where measured start-ups are kept: ``startup.json`` in the cache folder the catalog uses
    (``$SRIFTY_CACHE_DIR`` or ``$XDG_CACHE_HOME/lightning-srifty``)."""

    return cache_dir() / "startup.json"


def measured() -> dict[str, float]:
    """Instance type -> median measured provisioning seconds (empty when nothing was measured or the file
    cannot be read: a cache, never a reason to fail)."""
    return _medians("provision_s")


def measured_ready() -> dict[str, float]:
    """Instance type -> median measured seconds from the fleet up to the job's first step (boot, the environment's
    install, warm-up: :func:`record_ready`); empty when none was measured."""
    return _medians("ready_s")


def _medians(key: str) -> dict[str, float]:
    try:
        data = json.loads(store_path().read_text(encoding="utf-8"))
        return {
            str(k): float(statistics.median(float(x) for x in v))
            for k, v in data.get(key, {}).items()
            if isinstance(v, list) and v
        }
    except (OSError, ValueError, TypeError, AttributeError, statistics.StatisticsError):
        return {}


def record_ready(instance_types: Iterable[str], seconds: float) -> None:
    """Add one measured time from a fleet up to its job's first step (``srifty launch``: the first step's time, which
    the job writes in ``STARTED.json``, less the fleet's provisioning): what a node's boot, the environment's install
    (from PyPI on a first boot, from the fleet's wheelhouse after) and the warm-up took. Up to 3 h is kept (a longer
    one is a stalled start, not a start-up)."""
    if 0 < seconds <= 3 * 3600:
        record(instance_types, seconds, key="ready_s")


def record(instance_types: Iterable[str], seconds: float, key: str = "provision_s") -> None:
    """Add one measured provisioning (``srifty launch``: from asking for the fleet to the fleet up) for each
    of the fleet's instance types (``key``: another figure, :func:`record_ready`); best effort, atomic."""

    if not (seconds >= 0 and np.isfinite(seconds)):
        return
    path = store_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        runs = data.setdefault(key, {})
        for name in set(instance_types):
            runs[name] = ([*runs.get(name, []), round(float(seconds), 1)])[-MAX_MEASUREMENTS:]
        data["updated_unix"] = round(time.time())
        atomic_write_json(path, data)
    except (OSError, ValueError, TypeError, AttributeError):
        pass


@dataclass(frozen=True)
class TypeStartup:
    """One instance type's start-up, in seconds, and where its provisioning figure came from."""

    provision_s: float
    boot_s: float
    setup_s: float
    data_s: float
    warmup_s: float
    source: str  # "measured (n launches)" or "default"

    @property
    def total_s(self) -> float:
        return self.provision_s + self.boot_s + self.setup_s + self.data_s + self.warmup_s


def type_startup(
    it: InstanceType,
    dataset_gb: float = 0.0,
    known: dict[str, float] | None = None,
    ready: dict[str, float] | None = None,
) -> TypeStartup:
    """The start-up of one instance of ``it`` (``known``: measured provisioning by type, :func:`measured`; ``ready``:
    measured boot to first step by type, :func:`measured_ready`, which replaces boot, setup and warm-up)."""
    known = measured() if known is None else known
    ready = measured_ready() if ready is None else ready
    provision = known.get(it.name)
    source = "measured by srifty launch" if provision is not None else "default"
    data_s = staging_s(it, dataset_gb)
    provision_s = provision if provision is not None else default_provision_s(it)
    if it.name in ready:  # boot, the environment's install and warm-up, as the fleet's nodes took them
        return TypeStartup(provision_s, ready[it.name], 0.0, data_s, 0.0, source + "; boot to first step measured")
    return TypeStartup(provision_s, BOOT_S, SETUP_S, data_s, WARMUP_S, source)


def staging_s(it: InstanceType, dataset_gb: float) -> float:
    """Seconds one instance of ``it`` takes to download ``dataset_gb`` from S3: at its network's rate, at most
    :data:`S3_GBPS_PER_INSTANCE`; on an "up to" network, at that rate while its network I/O credits last, then at its
    baseline (:data:`UP_TO_CREDIT_S`; a review: 2 TB on g5.xlarge was priced at the burst's rate whatever its size)."""
    if dataset_gb <= 0:
        return 0.0
    bits = float(dataset_gb) * 8.0  # Gbit
    rate = min(float(it.network_gbps or S3_GBPS_PER_INSTANCE), S3_GBPS_PER_INSTANCE)
    baseline = float(it.network_baseline_gbps or 0.0) if it.network_up_to else 0.0
    if not 0 < baseline < rate:
        return bits / rate
    burst_s = UP_TO_CREDIT_S * baseline / (rate - baseline)  # the bucket drains at the rate above the refill
    if bits <= rate * burst_s:
        return bits / rate
    return burst_s + (bits - rate * burst_s) / baseline


def fleet_startup_s(
    types: list[InstanceType],
    type_index: np.ndarray,
    counts: np.ndarray,
    dataset_gb: float = 0.0,
    known: dict[str, float] | None = None,
    ready: dict[str, float] | None = None,
) -> np.ndarray:
    """Start-up seconds of every candidate fleet (rows of ``type_index`` / ``counts``): its slowest group's
    (``known``, ``ready``: measured provisioning and boot to first step by type, read from the store when not
    given)."""
    known = measured() if known is None else known
    ready = measured_ready() if ready is None else ready
    per_type = np.array([type_startup(it, dataset_gb, known, ready).total_s for it in types])
    return np.max(np.where(counts > 0, per_type[type_index], 0.0), axis=1)


def billed_hours(wall_s: np.ndarray) -> np.ndarray:
    """Hours billed per instance for ``wall_s`` seconds up (per-second billing, 60 s minimum)."""
    return np.maximum(np.asarray(wall_s, dtype=float), BILLING_MINIMUM_S) / 3600.0
