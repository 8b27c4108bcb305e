"""The operator table in the predictor: ATen classification, and composition into a step time on a GPU."""

from __future__ import annotations

import copy
import math
import sys
import types

import numpy as np
import pytest

from _support import MINIMAL
from predictor.documents.profile import OpRecord, load_profile
from predictor.model.ops import classify, classify_table
from predictor.model.predict import predict


def rec(op: str, shapes, *, phase="forward", count=1, flops=0.0, dtype="float32", out=None, params=None) -> OpRecord:
    nbytes = sum(float(np.prod(s)) * 4 for s in shapes)
    return OpRecord(
        op=op,
        phase=phase,
        count=count,
        shapes=tuple(tuple(s) for s in shapes),
        dtypes=tuple(dtype for _ in shapes),
        flops=flops,
        bytes_read=nbytes,
        bytes_written=float(np.prod(out or shapes[0])) * 4,
        out_shapes=(tuple(out),) if out else None,
        params=params,
    )


def test_gemms_give_batch_m_n_k() -> None:
    assert classify(rec("aten.mm.default", [[64, 128], [128, 32]])).dims == {"b": 1, "m": 64, "n": 32, "k": 128}
    c = classify(rec("aten.addmm.default", [[32], [64, 128], [128, 32]], count=3))
    assert (c.cls, c.dims, c.scale) == ("gemm", {"b": 1, "m": 64, "n": 32, "k": 128}, 3)
    assert classify(rec("aten.bmm.default", [[8, 16, 4], [8, 4, 16]])).dims == {"b": 8, "m": 16, "n": 16, "k": 4}
    assert classify(rec("aten.mm.default", [[64, 128], [128, 32]], dtype="bfloat16")).half


def test_convolution_backward_is_the_forward_scaled_by_its_flops() -> None:
    params = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": [1], "transposed": [0]}
    fwd = classify(rec("aten.convolution.default", [[8, 16, 32, 32], [32, 16, 3, 3]], params=params))
    assert fwd.cls == "conv" and fwd.dims["cin"] == 16 and fwd.dims["cout"] == 32 and fwd.scale == 1
    flops = 2 * 8 * 32 * 32 * 32 * 16 * 9
    bwd = classify(
        rec(
            "aten.convolution_backward.default",
            [[8, 32, 32, 32], [8, 16, 32, 32], [32, 16, 3, 3]],
            phase="backward",
            flops=2 * flops,
            params=params,
        )
    )
    assert bwd.cls == "conv" and bwd.dims == fwd.dims and bwd.scale == pytest.approx(2.0)


def test_a_grouped_convolution_s_backward_takes_its_gradients_not_the_recorded_flops() -> None:
    """Tables recorded before the capture corrected torch's formula carry a depthwise weight gradient ``groups``
    times over: the backward is priced as one forward per gradient the record's output mask asks for."""
    params = {"stride": [1, 1], "padding": [1, 1], "groups": [96], "transposed": [0], "output_mask": [1, 1, 0]}
    shapes = [[12, 96, 14, 14], [12, 96, 14, 14], [96, 1, 3, 3]]
    forward = 2 * 12 * 96 * 14 * 14 * 9
    overcounted = forward + 96 * forward  # torch 2.13's count: the input gradient right, the weight's x groups
    bwd = classify(rec("aten.convolution_backward.default", shapes, phase="backward", flops=overcounted, params=params))
    assert bwd.cls == "conv" and bwd.dims["groups"] == 96 and bwd.scale == pytest.approx(2.0)
    weight_only = {**params, "output_mask": [0, 1, 0]}
    bwd = classify(rec("aten.convolution_backward.default", shapes, phase="backward", flops=96 * forward,
                       params=weight_only))  # fmt: skip
    assert bwd.scale == pytest.approx(1.0)
    # the bias gradient alone is a per-channel sum of grad_output (it was priced as two convolutions)
    for groups in ([96], [1]):
        bias = {**params, "groups": groups, "output_mask": [0, 0, 1]}
        bwd = classify(rec("aten.convolution_backward.default", shapes, phase="backward", params=bias))
        assert bwd.cls == "reduction" and bwd.dims["n"] == 12 * 96 * 14 * 14


def test_attention_is_two_batched_matmuls_and_a_softmax_on_chip() -> None:
    q = [2, 12, 384, 64]
    flops = 2 * 2 * 24 * 384 * 384 * 64
    record = rec("aten._scaled_dot_product_flash_attention_for_cpu.default", [q, q, q], flops=flops)
    table = classify_table([record])
    assert [c.cls for c in table] == ["gemm", "elementwise"]
    assert table[0].dims == {"b": 24, "m": 384, "n": 384, "k": 64} and table[0].scale == pytest.approx(2.0)
    # the fused kernel never writes the 384 x 384 scores: its softmax moves the kernel's real bytes (q, k, v, out)
    scores = 24 * 384 * 384
    assert table[1].dims["n"] == scores and table[1].dims["flops"] == 4 * scores
    assert table[1].dims["bytes"] == record.bytes_read + record.bytes_written < 2 * scores * 4


