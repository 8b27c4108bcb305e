"""bench/horovod_tcp.py's data and nodes: Horovod's published data parallelism over TCP as BENCHMARKS.md quotes it
(the README @ d54e3a88 read by scripts/build_horovod_tcp_data.py), and the nodes the bench prices it on: four GPUs a
node, no EFA, so NCCL's sockets with each node's transfers staged through host memory (the scoring itself captures
torchvision's architectures and runs in the bench)."""

from __future__ import annotations

import csv
import importlib.util

import pytest

from _support import ROOT, bench_module
from predictor.model.collectives import SOCKETS
from predictor.model.network import DEFAULT_NETWORK, inter_node_link

DATA = ROOT / "bench" / "data" / "horovod_tcp_scaling.csv"
AWS_2018 = ROOT / "bench" / "data" / "horovod_aws_tcp_2018.csv"


def builder():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("build_horovod", ROOT / "scripts" / "build_horovod_tcp_data.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


README = """
The first benchmark was done on 4 servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s network:

| Setup | Inception V3 | ResNet-101 | VGG-16 |
|---|:---:|:---:|:---:|
| Baseline single-GPU (batch size=64) | 134.4 | 119.4 | 130.9 |
| TCP Horovod (allreduce on CPU) | **2,073.3 (15.4x)** | 1,338.3 (11.2x) | 616.8 (4.7x) |
| TCP Horovod (allreduce on GPU with NCCL) | 1,990.7 (14.8x) | 1,685.1 (14.1x) | 1,308.7 (10.0x) |

The second benchmark was done on 16 servers with 4 Pascal GPUs each connected by plain 40 Gbit/s network:

| Setup | Inception V3 | ResNet-101 | VGG-16 |
|---|:---:|:---:|:---:|
| Baseline single-GPU (batch size=64) | 148.8 | 136.0 | 149.6 |
| TCP Horovod (allreduce on GPU with NCCL) | **7,932.1 (53.3x)** | **7,741.6 (56.9x)** | **6,084.2 (40.7x)** |
"""


def test_the_builder_reads_the_nccl_rows_of_both_clusters_and_checks_their_speedups() -> None:
    build = builder()
    got = build.rows(README)
    assert [(r["model"], r["nodes"], r["network_gbps"], r["dp_img_s"]) for r in got] == [
        ("inception_v3", 4, 25, 1990.7), ("resnet101", 4, 25, 1685.1), ("vgg16", 4, 25, 1308.7),
        ("inception_v3", 16, 40, 7932.1), ("resnet101", 16, 40, 7741.6), ("vgg16", 16, 40, 6084.2),
    ]  # fmt: skip
    assert all(r["per_gpu_batch"] == 64 and r["gpus_per_node"] == 4 for r in got)
    with pytest.raises(ValueError, match="not the README's"):  # a throughput that disagrees with its speedup
        build.rows(README.replace("1,308.7 (10.0x)", "1,608.7 (10.0x)"))


def test_the_data_is_the_readme_as_built() -> None:
    with DATA.open(encoding="utf-8") as fh:
        data = list(csv.DictReader(fh))
    assert len(data) == 6 and all("d54e3a88" in r["source"] for r in data)
    assert {(r["model"], r["nodes"]): float(r["dp_img_s"]) for r in data} == {
        ("inception_v3", "4"): 1990.7, ("resnet101", "4"): 1685.1, ("vgg16", "4"): 1308.7,
        ("inception_v3", "16"): 7932.1, ("resnet101", "16"): 7741.6, ("vgg16", "16"): 6084.2,
    }  # fmt: skip
    for r in data:  # each throughput is its speedup over its own cluster's one-GPU baseline
        assert abs(float(r["dp_img_s"]) / float(r["single_img_s"]) - float(r["speedup"])) < 0.06
    with AWS_2018.open(encoding="utf-8") as fh:
        aws = list(csv.DictReader(fh))
    assert {r["instance_type"] for r in aws} == {"p3.16xlarge"} and len(aws) == 7
    assert all("horovod/horovod#396" in r["source"] for r in aws)
    assert {(r["model"], int(r["nodes"])): (float(r["node_img_s"]), float(r["dp_img_s"])) for r in aws} == {
        ("resnet50", 2): (2697.29, 2632.95), ("resnet50", 4): (2697.29, 4772.04), ("resnet50", 8): (2697.29, 9745.38),
        ("resnet101", 2): (1523, 1529), ("resnet101", 4): (1523, 2958), ("resnet101", 8): (1523, 5806),
        ("resnet101", 16): (1523, 11384),
    }  # fmt: skip


def test_the_bench_prices_four_gpu_nodes_over_host_staged_sockets() -> None:
    bench = bench_module("horovod_tcp")
    catalog = bench.catalog()
    for row in bench.rows():
        node = catalog.get(f"uber-p100x4-{row['network_gbps']}g")
        assert node.gpus == 4 and node.gpu == bench.GPU and not node.efa and node.gpu_interconnect == "pcie"
        link = inter_node_link(node, DEFAULT_NETWORK, catalog.gpus)
        assert link.kind == "tcp" and link.crossing == SOCKETS
        assert link.staging == DEFAULT_NETWORK.host_staged_efficiency  # four GPUs a node: staged
        expected = row["network_gbps"] / 8 * DEFAULT_NETWORK.tcp_efficiency * DEFAULT_NETWORK.host_staged_efficiency
        assert link.gbps == pytest.approx(expected)
