"""The bundled catalog, its queries, and user-defined GPUs and instance types from YAML."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import ROOT
from lightning_srifty.cli import main
from predictor.catalog import Catalog
from predictor.catalog.instances import interruption_rate
from predictor.exceptions import CatalogError, UnknownNameError

EXAMPLE = ROOT / "tests" / "data" / "extra_example.yaml"


@pytest.fixture
def bundled(monkeypatch, tmp_path) -> Catalog:
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path / "cache"))  # no refreshed copy: the bundled snapshot
    monkeypatch.delenv("SRIFTY_CATALOG_EXTRA", raising=False)
    return Catalog.load()


def test_bundled_snapshot_answers_for_every_accelerator_type(bundled: Catalog) -> None:
    assert len(bundled) >= 60
    assert bundled.info.source == "bundled" and bundled.info.snapshot == "2026-07-20"
    p4d = bundled.get("p4d.24xlarge")
    assert (p4d.gpu, p4d.gpus, p4d.gpu_memory_gib, p4d.vcpus, p4d.network_gbps, p4d.efa, p4d.gpu_interconnect) == (
        "A100-SXM-40GB",
        8,
        40.0,
        96,
        400.0,
        True,
        "nvswitch",
    )
    assert p4d.price_usd_hr("us-east-1") == pytest.approx(21.957642)
    assert p4d.price("us-east-1", "spot").availability_zone == "use1-az1"  # the cheapest measured zone
    assert p4d.spot_interruption_bucket == "10-15%"
    g5 = bundled.get("g5.xlarge")
    assert g5.network_up_to and g5.gpu_interconnect == "single"
    assert g5.price("us-east-1", "spot").estimated  # only an advisor-based estimate exists for it
    assert not bundled.get("trn1.32xlarge").cuda and bundled.get("trn1.32xlarge").gpu is None


def test_an_accelerators_memory_is_its_vendors_not_a_dumps_misreading(bundled: Catalog) -> None:
    """moto's DescribeInstanceTypes dump gives a Trainium2 512 GiB; AWS Neuron's Trainium2 architecture page gives 96
    GiB of device memory a chip, 1.5 TiB on trn2.48xlarge's 16 (scripts/build_data.py DEVICE_MEMORY_FIXES)."""
    for name, devices in (("trn2.3xlarge", 1), ("trn2.48xlarge", 16)):
        it = bundled.get(name)
        assert (it.gpus, it.gpu_memory_gib) == (devices, 96.0)
    assert bundled.get("trn1.32xlarge").gpu_memory_gib == 32.0  # Trainium: 32 GiB a chip, as the dump says


def test_every_cuda_type_has_a_known_gpu(bundled: Catalog) -> None:
    missing = sorted({it.gpu for it in bundled if it.cuda and it.gpu not in bundled.gpus})
    assert missing == []
    # B200 and B300 are not in shared/'s table: their rows come from NVIDIA's datasheets (scripts/data/)
    b200, b300 = bundled.gpu("NVIDIA B200"), bundled.gpu("NVIDIA B300")
    assert (b200.key, b200.bf16_tflops, b200.fp32_tflops, b200.memory_bw_gbps, b200.compute_capability) == (
        "B200-SXM",
        2250,
        75,
        7700,
        "10.0",
    )
    assert (b300.key, b300.memory_gb, b300.sms, b300.compute_capability) == ("B300-SXM", 270, 160, "10.3")
    # the architecture facts agree with the datasheet's FP32 peak: SMs x 128 lanes x 2 x boost clock
    for gpu in (b200, b300):
        assert gpu.sms * 128 * 2 * gpu.clock_mhz * 1e6 / 1e12 == pytest.approx(gpu.fp32_tflops, rel=0.01)


