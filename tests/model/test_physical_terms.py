"""Every data-parallel term is a physical quantity with a bound (issue #21): counted copies, contention bounded by
NCCL's share of the SMs, pipelined hierarchical collectives."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from _support import MINIMAL
from predictor.documents.profile import load_profile
from predictor.model.basis import grad_bytes
from predictor.model.collectives import TREE_NET_HOP, allreduce_latency
from predictor.model.network import allreduce_time, inter_node_link, intra_node_link
from predictor.model.predict import predict
from predictor.model.scaling import DDP_GRAD_PASSES, NCCL_MAX_CHANNELS, SIGMA_MAX, ScalingModel, contention_bound


def test_contention_is_bounded_by_the_sms_nccl_can_hold() -> None:
    assert contention_bound(108, False) == pytest.approx(NCCL_MAX_CHANNELS / 108)
    assert contention_bound(16, False) == 1.0
    assert contention_bound(132, True) == 0.0  # gloo: the host CPU runs the collectives, no SM is taken
    assert contention_bound(None, False) == 0.0
    model = ScalingModel(sigma=0.0, kappa=5.0)  # a fitted kappa above the bound is clipped to it
    loss = model.loss(np.array([1.0]), np.array([8.0]), np.array([0.5]), contention_bound=0.25)
    assert loss[0] == pytest.approx(0.25 * 0.5)


def test_sigma_is_bounded() -> None:
    wild = ScalingModel(sigma=3.0, kappa=0.0).loss(np.array([1.0]), np.array([2.0]), np.array([0.0]))
    bounded = ScalingModel(sigma=SIGMA_MAX, kappa=0.0).loss(np.array([1.0]), np.array([2.0]), np.array([0.0]))
    assert wild[0] == pytest.approx(bounded[0])


def test_ddp_copies_are_counted_passes_over_the_gradients(catalog) -> None:
    profile = load_profile(copy.deepcopy(MINIMAL))
    p = predict(profile, "p4d.24xlarge:1", catalog=catalog, dp_model=ScalingModel(sigma=0.0, kappa=0.0))
    bw = catalog.gpu("A100-SXM-40GB").memory_bw_gbps * 1e9
    # with stragglers and contention off, the loss is DDP's bucket copies alone: 4 passes, nothing fitted
    assert p.breakdown["dp_loss_s"] == pytest.approx(DDP_GRAD_PASSES * grad_bytes(profile) / bw, rel=1e-6)


def test_hierarchical_phases_are_pipelined(catalog) -> None:
    p5 = catalog.get("p5.48xlarge")
    nbytes = 2**30
    est = allreduce_time(nbytes, [(p5, 4)], catalog.gpus)
    intra, inter = intra_node_link(p5, catalog.gpus), inter_node_link(p5)
    gb = nbytes / 1e9
    intra_bw, inter_bw = 2 * 7 / 8 * gb / intra.gbps, 2 * 3 / 4 * gb / inter.gbps
    latency = 2 * 7 * intra.latency_s + 2 * 3 * inter.latency_s
    assert est.seconds == pytest.approx(max(intra_bw, inter_bw) + latency)
    assert est.seconds < est.intra_s + est.inter_s  # never the sum of the two phases


def test_an_all_reduce_call_pays_the_ring_or_the_tree_whichever_is_shorter() -> None:
    """NCCL prices its ring and its tree for every call and runs the cheaper (src/graph/tuning.cc): the ring's
    network hops grow with the nodes, the tree's with their logarithm, each tree hop costing TREE_NET_HOP ring hops."""
    hop_i, hop_n = 10e-6, 50e-6
    nodes = np.array([1, 2, 4, 6, 8, 16, 64, 434])
    lat = allreduce_latency(nodes, 8, hop_i, hop_n)
    ring = 2 * 7 * hop_i + 2 * (nodes - 1) * hop_n
    tree = 2 * 7 * hop_i + 2 * np.floor(np.log2(nodes)) * TREE_NET_HOP * hop_n
    assert lat[:3] == pytest.approx(ring[:3])  # a few nodes: the ring
    assert lat[3:] == pytest.approx(tree[3:])  # from 6 nodes: the tree
    assert np.all(np.diff(lat) >= 0)  # never cheaper on more nodes
    assert lat[-1] < 2e-3 < ring[-1] / 20  # 434 nodes: 1.7 ms, not the ring's 43 ms
    assert allreduce_latency(1, 1, hop_i, hop_n) == 0.0  # one GPU: nothing to reduce


