"""Instance types and their prices: typed records over fixed-column data (bundled CSV or a refreshed copy)."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Literal, cast

from typing_extensions import TypedDict  # typing's TypedDict has no __orig_bases__ before 3.12 (pydantic needs them)

Market = Literal["on-demand", "spot"]

# The fixed columns of a catalog copy (bundled predictor/data or a refreshed copy in the cache).
INSTANCE_COLUMNS = [
    "instance_type",
    "family",
    "accelerator",
    "accelerator_kind",
    "gpu",
    "gpus",
    "gpu_memory_gib",
    "vcpus",
    "memory_gib",
    "network_gbps",
    "network_up_to",
    "network_cards",
    "efa",
    "efa_max_interfaces",
    "gpu_interconnect",
    "gpu_interconnect_detail",
    "local_nvme_gb",
    "arch",
    "placement_strategies",
    "usage_classes",
    "spot_interruption_bucket",
    "spot_savings_pct",
    "spot_advisor_as_of",
    "specs_source",
]
PRICE_COLUMNS = ["instance_type", "region", "market", "availability_zone", "usd_hr", "estimated", "as_of", "source"]
KINDS = ("cuda", "neuron", "gaudi", "amd", "other")
INTERCONNECTS = ("single", "pcie", "nvlink", "nvswitch", "neuronlink", "other")

# Spot Advisor "frequency of interruption" buckets: share of instances interrupted over the last month.
# The midpoint (and 30% for ">20%") is turned into a constant hourly rate: -ln(1 - p) / 730 h.
BUCKET_MONTHLY = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.30}
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Price:
    """One observed or estimated price."""

    region: str
    market: Market
    usd_hr: float
    availability_zone: str | None = None
    estimated: bool = False
    as_of: str = ""
    source: str = ""


@dataclass(frozen=True)
class InstanceType:
    """An instance type and what decides training speed and cost on it."""

    name: str
    family: str
    accelerator: str
    accelerator_kind: str
    gpu: str | None
    gpus: int
    gpu_memory_gib: float
    vcpus: int
    memory_gib: float
    network_gbps: float | None
    network_up_to: bool = False
    efa: bool = False
    network_cards: int = 1  # NetworkInfo.MaximumNetworkCards
    efa_interfaces: int = 0  # EfaInfo.MaximumEfaInterfaces: at most one EFA interface per network card
    gpu_interconnect: str = "pcie"
    local_nvme_gb: float = 0.0
    arch: str = "x86_64"
    spot_interruption_bucket: str | None = None
    interruption_rate_per_hr: float | None = None
    prices: tuple[Price, ...] = field(default=(), repr=False)
    origin: str = "bundled"
    # the process-group backend a job on it runs: nccl on CUDA GPUs (collectives on their own streams, overlapping
    # compute); gloo where the "GPU" is the host CPU (a lab): FSDP's collectives then block the training thread
    process_group_backend: str = "nccl"

    @property
    def cuda(self) -> bool:
        """True for NVIDIA GPU types that a CUDA PyTorch job can use."""
        return self.accelerator_kind == "cuda"

    @property
    def regions(self) -> list[str]:
        return sorted({p.region for p in self.prices})

    @property
    def network_card_gbps(self) -> float | None:
        """Gigabits per second of one network card: the instance's bandwidth shared by the cards that carry it (the
        EFA-capable ones on EFA types: p4d.24xlarge 400 / 4 = 100, p5.48xlarge 3200 / 32 = 100, p5en.48xlarge
        3200 / 16 = 200)."""
        if self.network_gbps is None:
            return None
        cards = self.efa_interfaces if self.efa and self.efa_interfaces > 0 else self.network_cards
        return self.network_gbps / max(1, cards)

    def network_interfaces(self, multi_node: bool) -> int:
        """Network interfaces a srifty fleet attaches to each instance, one per network card: every EFA interface
        the type supports when the fleet spans nodes and the type has EFA, else one (ENA on card 0). The Terraform
        module attaches this many and the predictor's inter-node link is this many cards wide."""
        return max(1, self.efa_interfaces) if self.efa and multi_node else 1

    def provisioned_network_gbps(self, multi_node: bool = True) -> float | None:
        """Gigabits per second the attached interfaces give: cards x per-card rate, at most the instance's."""
        card = self.network_card_gbps
        if card is None or self.network_gbps is None:
            return None
        return min(self.network_gbps, card * self.network_interfaces(multi_node))

    def price(self, region: str | None = None, market: Market = "on-demand") -> Price | None:
        """The price in ``region`` (any region if None): on-demand, or the cheapest measured spot zone (an
        advisor-based estimate only when no zone was measured)."""
        found = [p for p in self.prices if p.market == market and (region is None or p.region == region)]
        if not found:
            return None
        measured = [p for p in found if not p.estimated]
        return min(measured or found, key=lambda p: p.usd_hr)

    @property
    def spot_rate_per_hr(self) -> float:
        """The interruption rate its spot capacity is priced at: the Spot Advisor's bucket (or the user's rate), else
        :data:`UNLISTED_BUCKET`'s (:meth:`spot_unlisted` says so)."""
        if self.interruption_rate_per_hr is not None:
            return self.interruption_rate_per_hr
        return interruption_rate(UNLISTED_BUCKET) or 0.0

    def spot_unlisted(self) -> str | None:
        """A sentence when its spot entries assume :data:`UNLISTED_BUCKET` for want of the advisor's figure."""
        if self.interruption_rate_per_hr is not None:
            return None
        return (
            f"{self.name} is {SPOT_UNLISTED_HINT} (no interruption frequency published): its spot entries assume the "
            f"worst bucket, {UNLISTED_BUCKET} of instances interrupted a month; a spot trace of its history "
            "(--spot-trace) or the type redefined with interruption_rate_per_hr (--catalog-extra) replaces the "
            "assumption"
        )

    def spot_outlier(self, region: str) -> str | None:
        """A sentence when the spot price the ranking takes in ``region`` (its cheapest measured zone) is under half
        the median of the region's other zones: more likely a stale or odd sample of the catalog's source than a
        price to bet on (issue #37 L: p4d.24xlarge at $2.47/h in use1-az1 where its other zones ask $7.88-8.19 and
        on demand is $21.96). None otherwise, or with fewer than two other zones to compare."""
        zones = sorted((p for p in self.prices if p.market == "spot" and p.region == region and not p.estimated),
                       key=lambda p: p.usd_hr)  # fmt: skip
        if len(zones) < 3:
            return None
        cheapest, others = zones[0], sorted(p.usd_hr for p in zones[1:])
        half = len(others) // 2
        median = others[half] if len(others) % 2 else (others[half - 1] + others[half]) / 2
        if cheapest.usd_hr >= 0.5 * median:
            return None
        return (
            f"{self.name}'s spot price in {region} is its {cheapest.availability_zone or 'cheapest'} zone's "
            f"${cheapest.usd_hr:,.2f}/h, {cheapest.usd_hr / median:.2f}x the median of its other {len(others)} zones "
            f"(${median:,.2f}/h; {cheapest.source}): {SPOT_OUTLIER_HINT} (aws ec2 describe-spot-price-history "
            f"--instance-types {self.name}) before betting on it"
        )

    def price_usd_hr(self, region: str | None = None, market: Market = "on-demand") -> float | None:
        p = self.price(region, market)
        return p.usd_hr if p else None