def test_unknown_names_suggest(bundled: Catalog) -> None:
    with pytest.raises(UnknownNameError) as info:
        bundled.get("p4d.24xlarg")
    assert info.value.suggestions[0] == "p4d.24xlarge"
    assert "Did you mean 'p4d.24xlarge'" in str(info.value)
    assert bundled.get("P4D.24XLARGE").name == "p4d.24xlarge"
    with pytest.raises(UnknownNameError, match="Did you mean 'H100-SXM'"):
        bundled.gpu("H100-SXN")
    assert "--catalog-extra" in str(info.value)  # a name that is no GPU keeps the generic hint
    # a family without its size (a new user's --current p4d:1) names its types, smallest first
    with pytest.raises(UnknownNameError) as family:
        bundled.get("p4d")
    assert family.value.suggestions == ["p4d.24xlarge"]
    with pytest.raises(UnknownNameError) as family:
        bundled.get("g5")
    assert family.value.suggestions[0] == "g5.xlarge" and len(family.value.suggestions) == 4


def test_a_gpu_given_as_an_instance_type_names_the_types_that_carry_it(bundled: Catalog) -> None:
    with pytest.raises(UnknownNameError) as info:
        bundled.get("a100")
    text = str(info.value)
    assert "'a100' is a GPU, not an instance type: the types with it are p4d.24xlarge, p4de.24xlarge" in text
    assert "srifty catalog show --gpu a100" in text and "e.g. p4d.24xlarge:2" in text
    with pytest.raises(UnknownNameError, match=r"'L4' is a GPU.*g6\.xlarge"):
        bundled.get("L4")


def test_filters(bundled: Catalog) -> None:
    assert [it.name for it in bundled.filter(gpu="A100")] == ["p4d.24xlarge", "p4de.24xlarge"]
    assert {it.gpu for it in bundled.filter(gpu="H100")} == {"H100-SXM"}
    cheap = bundled.filter(region="us-east-1", max_price=2.0)
    prices = [it.price_usd_hr("us-east-1") for it in cheap]
    assert cheap and all(p <= 2.0 for p in prices) and prices == sorted(prices)
    assert all(it.cuda for it in bundled.filter())
    assert any(not it.cuda for it in bundled.filter(cuda_only=False))
    big = bundled.filter(min_gpu_memory_gib=80)
    assert big and all(it.gpu_memory_gib >= 80 for it in big)
    assert bundled.gpu("NVIDIA A100-SXM4-40GB").key == "A100-SXM-40GB"


def test_interruption_buckets_become_hourly_rates() -> None:
    assert interruption_rate("<5%") == pytest.approx(-math.log(0.975) / 730)
    assert interruption_rate(">20%") > interruption_rate("10-15%") > interruption_rate("<5%")
    assert interruption_rate("") is None


def test_the_documented_yaml_adds_gpus_and_types(bundled: Catalog) -> None:
    cat = Catalog.load(extra=[EXAMPLE])
    assert len(cat) == len(bundled) + 1
    dgx = cat.get("dgx-a100-40g")
    assert (dgx.gpu, dgx.gpus, dgx.vcpus, dgx.network_gbps, dgx.efa, dgx.gpu_interconnect) == (
        "A100-SXM-40GB",
        8,
        256,
        1600.0,
        True,
        "nvswitch",
    )
    assert dgx.price_usd_hr() == 30.0 and dgx.gpu_memory_gib == 40
    assert cat.gpu("B200-SXM").bf16_tflops == 2250
    assert cat.get("p6-b200.48xlarge").gpu in cat.gpus  # the bundled B200 type now has specs
    assert str(EXAMPLE) in cat.info.extras and dgx.origin.startswith("user")
    assert "dgx-a100-40g" in [it.name for it in cat.filter(gpu="A100", region="us-east-1")]


def test_extra_gpu_architecture_facts(tmp_path) -> None:
    path = tmp_path / "arch.yaml"
    path.write_text(
        "gpus:\n  - name: X1\n    memory_gb: 4\n    sms: 10\n    clock_mhz: 1500\n    l2_mb: 8\n"
        "    compute_capability: 9.0\n  - name: X2\n    memory_gb: 4\n"
    )
    cat = Catalog.load(extra=[path], use_refreshed=False)
    x1, x2 = cat.gpu("X1"), cat.gpu("X2")
    assert (x1.sms, x1.clock_mhz, x1.l2_mb, x1.compute_capability) == (10, 1500.0, 8.0, "9.0")
    assert (x2.sms, x2.clock_mhz, x2.l2_mb, x2.compute_capability) == (None, None, None, None)


