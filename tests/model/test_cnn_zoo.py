"""bench/cnn_zoo.py's data and GPUs: the published steps as BENCHMARKS.md quotes them, and the five GPUs EC2 does not
sell stated as the kernel model needs them (the scoring itself needs torchvision and runs in the bench)."""

from __future__ import annotations

import csv
from collections import Counter

from _support import ROOT, bench_module

DATA = ROOT / "bench" / "data" / "published_cnn_zoo.csv"


def rows() -> list[dict[str, str]]:
    with DATA.open() as fh:
        return list(csv.DictReader(fh))


def test_the_published_steps_are_the_ones_quoted() -> None:
    data = rows()
    assert len(data) == 316 and len({r["model"] for r in data}) == 32
    assert Counter(r["precision"] for r in data) == {"FP32": 158, "FP16": 158}
    for r in data:
        assert float(r["p10_ms"]) <= float(r["step_ms"]) <= float(r["p90_ms"]), r
        assert r["repo"] == "ryujaehun/pytorch-gpu-benchmark" and len(r["commit"]) == 40 and int(r["batch"]) == 12
    step = {(r["gpu"], r["model"], r["precision"]): float(r["step_ms"]) for r in data}
    # the host-bound example BENCHMARKS.md gives: ResNet-18 FP32 on the A100 and the TITAN V
    assert round(step[("A100-SXM-40GB", "resnet18", "FP32")], 1) == 16.0
    assert round(step[("TITAN-V", "resnet18", "FP32")], 1) == 16.5


def test_every_gpu_of_the_set_is_priced_with_its_architecture() -> None:
    zoo = bench_module("cnn_zoo")
    catalog = zoo.catalog()
    for key in {r["gpu"] for r in rows()}:
        gpu = catalog.gpus.get(key)
        assert gpu.sms and gpu.clock_mhz and gpu.l2_mb and gpu.memory_bw_gbps and gpu.fp32_tflops, key
        assert catalog.get(f"zoo-{key}").gpu == key
    pascal = [g for g in zoo.zoo_gpus() if g.compute_capability == "6.1"]
    assert pascal and all(g.fp16_tflops is None for g in pascal)  # FP16 on the FP32 units, not at 1/64 rate
    assert zoo.family("mnasnet1_0") == "depthwise" and zoo.family("wide_resnet50_2") == "ResNet"