def test_ddp_pays_the_latency_once_per_bucket(catalog) -> None:
    """DDP issues one all-reduce per gradient bucket: the same gradient bytes in ten buckets pay ten latencies."""
    p4d = catalog.get("p4d.24xlarge")
    hop_i, hop_n = intra_node_link(p4d, catalog.gpus).latency_s, inter_node_link(p4d).latency_s
    total = MINIMAL["model"]["parameters"] * 4

    def allreduce(buckets: int) -> float:
        data = copy.deepcopy(MINIMAL)
        data["communication"] = {
            "world_size": 8,
            "bucket_detail": [
                {"index": i, "bytes": total // buckets, "allreduce_s": {"p50": 0.001}} for i in range(buckets)
            ],
        }
        return predict(load_profile(data), "p4d.24xlarge:16", catalog=catalog).breakdown["allreduce_s"]

    per_call = float(allreduce_latency(16, 8, hop_i, hop_n))
    assert allreduce(10) - allreduce(1) == pytest.approx(9 * per_call, rel=1e-3)


def _phased_profile():
    data = copy.deepcopy(MINIMAL)
    data["timing"] = {
        "step_time_s": {"p50": 0.31},
        "phases_s": {
            "data": {"p50": 0.0},
            "forward": {"p50": 0.1},
            "backward": {"p50": 0.18},
            "optimizer": {"p50": 0.03},
        },
    }
    return load_profile(data)


def test_the_optimizer_step_runs_once_per_step_whatever_the_batch(catalog) -> None:
    """Strong scaling over 8 GPUs gives each 1/8 of the batch: forward and backward shrink with it, the optimizer step
    (every DDP rank updates the whole model) does not."""
    profile = _phased_profile()
    one = predict(profile, "p3.2xlarge:1", catalog=catalog)  # the profiled V100, the profiled batch
    eight = predict(profile, "p3.16xlarge:1", catalog=catalog)
    assert one.breakdown["compute_s"] == pytest.approx(0.31, rel=1e-6)
    assert eight.breakdown["compute_s"] == pytest.approx(0.28 / 8 + 0.03, rel=1e-6)


def test_framework_time_is_a_floor_per_micro_step(catalog) -> None:
    """The host's framework time (step minus its phases) bounds each micro-step, however small the batch share."""
    data = copy.deepcopy(MINIMAL)
    data["batch"] = {"per_device": 8}
    data["timing"] = {
        "step_time_s": {"p50": 0.012, "mean": 0.012},
        "phases_s": {p: {"p50": 0.001, "mean": 0.001} for p in ("data", "forward", "backward", "optimizer")},
    }
    profile = load_profile(data)
    p = predict(profile, "p3.16xlarge:1", catalog=catalog)  # 1 sample per GPU
    assert p.breakdown["compute_s"] >= 0.012 - 0.004  # the 8 ms the host spends outside the phases
    # and the prediction says so: a user saw compute far above the GPU work and the launch floor, with nothing naming it
    assert any("host's own time per micro-step, 8 ms as profiled" in note for note in p.assumptions), p.assumptions


def test_a_busy_profiling_host_does_not_floor_every_micro_step(catalog) -> None:
    """Issue #37 H1: the host's time was the step's median less the phases' medians. The recorder's phases add up to
    each step, so that difference is an artefact of medians of skewed series (45.4, 0.3 and 71.5 ms in three
    profiles of the same run on a loaded machine; 0.00 ms with means, every time) and it floored every micro-step:
    the same demo predicted g4dn.xlarge:1 at 1.44 h in one run and 10.6 min in another. Now the means decide."""
    import random

    rng = random.Random(0)
    names = ("data", "forward", "backward", "optimizer")
    steps = []
    for _ in range(200):  # a loaded host: most phases quick, some stalled, and the stalls fall in different steps
        phases = {n: 0.002 + (rng.random() < 0.3) * rng.uniform(0.02, 0.08) for n in names}
        steps.append(phases)

    def stats(values: list[float]) -> dict:
        ordered = sorted(values)
        return {"p50": ordered[len(ordered) // 2], "mean": sum(values) / len(values), "min": ordered[0]}

    step_s = [sum(p.values()) for p in steps]
    data = copy.deepcopy(MINIMAL)
    data["batch"] = {"per_device": 8}
    data["timing"] = {"step_time_s": stats(step_s), "phases_s": {n: stats([p[n] for p in steps]) for n in names}}
    profile = load_profile(data)
    t = profile.timing
    medians_gap = t.step_time_s.p50 - sum(t.phases_s[n].p50 for n in names)
    assert medians_gap > 0.02  # the old statistic: tens of milliseconds that no step has
    from predictor.model.ops import framework_s

    assert framework_s(profile) == pytest.approx(0.0, abs=1e-9)
    p = predict(profile, "p3.16xlarge:1", catalog=catalog)
    assert not any("host's own time per micro-step" in note for note in p.assumptions)
    # a profile that recorded medians only says nothing of the host's own time (no floor is made up)
    only_p50 = copy.deepcopy(data)
    only_p50["timing"] = {
        "step_time_s": {"p50": 0.012},
        "phases_s": {n: {"p50": 0.001} for n in names},
    }
    assert framework_s(load_profile(only_p50)) is None


def _causal_flash_forward(seq: int):
    """One causal bf16 flash-attention forward of 32 heads of 128 over ``seq`` tokens, as a capture records it."""
    from predictor.documents.profile import OpRecord

    q = [1, 32, seq, 128]
    return OpRecord(
        op="aten._scaled_dot_product_flash_attention.default",
        phase="forward",
        count=1,
        shapes=[q, q, q],
        dtypes=["bfloat16"] * 3,
        flops=2 * 2 * 32 * seq * seq * 128 / 2,
        bytes_read=3 * 2 * 32 * seq * 128,
        bytes_written=2 * 32 * seq * 128,
        params={"is_causal": [1]},
    )


@pytest.mark.parametrize("tokens", [384, 65536])
def test_fused_attention_runs_at_its_published_share_of_the_peak(catalog, tokens) -> None:
    """Its matmuls at the share (the scores never leave the chip, so not the GEMM model's two batched matmuls,
    which write and read them: 3x the H100's measured cuDNN attention at BERT's 384 tokens); its traffic on top."""
    from predictor.model.ops import attention_ceiling, classify_table, ops_time

    rec = _causal_flash_forward(tokens)
    for gpu_key, share in (("H100-SXM", 0.3), ("A100-SXM-80GB", 0.6)):
        gpu = catalog.gpu(gpu_key)
        assert attention_ceiling(gpu) == share
        t = ops_time(classify_table([rec]), gpu, "bf16-mixed", None, "absolute")
        assert rec.flops / t.by_class["gemm"] == pytest.approx(share * gpu.bf16_tflops * 1e12, rel=1e-9)
        assert rec.flops / t.seconds <= share * gpu.bf16_tflops * 1e12 * 1.001


def test_a_torch_before_2_2_runs_flash_attention_v1_at_its_own_ceiling(catalog) -> None:
    """torch 2.0-2.1's SDPA (and flash-attn 1.x) is FlashAttention v1: 25-40 % of A100's peak (FlashAttention-2
    paper), not v2's 50-73 %; the profile's torch version decides, an unknown one is today's torch."""
    from predictor.exceptions import PredictionError
    from predictor.model.ops import attention_ceiling, attention_generation, classify_table, ops_time

    assert [attention_generation(v) for v in ("2.1.0+cu121", "2.0.1", "2.2.0", "2.13.0", None, "nightly")] == [
        "fa1",
        "fa1",
        "fa2",
        "fa2",
        "fa2",
        "fa2",
    ]
    rec = _causal_flash_forward(16384)
    for key in ("A100-SXM-80GB", "H100-SXM"):
        gpu = catalog.gpu(key)
        v1, v2 = attention_ceiling(gpu, "fa1"), attention_ceiling(gpu, "fa2")
        assert v1 < v2
        t1 = ops_time(classify_table([rec]), gpu, "bf16-mixed", None, "absolute", "fa1").seconds
        t2 = ops_time(classify_table([rec]), gpu, "bf16-mixed", None, "absolute", "fa2").seconds
        assert t1 > t2 and rec.flops / t1 <= v1 * gpu.bf16_tflops * 1e12 * 1.001
    with pytest.raises(PredictionError, match="unknown attention kernel generation 'fa9'"):
        attention_ceiling(catalog.gpu("H100-SXM"), "fa9")


def test_a_prediction_says_when_attention_is_priced_as_flash_attention_v1(catalog) -> None:
    import dataclasses
    import json

    from conftest import ROOT
    from predictor.documents.profile import Software, load_profile
    from predictor.model.predict import predict

    profile = load_profile(json.loads((ROOT / "examples" / "profiles" / "llama-1b-meta.json").read_text()))
    old = dataclasses.replace(profile, software=Software(torch="2.1.0+cu121"))
    new = predict(profile, "p5.48xlarge:1", catalog=catalog, scaling="weak")
    v1 = predict(old, "p5.48xlarge:1", catalog=catalog, scaling="weak")
    assert any("FlashAttention v1" in n and "torch 2.1.0+cu121" in n for n in v1.assumptions)
    assert not any("FlashAttention v1" in n for n in new.assumptions)
    assert v1.throughput_samples_s <= new.throughput_samples_s  # slower only where the ceiling binds (long sequences)


def test_the_input_pipeline_says_how_it_was_scaled(catalog) -> None:
    """A profile with its CPU count has its data time scaled by CPUs per GPU, and the prediction says from what to
    what (a user saw "input 0.0 ms" against a profiled 0.8 ms and no line about it)."""
    from lightning_srifty.cli.predict import _ms

    data = copy.deepcopy(MINIMAL)
    data["hardware"] = {**data["hardware"], "cpu_count": 8, "devices": 1}
    # without a data phase the wait is inside the measured step, scaled with it (it said "scaled by CPUs per GPU" of
    # a data time it did not have); a capture runs no DataLoader, and says the input pipeline is not in its time
    inside = predict(load_profile(data), "g5.12xlarge:1", catalog=catalog)
    assert "input pipeline: inside the measured step (its data wait not timed apart)" in " ".join(inside.assumptions)
    data["timing"]["phases_s"] = {k: {"p50": v} for k, v in (("data", 0.01), ("forward", 0.1), ("backward", 0.18),
                                                              ("optimizer", 0.02))}  # fmt: skip
    p = predict(load_profile(data), "g5.12xlarge:1", catalog=catalog)
    assert any("scaled by CPUs per GPU (8 profiled -> 12 on g5.12xlarge)" in n for n in p.assumptions), p.assumptions
    from pathlib import Path

    captured = load_profile(Path(__file__).resolve().parents[2] / "examples" / "profiles" / "llama-1b-meta.json")
    words = " ".join(predict(captured, "g5.12xlarge:1", catalog=catalog).assumptions)
    assert "input pipeline: not modelled (the capture ran no DataLoader: 0 ms a step)" in words
    assert [_ms(x) for x in (0.0, 3.3e-5, 0.0123)] == ["0.0 ms", "0.033 ms", "12.3 ms"]
