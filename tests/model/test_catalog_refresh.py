"""`srifty catalog refresh`: real boto3 against moto's HTTP server on 127.0.0.1 for EC2; botocore's Stubber for the
Pricing API (not in moto) and for spot-price pagination and throttling (moto's spot prices are placeholders)."""

from __future__ import annotations

import datetime as dt
import json

import boto3
import pytest
from botocore.stub import Stubber

from lightning_srifty.cli import main
from predictor.catalog import Catalog
from predictor.catalog.refresh import _spot_prices, default_client_factory, fetch_ondemand, refresh_catalog
from predictor.exceptions import CatalogError

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def moto_endpoint():
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is needed (pip install -e '.[dev]')")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws(monkeypatch, moto_endpoint, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_endpoint)
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SRIFTY_CATALOG_EXTRA", raising=False)
    return moto_endpoint


def product(instance_type: str, usd: str, sku: str = "SKU1") -> str:
    """A get_products PriceList entry shaped like the real one (a JSON string)."""
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "sku": sku,
                "attributes": {
                    "instanceType": instance_type,
                    "location": "US East (N. Virginia)",
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "capacitystatus": "Used",
                    "preInstalledSw": "NA",
                },
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "offerTermCode": "JRTCKXETXF",
                        "sku": sku,
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "priceDimensions": {
                            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": usd},
                                "description": f"${usd} per On Demand Linux",
                            }
                        },
                    }
                }
            },
            "version": "20261101000000",
            "publicationDate": "2026-11-01T00:00:00Z",
        }
    )


def pricing_client() -> tuple[object, Stubber]:
    client = boto3.client("pricing", region_name="us-east-1")
    return client, Stubber(client)


def accelerator_types_offered(endpoint: str, region: str) -> list[str]:
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint)
    types = {
        it["InstanceType"]
        for page in ec2.get_paginator("describe_instance_types").paginate()
        for it in page["InstanceTypes"]
        if "GpuInfo" in it or "NeuronInfo" in it
    }
    offered = {
        o["InstanceType"]
        for o in ec2.describe_instance_type_offerings(
            LocationType="region", Filters=[{"Name": "location", "Values": [region]}]
        )["InstanceTypeOfferings"]
    }
    return sorted(types & offered)


def test_refresh_against_moto_matches_what_the_server_returned(aws, tmp_path) -> None:
    names = accelerator_types_offered(aws, "us-east-1")
    assert len(names) >= 60
    pricing, stub = pricing_client()
    for i, name in enumerate(names):
        stub.add_response(
            "get_products", {"PriceList": [product(name, f"{1 + i / 10:.4f}")], "FormatVersion": "aws_v1"}
        )
    ec2_factory = default_client_factory(max_attempts=1)
    with stub:
        result = refresh_catalog(
            ["us-east-1"], client_factory=lambda s, r: pricing if s == "pricing" else ec2_factory(s, r), now=NOW
        )
        stub.assert_no_pending_responses()
    assert result.failures == []
    assert result.path.name == "20261122T120000Z" and (result.path / "meta.json").exists()
    cat = Catalog.load()  # the newest refreshed copy is picked up by default
    assert cat.info.source == str(result.path) and cat.info.snapshot == "2026-11-22"
    assert sorted(cat.names) == names
    live = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws).describe_instance_types(
        InstanceTypes=["p4d.24xlarge", "g5.12xlarge"]
    )["InstanceTypes"]
    for item in live:
        it = cat.get(item["InstanceType"])
        gpu = item["GpuInfo"]["Gpus"][0]
        assert it.vcpus == item["VCpuInfo"]["DefaultVCpus"]
        assert it.memory_gib == item["MemoryInfo"]["SizeInMiB"] / 1024
        assert it.gpus == gpu["Count"] and it.gpu_memory_gib == pytest.approx(
            gpu["MemoryInfo"]["SizeInMiB"] / 1024, abs=0.01
        )
        assert it.efa == item["NetworkInfo"].get("EfaSupported", False)
        # what srifty terraform attaches (one EFA interface per card) comes from the refreshed copy too
        assert it.network_cards == item["NetworkInfo"]["MaximumNetworkCards"]
        assert it.efa_interfaces == item["NetworkInfo"].get("EfaInfo", {}).get("MaximumEfaInterfaces", 0)
    assert (cat.get("p4d.24xlarge").network_cards, cat.get("p4d.24xlarge").efa_interfaces) == (4, 4)
    assert cat.get("g5g.xlarge").arch == "arm64" and cat.get("g5.xlarge").arch == "x86_64"  # one value, not a list
    p4d = cat.get("p4d.24xlarge")
    assert p4d.network_gbps == 400 and p4d.gpu == "A100-SXM-40GB" and p4d.gpu_interconnect == "nvswitch"
    assert p4d.price_usd_hr("us-east-1") == pytest.approx(1 + names.index("p4d.24xlarge") / 10, abs=1e-4)
    assert p4d.price("us-east-1", "on-demand").source == "pricing.get_products"
    assert p4d.spot_interruption_bucket == "10-15%"  # no API: carried from the Spot Advisor data
    assert p4d.price("us-east-1", "spot").source == "ec2.describe_spot_price_history"


