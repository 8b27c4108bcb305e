"""Instance types and their prices: typed records over fixed-column data (bundled CSV or a refreshed copy)."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Literal, cast

from typing_extensions import TypedDict  # typing's TypedDict has no __orig_bases__ before 3.12 (pydantic needs them)

from predictor.catalog.fields import COLUMNS, JSON_FIELDS, read_row

Market = Literal["on-demand", "spot"]

# The fixed columns of a catalog copy (bundled predictor/data or a refreshed copy in the cache): the declarations'
INSTANCE_COLUMNS = COLUMNS
PRICE_COLUMNS = ["instance_type", "region", "market", "availability_zone", "usd_hr", "estimated", "as_of", "source"]

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
    # Gbit/s an "up to" network sustains once its burst credits are spent (DescribeInstanceTypes'
    # BaselineBandwidthInGbps); None: not given (a sustained network, or a copy without the column)
    network_baseline_gbps: float | None = None
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
    # whether its EFA moves GPU memory by GPUDirect RDMA; None: as AWS's NCCL plugin requires it for the type's name
    # (predictor.model.network.gpudirect_rdma). A catalog extra of non-EC2 nodes (RoCE or InfiniBand RDMA) says true
    gpudirect_rdma: bool | None = None

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
    """A catalog copy's rows as records, each cell read by its field's declaration (:mod:`predictor.catalog.fields`);
    the interruption rate from the advisor's bucket.

    Raises:
        KeyError: a column a field needs, missing or empty; ValueError: a cell that is not its kind.
    """
    out: dict[str, InstanceType] = {}
    for row in rows:
        fields = read_row(row)
        out[fields["name"]] = InstanceType(
            **fields,
            interruption_rate_per_hr=interruption_rate(fields["spot_interruption_bucket"]),
            prices=tuple(prices.get(fields["name"], ())),
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
    ``GET /v1/catalog``, whose OpenAPI schema comes from this declaration. The keys before the prices are the
    fields' JSON keys (:data:`~predictor.catalog.fields.JSON_FIELDS`, the one declaration; the type checker's copy
    here is held to it by tests/model/test_instance_fields.py). Prices are those of the region asked (the lowest over
    regions when none was asked); None where the catalog has none."""

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
    network_baseline_gbps: float | None
    network_cards: int
    efa: bool
    efa_interfaces: int
    gpu_interconnect: str
    local_nvme_gb: float
    arch: str
    spot_interruption_bucket: str | None
    interruption_rate_per_hr: float | None
    process_group_backend: str
    gpudirect_rdma: bool | None
    origin: str
    ondemand_usd_hr: float | None
    ondemand_as_of: str | None
    spot_usd_hr: float | None
    spot_estimated: bool | None
    spot_as_of: str | None


def instance_to_dict(it: InstanceType, region: str | None = None) -> InstanceRow:
    """Stable JSON form used by ``srifty catalog show --format json`` (documented in docs/catalog.md): the fields
    the declarations give a JSON key (:data:`~predictor.catalog.fields.JSON_FIELDS`), then the prices of ``region``."""
    od, spot = it.price(region, "on-demand"), it.price(region, "spot")
    row = {f.key("json"): getattr(it, f.name) for f in JSON_FIELDS}
    row.update(
        ondemand_usd_hr=od.usd_hr if od else None,
        ondemand_as_of=od.as_of if od else None,
        spot_usd_hr=spot.usd_hr if spot else None,
        spot_estimated=spot.estimated if spot else None,
        spot_as_of=spot.as_of if spot else None,
    )
    return cast(InstanceRow, row)
