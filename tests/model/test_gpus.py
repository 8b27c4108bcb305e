"""Canonical GPU keys from the names torch reports."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from predictor.catalog import canonical_gpu, get_gpu, gpu_table
from predictor.exceptions import UnknownNameError


@pytest.mark.parametrize(
    ("reported", "memory", "key"),
    [
        ("NVIDIA A100-SXM4-40GB", 39.4, "A100-SXM-40GB"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "A100-SXM-80GB"),
        ("NVIDIA A100 80GB PCIe", 79.2, "A100-PCIe-80GB"),
        ("Tesla V100-SXM2-16GB", 15.8, "V100-SXM2-16GB"),
        ("Tesla V100-SXM2-32GB", 31.7, "V100-SXM2-32GB"),
        ("Tesla T4", 14.6, "T4"),
        ("NVIDIA A10G", 22.3, "A10G"),
        ("NVIDIA H100 80GB HBM3", 79.1, "H100-SXM"),
        ("NVIDIA L40S", 44.4, "L40S"),
        ("NVIDIA GeForce RTX 4090", 23.6, "RTX-4090"),
        ("a10g", None, "A10G"),
        ("V100-SXM2", 31.7, "V100-SXM2-32GB"),  # family name: memory decides the size
        ("V100-SXM2", 15.8, "V100-SXM2-16GB"),
    ],
)
def test_torch_names_map_to_canonical_keys(reported: str, memory: float | None, key: str) -> None:
    assert canonical_gpu(reported, memory) == key


def test_unknown_gpu_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        canonical_gpu("A100-SXM-48GB")
    assert info.value.kind == "GPU"
    assert "A100-SXM-40GB" in info.value.suggestions
    assert "Did you mean" in str(info.value)
    with pytest.raises(UnknownNameError, match=r"Unknown GPU 'V100-SXM2'.*V100-SXM2-16GB"):
        canonical_gpu("V100-SXM2")  # ambiguous without the memory size


def test_specs_are_parsed_numbers() -> None:
    a100 = get_gpu("NVIDIA A100-SXM4-40GB")
    assert (a100.memory_gb, a100.memory_bw_gbps, a100.bf16_tflops, a100.nvlink_gbps) == (40, 1555, 312, 600)
    assert get_gpu("V100-SXM2-32GB").memory_gb == 32
    assert get_gpu("V100-SXM2-32GB").nvlink_gbps == 300
    assert len(gpu_table()) >= 25
    assert all(g.source for g in gpu_table().values()), "every row keeps its citation"


def test_bundled_data_is_what_the_build_script_wrote() -> None:
    """predictor/data/sources.json records the sha256 of every file scripts/build_data.py wrote: a hand edit of the
    bundled numbers fails here on any checkout, CI's clean one included. Where the shared reference data is present
    (a developer's checkout), the build is also re-run against it: the bundled copy is up to date with its source."""
    data = ROOT / "predictor" / "data"
    manifest = json.loads((data / "sources.json").read_text())
    assert set(manifest["outputs"]) == {"gpus.csv", "instances.csv", "prices.csv", "measurements.csv"}
    for name, digest in manifest["outputs"].items():
        actual = hashlib.sha256((data / name).read_bytes()).hexdigest()
        assert actual == digest, f"predictor/data/{name} differs from the build's: run python scripts/build_data.py"
    shared = ROOT.parent / "shared" / "data"
    if (shared / "gpu_specs.csv").exists():
        result = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "build_data.py"), "--check", "--shared", str(shared)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr


# FP32 lanes per SM by compute capability (NVIDIA CUDA C Programming Guide, "Arithmetic Instructions" table)
FP32_PER_SM = {"3.7": 192, "5.2": 128, "6.0": 64, "7.0": 64, "7.5": 64, "8.0": 64, "8.6": 128, "8.9": 128, "9.0": 128,
               "10.0": 128, "10.3": 128}  # fmt: skip


def test_every_bundled_gpu_has_architecture_facts() -> None:
    for gpu in gpu_table().values():
        assert gpu.sms and gpu.clock_mhz and gpu.l2_mb and gpu.compute_capability, gpu.key
    a100, l4 = get_gpu("A100-PCIe-80GB"), get_gpu("L4")
    assert (a100.sms, a100.clock_mhz, a100.l2_mb, a100.compute_capability) == (108, 1410, 40, "8.0")
    assert (l4.sms, l4.l2_mb, l4.compute_capability) == (58, 48, "8.9")  # datasheet: 7424 cores / 128 (NeuSight: 60)


@pytest.mark.parametrize("key", sorted(set(gpu_table()) - {"A10G"}))
def test_architecture_facts_reproduce_the_fp32_peak(key: str) -> None:
    """SMs x FP32 lanes x 2 x boost clock is the datasheet FP32 peak (A10G: the catalog carries A10 figures)."""
    gpu = get_gpu(key)
    peak = gpu.sms * FP32_PER_SM[gpu.compute_capability] * 2 * gpu.clock_mhz / 1e6
    assert peak == pytest.approx(gpu.fp32_tflops, rel=0.015)


@pytest.mark.parametrize(
    ("text", "capability", "tf32"),
    [("8.6", (8, 6), True), ("7.5", (7, 5), False), ("10.0", (10, 0), True), ("9", (9, 0), True), (None, None, False),
     ("x.y", None, False)],
)  # fmt: skip
def test_compute_capability_is_read_once_for_every_rule(text, capability, tf32) -> None:
    """The one reading of a GPU's compute capability (torch builds, tensor cores, TF32, NVLS all ask it)."""
    import dataclasses

    gpu = dataclasses.replace(get_gpu("A10G"), compute_capability=text)
    assert gpu.capability == capability and gpu.tf32_convolutions is tf32
    assert get_gpu("V100-SXM2-16GB").tf32_convolutions is False and get_gpu("A100-SXM-80GB").tf32_convolutions
