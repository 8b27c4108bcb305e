"""An "up to" network held to its baseline once its burst credits are spent (predictor.model.network's
``Link.sustained_gbps``, ``fleets.combine``'s ``baseline_wait_s``), the catalog field it reads, and the published
hour-long measurements it is scored on (bench/burst_baseline.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from _support import ROOT, bench_module
from predictor.catalog import Catalog
from predictor.catalog.fields import read_row
from predictor.catalog.refresh import _spec_row
from predictor.documents.profile import load_profile
from predictor.model import basis
from predictor.model.collectives import bus_factor
from predictor.model.memory import profile_sizes
from predictor.model.network import DEFAULT_NETWORK, calibrate, inter_node_link
from predictor.model.predict import predict

RESNET = ROOT / "examples" / "profiles" / "resnet50-v100.json"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(use_refreshed=False, use_env=False)


def test_an_up_to_network_sustains_its_baseline_and_no_more_than_its_burst(catalog: Catalog) -> None:
    """g4dn.xlarge ('up to 25', baseline 5) sustains 5 Gbit/s through the same efficiency as its burst's rate;
    g4dn.4xlarge's baseline (20) is above the burst's rate the model takes (0.4 x 25), so nothing is held; a
    sustained network (p4d) and an 'up to' type without a baseline (p3.2xlarge) are never held."""
    small = inter_node_link(catalog.get("g4dn.xlarge"))
    assert small.sustained_gbps == pytest.approx(5.0 / 8 * DEFAULT_NETWORK.tcp_efficiency)
    assert small.gbps == pytest.approx(25.0 / 8 * DEFAULT_NETWORK.up_to_burst * DEFAULT_NETWORK.tcp_efficiency)
    large = inter_node_link(catalog.get("g4dn.4xlarge"))
    assert large.sustained_gbps == pytest.approx(large.gbps)
    assert math.isinf(inter_node_link(catalog.get("p4d.24xlarge")).sustained_gbps)
    assert catalog.get("p3.2xlarge").network_up_to and catalog.get("p3.2xlarge").network_baseline_gbps is None
    assert math.isinf(inter_node_link(catalog.get("p3.2xlarge")).sustained_gbps)


def test_a_step_that_sends_more_than_the_baseline_carries_waits_for_it(catalog: Catalog) -> None:
    """ResNet-50's fp32 gradients (DDP) on 4 g5.xlarge (baseline 2.5 Gbit/s): each node sends a flat ring's
    2 (n-1)/n of them a step, more than the baseline carries in the step at the burst's rate, so the step is that
    traffic over the sustained rate exactly, the wait is in the exposed communication, and the prediction says so."""
    profile = load_profile(RESNET)
    p = predict(profile, "g5.xlarge:4", catalog=catalog, layout="ddp")
    sustained = inter_node_link(catalog.get("g5.xlarge")).sustained_gbps
    sent_gb = float(bus_factor("all_reduce", 4)) * profile.model.parameters * 4 / 1e9
    assert p.iteration_time_s == pytest.approx(sent_gb / sustained, rel=1e-9)
    words = " ".join(p.assumptions)
    assert "'up to 10 Gigabit'" in words and "its 2.5 Gbit/s baseline" in words and "priced in" in words
    # the same fleet with a baseline as fast as the burst's rate: nothing to wait for, and a faster step
    roomy = _with_baseline(catalog, "g5.xlarge", 10.0)
    q = predict(profile, "g5.xlarge:4", catalog=roomy, layout="ddp")
    assert q.iteration_time_s < p.iteration_time_s
    assert p.breakdown["exposed_comm_s"] - q.breakdown["exposed_comm_s"] == pytest.approx(
        p.iteration_time_s - q.iteration_time_s, rel=1e-6
    )
    assert "rated 'up to" not in " ".join(q.assumptions)  # a baseline at the burst's rate never holds: not said


def test_a_step_under_the_baseline_is_unchanged(catalog: Catalog) -> None:
    """ResNet-50 on 2 g4dn.xlarge sends less a step than 5 Gbit/s carries in it: the step is the burst's, the same as
    with no baseline at all, and the prediction says the burst's rate holds."""
    profile = load_profile(RESNET)
    held = predict(profile, "g4dn.xlarge:2", catalog=catalog, layout="ddp")
    free = predict(profile, "g4dn.xlarge:2", catalog=_with_baseline(catalog, "g4dn.xlarge", None), layout="ddp")
    assert held.iteration_time_s == pytest.approx(free.iteration_time_s, rel=1e-12)
    assert "no wait" in " ".join(held.assumptions)
    assert "no baseline for it" in " ".join(free.assumptions)


