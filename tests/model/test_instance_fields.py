"""An instance type's fields, declared once (predictor.catalog.fields.FIELDS): the catalog copy's columns, the record,
the JSON form, the catalog extra's YAML, the refresh's AWS keys and the bundled build's shared/ columns are each read
from the declarations, and each form is held to them here."""

from __future__ import annotations

import csv
import dataclasses
import functools
import importlib.util
import json
import subprocess
import sys
import typing

import pytest
from botocore.loaders import Loader
from botocore.model import ServiceModel

from conftest import ROOT
from predictor.catalog import Catalog
from predictor.catalog.extra import GPU_FIELDS, INSTANCE_FIELDS, PRICE_FIELDS
from predictor.catalog.fields import (
    BY_NAME,
    COLUMNS,
    FIELDS,
    GPU_SPECS,
    JSON_FIELDS,
    Field,
    columns,
    from_aws,
    from_shared,
    read_row,
    write_row,
    yaml_fields,
)
from predictor.catalog.gpus import GPU, gpu_table
from predictor.catalog.instances import InstanceRow, InstanceType, instance_to_dict
from predictor.catalog.refresh import _spec_row

PRICE_KEYS = ["ondemand_usd_hr", "ondemand_as_of", "spot_usd_hr", "spot_estimated", "spot_as_of"]
SHARED = ROOT.parent / "shared" / "data" / "ec2_gpu_instances.csv"


def test_the_bundled_copy_has_the_declared_columns_in_order() -> None:
    with (ROOT / "predictor" / "data" / "instances.csv").open(encoding="utf-8") as handle:
        assert next(csv.reader(handle)) == COLUMNS


def test_the_record_and_the_declarations_name_the_same_fields() -> None:
    """Every attribute of InstanceType but its prices is declared, and every declared record field is one."""
    attributes = {f.name for f in dataclasses.fields(InstanceType)} - {"prices"}
    assert attributes == {f.name for f in FIELDS if f.record}


def test_the_json_type_is_the_declared_keys_then_the_prices() -> None:
    """InstanceRow (the type checker's and the OpenAPI schema's copy) has exactly the declared JSON keys, in order,
    then the prices; instance_to_dict gives exactly those keys."""
    assert list(typing.get_type_hints(InstanceRow)) == [f.key("json") for f in JSON_FIELDS] + PRICE_KEYS
    row = instance_to_dict(Catalog.load().get("p4d.24xlarge"), "us-east-1")
    assert list(row) == list(typing.get_type_hints(InstanceRow))


def test_the_extra_takes_the_declared_yaml_fields_and_its_prices() -> None:
    assert {**yaml_fields(), **PRICE_FIELDS} == INSTANCE_FIELDS
    assert set(yaml_fields()).isdisjoint(PRICE_FIELDS)
    assert yaml_fields()["name"] is BY_NAME["name"].yaml  # the YAML name of the type is the column instance_type
    assert BY_NAME["name"].key("column") == "instance_type" and BY_NAME["efa_interfaces"].key("column") == (
        "efa_max_interfaces"
    )


@pytest.mark.parametrize("name", sorted(Catalog.load().names))
def test_every_bundled_row_reads_and_writes_back_to_its_cells(name: str) -> None:
    """A row read by the declarations and written back gives the same values (cells may differ only in how a
    number is spelt: '40' and '40.0')."""
    with (ROOT / "predictor" / "data" / "instances.csv").open(encoding="utf-8") as handle:
        row = next(r for r in csv.DictReader(handle) if r["instance_type"] == name)
    fields = read_row(row)
    assert read_row(write_row(fields)) == fields
    assert fields["name"] == name and fields["arch"] in ("x86_64", "arm64")


def test_a_cell_a_field_must_have_is_refused_and_a_defaulted_one_is_not() -> None:
    """An older copy without network_cards or efa_max_interfaces reads their defaults; one without vcpus is refused
    (the catalog's loader reports a KeyError or ValueError as an unreadable copy)."""
    with (ROOT / "predictor" / "data" / "instances.csv").open(encoding="utf-8") as handle:
        row = next(csv.DictReader(handle))
    old = {k: v for k, v in row.items() if k not in ("network_cards", "efa_max_interfaces")}
    assert read_row(old)["network_cards"] == 1 and read_row(old)["efa_interfaces"] == 0
    with pytest.raises(KeyError, match="vcpus"):
        read_row({**row, "vcpus": ""})
    with pytest.raises(ValueError):
        read_row({**row, "gpus": "eight"})


