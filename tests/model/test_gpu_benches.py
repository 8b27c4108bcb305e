"""The benches of a lent GPU (bench/gpu_lambda.py, kernel_replay.py, kernel_breakdown.py): their plumbing here, and
the figures BENCHMARKS.md quotes re-derived from the committed raw results (bench/data/h100_*_2026-11-27.*)."""

from __future__ import annotations

import csv
from collections import defaultdict

import numpy as np
import pytest

from _support import ROOT, bench_module

DATA = ROOT / "bench" / "data"


def test_the_lambda_cases_put_each_model_and_precision_first_at_its_largest_batch() -> None:
    gpu_lambda = bench_module("gpu_lambda")
    cases = gpu_lambda.cases()
    assert len(cases) == len(set(cases)) == 24
    firsts = cases[:6]
    assert {(m, p) for m, p, _ in firsts} == {(m, p) for m, p, _ in cases}  # every model and precision, once
    for model, precision, batch in firsts:
        assert batch == max(b for m, p, b in cases if (m, p) == (model, precision))


def test_the_replayed_h100_gemms_differ_from_neusight_as_benchmarks_says() -> None:
    with (DATA / "h100_kernel_replay_2026-11-27.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    mape = bench_module("kernel_replay").mape
    by_op = defaultdict(list)
    for r in rows:
        by_op[r["op"]].append((float(r["measured_ms"]), float(r["neusight_ms"])))
    figures = {op: mape(np.array([h for h, _ in v]), np.array([n for _, n in v])) for op, v in by_op.items()}
    assert len(by_op["linear"]) == 300 and len(by_op["bmm"]) == 196
    assert figures["linear"] == pytest.approx(0.084, abs=0.0005)
    assert figures["bmm"] == pytest.approx(0.137, abs=0.0005)


def test_the_replay_samples_the_same_shapes_every_time(tmp_path) -> None:
    replay = bench_module("kernel_replay")
    header = "split,device,torch,op,b,m,n,k,latency_ms\n"
    for op in ("linear", "bmm"):
        lines = [f"test,{replay.H100},p2.1.0,{op},{i},2,3,4,0.01\n" for i in range(50)]
        lines.append(f"test,NVIDIA L4,p2.1.0,{op},99,2,3,4,0.01\n")  # another GPU's row is never sampled
        (tmp_path / f"{op}.csv").write_text(header + "".join(lines))
    first = replay.sample(tmp_path, 10)
    assert first == replay.sample(tmp_path, 10) and len(first) == 20
    assert all(r["device"] == replay.H100 for r in first)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("nvjet_sm90_hsh_192x192_64x4_1x2_h_bz_coopB_bias_TNN", "gemm"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize256x128x32_warpgroupsize2x1x1_execute", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64", "attention"),
        ("void cudnn::fusion::convert_dq_to_16bits<false>(void const*, void*)", "attention"),
        (
            "fmha_cutlassB_f32_aligned_64x64_k64_dropout_sm80(PyTorchMemEffAttention::AttentionBackwardKernel",
            "attention",
        ),
        ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "conv"),
        ("void cudnn::bn_bw_1C11_kernel_new<__half, float, float2, 128, true, 1>", "norm"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>", "norm"),
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<__half, __half, float, false, true>", "copy"),
        ("void at::native::(anonymous namespace)::max_pool_backward_nchw<c10::Half, float, int>", "pool"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<3>>", "optimizer"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "elementwise"),
    ],
)
def test_kernel_names_sort_into_the_model_classes(name, cls) -> None:
    assert bench_module("kernel_breakdown").classify(name) == cls


def test_every_heavy_kernel_of_the_h100_breakdown_has_a_class() -> None:
    """No kernel that takes 1 % of a step is left in 'other' (the table in BENCHMARKS.md reads the classes)."""
    breakdown = bench_module("kernel_breakdown")
    with (DATA / "h100_kernel_breakdown_2026-11-27.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    total: dict[tuple, float] = defaultdict(float)
    for r in rows:
        total[(r["model"], r["precision"])] += float(r["gpu_us"])
    heavy = [r for r in rows if float(r["gpu_us"]) > 0.01 * total[(r["model"], r["precision"])]]
    assert len(total) == 5 and heavy
    assert [r["kernel"][:80] for r in heavy if breakdown.classify(r["kernel"]) == "other"] == []
