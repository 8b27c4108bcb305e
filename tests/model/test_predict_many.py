"""predict_many() is predict() vectorised: same numbers for every type and count."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from _support import MINIMAL
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError, PredictionError
from predictor.model.fleets import predict_many, predict_mixes
from predictor.model.predict import predict


def rich_profile():
    data = copy.deepcopy(MINIMAL)
    data["timing"] = {
        "step_time_s": {"p50": 0.31, "cv": 0.04},
        "phases_s": {
            "data": {"p50": 0.01},
            "forward": {"p50": 0.1},
            "backward": {"p50": 0.18},
            "optimizer": {"p50": 0.02},
        },
    }
    data["hardware"]["cpu_count"] = 8
    data["memory"] = {"peak_allocated_bytes": 9 * 2**30}
    return load_profile(data)


@pytest.mark.parametrize("scaling", ["weak", "strong"])
@pytest.mark.parametrize("make", [lambda: load_profile(copy.deepcopy(MINIMAL)), rich_profile])
def test_same_numbers_as_predict(catalog, scaling, make) -> None:
    profile = make()
    types = [it.name for it in catalog.filter() if it.gpu in catalog.gpus]
    names = [t for t in types for _ in (1, 2, 3, 8)]
    counts = [c for _ in types for c in (1, 2, 3, 8)]
    many = predict_many(profile, names, counts, catalog=catalog, scaling=scaling)
    for i, (name, count) in enumerate(zip(names, counts)):
        one = predict(profile, f"{name}:{count}", catalog=catalog, scaling=scaling, layout="ddp")  # predict_many's
        assert many.iteration_time_s[i] == pytest.approx(one.iteration_time_s, rel=1e-9), (name, count)
        assert many.throughput_samples_s[i] == pytest.approx(one.throughput_samples_s, rel=1e-9)
        lo, hi = one.interval["iteration_time_s"]
        assert (many.iteration_time_lo_s[i], many.iteration_time_hi_s[i]) == (pytest.approx(lo), pytest.approx(hi))
        assert many.exposed_comm_s[i] == pytest.approx(one.breakdown["exposed_comm_s"], rel=1e-9, abs=1e-15)
        assert bool(many.fits_memory[i]) == one.fits_memory
        assert many.global_batch[i] == pytest.approx(one.global_batch)


def test_bad_input(catalog) -> None:
    profile = load_profile(copy.deepcopy(MINIMAL))
    with pytest.raises(ConfigError, match="one count per instance type"):
        predict_many(profile, ["p3.2xlarge"], [1, 2], catalog=catalog)
    with pytest.raises(ConfigError, match=r">= 1\. Got 0"):
        predict_many(profile, ["p3.2xlarge"], np.array([0]), catalog=catalog)
    with pytest.raises(PredictionError, match="not a CUDA GPU"):
        predict_many(profile, ["trn1.32xlarge"], [1], catalog=catalog)


@pytest.mark.parametrize("scaling", ["weak", "strong"])
def test_mixes_same_numbers_as_predict(catalog, scaling) -> None:
    """Mixed fleets of 2 and 3 types (different GPUs, same GPU on different types, the profiled type with another)."""
    profile = rich_profile()
    fleets = [
        [("p3.8xlarge", 2), ("g5.12xlarge", 1)],
        [("p3.2xlarge", 1), ("p3.8xlarge", 1)],  # same GPU, different types: an equal split
        [("p3.2xlarge", 3), ("g5.xlarge", 2), ("p4d.24xlarge", 1)],
        [("g4dn.xlarge", 4), ("g6.xlarge", 1)],
        [("p5.48xlarge", 2), ("g5.48xlarge", 1)],
    ]
    names = sorted({t for fleet in fleets for t, _ in fleet})
    k = max(len(f) for f in fleets)
    tidx = np.zeros((len(fleets), k), dtype=int)
    counts = np.zeros((len(fleets), k), dtype=int)
    for i, fleet in enumerate(fleets):
        for j, (t, c) in enumerate(fleet):
            tidx[i, j], counts[i, j] = names.index(t), c
    many = predict_mixes(profile, names, tidx, counts, catalog=catalog, scaling=scaling)
    for i, fleet in enumerate(fleets):
        one = predict(profile, fleet, catalog=catalog, scaling=scaling)
        assert many.iteration_time_s[i] == pytest.approx(one.iteration_time_s, rel=1e-9), fleet
        assert many.throughput_samples_s[i] == pytest.approx(one.throughput_samples_s, rel=1e-9)
        lo, hi = one.interval["iteration_time_s"]
        assert (many.iteration_time_lo_s[i], many.iteration_time_hi_s[i]) == (pytest.approx(lo), pytest.approx(hi))
        assert many.allreduce_s[i] == pytest.approx(one.breakdown["allreduce_s"], rel=1e-9)
        assert bool(many.fits_memory[i]) == one.fits_memory
        for j, group in enumerate(one.groups):
            assert many.per_device_batch[i, j] == pytest.approx(group.per_device_batch, rel=1e-9)
        # the groups' throughput adds up to the fleet's
        assert many.group_throughput()[i].sum() == pytest.approx(many.throughput_samples_s[i], rel=1e-9)


def test_calibration_scales_compute_of_that_gpu_only(catalog) -> None:
    profile = rich_profile()
    base = predict_many(profile, ["g5.xlarge", "p3.2xlarge"], [1, 1], catalog=catalog)
    tuned = predict_many(profile, ["g5.xlarge", "p3.2xlarge"], [1, 1], catalog=catalog, calibration={"A10G": 0.8})
    assert tuned.compute_s[0] == pytest.approx(base.compute_s[0] / 0.8)
    assert tuned.compute_s[1] == pytest.approx(base.compute_s[1])
    one = predict(profile, "g5.xlarge:1", catalog=catalog, calibration={"A10G": 0.8})
    assert one.iteration_time_s == pytest.approx(tuned.iteration_time_s[0])
    assert any("calibrated x0.80" in a for a in one.assumptions)


def test_a_mix_never_uses_the_link_measured_on_one_type(catalog) -> None:
    """Regression: the group count was a numpy OR (``row_sum(cnt > 0) == 1``), so every mix counted as one group and
    a mix containing the profiled type used the inter-node link measured on that type alone."""
    from predictor.model.collectives import allreduce_latency
    from predictor.model.network import inter_node_link, intra_node_link

    data = copy.deepcopy(MINIMAL)
    data["hardware"] = {"gpu": "V100-SXM2-16GB", "devices": 8, "nodes": 2, "instance_type": "p3.16xlarge"}
    data["communication"] = {
        "world_size": 16,
        "bucket_detail": [
            {"index": i, "bytes": size, "allreduce_s": {"p50": t}}
            for i, (size, t) in enumerate([(2**20, 0.004), (25 * 2**20, 0.09), (25 * 2**20, 0.091)])
        ],
    }
    profile = load_profile(data)
    mix = predict(profile, "p3.16xlarge:2,g5.48xlarge:1", catalog=catalog)
    plain = min(
        inter_node_link(catalog.get(name)).gbps for name in ("p3.16xlarge", "g5.48xlarge")
    )  # the catalog's links
    gb = profile.model.parameters * 4 / 1e9
    calls = len(data["communication"]["bucket_detail"])  # one all-reduce call per measured bucket

    def hop(name: str) -> float:  # the intra-node ring hop (both types have several GPUs)
        link = intra_node_link(catalog.get(name), catalog.gpus)
        assert link is not None
        return link.latency_s

    intra = max(
        predict(profile, f"{name}:1", catalog=catalog).breakdown["allreduce_s"]
        - calls * float(allreduce_latency(1, catalog.get(name).gpus, hop(name), 0.0))
        for name in ("p3.16xlarge", "g5.48xlarge")
    )
    # p3.16xlarge has no EFA: NCCL's sockets, whose traffic crosses nodes as a flat ring of all 24 ranks
    expected_inter = 2 * 23 / 24 * gb / plain
    net_hop = max(inter_node_link(catalog.get(name)).latency_s for name in ("p3.16xlarge", "g5.48xlarge"))
    latency = calls * float(allreduce_latency(3, 8, max(hop("p3.16xlarge"), hop("g5.48xlarge")), net_hop))
    # the intra-node and network phases are pipelined (predictor.model.network): the slower one sets the pace
    assert mix.breakdown["allreduce_s"] == pytest.approx(max(intra, expected_inter) + latency, rel=0.02)
    assert not any("calibrated from the profile's measured buckets" in a for a in mix.assumptions)
    same = predict(profile, "p3.16xlarge:3", catalog=catalog)
    assert any("calibrated from the profile's measured buckets" in a for a in same.assumptions)
    many = predict_mixes(
        profile, ["g5.48xlarge", "p3.16xlarge"], np.array([[1, 0], [1, 0]]), np.array([[2, 1], [3, 0]]), catalog=catalog
    )
    assert many.allreduce_s[0] == pytest.approx(mix.breakdown["allreduce_s"], rel=1e-12)
    assert many.allreduce_s[1] == pytest.approx(same.breakdown["allreduce_s"], rel=1e-12)