@functools.cache
def _ec2_model() -> ServiceModel:
    return ServiceModel(Loader().load_service_model("ec2", "service-2"), "ec2")


@pytest.mark.parametrize("declared", [f for f in FIELDS if f.aws], ids=lambda f: f.name)
def test_every_aws_key_is_one_describe_instance_types_returns(declared: Field) -> None:
    """The refresh's keys, checked against the EC2 API's published model as botocore ships it
    (InstanceTypeInfo: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceTypeInfo.html): a
    misspelt key would read the default for every type, silently."""
    shape = _ec2_model().operation_model("DescribeInstanceTypes").output_shape.members["InstanceTypes"].member
    for part in (declared.aws or "").split("."):
        assert part in shape.members, f"{declared.name}: {declared.aws}: no {part!r} in {shape.name}"
        shape = shape.members[part]
    kind = {"integer": int, "long": int, "boolean": bool, "string": str, "list": str, "double": float}[shape.type_name]
    assert kind is declared.kind or (kind is int and declared.kind is float), (declared.name, shape.type_name)


def test_a_refresh_row_has_every_column_and_reads_as_the_item_says() -> None:
    """One describe_instance_types item shaped as AWS returns it (p4d.24xlarge): the row has exactly the declared
    columns, and the copied fields read back as the item gave them."""
    item = {
        "InstanceType": "p4d.24xlarge",
        "VCpuInfo": {"DefaultVCpus": 96},
        "MemoryInfo": {"SizeInMiB": 1179648},
        "GpuInfo": {
            "Gpus": [{"Name": "A100", "Manufacturer": "NVIDIA", "Count": 8, "MemoryInfo": {"SizeInMiB": 40960}}]
        },
        "NetworkInfo": {
            "NetworkPerformance": "4x 100 Gigabit",
            "MaximumNetworkCards": 4,
            "EfaSupported": True,
            "EfaInfo": {"MaximumEfaInterfaces": 4},
        },
        "InstanceStorageInfo": {"TotalSizeInGB": 8000},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
        "SupportedUsageClasses": ["on-demand", "spot"],
    }
    notes: list[str] = []
    row = _spec_row(item, Catalog.load(), notes)
    assert row is not None and list(row) == COLUMNS
    fields = read_row(row)
    assert {k: fields[k] for k in from_aws(item) if k in fields} == {
        "name": "p4d.24xlarge",
        "vcpus": 96,
        "network_cards": 4,
        "efa": True,
        "efa_interfaces": 4,
        "local_nvme_gb": 8000.0,
        "arch": "x86_64",
    }
    assert row["placement_strategies"] == "cluster,partition,spread" and row["usage_classes"] == "on-demand,spot"
    assert fields["gpu"] == "A100-SXM-40GB" and fields["network_gbps"] == 400.0 and fields["memory_gib"] == 1152.0
    assert fields["gpu_interconnect"] == "nvswitch"  # in no API: the previous copy's


