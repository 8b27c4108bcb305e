"""Refresh the catalog from the real AWS APIs (boto3) into a dated copy in the user cache.

Specs: ``ec2.describe_instance_types`` (paginated; types with GpuInfo or NeuronInfo).
Where offered: ``ec2.describe_instance_type_offerings`` (per region). Spot: ``ec2.describe_spot_price_history``
(latest per zone, Linux/UNIX). On-demand: ``pricing.get_products`` (endpoint region us-east-1; Linux, shared
tenancy, no pre-installed software, capacity status Used). Interruption buckets have no API: they are carried over
from the previous copy (Spot Advisor data). Endpoints follow boto3's standard settings (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_EC2``...); retries use botocore's standard mode.

A refresh that cannot read instance types anywhere writes nothing and keeps the previous copy; one that loses
only some prices writes the copy with the previous prices for those (each price keeps its own date) and lists
what failed.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predictor.catalog.catalog import CATALOG_SCHEMA, Catalog, catalog_root
from predictor.catalog.fields import from_aws, read_row, write_row
from predictor.catalog.instances import INSTANCE_COLUMNS, PRICE_COLUMNS, InstanceType, Price
from predictor.exceptions import CatalogError, UnknownNameError

PRICING_REGION = "us-east-1"
ClientFactory = Callable[[str, str], Any]


@dataclass
class RefreshResult:
    """What a refresh did."""

    path: Path | None
    regions: list[str]
    instance_types: int = 0
    prices: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def default_client_factory(session: Any = None, max_attempts: int = 5) -> ClientFactory:
    """boto3 clients with botocore's standard retry mode; endpoints from the usual AWS_ENDPOINT_URL* settings."""
    import boto3
    from botocore.config import Config

    session = session or boto3.session.Session()
    config = Config(retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=5, read_timeout=30)

    def make(service: str, region: str) -> Any:
        return session.client(service, region_name=region, config=config)

    return make


def has_credentials(session: Any = None) -> bool:
    import boto3

    return (session or boto3.session.Session()).get_credentials() is not None


def region_location(region: str) -> str:
    """The Pricing API's location name of a region ('us-east-1' -> 'US East (N. Virginia)')."""
    from botocore.loaders import Loader

    for partition in Loader().load_data("endpoints")["partitions"]:
        if region in partition.get("regions", {}):
            return partition["regions"][region]["description"]
    raise CatalogError(f"Unknown AWS region {region!r}: no Pricing API location for it.")


def _network_gbps(info: dict[str, Any]) -> tuple[float | None, bool]:
    cards = info.get("NetworkCards") or []
    perf = info.get("NetworkPerformance", "")
    up_to = perf.lower().startswith("up to")
    match = re.search(r"(?:(\d+)x\s*)?(\d+(?:\.\d+)?)\s*Gigabit", perf)
    if match:
        return float(match.group(2)) * (int(match.group(1)) if match.group(1) else 1), up_to
    peak = sum(c.get("PeakBandwidthInGbps") or 0 for c in cards)
    return (peak or None), up_to


def _accelerator(item: dict[str, Any]) -> tuple[str, str, int, float, str] | None:
    """(AWS's accelerator name, its kind, the count, GiB each, the GPU's own name) of one item; None without one."""
    gpu_info, neuron = item.get("GpuInfo"), item.get("NeuronInfo")
    if gpu_info and gpu_info.get("Gpus"):
        g = gpu_info["Gpus"][0]
        maker = g.get("Manufacturer", "")
        kind = "cuda" if maker == "NVIDIA" else ("amd" if maker == "AMD" else "gaudi" if "Habana" in maker else "other")
        count = sum(x.get("Count", 0) for x in gpu_info["Gpus"])
        memory = g.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024
        return f"{maker} {g.get('Name', '')}".strip(), kind, count, memory, g.get("Name", "")
    if neuron and neuron.get("NeuronDevices"):
        d = neuron["NeuronDevices"][0]
        count = sum(x.get("Count", 0) for x in neuron["NeuronDevices"])
        memory = d.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024
        return f"AWS {d.get('Name', 'Neuron')}", "neuron", count, memory, ""
    return None