SPOT_OUTLIER_HINT = "check today's price"  # how a plan note of InstanceType.spot_outlier reads (the CLI shows them)
# a spot type the Spot Instance Advisor does not list (p5e, p6-b200, p6-b300 in the bundled catalog) is priced at its
# worst bucket, not at no interruptions at all (which made a new type's spot look safer than every listed one)
UNLISTED_BUCKET = ">20%"
SPOT_UNLISTED_HINT = "not in the Spot Instance Advisor"  # how a plan note of InstanceType.spot_unlisted reads


def interruption_rate(bucket: str | None) -> float | None:
    """Hourly interruption rate from a Spot Advisor bucket ('10-15%' -> about 0.00018 per hour)."""
    if not bucket or bucket not in BUCKET_MONTHLY:
        return None
    return -math.log(1 - BUCKET_MONTHLY[bucket]) / HOURS_PER_MONTH


ARCHES = ("x86_64", "arm64")


def normal_arch(text: str | None) -> str:
    """One architecture of ``ARCHES`` from a catalog cell or DescribeInstanceTypes' SupportedArchitectures joined
    with commas ('i386,x86_64' -> 'x86_64', 'arm64' -> 'arm64'); empty means x86_64."""
    parts = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not parts or "x86_64" in parts:
        return "x86_64"
    if "arm64" in parts:
        return "arm64"
    return parts[0]