@pytest.mark.parametrize("layout", ["ddp", "fsdp:full_shard", "fsdp:shard_grad_op"])
def test_a_larger_baseline_never_slows_a_step(catalog: Catalog, layout: str) -> None:
    """Monotone in the baseline, under every layout that crosses nodes."""
    profile = load_profile(RESNET)
    steps = [
        predict(profile, "g6e.xlarge:4", catalog=_with_baseline(catalog, "g6e.xlarge", b), layout=layout)
        .iteration_time_s
        for b in (0.5, 1.0, 2.5, 5.0, 20.0)
    ]  # fmt: skip
    assert steps == sorted(steps, reverse=True) and steps[0] > steps[-1]


def test_a_refresh_sums_the_cards_baselines_of_an_up_to_type() -> None:
    """describe_instance_types gives BaselineBandwidthInGbps per network card (botocore's model has the key): a
    refresh keeps their sum for an 'up to' type and nothing for a sustained one."""
    item = {
        "InstanceType": "g4dn.xlarge",
        "VCpuInfo": {"DefaultVCpus": 4},
        "MemoryInfo": {"SizeInMiB": 16384},
        "GpuInfo": {"Gpus": [{"Name": "T4", "Manufacturer": "NVIDIA", "Count": 1, "MemoryInfo": {"SizeInMiB": 15360}}]},
        "NetworkInfo": {
            "NetworkPerformance": "Up to 25 Gigabit",
            "NetworkCards": [{"BaselineBandwidthInGbps": 5.0, "PeakBandwidthInGbps": 25.0}],
        },
    }
    row = _spec_row(item, Catalog.load(), [])
    assert row is not None and read_row(row)["network_baseline_gbps"] == 5.0
    item["NetworkInfo"]["NetworkPerformance"] = "25 Gigabit"
    row = _spec_row(item, Catalog.load(), [])
    assert row is not None and read_row(row)["network_baseline_gbps"] is None
    import botocore.session

    model = botocore.session.get_session().get_service_model("ec2")
    card = model.shape_for("NetworkCardInfo")
    assert "BaselineBandwidthInGbps" in card.members


def test_the_published_hour_long_rates_are_the_baselines() -> None:
    """bench/burst_baseline.py: 13 types measured over an hour (iperf3) or throttled after their burst (S3): the
    model's sustained rate is within 0.76-1.04x of every one (before: 0.76-63x), nothing fitted."""
    rows = bench_module("burst_baseline").rows()
    assert len(rows) == 13
    for r in rows:
        ratio = r["after"] / float(r["sustained_gbps"])
        assert 0.75 <= ratio <= 1.05, (r["instance_type"], ratio)
    assert max(r["before"] / float(r["sustained_gbps"]) for r in rows) > 10


def _with_baseline(catalog: Catalog, name: str, gbps: float | None) -> Catalog:
    """A copy of ``catalog`` whose ``name`` has the baseline ``gbps``."""
    types = {it.name: it for it in catalog}
    types[name] = dataclasses.replace(types[name], network_baseline_gbps=gbps)
    return Catalog(types, catalog.gpus, catalog.info)


TINY = 0.001  # Gbit/s: a baseline so small that the wait sets every step, so the step is the traffic exactly