def test_attention_without_flops_is_sized_from_its_name_and_mask() -> None:
    """Profiles from before the attention formulas recorded the CPU kernel with 0 FLOPs: its backward is the flash
    recompute (2.5 x the forward), not the forward again; a causal record does about half the pairs."""
    q, lse = [2, 12, 384, 64], [2, 12, 384]
    old_fwd = classify_table([rec("aten._scaled_dot_product_flash_attention_for_cpu.default", [q, q, q])])
    old_bwd = classify_table(
        [
            rec(
                "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                [q, q, q, q, q, lse],
                phase="backward",
            )
        ]
    )
    assert old_fwd[0].scale == pytest.approx(2.0) and old_bwd[0].scale == pytest.approx(2 * 2.5)
    assert old_bwd[0].dims == old_fwd[0].dims == {"b": 24, "m": 384, "n": 384, "k": 64}
    # the softmax's bytes stay the call's bytes: scale x bytes per unit = count x (read + written)
    record = rec("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", [q, q, q, q, q, lse])
    soft = classify_table([record])[1]
    assert soft.scale * soft.dims["bytes"] == pytest.approx(record.bytes_read + record.bytes_written)
    full = 2 * 2 * 24 * 384 * 384 * 64
    causal = classify_table(
        [rec("aten._scaled_dot_product_flash_attention.default", [q, q, q], params={"is_causal": [1]})]
    )
    assert causal[0].scale == pytest.approx(2 * 385 / 768)
    # recorded FLOPs win over the name: the same causal forward with its FLOPs gives the same work
    counted = rec("aten._scaled_dot_product_flash_attention.default", [q, q, q], flops=full * 385 / 768)
    assert classify_table([counted])[0].scale == pytest.approx(causal[0].scale)
    # GQA: the query's heads; _flash_attention_forward's [b, s, h, d] layout
    kv = [2, 4, 384, 64]
    gqa = classify_table([rec("aten._scaled_dot_product_efficient_attention.default", [q, kv, kv])])
    assert gqa[0].dims == {"b": 24, "m": 384, "n": 384, "k": 64}
    q_bshd, kv_bshd = [2, 384, 12, 64], [2, 384, 4, 64]
    bshd = classify_table([rec("aten._flash_attention_forward.default", [q_bshd, kv_bshd, kv_bshd])])
    assert bshd[0].dims == {"b": 24, "m": 384, "n": 384, "k": 64} and bshd[0].scale == pytest.approx(2.0)


def test_the_math_path_moves_its_scores() -> None:
    q = [2, 12, 384, 64]
    fused = classify_table([rec("aten._scaled_dot_product_flash_attention.default", [q, q, q])])[1]
    math_ = classify_table([rec("aten._scaled_dot_product_attention_math.default", [q, q, q])])[1]
    assert math_.dims["bytes"] - fused.dims["bytes"] == 4 * 24 * 384 * 384 * 4
    back = classify_table([rec("aten._scaled_dot_product_attention_math.default", [q, q, q], phase="backward")])
    assert back[0].scale == pytest.approx(2 * 2.0)  # four matmuls: the probabilities were saved


def test_casts_are_copies_not_unknown_operators() -> None:
    cast = classify(rec("aten._to_copy.default", [[4, 2048]]))
    assert cast.cls == "memory" and not cast.op.endswith("?")


def test_gradscalers_unscale_and_update_are_memory_passes_not_unknown_operators() -> None:
    """A profile recorded on a GPU under 16-mixed holds GradScaler's two operators (seen on the H100, 2026-11-27)."""
    unscale = rec(
        "aten._amp_foreach_non_finite_check_and_unscale_.default", [[1024, 1024], [1], [1]], phase="optimizer"
    )
    update = rec("aten._amp_update_scale_.default", [[1], [1], [1]], phase="optimizer")
    for r in (unscale, update):
        c = classify(r)
        assert c.cls == "memory" and not c.op.endswith("?")
        assert c.dims["bytes"] == r.bytes_read + r.bytes_written


def test_norms_softmax_reductions_elementwise_and_memory() -> None:
    ln = classify(rec("aten.native_layer_norm.default", [[4, 128, 768], [768], [768]]))
    assert ln.cls == "norm" and ln.dims["cols"] == 768 and ln.dims["rows"] == 4 * 128
    bn = classify(rec("aten._native_batch_norm_legit_functional.default", [[8, 64, 56, 56], [64], [64]]))
    assert bn.cls == "batch_norm" and bn.dims == {"elements": 8 * 64 * 56 * 56, "passes": 3.0, "nhwc": 0.0}
    bn_back = classify(rec("aten.native_batch_norm_backward.default", [[8, 64, 56, 56]] * 2, phase="backward"))
    assert bn_back.dims["passes"] == 5.0
    assert classify(rec("aten._softmax.default", [[4, 12, 128, 128]])).dims["cols"] == 128
    assert classify(rec("aten.sum.dim_IntList", [[4, 1000]])).cls == "reduction"
    assert classify(rec("aten.gelu.default", [[4, 3072]])).cls == "elementwise"
    assert classify(rec("aten.threshold_backward.default", [[4, 3072], [4, 3072]])).cls == "elementwise"
    assert classify(rec("aten._foreach_mul_.Scalar", [[10], [20]], phase="optimizer")).cls == "memory"
    assert classify(rec("aten.embedding.default", [[30522, 768], [4, 128]])).cls == "memory"
    odd = classify(rec("aten.some_new_kernel.default", [[4, 4]]))
    assert odd.cls == "memory" and odd.op.endswith("?")  # bandwidth-bound, and reported


class _Roofline:
    """A stand-in latency model with a known answer: FLOPs at the peak given, else bytes at the GPU's bandwidth."""

    def latency(self, cls, dims, gpu, *, peak_tflops=None, element_bytes=4.0):
        if cls == "gemm":
            return 2 * dims["b"] * dims["m"] * dims["n"] * dims["k"] / ((peak_tflops or gpu.fp32_tflops) * 1e12)
        return np.asarray(dims["bytes"], dtype=float) / (gpu.memory_bw_gbps * 1e9) + 5e-6

    step_time = latency  # a roofline has no launch overhead to take away


@pytest.fixture
def roofline(monkeypatch):
    fake = types.ModuleType("predictor.model.kernels")
    fake.load_kernel_model = lambda: _Roofline()
    monkeypatch.setitem(sys.modules, "predictor.model.kernels", fake)


