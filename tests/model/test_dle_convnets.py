"""bench/dle_convnets.py's data and fleets: NVIDIA DeepLearningExamples' ConvNet throughput as BENCHMARKS.md quotes
it, each row at the repository's own per-GPU batch and layout, and the fleets the bench prices it on (the scoring
itself captures torchvision's architectures and runs in the bench)."""

from __future__ import annotations

import csv
from collections import Counter

from _support import ROOT, bench_module

DATA = ROOT / "bench" / "data" / "published_dle_convnets.csv"


def rows() -> list[dict[str, str]]:
    with DATA.open() as fh:
        return list(csv.DictReader(fh))


def test_the_published_throughputs_are_the_ones_quoted() -> None:
    data = rows()
    assert len(data) == 48
    assert Counter(r["model"] for r in data) == {"resnet50": 8, "resnext101-32x4d": 8, "se-resnext101-32x4d": 8,
                                                 "efficientnet-b0": 10, "efficientnet-b4": 14}  # fmt: skip
    for r in data:
        assert r["repo"] == "NVIDIA/DeepLearningExamples" and len(r["commit"]) == 40, r
        # AMP ran channels-last (configs.yml: memory_format nhwc), FP32 / TF32 NCHW; TF32 only on the A100
        assert (r["memory_format"] == "NHWC") == (r["precision"] == "AMP"), r
        assert r["precision"] != "TF32" or r["gpu"] == "A100-SXM-80GB", r
        assert r["precision"] != "FP32" or r["gpu"] == "V100-SXM2-16GB", r
    value = {(r["model"], r["gpu"], r["precision"], int(r["gpus"])): float(r["throughput_img_s"]) for r in data}
    batch = {(r["model"], r["gpu"], r["precision"]): int(r["per_gpu_batch"]) for r in data}
    # the rows BENCHMARKS.md names: the input pipeline's rate on the DGX A100, the V100's EfficientNet in FP32
    a100, v100 = "A100-SXM-80GB", "V100-SXM2-16GB"
    assert value[("resnet50", a100, "AMP", 1)] == 2470 and value[("efficientnet-b0", a100, "AMP", 1)] == 2489
    assert value[("resnet50", a100, "AMP", 8)] == 16621 and value[("efficientnet-b0", a100, "AMP", 8)] == 16652
    assert value[("efficientnet-b0", v100, "FP32", 1)] == 655 and batch[("efficientnet-b0", v100, "FP32")] == 64
    assert value[("efficientnet-b4", "A100-SXM-80GB", "TF32", 64)] == 9146
    assert {int(r["image_size"]) for r in data if r["model"] == "efficientnet-b4"} == {380}


def test_the_bench_prices_each_row_on_the_servers_that_ran_it() -> None:
    dle = bench_module("dle_convnets")
    catalog = dle.catalog()
    for r in dle.rows():
        if r["gpus"] == 1:
            instance = catalog.get(f"dle-{r['gpu']}")
            assert instance.gpus == 1 and instance.gpu == r["gpu"]
        else:
            server = catalog.get(dle.SERVER[r["gpu"]])
            assert server.gpus == 8 and server.gpu == r["gpu"] and r["gpus"] % 8 == 0
    assert catalog.get("p4de.24xlarge").gpu_interconnect == "nvswitch"  # a DGX A100's NVSwitch
    assert catalog.get("p3.16xlarge").gpu_interconnect == "nvlink"  # a DGX-1's NVLink mesh
