"""Sixteen-bit GEMMs priced by waves of tiles at the GPU's measured ceiling (predictor/model/tensor_gemm.py), and the
operator path's use of it (issue #38 item 5)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from predictor.catalog.gpus import bundled_gpus
from predictor.documents.profile import OpRecord
from predictor.model import ops
from predictor.model.kernels import MIN_KERNEL_S
from predictor.model.tensor_gemm import MATMUL_CEILING, RAMP_S, ceiling, tensor_gemm_time

ROOT = Path(__file__).resolve().parents[2]


def dims(b, m, n, k) -> dict[str, np.ndarray]:
    return {key: np.atleast_1d(np.asarray(v, dtype=float)) for key, v in zip("bmnk", (b, m, n, k), strict=True)}


def test_a_large_gemm_runs_at_the_published_ceiling() -> None:
    gpu = bundled_gpus().get("A100-SXM-80GB")
    t = tensor_gemm_time(dims(1, 16384, 16384, 8192), gpu, gpu.bf16_tflops)[0]
    rate = 2 * 16384 * 16384 * 8192 / (t - RAMP_S)
    assert rate == pytest.approx(MATMUL_CEILING["A100-SXM-80GB"] * gpu.bf16_tflops * 1e12, rel=0.02)
    assert rate < gpu.bf16_tflops * 1e12  # never the datasheet peak


def test_more_work_never_takes_less_time_and_big_gemms_are_not_less_efficient() -> None:
    gpu = bundled_gpus().get("H100-SXM")
    ms = np.array([256, 1024, 4096, 16384, 32768, 65536], dtype=float)
    t = tensor_gemm_time(dims(1, ms, 8192, 8192), gpu, gpu.bf16_tflops)
    assert np.all(np.diff(t) > 0)
    rate = 2 * ms * 8192 * 8192 / t
    assert np.all(np.diff(rate[2:]) >= -1e-6 * rate[2:-1])  # past a few waves the rate does not fall with size
    # (the FP32-learned utilisation it replaces priced 32768 x 22016 x 8192 slower per FLOP than 32768 x 1024 x 8192)
    big, small = tensor_gemm_time(dims(1, [32768, 32768], [22016, 1024], 8192), gpu, gpu.bf16_tflops)
    assert 2 * 32768 * 22016 * 8192 / big >= 2 * 32768 * 1024 * 8192 / small


def test_small_gemms_pay_the_ramp_and_skinny_ones_the_bandwidth() -> None:
    gpu = bundled_gpus().get("H100-SXM")
    tiny = tensor_gemm_time(dims(1, 64, 64, 64), gpu, gpu.bf16_tflops)[0]
    assert RAMP_S <= tiny < RAMP_S + 1e-6 and RAMP_S >= MIN_KERNEL_S
    # a matrix-vector product is memory-bound: at least its operands' bytes at the memory bandwidth
    gemv = tensor_gemm_time(dims(1, 1, 65536, 65536), gpu, gpu.bf16_tflops)[0]
    assert gemv >= 2 * 65536 * 65536 / (gpu.memory_bw_gbps * 1e9)
    assert tensor_gemm_time(dims(1, 0, 128, 128), gpu, gpu.bf16_tflops)[0] == pytest.approx(RAMP_S)


def test_a_gpu_without_a_published_ceiling_takes_its_fp32_kernels_best_share() -> None:
    gpus = bundled_gpus()
    share, source = ceiling(gpus.get("T4"))
    assert 0.0 < share <= 1.0 and "FP32" in source
    share, source = ceiling(gpus.get("H100-SXM"))
    assert share == MATMUL_CEILING["H100-SXM"] and "MAMF" in source


def test_sixteen_bit_gemms_no_longer_follow_the_fitted_tensor_core_efficiency(monkeypatch) -> None:
    gpu = bundled_gpus().get("H100-SXM")
    d = dims(1, 8192, 8192, 8192)
    before = ops.gemm_step_time(d, gpu, True, "bf16-mixed", None, 2.0, "absolute")
    monkeypatch.setattr(ops, "tensor_core_efficiency", lambda kind, path="ratio": 0.1)
    assert ops.gemm_step_time(d, gpu, True, "bf16-mixed", None, 2.0, "absolute") == pytest.approx(before)
    # TF32 and FP32 GEMMs stay on the kernel model (TF32 with the fitted efficiency)
    tf32 = ops.gemm_step_time(d, gpu, False, "32-true", "high", 4.0, "absolute")
    monkeypatch.setattr(ops, "tensor_core_efficiency", lambda kind, path="ratio": 0.2)
    assert ops.gemm_step_time(d, gpu, False, "32-true", "high", 4.0, "absolute")[0] < tf32[0]


def test_fp32_fused_attention_runs_on_the_cuda_cores_whatever_the_matmul_precision() -> None:
    gpu = bundled_gpus().get("H100-SXM")
    q = (32, 12, 384, 64)
    record = OpRecord(
        op="aten._scaled_dot_product_efficient_attention.default",
        phase="forward",
        count=1,
        shapes=(q, q, q),
        dtypes=("float32",) * 3,
        flops=4e9,
        bytes_read=3 * 4.0 * np.prod(q),
        bytes_written=4.0 * np.prod(q),
    )
    table = ops.classify_table([record])
    tf32 = ops.ops_time(table, gpu, "32-true", "high", "absolute")
    fp32 = ops.ops_time(table, gpu, "32-true", "highest", "absolute")
    assert tf32.by_class["gemm"] == pytest.approx(fp32.by_class["gemm"])


def test_xla_measured_dots_are_priced_within_their_held_out_figures() -> None:
    """A regression guard on the held-out figures BENCHMARKS.md reports (time-weighted error of bf16 GEMMs against
    XLA's measured H100 and B200 dots: 5.6 % and 11.1 % when shipped; nothing fitted on them but the ramp)."""
    with (ROOT / "bench" / "data" / "xla_matmul_rates.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["bf16_flops"]]
    gpus = bundled_gpus()
    for key, bound in (("H100-SXM", 0.08), ("B200-SXM", 0.15)):
        mine = [r for r in rows if r["gpu"] == key]
        d = {x: np.array([float(r[x]) for r in mine]) for x in "bmnk"}
        measured = 2 * d["b"] * d["m"] * d["n"] * d["k"] / np.array([float(r["bf16_flops"]) for r in mine])
        predicted = ops.gemm_step_time(d, gpus.get(key), True, "bf16-mixed", None, 2.0, "absolute")
        assert np.sum(np.abs(predicted - measured)) / np.sum(measured) < bound, key