def _profile_with_ops(gpu: str | None, step: float) -> object:
    data = copy.deepcopy(MINIMAL)
    data["hardware"] = {"gpu": gpu, "devices": 1} if gpu else {"devices": 1, "accelerator": "cpu"}
    data["timing"] = {"step_time_s": {"p50": step}}
    data["batch"] = {"per_device": 32}
    mm = {"op": "aten.mm.default", "phase": "forward", "count": 10, "shapes": [[4096, 4096], [4096, 4096]]}
    add = {"op": "aten.add.Tensor", "phase": "forward", "count": 20, "shapes": [[4096, 4096], [4096, 4096]]}
    ops = []
    for o in (mm, add):
        n = 4096 * 4096 * 4
        ops.append(
            {**o, "dtypes": ["float32", "float32"], "flops": 2 * 4096**3 if "mm" in o["op"] else 0.0}
            | {"bytes_read": 2 * n, "bytes_written": n}
        )
    data["ops"] = {"device": "meta", "samples": 32, "ops": ops}
    return load_profile(data)


def test_profiled_gpu_step_is_scaled_by_the_ratio_of_operator_sums(roofline, catalog) -> None:
    profile = _profile_with_ops("V100-SXM2-16GB", 0.15)  # the stand-in's GPU time is 92 ms: within its error
    v100, a100 = catalog.gpu("V100-SXM2-16GB"), catalog.gpu("A100-SXM-40GB")
    n = 4096 * 4096 * 4

    def ops_sum(gpu):
        return 10 * 2 * 4096**3 / (gpu.fp32_tflops * 1e12) + 20 * (3 * n / (gpu.memory_bw_gbps * 1e9) + 5e-6)

    same = predict(profile, "p3.2xlarge:1", catalog=catalog)
    assert same.iteration_time_s == pytest.approx(0.15)
    other = predict(profile, "p4d.24xlarge:1", catalog=catalog, scaling="weak")  # the profiled batch on every GPU
    expected = 0.15 * ops_sum(a100) / ops_sum(v100)
    assert other.breakdown["compute_s"] == pytest.approx(expected, rel=1e-9)
    assert any("from the operator table" in a for a in other.assumptions)


def _small_kernels_profile(gpu: str, step: float, count: int = 1000) -> object:
    """A step of ``2 * count`` tiny kernels (GPU time ~ count x 10 us on the stand-in roofline)."""
    data = copy.deepcopy(MINIMAL)
    data["hardware"] = {"gpu": gpu, "devices": 1}
    data["timing"] = {"step_time_s": {"p50": step}}
    data["batch"] = {"per_device": 8}
    tiny = {"dtypes": ["float32", "float32"], "shapes": [[64, 64], [64, 64]], "bytes_written": 64 * 64 * 4}
    data["ops"] = {
        "device": "cuda",
        "samples": 8,
        "ops": [
            {
                "op": "aten.mm.default",
                "phase": "forward",
                "count": count,
                "flops": 2 * 64**3,
                "bytes_read": 2 * 64 * 64 * 4,
            }
            | tiny,
            {"op": "aten.add.Tensor", "phase": "forward", "count": count, "flops": 0.0, "bytes_read": 2 * 64 * 64 * 4}
            | tiny,
        ],
    }
    return load_profile(data)


def test_a_host_bound_step_scales_only_its_gpu_time_and_the_host_floor_holds(roofline, catalog) -> None:
    """A step measured at the host's floor (Lightning's own step and 2,000 kernels at HOST_S_PER_KERNEL) says nothing
    of the GPU: on a slower GPU the ratio scales the model's GPU time, not the measured step, and the floor keeps the
    step at the host's."""
    from predictor.model.ops import HOST_BOUND_BAND, HOST_S_PER_KERNEL, LIGHTNING_STEP_S

    floor = LIGHTNING_STEP_S + 2000 * HOST_S_PER_KERNEL
    host_bound = _small_kernels_profile("A100-SXM-40GB", 1.1 * floor)
    assert HOST_BOUND_BAND > 1.1
    slower = predict(host_bound, "p3.2xlarge:1", catalog=catalog, scaling="weak")
    # the V100 waits on the same host, which took the measured step
    assert slower.breakdown["compute_s"] == pytest.approx(1.1 * floor, rel=1e-6)
    assert any("host-bound" in a and "within x1.3" in a for a in slower.assumptions)
    assert slower.bottleneck.startswith("the host")  # said so: a faster GPU does not help
    # a step the model's GPU time explains (within its held-out error) is the GPU's: the measured time is scaled
    gpu_bound = predict(_profile_with_ops("V100-SXM2-16GB", 0.15), "p4d.24xlarge:1", catalog=catalog, scaling="weak")
    assert not any("host-bound" in a for a in gpu_bound.assumptions)
    assert not gpu_bound.bottleneck.startswith("the host")


def test_a_step_its_gpu_time_cannot_explain_is_the_host_s(roofline, catalog) -> None:
    """Far above the floor but over GPU_EXPLAINS_AT_MOST times the model's GPU time (an old PyTorch, a slow CPU: the
    published A100 steps of 2021 took 63 us a kernel): the step is the host's, so a slower GPU is not predicted
    slower by the ratio of the operator sums (it was: a ResNet-18 measured at 16 ms on an A100 came out at 133 ms on
    a TITAN V, measured 16.5), and the measured step floors every GPU; below that multiple the step is scaled."""
    from predictor.model.ops import GPU_EXPLAINS_AT_MOST, HOST_S_PER_KERNEL, LIGHTNING_STEP_S

    floor = LIGHTNING_STEP_S + 2000 * HOST_S_PER_KERNEL
    slow_host = _small_kernels_profile("A100-SXM-40GB", 2.5 * floor)  # 2,000 tiny kernels: the GPU's ~10 ms
    on_v100 = predict(slow_host, "p3.2xlarge:1", catalog=catalog, scaling="weak")
    assert on_v100.breakdown["compute_s"] == pytest.approx(2.5 * floor, rel=1e-6)
    assert any("held-out error allows" in a for a in on_v100.assumptions)
    assert on_v100.bottleneck.startswith("the host")
    assert GPU_EXPLAINS_AT_MOST >= 1.5  # the largest held-out shortfall of the model's GPU time (its bound)
    # a V100 step 1.6x the model's GPU time is within that error: the GPU's, scaled to the A100
    scaled = predict(_profile_with_ops("V100-SXM2-16GB", 0.15), "p4d.24xlarge:1", catalog=catalog, scaling="weak")
    assert scaled.breakdown["compute_s"] < 0.15