def test_pricing_throttled_keeps_previous_prices_with_their_dates(aws) -> None:
    pricing, stub = pricing_client()
    stub.add_client_error(
        "get_products", service_error_code="ThrottlingException", service_message="Rate exceeded", http_status_code=400
    )
    ec2_factory = default_client_factory(max_attempts=1)
    with stub:
        result = refresh_catalog(
            ["us-east-1"], client_factory=lambda s, r: pricing if s == "pricing" else ec2_factory(s, r), now=NOW
        )
    assert result.failures == [
        "pricing.get_products (us-east-1): ThrottlingException: An error occurred "
        "(ThrottlingException) when calling the GetProducts operation: Rate exceeded"
    ]
    assert any("carried over" in n for n in result.notes)
    price = Catalog.load(result.path).get("p4d.24xlarge").price("us-east-1", "on-demand")
    assert price.usd_hr == pytest.approx(21.957642) and price.as_of == "2026-07-20"  # the bundled price, its date


def test_unreachable_ec2_writes_nothing(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path))
    with pytest.raises(CatalogError, match=r"nothing was written and the previous catalog \(bundled, 2026-07-20\)"):
        refresh_catalog(["us-east-1"], client_factory=default_client_factory(max_attempts=1), now=NOW)
    assert not (tmp_path / "catalog" / "v1").exists() or not any((tmp_path / "catalog" / "v1").iterdir())
    assert Catalog.load().info.source == "bundled"


def test_ondemand_price_follows_pagination() -> None:
    pricing, stub = pricing_client()
    filters = [
        {"Type": "TERM_MATCH", "Field": f, "Value": v}
        for f, v in (
            ("instanceType", "p4d.24xlarge"),
            ("location", "US East (N. Virginia)"),
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("preInstalledSw", "NA"),
            ("capacitystatus", "Used"),
        )
    ]
    stub.add_response(
        "get_products",
        {"PriceList": [product("p4d.24xlarge", "32.7726", "A")], "NextToken": "t1"},
        {"ServiceCode": "AmazonEC2", "Filters": filters},
    )
    stub.add_response(
        "get_products",
        {"PriceList": [product("p4d.24xlarge", "21.9576", "B")]},
        {"ServiceCode": "AmazonEC2", "Filters": filters, "NextToken": "t1"},
    )
    with stub:
        assert fetch_ondemand(pricing, "p4d.24xlarge", "us-east-1") == pytest.approx(21.9576)
        stub.assert_no_pending_responses()


def test_spot_history_keeps_the_latest_price_per_zone_across_pages() -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)

    def entry(az: str, price: str, hour: int) -> dict:
        return {
            "AvailabilityZone": az,
            "InstanceType": "p5.48xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": price,
            "Timestamp": dt.datetime(2026, 11, 22, hour, tzinfo=dt.timezone.utc),
        }

    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [entry("us-east-1a", "20.1", 9), entry("us-east-1b", "18.0", 8)], "NextToken": "n1"},
    )
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [entry("us-east-1a", "19.5", 11), entry("us-east-1b", "25.0", 6)]},
    )
    with stub:
        rows = _spot_prices(ec2, ["p5.48xlarge"], "us-east-1", NOW)
    assert [(r["availability_zone"], r["usd_hr"]) for r in rows] == [("us-east-1a", 19.5), ("us-east-1b", 18.0)]
    stub = Stubber(ec2)
    stub.add_client_error(
        "describe_spot_price_history", service_error_code="RequestLimitExceeded", http_status_code=503
    )
    with stub, pytest.raises(Exception, match="RequestLimitExceeded"):
        _spot_prices(ec2, ["p5.48xlarge"], "us-east-1", NOW)


def test_refresh_without_credentials_says_the_bundled_snapshot_is_used(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert main(["catalog", "refresh"]) == 1
    err = capsys.readouterr().err
    assert "no AWS credentials" in err and "bundled catalog (snapshot 2026-07-20) stays in use" in err