def _float(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def _bool(text: str) -> bool:
    return str(text).strip().lower() == "true"


def read_prices(rows: Iterable[dict[str, str]]) -> dict[str, list[Price]]:
    out: dict[str, list[Price]] = {}
    for row in rows:
        out.setdefault(row["instance_type"], []).append(
            Price(
                region=row["region"],
                market=cast(Market, row["market"]),  # the column holds Market values (bundled data, refresh writes)
                usd_hr=float(row["usd_hr"]),
                availability_zone=row["availability_zone"] or None,
                estimated=_bool(row["estimated"]),
                as_of=row["as_of"],
                source=row["source"],
            )
        )
    return out


def read_instances(
    rows: Iterable[dict[str, str]], prices: dict[str, list[Price]], origin: str = "bundled"
) -> dict[str, InstanceType]:
    out: dict[str, InstanceType] = {}
    for row in rows:
        bucket = row.get("spot_interruption_bucket") or None
        out[row["instance_type"]] = InstanceType(
            name=row["instance_type"],
            family=row["family"],
            accelerator=row["accelerator"],
            accelerator_kind=row["accelerator_kind"],
            gpu=row["gpu"] or None,
            gpus=int(row["gpus"]),
            gpu_memory_gib=float(row["gpu_memory_gib"]),
            vcpus=int(row["vcpus"]),
            memory_gib=float(row["memory_gib"]),
            network_gbps=_float(row["network_gbps"]),
            network_up_to=_bool(row["network_up_to"]),
            efa=_bool(row["efa"]),
            network_cards=int(row.get("network_cards") or 1),
            efa_interfaces=int(row.get("efa_max_interfaces") or 0),
            gpu_interconnect=row["gpu_interconnect"],
            local_nvme_gb=_float(row["local_nvme_gb"]) or 0.0,
            arch=normal_arch(row["arch"]),
            spot_interruption_bucket=bucket,
            interruption_rate_per_hr=interruption_rate(bucket),
            prices=tuple(prices.get(row["instance_type"], ())),
            origin=origin,
        )
    return out


def bundled_rows(name: str) -> list[dict[str, str]]:
    with resources.files("predictor.data").joinpath(name).open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def with_prices(instance: InstanceType, prices: Iterable[Price]) -> InstanceType:
    return replace(instance, prices=tuple(prices))


class InstanceRow(TypedDict):
    """One instance type as JSON (:func:`instance_to_dict`): ``srifty catalog show --format json`` and the service's
    ``GET /v1/catalog``, whose OpenAPI schema comes from this declaration. Prices are those of the region asked
    (the lowest over regions when none was asked); None where the catalog has none."""

    instance_type: str
    family: str
    accelerator_kind: str
    gpu: str | None
    gpus: int
    gpu_memory_gib: float
    vcpus: int
    memory_gib: float
    network_gbps: float | None
    network_up_to: bool
    efa: bool
    network_cards: int
    efa_interfaces: int
    gpu_interconnect: str
    local_nvme_gb: float
    arch: str
    ondemand_usd_hr: float | None
    ondemand_as_of: str | None
    spot_usd_hr: float | None
    spot_estimated: bool | None
    spot_as_of: str | None
    spot_interruption_bucket: str | None
    interruption_rate_per_hr: float | None
    process_group_backend: str
    origin: str


def instance_to_dict(it: InstanceType, region: str | None = None) -> InstanceRow:
    """Stable JSON form used by ``srifty catalog show --format json`` (documented in docs/catalog.md)."""
    od, spot = it.price(region, "on-demand"), it.price(region, "spot")
    return {
        "instance_type": it.name,
        "family": it.family,
        "accelerator_kind": it.accelerator_kind,
        "gpu": it.gpu,
        "gpus": it.gpus,
        "gpu_memory_gib": it.gpu_memory_gib,
        "vcpus": it.vcpus,
        "memory_gib": it.memory_gib,
        "network_gbps": it.network_gbps,
        "network_up_to": it.network_up_to,
        "efa": it.efa,
        "network_cards": it.network_cards,
        "efa_interfaces": it.efa_interfaces,
        "gpu_interconnect": it.gpu_interconnect,
        "local_nvme_gb": it.local_nvme_gb,
        "arch": it.arch,
        "ondemand_usd_hr": od.usd_hr if od else None,
        "ondemand_as_of": od.as_of if od else None,
        "spot_usd_hr": spot.usd_hr if spot else None,
        "spot_estimated": spot.estimated if spot else None,
        "spot_as_of": spot.as_of if spot else None,
        "spot_interruption_bucket": it.spot_interruption_bucket,
        "interruption_rate_per_hr": it.interruption_rate_per_hr,
        "process_group_backend": it.process_group_backend,
        "origin": it.origin,
    }