def test_the_host_rule_refuses_what_no_host_takes_and_gives_back_its_own_step(roofline, catalog) -> None:
    """Over HOST_S_PER_KERNEL_MAX a kernel the step is a GPU the model prices too fast, not a host (the review's
    ResNeXt-101 FP16 on a TITAN RTX, 166 us a kernel); a multi-GPU step is not put to the test (its data-parallel
    costs are not in the one-GPU sum); and a host-bound step with an optimizer, predicted on its own GPU, is the step
    measured (the floor leaves the optimizer out: it is added once per optimizer step on top)."""
    from predictor.model.ops import HOST_S_PER_KERNEL_MAX

    too_slow = _small_kernels_profile("A100-SXM-40GB", 4000 * 1.2 * HOST_S_PER_KERNEL_MAX)  # 2,000 x 2 kernels
    on_v100 = predict(too_slow, "p3.2xlarge:1", catalog=catalog, scaling="weak")
    assert not any("host-bound" in a for a in on_v100.assumptions)
    data = too_slow.to_dict() | {"hardware": {"gpu": "A100-SXM-40GB", "devices": 2, "nodes": 1}}
    data["timing"] = {"step_time_s": {"p50": 0.3}}
    two = predict(load_profile(data), "p4d.24xlarge:2", catalog=catalog, scaling="weak")
    assert not any("held-out error allows" in a for a in two.assumptions)

    data = _small_kernels_profile("A100-SXM-40GB", 0.25).to_dict()  # 125 us a kernel: the host's
    foreach = {"op": "aten._foreach_add_.List", "phase": "optimizer", "count": 1, "flops": 0.0,
               "dtypes": ["float32"], "shapes": [[4096, 4096]], "bytes_read": 2 * 4096 * 4096 * 4,
               "bytes_written": 4096 * 4096 * 4}  # fmt: skip
    data["ops"]["ops"].append(foreach)
    with_optimizer = load_profile(data)
    same = predict(with_optimizer, "p4d.24xlarge:1", catalog=catalog, scaling="weak")
    assert any("held-out error allows" in a for a in same.assumptions)
    assert same.breakdown["compute_s"] == pytest.approx(0.25, rel=1e-9)  # its data-parallel losses on 8 GPUs apart


def test_a_step_near_the_host_rules_lines_moves_the_prediction_continuously(catalog) -> None:
    """A measured step a per cent either side of a line of the host rule (HOST_S_PER_KERNEL_MAX here) moved a slower
    GPU's prediction 5.6x (a review's sweep of the lent H100's BERT-large step). Across the ramp the step is read
    partly as the host's: the prediction moves by small steps from one reading to the other, the interval is widest
    in the middle, and the GPU the step was measured on still gets the measured step."""
    from predictor.model.ops import HOST_BOUND_RAMP, HOST_S_PER_KERNEL_MAX

    edge = 2000 * HOST_S_PER_KERNEL_MAX  # 2,000 kernels at the most a host takes a kernel
    steps = np.geomspace(edge / HOST_BOUND_RAMP**2, edge * HOST_BOUND_RAMP**2, 31)
    times, widths, same = [], [], []
    # with an optimizer step in the table (a review: the host's reading counted its floor into the optimizer step, and
    # the prediction jumped 26 % a step 1.1 % past the first ramp's edge)
    foreach = {"op": "aten._foreach_add_.List", "phase": "optimizer", "count": 1, "flops": 0.0,
               "dtypes": ["float32"], "shapes": [[40 * 4096, 4096]], "bytes_read": 2 * 40 * 4096 * 4096 * 4,
               "bytes_written": 40 * 4096 * 4096 * 4}  # fmt: skip
    for s in steps:
        data = _small_kernels_profile("A100-SXM-40GB", float(s)).to_dict()
        data["ops"]["ops"].append(foreach)
        profile = load_profile(data)
        p = predict(profile, "p3.2xlarge:1", catalog=catalog, scaling="weak")  # the shipped kernel model
        times.append(p.breakdown["compute_s"])
        low, high = p.interval["iteration_time_s"]
        widths.append(math.log(high / low))
        same.append(predict(profile, "p4d.24xlarge:1", catalog=catalog, scaling="weak").breakdown["compute_s"])
    jumps = np.abs(np.diff(np.log(times)))
    assert times[0] < times[-1] and jumps.max() < 0.1  # 30 steps of 2.6 %: none jumps the output (it was x5.6)
    assert np.log(times[-1] / times[0]) > 2 * np.log(steps[-1] / steps[0])  # the two readings really differ
    middle = int(np.argmax(widths))
    assert 5 < middle < 25 and widths[middle] > 1.3 * widths[0] and widths[middle] > 1.3 * widths[-1]
    assert same == pytest.approx(list(steps), rel=1e-6)  # on its own GPU: the measured step, whatever the reading
    # the line where the model's own GPU time explains the step is a ramp too (a review: +0.25 % moved w 0 -> 0.48)
    from predictor.model.ops import host_bound_weight

    ws = [host_bound_weight(m * 0.1, 0.1, 0.09, 100, True) for m in np.geomspace(0.85, 1.15, 31)]
    assert max(np.abs(np.diff(ws))) < 0.1 and ws[0] == 0.0


def test_the_host_floor_is_the_measured_median_of_the_h100_batch_one_steps() -> None:
    """HOST_S_PER_KERNEL is what bench/host_floor.py fits on the archived H100 profiles, Lightning's own time per step
    (LIGHTNING_STEP_S, measured apart: bench/lightning_overhead.py) taken out (not a judgement)."""
    import statistics

    from _support import bench_module
    from predictor.model.ops import HOST_S_PER_KERNEL, LIGHTNING_STEP_S

    host_floor = bench_module("host_floor")
    cases = host_floor.load(host_floor.ARCHIVE)
    fit = [(v["step_s"] - LIGHTNING_STEP_S) / v["kernels"] for k, v in cases.items() if host_floor.fitted(k)]
    assert len(fit) == 6
    assert statistics.median(fit) == pytest.approx(HOST_S_PER_KERNEL, abs=0.5e-6)