def test_extra_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SRIFTY_CATALOG_EXTRA", str(EXAMPLE))
    assert "dgx-a100-40g" in Catalog.load()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "instance_types:\n  - name: x\n    gpu: A100-SXM-40GB\n    gpus: 8\n    vcpus: 8\n    memory_gib: 64\n"
            "    network_gbps: 10\n    gpu_per_node: 3\n",
            r"instance_types\[0\] \(x\)\.gpu_per_node: unknown field",
        ),
        (
            "instance_types:\n  - name: x\n    gpus: 8\n    vcpus: 8\n    memory_gib: 64\n    network_gbps: 10\n",
            r"instance_types\[0\] \(x\)\.gpu: missing",
        ),
        (
            "instance_types:\n  - name: x\n    gpu: A100-SXM-40GB\n    gpus: eight\n    vcpus: 8\n    memory_gib: 64\n"
            "    network_gbps: 10\n",
            r"\.gpus: expected a whole number, got 'eight'",
        ),
        (
            "instance_types:\n  - name: x\n    gpu: A100-SXM-41GB\n    gpus: 8\n    vcpus: 8\n    memory_gib: 64\n"
            "    network_gbps: 10\n",
            r"instance_types\[0\]\.gpu: Unknown GPU 'A100-SXM-41GB'\. Did you mean",
        ),
        (
            "instance_types:\n  - name: x\n    gpu: T4\n    gpus: 1\n    vcpus: 8\n    memory_gib: 64\n"
            "    network_gbps: 10\n    gpu_interconnect: nvswich\n",
            r"Did you mean 'nvswitch'",
        ),
        ("gpus:\n  - name: X1\n    memory_gb: -4\n", r"gpus\[0\]\.memory_gb: must not be negative"),
        ("gpus:\n  - name: X1\n    memory_gb: 4\n    sms: 13.5\n", r"gpus\[0\]\.sms: expected a whole number"),
        (
            "gpus:\n  - name: X1\n    memory_gb: 4\n    compute_capability: sm90\n",
            r"gpus\[0\]\.compute_capability: expected MAJOR\.MINOR",
        ),
        ("gpus:\n  - name: X1\n   memory_gb: 4\n", r"not valid YAML at line 3"),
        ("instance_type:\n  - name: x\n", r"unknown section 'instance_type'\. Did you mean 'instance_types'"),
        ("- 1\n- 2\n", r"expected a mapping"),
    ],
)
def test_bad_yaml_names_file_entry_and_field(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message) as info:
        Catalog.load(extra=[path], use_refreshed=False)
    assert str(info.value).startswith(str(path))


def test_missing_extra_file(tmp_path) -> None:
    with pytest.raises(CatalogError, match="not found"):
        Catalog.load(extra=[tmp_path / "nope.yaml"])