def _spec_row(item: dict[str, Any], previous: Catalog, notes: list[str]) -> dict[str, str] | None:
    """One ``describe_instance_types`` item as a catalog row: the fields declared with an ``aws`` key copied
    (:func:`~predictor.catalog.fields.from_aws`), the accelerator, the network's headline and what no API reports
    (the interconnect, the advisor's bucket: the previous copy's) computed; None for a type without accelerators, or
    one whose row the copy's reader would refuse (said in ``notes``)."""
    found = _accelerator(item)
    if found is None:
        return None
    name = item["InstanceType"]
    old: InstanceType | None = previous.get(name) if name in previous else None
    accelerator, kind, count, memory, gpu_name = found
    gpu = _catalog_gpu(name, gpu_name, accelerator, memory, old, previous, notes) if kind == "cuda" else ""
    net = item.get("NetworkInfo", {})
    gbps, up_to = _network_gbps(net)
    if old is None and count > 1:
        notes.append(f"{name}: GPU interconnect is in no AWS API; assumed 'pcie' (set it with --catalog-extra)")
    row = write_row(
        {
            **from_aws(item),
            "family": name.split(".")[0],
            "accelerator": accelerator,
            "accelerator_kind": kind,
            "gpu": gpu,
            "gpus": count,
            "gpu_memory_gib": round(memory, 2),
            "memory_gib": item["MemoryInfo"]["SizeInMiB"] / 1024,
            "network_gbps": gbps,
            "network_up_to": up_to,
            # what an "up to" network sustains once its burst credits are spent (absent before 2023's API)
            "network_baseline_gbps": (
                sum(c.get("BaselineBandwidthInGbps") or 0 for c in net.get("NetworkCards") or []) or None
            )
            if up_to
            else None,
            # one EFA interface per network card at most: the fleet attaches efa_interfaces of them (docs/catalog.md)
            "network_cards": net.get("MaximumNetworkCards") or len(net.get("NetworkCards") or []) or 1,
            "gpu_interconnect": old.gpu_interconnect if old is not None else ("single" if count == 1 else "pcie"),
            "gpu_interconnect_detail": "carried over" if old else "assumed",
            "spot_interruption_bucket": old.spot_interruption_bucket if old else None,
            "specs_source": "ec2.describe_instance_types",
        }
    )
    try:  # a row the copy's reader would refuse would make the whole copy unreadable: the type is left out instead
        read_row(row)
    except (KeyError, ValueError) as exc:
        notes.append(f"{name}: left out: describe_instance_types gave no usable {exc} for it")
        return None
    return row


def _catalog_gpu(
    name: str, gpu_name: str, accelerator: str, memory: float, old: InstanceType | None, previous: Catalog, notes: list
) -> str:
    """The type's GPU as the catalog names it: the previous copy's, else the GPU table's match (a GPU it does not
    know keeps AWS's name, said in ``notes``)."""
    if old is not None and old.gpu:
        return old.gpu
    try:
        return previous.gpus.canonical(gpu_name, memory)
    except UnknownNameError:
        notes.append(
            f"{name}: GPU {accelerator!r} ({memory:.0f} GiB) is not in the GPU table; add its specs "
            "with --catalog-extra to predict on it"
        )
        return gpu_name