def test_meta_profile_is_predicted_absolutely_and_says_so(roofline, catalog) -> None:
    data = _profile_with_ops(None, 0.0)
    profile = load_profile({**data.to_dict(), "timing": {"step_time_s": {"p50": 0.0}}})
    a10g = catalog.gpu("A10G")
    n = 4096 * 4096 * 4
    gpu_s = 10 * 2 * 4096**3 / (a10g.fp32_tflops * 1e12) + 20 * (3 * n / (a10g.memory_bw_gbps * 1e9) + 5e-6)
    result = predict(profile, "g5.xlarge:1", catalog=catalog)
    assert result.breakdown["compute_s"] == pytest.approx(gpu_s, rel=1e-9)
    assert any("predicted absolutely from the operator table" in a for a in result.assumptions)
    assert any("operator model's alone" in e for e in result.extrapolation)


def test_a_timeless_profile_without_ops_is_a_clear_error(catalog) -> None:
    data = copy.deepcopy(MINIMAL)
    data["timing"] = {"step_time_s": {"p50": 0.0}}
    from predictor.exceptions import PredictionError

    with pytest.raises(PredictionError, match=r"no step was timed.*srifty capture"):
        predict(load_profile(data), "g5.xlarge:1", catalog=catalog)


def test_layer_norm_backward_normalises_over_the_weight_not_the_whole_input() -> None:
    x, stats, w = [4, 128, 768], [4, 128, 1], [768]
    bwd = classify(rec("aten.native_layer_norm_backward.default", [x, x, stats, stats, w, w], phase="backward"))
    fwd = classify(rec("aten.native_layer_norm.default", [x, w, w]))
    assert bwd.cls == fwd.cls == "norm"
    assert (bwd.dims["rows"], bwd.dims["cols"]) == (fwd.dims["rows"], fwd.dims["cols"]) == (4 * 128, 768)


def test_bad_shapes_are_refused_naming_the_record_and_unknown_dtypes_are_noted() -> None:
    from predictor.documents.profile import profile_from_dict
    from predictor.exceptions import ProfileSchemaError

    def profile_with(**change) -> dict:
        op = {"op": "aten.mm.default", "phase": "forward", "count": 1, "shapes": [[64, 128], [128, 32]],
              "dtypes": ["float32", "float32"], "flops": 2 * 64 * 128 * 32, "bytes_read": 4 * (64 * 128 + 128 * 32),
              "bytes_written": 4 * 64 * 32} | change  # fmt: skip
        return {
            "schema": "srifty.profile/v1",
            "model": {"name": "m", "parameters": 4096, "precision": "32-true"},
            "batch": {"per_device": 64},
            "hardware": {"gpu": None, "devices": 1, "accelerator": "meta"},
            "timing": {"step_time_s": {"p50": 0.0}},
            "ops": {"device": "meta", "samples": 64, "ops": [op]},
        }

    with pytest.raises(ProfileSchemaError, match=r"ops\.ops\[0\].*negative dimension"):
        profile_from_dict(profile_with(shapes=[[-64, 128], [128, 32]]))
    with pytest.raises(ProfileSchemaError, match=r"ops\.ops\[0\].*overflowed"):
        profile_from_dict(profile_with(shapes=[[10**12, 10**12], [128, 32]]))
    from predictor.model.predict import predict

    r = predict(profile_from_dict(profile_with(dtypes=["float8_e4m3fn"] * 2)), "p4d.24xlarge:1")
    assert any("float8_e4m3fn" in n and "4 bytes" in n for n in r.assumptions)
    empty = predict(profile_from_dict(profile_with(shapes=[[0, 128], [128, 32]])), "p4d.24xlarge:1")
    assert empty.iteration_time_s > 0  # a zero-size operator costs its launch floor