@pytest.mark.parametrize(("layout", "collectives"), [("fsdp:full_shard", 3), ("fsdp:shard_grad_op", 2)])
def test_fsdp_traffic_is_every_collective_of_every_micro_step(catalog: Catalog, layout: str, collectives: int) -> None:
    """Llama 7B under FSDP on 4 g6e.xlarge takes 16 micro-steps; each all-gathers the 16-bit parameters for forward
    (and backward, full_shard) and reduce-scatters as many bytes: each node sends a ring's (n-1)/n of each."""
    profile = load_profile(ROOT / "examples" / "profiles" / "llama-7b-bf16-handwritten.json")
    tiny = _with_baseline(catalog, "g6e.xlarge", TINY)
    p = predict(profile, "g6e.xlarge:4", catalog=tiny, layout=layout)
    sizes = profile_sizes(profile)
    sent_gb = collectives * float(bus_factor("all_gather", 4)) * sizes.parameters * sizes.compute / 1e9
    sustained = inter_node_link(tiny.get("g6e.xlarge")).sustained_gbps
    assert p.iteration_time_s == pytest.approx(p.accumulate_grad_batches * sent_gb / sustained, rel=1e-9)
    if layout == "fsdp:full_shard":
        assert p.accumulate_grad_batches > 1  # the accumulation is counted, not taken as one


def test_a_mixed_fleet_waits_for_its_slowest_baseline(catalog: Catalog) -> None:
    """g5.xlarge and g6e.xlarge groups: the traffic is the whole fleet's ring's, the rate the lesser sustained one,
    whichever group has it."""
    profile = load_profile(RESNET)
    for slow in ("g5.xlarge", "g6e.xlarge"):
        tiny = _with_baseline(catalog, slow, TINY)
        p = predict(profile, "g5.xlarge:2,g6e.xlarge:2", catalog=tiny, layout="ddp")
        sent_gb = float(bus_factor("all_reduce", 4)) * profile.model.parameters * 4 / 1e9
        assert p.iteration_time_s == pytest.approx(sent_gb / inter_node_link(tiny.get(slow)).sustained_gbps, rel=1e-9)
        assert p.bottleneck.startswith("network (an 'up to' network's baseline")
        assert f"{slow}'s network is rated" in " ".join(p.assumptions)


def test_a_pipeline_stage_sends_its_activations_once_on_two_stages(catalog: Catalog) -> None:
    """pipeline:2: each node sends one way, every micro-batch's block input (forward from the first stage, its
    gradient back from the second), not both."""
    profile = load_profile(ROOT / "examples" / "profiles" / "llama-7b-bf16-handwritten.json")
    tiny = _with_baseline(catalog, "g5.xlarge", TINY)
    p = predict(profile, "g5.xlarge:2", catalog=tiny, layout="pipeline:2")
    micro = p.groups[0].micro_batch
    boundary_gb = profile.model.structure.block_input_bytes_per_sample * micro / 1e9
    sent_gb = p.accumulate_grad_batches * boundary_gb
    assert p.iteration_time_s == pytest.approx(sent_gb / inter_node_link(tiny.get("g5.xlarge")).sustained_gbps)


def test_a_measured_link_keeps_the_catalogs_baseline(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile that measured its all-reduce across g5.xlarge nodes (a window of the run: the burst at most) is
    still held to the baseline over a run."""
    profile = load_profile(RESNET)
    measured = calibrate([25e6, 25e6], [0.01, 0.01], 4, 4, 2.0)
    assert math.isinf(measured.sustained_gbps)
    monkeypatch.setattr(basis, "measured_link", lambda *args: measured)
    b = basis.type_basis(profile, basis.Source.of(profile, catalog), catalog.get("g5.xlarge"), catalog, DEFAULT_NETWORK)
    assert b.inter.gbps == measured.gbps
    assert b.inter.sustained_gbps == inter_node_link(catalog.get("g5.xlarge")).sustained_gbps


def test_one_node_says_nothing_of_its_network(catalog: Catalog) -> None:
    """One g5.xlarge never crosses its network: no wait, no words."""
    p = predict(load_profile(RESNET), "g5.xlarge:1", catalog=_with_baseline(catalog, "g5.xlarge", TINY))
    assert p.breakdown["baseline_wait_s"] == 0.0
    assert "rated 'up to" not in " ".join(p.assumptions)