def _paginate(client: Any, op: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator(op).paginate(**kwargs):
        out.extend(page.get(key, []))
    return out


def fetch_ondemand(pricing: Any, instance_type: str, region: str) -> float | None:
    """On-demand Linux price per hour of one type in one region (None when AWS lists none)."""
    filters = [
        {"Type": "TERM_MATCH", "Field": f, "Value": v}
        for f, v in (
            ("instanceType", instance_type),
            ("location", region_location(region)),
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("preInstalledSw", "NA"),
            ("capacitystatus", "Used"),
        )
    ]
    prices = []
    for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
        for raw in page.get("PriceList", []):
            product = json.loads(raw) if isinstance(raw, str) else raw
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                for dim in term.get("priceDimensions", {}).values():
                    usd = float(dim.get("pricePerUnit", {}).get("USD", "0"))
                    if usd > 0:
                        prices.append(usd)
    return min(prices) if prices else None


def refresh_catalog(
    regions: Sequence[str],
    *,
    client_factory: ClientFactory | None = None,
    previous: Catalog | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    now: dt.datetime | None = None,
    root: Path | None = None,
) -> RefreshResult:
    """Query AWS and write a new catalog copy; see the module docstring for the failure policy.

    Raises:
        CatalogError: instance types could not be read in any region (nothing written).
    """
    make = client_factory or default_client_factory()
    previous = previous or Catalog.load()
    now = now or dt.datetime.now(dt.timezone.utc)
    stamp, today = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y-%m-%d")
    result = RefreshResult(path=None, regions=list(regions))
    report = progress or (lambda _msg, _i, _n: None)
    specs: dict[str, dict[str, Any]] = {}
    offered: dict[str, set[str]] = {}
    prices: list[dict[str, Any]] = []
    steps = len(regions) * 3 + 1
    step = 0

    def tick(what: str, at: int) -> None:
        report(what, at, steps)

    for region in regions:
        step = _read_region(make("ec2", region), region, previous, now, result, (specs, offered, prices), tick, step)
    if not specs:
        raise CatalogError(
            "Catalog refresh failed, nothing was written and the previous catalog "
            f"({previous.info.source}, {previous.info.snapshot}) stays in use: " + "; ".join(result.failures)
        )
    step += 1
    report("on-demand prices (pricing.get_products)", step, steps)
    prices += _ondemand_prices(make("pricing", PRICING_REGION), regions, offered, result, today)
    available = set().union(*offered.values()) if offered else set()
    dropped = len(specs) - len(available & set(specs))
    specs = {name: row for name, row in specs.items() if name in available}
    if dropped:
        result.notes.append(f"{dropped} accelerator types are not offered in {', '.join(regions)} and were left out")
    prices += _carried_prices(prices, specs, offered, previous, result)
    result.path = _write_copy(root or catalog_root(), stamp, specs, prices, regions, result, now)
    result.instance_types, result.prices = len(specs), len(prices)
    return result


def _read_region(
    ec2: Any,
    region: str,
    previous: Catalog,
    now: dt.datetime,
    result: RefreshResult,
    into: tuple[dict[str, dict[str, Any]], dict[str, set[str]], list[dict[str, Any]]],
    tick: Callable[[str, int], None],
    step: int,
) -> int:
    """One region's instance types, offerings and spot prices, added to ``into`` (specs, offered, prices); every
    failure is reported in ``result`` and none stops the others. Returns the progress step reached."""
    specs, offered, prices = into
    step += 1
    tick(f"{region}: instance types", step)
    try:
        for item in _paginate(ec2, "describe_instance_types", "InstanceTypes"):
            row = _spec_row(item, previous, result.notes)
            if row is not None:
                specs[row["instance_type"]] = row
    except Exception as exc:  # noqa: BLE001 - every AWS failure is reported, none aborts the others
        result.failures.append(f"{region}: describe_instance_types: {_why(exc)}")
        return step
    step += 1
    tick(f"{region}: offerings", step)
    try:
        offers = _paginate(
            ec2,
            "describe_instance_type_offerings",
            "InstanceTypeOfferings",
            LocationType="region",
            Filters=[{"Name": "location", "Values": [region]}],
        )
        offered[region] = {o["InstanceType"] for o in offers} & set(specs)
    except Exception as exc:  # noqa: BLE001
        result.failures.append(f"{region}: describe_instance_type_offerings: {_why(exc)}")
        offered[region] = set(specs)
    step += 1
    tick(f"{region}: spot prices", step)
    try:
        prices += _spot_prices(ec2, sorted(offered[region]), region, now)
    except Exception as exc:  # noqa: BLE001
        result.failures.append(f"{region}: describe_spot_price_history: {_why(exc)}")
    return step


def _ondemand_prices(
    pricing: Any, regions: Sequence[str], offered: dict[str, set[str]], result: RefreshResult, today: str
) -> list[dict[str, Any]]:
    """Each offered type's on-demand price from the Pricing API; the first failure stops the rest (one failure
    usually means all will) and is reported in ``result``."""
    out: list[dict[str, Any]] = []
    pricing_failed = False
    for region in regions:
        for name in sorted(offered.get(region, ())):
            if pricing_failed:
                break
            try:
                usd = fetch_ondemand(pricing, name, region)
            except Exception as exc:  # noqa: BLE001
                result.failures.append(f"pricing.get_products ({region}): {_why(exc)}")
                pricing_failed = True  # one failure usually means all will: stop hammering
                break
            if usd is not None:
                out.append(
                    {
                        "instance_type": name,
                        "region": region,
                        "market": "on-demand",
                        "availability_zone": "",
                        "usd_hr": usd,
                        "estimated": "false",
                        "as_of": today,
                        "source": "pricing.get_products",
                    }
                )
    return out


def _spot_prices(ec2: Any, types: list[str], region: str, now: dt.datetime) -> list[dict[str, Any]]:
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for chunk in (types[i : i + 50] for i in range(0, len(types), 50)):
        for item in _paginate(
            ec2,
            "describe_spot_price_history",
            "SpotPriceHistory",
            InstanceTypes=chunk,
            ProductDescriptions=["Linux/UNIX"],
            StartTime=now,
        ):
            key = (item["InstanceType"], item["AvailabilityZone"])
            if key not in latest or item["Timestamp"] > latest[key]["Timestamp"]:
                latest[key] = item
    return [
        {
            "instance_type": t,
            "region": region,
            "market": "spot",
            "availability_zone": az,
            "usd_hr": float(item["SpotPrice"]),
            "estimated": "false",
            "as_of": item["Timestamp"].strftime("%Y-%m-%d"),
            "source": "ec2.describe_spot_price_history",
        }
        for (t, az), item in sorted(latest.items())
    ]


def _carried_prices(
    fresh: list[dict[str, Any]],
    specs: dict[str, Any],
    offered: dict[str, set[str]],
    previous: Catalog,
    result: RefreshResult,
) -> list[dict[str, Any]]:
    """Previous prices for (type, region, market) the refresh did not get, each keeping its date and source."""
    have = {(p["instance_type"], p["region"], p["market"]) for p in fresh}
    carried = []
    for name in specs:
        if name not in previous:
            continue
        for price in previous.get(name).prices:
            if price.region in offered and (name, price.region, price.market) not in have:
                carried.append(_price_row(name, price))
    if carried:
        result.notes.append(
            f"{len(carried)} prices were not refreshed and are carried over from "
            f"{previous.info.source} with their own dates"
        )
    return carried


def _price_row(name: str, p: Price) -> dict[str, Any]:
    return {
        "instance_type": name,
        "region": p.region,
        "market": p.market,
        "availability_zone": p.availability_zone or "",
        "usd_hr": p.usd_hr,
        "estimated": str(p.estimated).lower(),
        "as_of": p.as_of,
        "source": p.source,
    }


def _write_copy(
    root: Path,
    stamp: str,
    specs: dict[str, Any],
    prices: list[dict[str, Any]],
    regions: Sequence[str],
    result: RefreshResult,
    now: dt.datetime,
) -> Path:
    """Write the copy into a temporary folder, then rename it into place (readers never see half a copy)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stamp}.", dir=root))
    try:
        for name, columns, rows in (
            ("instances.csv", INSTANCE_COLUMNS, sorted(specs.values(), key=lambda r: r["instance_type"])),
            ("prices.csv", PRICE_COLUMNS, prices),
        ):
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
            (tmp / name).write_text(buf.getvalue(), encoding="utf-8")
        meta = {
            "schema": CATALOG_SCHEMA,
            "created_at": now.isoformat(timespec="seconds"),
            "regions": list(regions),
            "instance_types": len(specs),
            "prices": len(prices),
            "failures": result.failures,
            "notes": result.notes,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        target = root / stamp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        return target
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _why(exc: Exception) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{code}: {text}" if code else f"{type(exc).__name__}: {text}"