@pytest.mark.skipif(not SHARED.is_file(), reason="shared/ is beside the project only in the developers' checkout")
def test_every_shared_column_is_one_of_the_shared_table() -> None:
    """The columns scripts/build_data.py copies as they are exist in shared/'s instance table, and its rows give
    the bundled copy's cells (the build's bytes are in predictor/data/sources.json, checked elsewhere)."""
    with SHARED.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    missing = [f.shared for f in FIELDS if f.shared and f.shared not in rows[0]]
    assert not missing
    with (ROOT / "predictor" / "data" / "instances.csv").open(encoding="utf-8") as handle:
        bundled = {r["instance_type"]: r for r in csv.DictReader(handle)}
    spec = importlib.util.spec_from_file_location("build_data", ROOT / "scripts" / "build_data.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for row in rows:
        copied = from_shared(build.vendor_fixed(row))  # the vendor's figure where moto's dump misreads one
        cells = bundled[row["instance_type"]]
        assert {BY_NAME[n].key("column"): v for n, v in copied.items()} == {
            BY_NAME[n].key("column"): cells[BY_NAME[n].key("column") or ""] for n in copied
        }


def test_the_docs_tables_are_the_declarations() -> None:
    """docs/catalog.md's tables of an instance type's and a GPU's fields are the declarations', row for row."""
    doc = (ROOT / "docs" / "catalog.md").read_text()
    assert fields_table() in doc, "docs/catalog.md: paste fields_table()'s output (its docstring says how)"
    assert fields_table(GPU_SPECS) in doc, "docs/catalog.md: paste fields_table(GPU_SPECS)'s output"


def test_a_gpus_fields_are_the_declarations_in_every_form() -> None:
    """The bundled GPU tables' columns, the GPU record, the extra's YAML and srifty catalog gpus' JSON keys are the
    declarations' (GPU_SPECS); every bundled GPU reads through them."""
    with (ROOT / "predictor" / "data" / "gpus.csv").open(encoding="utf-8") as handle:
        assert next(csv.reader(handle)) == columns(GPU_SPECS, "gpus.csv")
    with (ROOT / "predictor" / "data" / "gpu_arch.csv").open(encoding="utf-8") as handle:
        assert next(csv.reader(handle)) == ["key", *columns(GPU_SPECS, "gpu_arch.csv"), "source"]
    assert {f.name for f in dataclasses.fields(GPU)} == {f.name for f in GPU_SPECS if f.record}
    assert yaml_fields(GPU_SPECS) == GPU_FIELDS
    assert GPU_FIELDS["name"] is GPU_SPECS[0].yaml and GPU_SPECS[0].name == "key"
    assert len(gpu_table()) >= 25 and all(g.memory_gb > 0 for g in gpu_table().values())
    out = subprocess.run(
        [sys.executable, "-m", "lightning_srifty.cli", "catalog", "gpus", "--format", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    row = json.loads(out)[0]
    assert list(row) == [f.key("json") for f in GPU_SPECS if f.key("json") is not None]
    assert isinstance(row["aliases"], list)


def fields_table(fields: tuple[Field, ...] = FIELDS) -> str:
    """The markdown table docs/catalog.md shows of an instance type's fields, or given GPU_SPECS a GPU's (print them:
    ``cd tests && python -c "from model.test_instance_fields import *; print(fields_table());
    print(fields_table(GPU_SPECS))"``)."""

    def code(text: str | None) -> str:
        return f"`{text}`" if text else "-"

    aws = fields is FIELDS  # a GPU is in no AWS API
    head = "| field | meaning | column | JSON | YAML (catalog extra) |" + (" DescribeInstanceTypes |" if aws else "")
    lines = [head + " shared/ column |", "|---" * (7 if aws else 6) + "|"]
    for f in fields:
        yaml = code(f.key("yaml_key")) if f.yaml is not None else "-"
        if f.yaml is not None and f.yaml.required:
            yaml += " (required)"
        column = code(f.key("column")) + (f" ({f.table})" if f.table == "gpu_arch.csv" else "")
        lines.append(
            f"| `{f.name}` | {f.doc} | {column} | {code(f.key('json'))} | {yaml} |"
            + (f" {code(f.aws)} |" if aws else "")
            + f" {code(f.shared)} |"
        )
    return "\n".join(lines) + "\n"


def test_a_copy_missing_a_column_is_refused_unless_the_column_came_later() -> None:
    """A cut-down copy without gpu_interconnect would price every NVSwitch type as PCIe: refused (the catalog's
    loader reports an unreadable copy); network_cards, efa_max_interfaces and the advisor's bucket came within v1."""
    with (ROOT / "predictor" / "data" / "instances.csv").open(encoding="utf-8") as handle:
        row = next(csv.DictReader(handle))
    for column in ("gpu_interconnect", "arch", "local_nvme_gb", "network_up_to", "gpu"):
        with pytest.raises(KeyError, match=column):
            read_row({k: v for k, v in row.items() if k != column})
    later = {
        k: v for k, v in row.items() if k not in ("network_cards", "efa_max_interfaces", "spot_interruption_bucket")
    }
    assert read_row(later)["spot_interruption_bucket"] is None


def test_a_refresh_leaves_out_a_type_whose_row_would_not_read() -> None:
    """An item without VCpuInfo wrote vcpus='' and made every later load of the copy fail (a review found it): the
    type is left out with a note instead."""
    item = {
        "InstanceType": "g9.odd",
        "MemoryInfo": {"SizeInMiB": 16384},
        "GpuInfo": {"Gpus": [{"Name": "T4", "Manufacturer": "NVIDIA", "Count": 1, "MemoryInfo": {"SizeInMiB": 15360}}]},
        "NetworkInfo": {"NetworkPerformance": "Up to 25 Gigabit"},
    }
    notes: list[str] = []
    assert _spec_row(item, Catalog.load(), notes) is None
    assert any("g9.odd: left out" in n and "vcpus" in n for n in notes), notes
    item["VCpuInfo"] = {"DefaultVCpus": 4}
    assert _spec_row(item, Catalog.load(), []) is not None