def test_an_nchw_batch_norm_costs_its_elements_an_nhwc_one_its_bytes() -> None:
    """cuDNN's NCHW batch-norm kernels compute per element in fp32 whatever the input type and are bound by the SMs'
    issue rate (the lent H100 moved the same elements per second in FP32 and AMP: issue #40): a 16-bit one costs
    what an FP32 one does; channels-last runs bandwidth-bound kernels, where 16 bits move half the bytes."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model.kernels import load_kernel_model
    from predictor.model.ops import BN_PASSES_PER_SM_CYCLE, batch_norm_time

    h100, model = get_gpu("H100-SXM"), load_kernel_model()
    n = 64 * 256 * 56 * 56.0

    def seconds(eb: float, nhwc: float, passes: float = 3.0) -> float:
        dims = {"elements": np.array([n]), "passes": np.array([passes]), "nhwc": np.array([nhwc])}
        return float(batch_norm_time(dims, h100, eb, model)[0])

    issue = n * 3 / (BN_PASSES_PER_SM_CYCLE * h100.sms * h100.clock_mhz * 1e6)
    assert seconds(2.0, 0.0) == pytest.approx(seconds(4.0, 0.0)) == pytest.approx(issue)
    assert seconds(2.0, 1.0) < 0.6 * seconds(4.0, 1.0)  # NHWC: bandwidth-bound, half the bytes
    assert seconds(2.0, 1.0) < seconds(2.0, 0.0)  # the NHWC kernels are the faster ones
    assert seconds(4.0, 0.0, passes=5.0) == pytest.approx(issue * 5 / 3)
    # a layer norm keeps its bytes and the norm network
    ln = rec("aten.native_layer_norm.default", [[8, 128, 768], [768], [768]], dtype="bfloat16")
    assert classify(ln).cls == "norm" and classify(ln).dims["bytes"] == pytest.approx(ln.bytes_read + ln.bytes_written)


def test_pooling_is_priced_by_the_reads_its_kernels_make() -> None:
    """A 3x3 / 2 max pooling: the forward reads each output's 9-element window and writes its value and index; the
    backward gathers, for each input element, the ceil(3/2)^2 = 4 windows covering it (index and gradient)."""
    params = {"kernel_size": (3, 3), "stride": (2, 2), "padding": (1, 1)}
    x, y = [8, 64, 112, 112], [8, 64, 56, 56]
    fwd = classify(rec("aten.max_pool2d_with_indices.default", [x], out=y, params=params))
    assert fwd.cls == "pooling" and fwd.dims["bytes"] == pytest.approx(np.prod(y) * (9 * 4 + 4 + 8))
    bwd = classify(rec("aten.max_pool2d_with_indices_backward.default", [y, x, y], phase="backward", out=x,
                       params=params))  # fmt: skip
    assert bwd.dims["bytes"] == pytest.approx(np.prod(x) * (4 * (4 + 8) + 4))
    avg = classify(rec("aten.avg_pool2d.default", [x], out=y, params={"kernel_size": (2,)}))  # stride = kernel
    assert avg.dims["bytes"] == pytest.approx(np.prod(y) * (4 * 4 + 4))
    head = classify(rec("aten._adaptive_avg_pool2d.default", [[8, 2048, 7, 7]], out=[8, 2048, 1, 1]))
    assert head.dims["bytes"] == pytest.approx(4 * (8 * 2048 * 49 + 8 * 2048))
    # pooling of an unbatched (3-D) tensor: bandwidth-bound memory, a known operator (not reported as unclassified)
    flat = classify(rec("aten.max_pool2d_with_indices.default", [[8, 64, 112]]))
    assert flat.cls == "memory" and not flat.op.endswith("?")


def _conv_step(gpu: str, dtype: str, channels_last: bool) -> dict[str, float]:
    from predictor.catalog.gpus import get_gpu
    from predictor.model.ops import ops_time

    params = {"stride": (1,), "padding": (1,), "groups": (1,)} | ({"channels_last": (1,)} if channels_last else {})
    conv = rec("aten.convolution.default", [[64, 128, 28, 28], [128, 128, 3, 3], [128]], dtype=dtype,
               out=[64, 128, 28, 28], flops=2.0 * 64 * 128 * 28 * 28 * 128 * 9, params=params)  # fmt: skip
    precision = "16-mixed" if dtype == "float16" else "32-true"
    return ops_time(classify_table([conv]), get_gpu(gpu), precision, "highest", "absolute").by_class


def test_layout_conversions_where_the_gpu_s_algorithm_wants_the_other_layout() -> None:
    """cuDNN's tensor-core convolutions (16-bit from Volta, TF32 from Ampere) take NHWC, its FP32 CUDA-core ones
    NCHW: NCHW activations are converted on the former, channels-last ones on the latter, and nothing else."""
    assert _conv_step("H100-SXM", "float16", False)["layout"] > 0  # tensor cores, NCHW: converted
    assert _conv_step("H100-SXM", "float16", True)["layout"] == 0  # tensor cores, NHWC: as they want it
    assert _conv_step("A100-SXM-80GB", "float32", False)["layout"] > 0  # TF32 from Ampere
    assert _conv_step("V100-SXM2-16GB", "float32", False)["layout"] == 0  # FP32 on CUDA cores, NCHW
    assert _conv_step("V100-SXM2-16GB", "float32", True)["layout"] > 0  # ... handed NHWC: converted back
    assert _conv_step("V100-SXM2-16GB", "float16", False)["layout"] > 0  # Volta's fp16 tensor cores
    assert _conv_step("P100-SXM2-16GB", "float16", False)["layout"] == 0  # no tensor cores


def test_a_tensor_core_convolution_is_priced_as_its_implicit_gemm() -> None:
    """On tensor cores a convolution is the implicit GEMM cuDNN runs (output pixels x output channels, contracting
    input channels x window) at the GEMM wave model's measured ceiling; FP32 before Ampere keeps the kernel model."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model.kernels import load_kernel_model
    from predictor.model.tensor_gemm import RAMP_S, tensor_gemm_time

    h100 = get_gpu("H100-SXM")
    moved = 2.0 * (64 * 128 * 28 * 28 + 128 * 128 * 9 + 64 * 28 * 28 * 128)  # input, weight, output: not im2col
    want = tensor_gemm_time({"b": np.array([1.0]), "m": np.array([64 * 28 * 28.0]), "n": np.array([128.0]),
                             "k": np.array([128 * 9.0])}, h100, h100.fp16_tflops, element_bytes=2.0,
                            moved=np.array([moved]))  # fmt: skip
    assert _conv_step("H100-SXM", "float16", True)["conv"] == pytest.approx(float(want[0]))
    tf32 = _conv_step("H100-SXM", "float32", True)["conv"]
    assert tf32 - RAMP_S == pytest.approx(2 * (float(want[0]) - RAMP_S), rel=0.05)  # half the peak, same waves
    v100 = get_gpu("V100-SXM2-16GB")
    dims = {"b": np.array([64.0]), "cin": np.array([128.0]), "cout": np.array([128.0]), "kh": np.array([3.0]),
            "kw": np.array([3.0]), "h": np.array([28.0]), "w": np.array([28.0]), "stride": np.array([1.0]),
            "padding": np.array([1.0]), "groups": np.array([1.0])}  # fmt: skip
    cuda_cores = float(load_kernel_model().step_time("conv", dims, v100, peak_tflops=None, element_bytes=4.0)[0])
    assert _conv_step("V100-SXM2-16GB", "float32", False)["conv"] == pytest.approx(cuda_cores)


