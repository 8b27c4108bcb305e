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


def test_the_h200_replay_follows_neusights_orientation_as_benchmarks_says() -> None:
    """The lent H200 timed NeuSight's H100 GEMM shapes both ways: its latencies follow the orientation in which n is
    the contraction (shared/data/kernels' corrected README), clearly for bmm, and reproduce within 8-9 %."""
    replay = bench_module("kernel_replay")
    with (DATA / "h200_kernel_replay_2026-12-04.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    figures = {}
    for op in ("linear", "bmm"):
        for orientation in replay.ORIENTATIONS:
            rs = [r for r in rows if (r["op"], r["orientation"]) == (op, orientation)]
            here = np.array([float(r["measured_ms"]) for r in rs])
            neu = np.array([float(r["neusight_ms"]) for r in rs])
            figures[(op, orientation)] = (len(rs), replay.mape(here, neu), replay.weighted(here, neu))
    assert {k: v[0] for k, v in figures.items()} == {
        ("linear", "neusight"): 200,
        ("linear", "transposed"): 200,
        ("bmm", "neusight"): 182,
        ("bmm", "transposed"): 182,
    }
    assert figures[("linear", "neusight")][1] == pytest.approx(0.078, abs=0.0005)
    assert figures[("bmm", "neusight")][1] == pytest.approx(0.093, abs=0.0005)
    assert figures[("bmm", "transposed")][1] == pytest.approx(0.145, abs=0.0005)
    assert figures[("bmm", "neusight")][2] < figures[("bmm", "transposed")][2] - 0.04  # 7.0 % against 12.6 %


@pytest.mark.parametrize(
    ("op", "orientation", "x", "w"),
    [
        ("linear", "neusight", (2, 3, 4), (5, 4)),  # nn.Linear(n=4, k=5) on x[b, m, n]
        ("linear", "transposed", (2, 3, 5), (4, 5)),
        ("bmm", "neusight", (2, 3, 4), (2, 4, 5)),  # bmm([b, m, n], [b, n, k])
        ("bmm", "transposed", (2, 3, 5), (2, 5, 4)),
    ],
)
def test_the_replay_builds_each_orientations_operands(op, orientation, x, w) -> None:
    replay = bench_module("kernel_replay")
    assert replay.operands(op, orientation, 2, 3, 4, 5) == (x, w)
    dims = replay.aten_dims(op, orientation, {c: np.array([float(v)]) for c, v in zip("bmnk", (2, 3, 4, 5))})
    contraction = x[-1]
    assert dims["k"][0] == contraction and dims["n"][0] == w[0 if op == "linear" else -1]


def test_the_h200s_cnn_kernels_show_what_benchmarks_says() -> None:
    """bench/data/h200_cnn_kernels_*: 462 cases, none failed; cuDNN's NCHW batch norm runs a 64-channel layer's
    elements at 0.35x the rate of a 256-channel one (one block a channel on 132 SMs); 16-bit and TF32 NCHW
    convolutions convert their layout unless they are 1x1 over a large image."""
    cnn = bench_module("cnn_kernels")
    with bench_module("devicecli").unpacked(DATA / "h200_cnn_kernels_2026-12-04.tar.xz") as folder:
        cases, measured, versions = cnn.read(folder)
    assert len(cases) == 462 and "cuDNN 91900" in versions

    def pick(**want):
        (case,) = [c for c in cases if all(str(c[k]) == str(v) for k, v in want.items())]
        return case, measured[case["case"]]

    rate = {}
    for channels, side in ((64, 56), (256, 56)):
        _, got = pick(kind="batch_norm", dtype="fp32", layout="nchw", batch=128, cin=channels, side=side)
        rate[channels] = 128 * channels * side * side / got["batch_norm"]
    assert 2.7 < rate[256] / rate[64] < 2.9  # 2.83: beyond the 2.06 of idle SMs alone (one block an SM)
    for k, side, converts in ((3, 56, True), (1, 56, False), (1, 14, True)):
        cin, cout = (64, 64) if side == 56 else (1024, 256)
        _, got = pick(kind="conv", dtype="fp16", layout="nchw", mode="default", cin=cin, cout=cout, kernel=k, side=side)
        assert (got.get("layout", 0.0) > 0) == converts, (k, side)


def test_the_h200_did_not_hold_its_boost_clock_under_tensor_core_load(capsys) -> None:
    """bench/data/h200_clocks_*: at its 700 W limit the H200 held 1950 MHz on FP32 GEMMs but 1440-1485 under TF32
    and bf16 ones, reaching 0.66-0.75 of the datasheet peaks (BENCHMARKS.md, "A lent H200")."""
    assert bench_module("gpu_clocks").score(DATA / "h200_clocks_2026-12-04") == 0
    rows = {line.split(" | ")[0]: line.split(" | ") for line in capsys.readouterr().out.splitlines() if " | " in line}
    assert rows["fp32"][1] == "1950" and rows["bf16"][1] == "1440" and rows["tf32"][1] == "1485"
    assert float(rows["bf16"][5]) == pytest.approx(0.657, abs=0.001)
    assert rows["bf16"][2].startswith("692 / 700")