def test_catalog_show_without_credentials(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert main(["catalog", "show", "--gpu", "A100"]) == 0
    out = capsys.readouterr().out
    assert "p4d.24xlarge" in out and "p4de.24xlarge" in out and "snapshot 2026-07-20" in out
    assert "g5.xlarge" not in out


def test_catalog_show_json_is_stable(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path))
    assert main(["--catalog-extra", str(EXAMPLE), "catalog", "show", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "srifty.catalog-listing/v1" and doc["region"] == "us-east-1"
    first = doc["instance_types"][0]
    # the keys every entry has (their order follows the fields' declarations, predictor.catalog.fields: JSON
    # objects are unordered and docs/catalog.md promises the keys and their meaning, not an order)
    assert sorted(first) == sorted(
        [
            "instance_type",
            "family",
            "accelerator_kind",
            "gpu",
            "gpus",
            "gpu_memory_gib",
            "vcpus",
            "memory_gib",
            "network_gbps",
            "network_up_to",
            "efa",
            "network_baseline_gbps",  # added in issue #38 (an "up to" network's baseline)
            "network_cards",  # added in issue #12 (new keys may be added within the schema)
            "efa_interfaces",
            "gpu_interconnect",
            "local_nvme_gb",
            "arch",
            "ondemand_usd_hr",
            "ondemand_as_of",
            "spot_usd_hr",
            "spot_estimated",
            "spot_as_of",
            "spot_interruption_bucket",
            "interruption_rate_per_hr",
            "process_group_backend",
            "gpudirect_rdma",  # added in issue #38 item 3 (null: as AWS's NCCL plugin requires it per type)
            "origin",
        ]
    )
    priced = [t["ondemand_usd_hr"] for t in doc["instance_types"] if t["ondemand_usd_hr"] is not None]
    assert priced == sorted(priced)
    assert any(t["instance_type"] == "dgx-a100-40g" for t in doc["instance_types"])


def test_catalog_show_unknown_gpu_exits_2(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("SRIFTY_CACHE_DIR", str(tmp_path))
    assert main(["catalog", "show", "--gpu", "A1OO"]) == 2
    assert "Unknown GPU 'A1OO'" in capsys.readouterr().err


def test_catalog_gpus_lists_specs(capsys) -> None:
    assert main(["catalog", "gpus", "--format", "json", "--catalog-extra", str(EXAMPLE)]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["H100-SXM"]["bf16_tflops"] == 989.5 and "NVIDIA H100 80GB HBM3" in rows["H100-SXM"]["aliases"]
    assert rows["B200-SXM"]["memory_gb"] == 180  # user-defined


def test_catalog_yaml_refuses_aliases_non_finite_numbers_folders_and_non_utf8(tmp_path) -> None:
    from predictor.catalog.extra import load_extra

    laughs = tmp_path / "laughs.yaml"
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    rows += [f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]" for p, c in zip("abcdefgh", "bcdefghi")]
    laughs.write_text("\n".join(rows) + "\n")
    with pytest.raises(CatalogError, match=r"laughs\.yaml: not valid YAML at line 2.*aliases \(\*name\) are not"):
        load_extra(laughs)
    nan = tmp_path / "nan.yaml"
    nan.write_text("gpus:\n  - name: X1\n    memory_gb: 16\n    memory_bw_gbps: .nan\n    fp32_tflops: 10\n")
    with pytest.raises(CatalogError, match=r"gpus\[0\]\.memory_bw_gbps is NaN or infinite"):
        load_extra(nan)
    with pytest.raises(CatalogError, match="is a folder"):
        load_extra(tmp_path)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("gpus:\n  - name: Caf\xe9\n".encode("latin-1"))
    with pytest.raises(CatalogError, match="not UTF-8"):
        load_extra(latin)


def test_outputs_never_replace_what_is_not_a_regular_file(tmp_path) -> None:
    import os

    from predictor.documents.atomic import atomic_write_text, refuse_non_regular

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "plan.json"
    link.symlink_to(victim)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (link, fifo, tmp_path):
        with pytest.raises(OSError, match="not a regular file: refusing to replace it"):
            atomic_write_text(target, "{}")
    assert victim.read_text() == "keep" and link.is_symlink() and fifo.is_fifo()
    with pytest.raises(OSError, match="is a device"):
        refuse_non_regular(Path("/dev/null"))  # only looked at: never written, even if this regresses
    atomic_write_text(tmp_path / "new.json", "{}")  # a regular path still works


def test_the_cli_says_why_it_cannot_write_an_output_without_a_traceback(tmp_path, capsys) -> None:
    import os

    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    profile = str(ROOT / "examples" / "profiles" / "resnet50-v100.json")
    assert main(["recommend", "--profile", profile, "--steps", "1000", "--out", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert "is a FIFO, not a regular file" in err and "Traceback" not in err and fifo.is_fifo()