def test_a_depthwise_convolution_on_tensor_cores_is_bandwidth_bound() -> None:
    """A depthwise convolution (groups = channels: EfficientNet's, MobileNet's) is a batch of thin GEMMs, one per
    channel with a 9-long contraction: priced by its bytes (input, weight, output once) at the bandwidth."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model.ops import implicit_gemm_time
    from predictor.model.tensor_gemm import RAMP_S

    a100 = get_gpu("A100-SXM-80GB")
    shape = {"b": 64.0, "cin": 256.0, "cout": 256.0, "kh": 3.0, "kw": 3.0, "h": 56.0, "w": 56.0, "stride": 1.0,
             "padding": 1.0, "groups": 256.0, "oh": 56.0, "ow": 56.0, "transposed": 0.0}  # fmt: skip
    dims = {k: np.array([v]) for k, v in shape.items()}
    moved = 2.0 * (64 * 256 * 56 * 56 + 256 * 9 + 64 * 56 * 56 * 256)
    t = float(implicit_gemm_time(dims, a100, a100.fp16_tflops, 2.0)[0])
    assert t == pytest.approx(moved / (a100.memory_bw_gbps * 1e9) + RAMP_S, rel=1e-6)


def test_a_depthwise_convolution_on_cuda_cores_is_its_direct_kernel_not_the_kernel_model() -> None:
    """FP32 before Ampere a depthwise convolution runs PyTorch's / cuDNN's direct kernel too: its bytes at the
    bandwidth or its FLOPs at the FP32 units' sustained share, whichever is longer. The kernel model never saw a
    grouped convolution (NeuSight's are all dense 3x3 ones) and priced EfficientNet-B0's FP32 V100 step 1.9x the
    published one through them (bench/dle_convnets.py). A dense convolution, a grouped one with several channels a
    group, a transposed one and a 16-bit one before Volta keep the kernel model."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model.kernels import load_kernel_model
    from predictor.model.ops import ops_time
    from predictor.model.tensor_gemm import RAMP_S, fp32_ceiling

    v100, p100 = get_gpu("V100-SXM2-16GB"), get_gpu("P100-SXM2-16GB")

    def conv_s(gpu, w, groups, dtype="float32", transposed=False, b=64, side=56) -> tuple[float, float]:
        pad = w[2] // 2
        x, y = [b, w[1] * groups, side, side], [b, w[0], side, side]
        params = {"stride": (1,), "padding": (pad,), "groups": (groups,)} | ({"transposed": (1,)} if transposed else {})
        r = rec("aten.convolution.default", [x, w], dtype=dtype, out=y, flops=2.0 * np.prod(y) * np.prod(w[1:]),
                params=params)  # fmt: skip
        c = classify_table([r])[0]
        precision = "16-true" if dtype == "float16" else "32-true"
        got = ops_time([c], gpu, precision, None, "absolute").by_class["conv"]
        eb = 2.0 if dtype == "float16" else 4.0
        learned = load_kernel_model().step_time(
            "conv", {k: np.array([v]) for k, v in c.dims.items()}, gpu, peak_tflops=None, element_bytes=eb
        )
        return got, float(learned[0]) * c.scale

    def direct(gpu, b, cin, cout, k, side) -> tuple[float, float]:
        """(seconds, bytes-bound seconds) of the direct kernel."""
        moved = 4.0 * (b * cin * side * side + cout * k * k + b * side * side * cout)
        flops = 2.0 * b * side * side * cout * k * k
        rate = gpu.fp32_tflops * 1e12 * fp32_ceiling(gpu)
        return max(flops / rate, moved / (gpu.memory_bw_gbps * 1e9)) + RAMP_S, moved / (gpu.memory_bw_gbps * 1e9)

    got, learned = conv_s(v100, [256, 1, 3, 3], 256)
    want, bytes_s = direct(v100, 64, 256, 256, 3, 56)
    assert got == pytest.approx(want, rel=1e-6) and got != pytest.approx(learned, rel=0.05)
    assert bytes_s <= got < 1.5 * bytes_s  # a 3x3 depthwise convolution streams its tensors
    # a large window on a small image: the FLOPs bind, at the FP32 units' sustained share (not the whole peak)
    got, _ = conv_s(v100, [256, 1, 15, 15], 256, b=8, side=14)
    want, bytes_s = direct(v100, 8, 256, 256, 15, 14)
    assert got == pytest.approx(want, rel=1e-6) and got > 2 * bytes_s
    # a depthwise multiplier (two output channels an input channel) is depthwise too
    got, _ = conv_s(v100, [512, 1, 3, 3], 256)
    assert got == pytest.approx(direct(v100, 64, 256, 512, 3, 56)[0], rel=1e-6)
    for gpu, w, groups, dtype, transposed in (
        (v100, [256, 256, 3, 3], 1, "float32", False),  # dense
        (v100, [256, 8, 3, 3], 32, "float32", False),  # grouped, eight channels a group
        (v100, [256, 1, 3, 3], 256, "float32", True),  # transposed
        (p100, [256, 1, 3, 3], 256, "float16", False),  # 16-bit before Volta (the TITAN Xp's held-out steps)
    ):
        got, learned = conv_s(gpu, w, groups, dtype, transposed)
        assert got == pytest.approx(learned), (gpu.key, w, groups, dtype, transposed)


def test_an_nchw_convolutional_table_is_told_what_channels_last_would_save() -> None:
    """On a tensor-core GPU an NCHW table pays cuDNN's conversions and NCHW batch norm: the prediction says what
    channels-last would take off (the same table re-priced NHWC); a channels-last table, or FP32 on a V100 (NCHW is
    what its algorithm wants), is told nothing."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model.ops import channels_last_hint, ops_time

    def table(dtype: str, nhwc: bool) -> list:
        params = {"stride": (1,), "padding": (1,), "groups": (1,)} | ({"channels_last": (1,)} if nhwc else {})
        x = [64, 128, 28, 28]
        conv = rec("aten.convolution.default", [x, [128, 128, 3, 3], [128]], dtype=dtype, out=x,
                   flops=2.0 * 64 * 128 * 28 * 28 * 128 * 9, params=params)  # fmt: skip
        bn = rec("aten.cudnn_batch_norm.default", [x, [128], [128]], dtype=dtype,
                 params={"channels_last": (1,)} if nhwc else None)  # fmt: skip
        return classify_table([conv, bn])

    def hint(gpu: str, dtype: str, nhwc: bool) -> str | None:
        precision = "16-mixed" if dtype == "float16" else "32-true"
        classified = table(dtype, nhwc)
        target = ops_time(classified, get_gpu(gpu), precision, None, "absolute")
        return channels_last_hint(classified, target, get_gpu(gpu), precision, None, "absolute")

    said = hint("H100-SXM", "float16", False)
    assert said is not None and "channels_last" in said and "off the GPU's operator time" in said
    assert hint("H100-SXM", "float16", True) is None
    assert hint("V100-SXM2-16GB", "float32", False) is None


def test_a_convolution_s_gemm_takes_its_output_pixels_as_recorded() -> None:
    """The implicit GEMM's rows are the output's pixels as recorded (strides, dilation, uneven kernels and paddings
    give them), a grouped convolution is a batch of per-group GEMMs, a one-channel input with groups = 1 is an
    ordinary convolution (not depthwise), and a transposed convolution keeps the kernel model."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model.ops import ops_time
    from predictor.model.tensor_gemm import tensor_gemm_time

    a100 = get_gpu("A100-SXM-80GB")

    def conv_s(x, w, out, params) -> float:
        flops = 2.0 * np.prod(out) * (w[1] * w[2] * w[3])
        r = rec("aten.convolution.default", [x, w], dtype="float16", out=out, flops=flops, params=params)
        return ops_time(classify_table([r]), a100, "16-mixed", None, "absolute").by_class["conv"]

    def gemm_s(b, m, n, k, moved) -> float:
        dims = {"b": np.array([b]), "m": np.array([m]), "n": np.array([n]), "k": np.array([k])}
        return float(tensor_gemm_time(dims, a100, a100.fp16_tflops, element_bytes=2.0, moved=np.array([moved]))[0])

    # a 3x3 with dilation 2 and padding 2 keeps 56 x 56 (the plain formula would say 58 x 58)
    x, w, y = [32, 64, 56, 56], [64, 64, 3, 3], [32, 64, 56, 56]
    moved = 2.0 * (np.prod(x) + 64 * 64 * 9 + np.prod(y))
    dilated = conv_s(x, w, y, {"stride": (1,), "padding": (2,), "dilation": (2,), "groups": (1,)})
    assert dilated == pytest.approx(gemm_s(1, 32 * 56 * 56, 64, 64 * 9, moved))
    # stride 2: a quarter of the rows
    y2 = [32, 64, 28, 28]
    strided = conv_s(x, w, y2, {"stride": (2,), "padding": (1,), "groups": (1,)})
    assert strided == pytest.approx(gemm_s(1, 32 * 28 * 28, 64, 64 * 9, 2.0 * (np.prod(x) + 64 * 64 * 9 + np.prod(y2))))
    # 4 groups: a batch of 4 GEMMs of a quarter of the channels each
    grouped = conv_s(x, [64, 16, 3, 3], y, {"stride": (1,), "padding": (1,), "groups": (4,)})
    assert grouped == pytest.approx(gemm_s(4, 32 * 56 * 56, 16, 16 * 9, 2.0 * (np.prod(x) + 64 * 16 * 9 + np.prod(y))))
    # one input channel, groups = 1 (a grayscale first layer): the GEMM, not the depthwise kernel
    gray = conv_s([32, 1, 28, 28], [32, 1, 3, 3], [32, 32, 28, 28], {"stride": (1,), "padding": (1,), "groups": (1,)})
    moved = 2.0 * (32 * 28 * 28 + 32 * 9 + 32 * 32 * 28 * 28)
    assert gray == pytest.approx(gemm_s(1, 32 * 28 * 28, 32, 9, moved))
    # a transposed convolution: the kernel model's conv, as before
    from predictor.model.kernels import load_kernel_model

    t = rec("aten.convolution.default", [[8, 64, 7, 7], [64, 32, 4, 4]], dtype="float16", out=[8, 32, 14, 14],
            params={"stride": (2,), "padding": (1,), "groups": (1,), "transposed": (1,)})  # fmt: skip
    c = classify_table([t])[0]
    learned = load_kernel_model().step_time(
        "conv", {k: np.array([v]) for k, v in c.dims.items()}, a100, peak_tflops=a100.fp16_tflops, element_bytes=2.0
    )
    got = ops_time(classify_table([t]), a100, "16-mixed", None, "absolute").by_class["conv"]
    assert got == pytest.approx(float(learned[0]) * c.scale)


def test_the_host_is_the_bottleneck_only_where_the_floor_binds_with_recompute(roofline, catalog, monkeypatch) -> None:
    """Activation checkpointing lengthens the GPU's micro-step by its recompute: a floor between the step's GPU time
    without it and with it binds the plain layout (the host is the bottleneck) but not the checkpointed one."""
    from predictor.model import fleets, ops

    profile = _profile_with_ops(None, 0.0)  # a capture: the GPU time is the operator model's
    model = {
        **profile.to_dict()["model"],
        "structure": {"blocks": 10, "block": "Block", "block_parameters": 2_555_704, "saved_bytes_per_sample": 1e6},
    }
    profile = load_profile(profile.to_dict() | {"model": model})
    plain = predict(profile, "p3.2xlarge:1", catalog=catalog, scaling="weak")
    gpu = plain.breakdown["compute_s"]
    monkeypatch.setattr(ops, "LIGHTNING_STEP_S", 1.15 * gpu)  # the floor above the plain step's GPU time
    fleets._bases.cache_clear()  # the per-type quantities were computed with the shipped floor
    try:
        plain = predict(profile, "p3.2xlarge:1", catalog=catalog, scaling="weak")
        assert plain.bottleneck.startswith("the host")
        checkpointed = predict(profile, "p3.2xlarge:1", catalog=catalog, scaling="weak", layout="ddp+ac")
        assert checkpointed.breakdown["compute_s"] > plain.breakdown["compute_s"]  # the recompute is over the floor
        assert not checkpointed.bottleneck.startswith("the host")
    finally:
        fleets._bases.cache_clear()  # nothing priced with the patched floor outlives the test
