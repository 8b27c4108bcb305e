"""The MLPerf Training validation set (bench/mlperf.py, bench/data/mlperf_training.csv): what is scored, what is said
instead, and the nodes the rows run on. No capture and no prediction here (the bench does those)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from _support import load_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_path("bench_mlperf", ROOT / "bench" / "mlperf.py")


@pytest.fixture(scope="module")
def builder():
    return load_path("build_mlperf_data", ROOT / "scripts" / "build_mlperf_data.py")


def test_every_distinct_row_is_scored_or_says_why_not(bench) -> None:
    rows = bench.load_rows()
    with bench.DATA.open() as fh:
        everything = list(csv.DictReader(fh))
    assert len(rows) == sum(not r["duplicate_of"] for r in everything) >= 600  # republished runs dropped
    reasons = [bench.in_scope(r) for r in rows]
    scored = [r for r, why in zip(rows, reasons, strict=True) if why is None]
    assert scored and all(r["benchmark"] == "bert" and r["pytorch_based"] == "true" for r in scored)
    assert not any(r["fp8"] == "true" for r in scored), "an FP8 row is never scored as fp16"
    # Hopper / Ada rows without their config cannot rule FP8 out, and are said so
    assert all(r["config_file"] or not r["gpu"].startswith(bench.FP8_CAPABLE) for r in scored)
    assert all(isinstance(why, str) and why for why in reasons if why is not None)


def test_nvidias_bert_fp8_layers_are_flagged(builder) -> None:
    """NVIDIA's BERT turns FP8 on with --use_transformer_engine2 (run_pretraining.py: "Enable FP8 layers"), not with
    an FP8 variable: the H100 rows that ran it must not be scored as fp16."""
    text = 'export EXTRA_PARAMS="--pad_fmha --packed_samples --use_transformer_engine2 --use_cuda_graph "'
    flags = builder.config_flags({}, text)
    assert flags["fp8"] is True and flags["cuda_graphs"] is True and flags["packed_sequences"] is True
    assert builder.config_flags({}, 'export EXTRA_PARAMS="--pad_fmha --use_cuda_graph"')["fp8"] is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8x ConnectX-7 IB NDR 400Gb/Sec", (3200.0, 8, True)),
        (
            "Storage: 2x ConnectX-7 IB NDR 400Gb/s, Compute: 8x ConnectX-7 IB NDR 400Gb/s, Management: 100Gb/",
            (3200.0, 8, True),
        ),
        ("2x Cornelis Networks Omni-Path HFI Adapter 100 Series 100Gb/Sec", (200.0, 2, True)),
        ("1x Ethernet 25Gb/s", (25.0, 1, False)),
        ("Infiniband, Ethernet", None),
        ("", None),
    ],
)
def test_the_compute_network_is_read_from_the_systems_json(bench, text, expected) -> None:
    assert bench.network({"interconnect": text}) == expected


def test_a_multi_node_row_without_its_network_is_not_scored(bench) -> None:
    row = {
        "pytorch_based": "true",
        "fp8": "",
        "precision": "",
        "benchmark": "bert",
        "per_gpu_batch": "48",
        "config_file": "x/config.sh",
        "gpu": "A100-SXM-80GB",
        "nodes": "4",
        "interconnect": "Infiniband",
    }
    assert "network" in bench.in_scope(row)
    assert bench.in_scope({**row, "nodes": "1"}) is None
    assert "FP8" in bench.in_scope({**row, "nodes": "1", "gpu": "H100-SXM", "config_file": ""})


def test_the_node_of_a_row(bench) -> None:
    sxm8 = bench.node_type({"gpu": "H100-SXM", "gpus_per_node": "8", "interconnect": "8x ConnectX-7 IB NDR 400Gb/Sec"})
    assert sxm8["gpu_interconnect"] == "nvswitch" and sxm8["efa"] and sxm8["efa_interfaces"] == 8
    assert sxm8["network_gbps"] == 3200.0
    pcie = bench.node_type({"gpu": "A100-PCIe-80GB", "gpus_per_node": "4", "interconnect": ""})
    assert pcie["gpu_interconnect"] == "pcie" and "efa" not in pcie
    assert bench.node_type({"gpu": "L4", "gpus_per_node": "1", "interconnect": ""})["gpu_interconnect"] == "single"
