"""How NCCL's collectives cross nodes (issue #38 item 3): hierarchically only where the node reduces inside through
NVLink SHARP (NVSwitch with Hopper or later), as NCCL's ring through every rank on other EFA nodes (its tree on two
nodes), as a flat ring over sockets; held out on published nccl-tests of p4d.24xlarge (NVIDIA/nccl#527)."""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import numpy as np
import pytest

from _support import MINIMAL
from predictor.catalog import Catalog
from predictor.documents.profile import load_profile
from predictor.model.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    HIERARCHICAL,
    RING,
    SOCKETS,
    crossing_ranks,
    network_phase_s,
)
from predictor.model.network import allreduce_time, inter_node_link, nvls
from predictor.model.predict import predict

P4D = Path(__file__).resolve().parents[2] / "bench" / "data" / "nccl_tests_p4d_allreduce.csv"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(use_refreshed=False, use_env=False)


@pytest.mark.parametrize(
    ("name", "crossing"),
    [
        ("p5.48xlarge", HIERARCHICAL),  # H100 on NVSwitch gen 3: NVLS
        ("p5en.48xlarge", HIERARCHICAL),
        ("p6-b200.48xlarge", HIERARCHICAL),
        ("p4d.24xlarge", RING),  # A100 on NVSwitch gen 2: no NVLS
        ("p4de.24xlarge", RING),
        ("g4dn.12xlarge", RING),  # EFA, PCIe T4s
        ("p3.8xlarge", SOCKETS),  # no EFA: NCCL's socket transport
        ("g4dn.xlarge", SOCKETS),
    ],
)
def test_each_type_crosses_nodes_as_nccl_runs_its_collectives(catalog: Catalog, name: str, crossing: float) -> None:
    it = catalog.get(name)
    assert inter_node_link(it, gpus=catalog.gpus).crossing == crossing
    assert nvls(it, catalog.gpus) == (crossing == HIERARCHICAL)


def test_without_the_gpu_table_no_node_is_taken_for_nvls(catalog: Catalog) -> None:
    assert inter_node_link(catalog.get("p5.48xlarge")).crossing == RING  # the larger traffic, never the smaller


def test_the_ring_moves_every_rank_s_share_except_the_two_node_tree() -> None:
    nodes, ranks = np.array([2.0, 3.0, 4.0]), np.array([16.0, 24.0, 32.0])
    assert crossing_ranks(nodes, ranks, HIERARCHICAL).tolist() == [2, 3, 4]
    assert crossing_ranks(nodes, ranks, RING).tolist() == [2, 24, 32]  # tree on two nodes, ring from three
    assert crossing_ranks(nodes, ranks, SOCKETS).tolist() == [16, 24, 32]  # no tree gain over sockets
    # NCCL's all-gather and reduce-scatter are rings: no tree on two nodes
    assert crossing_ranks(nodes, ranks, RING, ALL_GATHER).tolist() == [16, 24, 32]
    gb, gbps = 1.0, 10.0
    ring4, hier4 = network_phase_s(gb, 4, 32, gbps, RING), network_phase_s(gb, 4, 32, gbps, HIERARCHICAL)
    assert float(ring4 / hier4) == pytest.approx((2 * 31 / 32) / (2 * 3 / 4))
    assert float(network_phase_s(gb, 2, 16, gbps, RING)) == float(network_phase_s(gb, 2, 16, gbps, HIERARCHICAL))
    assert float(network_phase_s(gb, 1, 8, gbps, RING, ALL_REDUCE)) == 0.0


def test_p4d_nccl_tests_held_out_are_priced_within_a_fifth(catalog: Catalog) -> None:
    """NVIDIA/nccl#527: all_reduce_perf of 1 GiB on 2-4 p4d.24xlarge over EFA, NCCL 2.9.9; nothing chosen on it.
    The hierarchical form the model used for every EFA node before was 1.51-1.57x the measured algbw at 3-4 nodes."""
    p4d = catalog.get("p4d.24xlarge")
    with P4D.open(encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["nodes"]) > 1]
    assert len(rows) == 3
    for r in rows:
        nodes, size = int(r["nodes"]), float(r["size_bytes"])
        algbw = size / allreduce_time(size, [(p4d, nodes)], catalog.gpus).seconds / 1e9
        assert algbw / float(r["out_algbw_gbs"]) == pytest.approx(1.0, abs=0.2), r
        as_p5 = inter_node_link(p4d)  # what the hierarchical form priced: the node's share only
        hier = size / 1e9 * (2 * (nodes - 1) / nodes) / as_p5.gbps
        if nodes > 2:
            assert size / 1e9 / hier / float(r["out_algbw_gbs"]) > 1.4


def test_a_fleet_mixing_nvls_and_ring_nodes_runs_the_ring(catalog: Catalog) -> None:
    profile = load_profile(copy.deepcopy(MINIMAL))
    alone = predict(profile, "p5.48xlarge:4", catalog=catalog)
    mixed = predict(profile, [("p5.48xlarge", 2), ("p4de.24xlarge", 2)], catalog=catalog)
    ring = predict(profile, "p4de.24xlarge:4", catalog=catalog)
    assert alone.breakdown["allreduce_s"] < mixed.breakdown["allreduce_s"]
    assert mixed.breakdown["allreduce_s"] == pytest.approx(ring.breakdown["allreduce_s"], rel=0.35)


def test_a_multi_node_prediction_says_how_its_nodes_are_priced_to_meet(catalog: Catalog) -> None:
    profile = load_profile(copy.deepcopy(MINIMAL))

    def across(fleet) -> list[str]:
        return [a for a in predict(profile, fleet, catalog=catalog).assumptions if a.startswith("across nodes")]

    (efa,) = across("p4de.24xlarge:2")
    assert "EFA" in efa and "ring through every rank" in efa and "aws-ofi-nccl" in efa
    (nvls_words,) = across("p5.48xlarge:2")
    assert "NVLS" in nvls_words
    (tcp,) = across("p3.8xlarge:2")
    assert "TCP" in tcp and "no EFA" in tcp
    # a mix of an NVLS node and a ring node runs the ring, and says so
    (mixed,) = across([("p5.48xlarge", 1), ("p4de.24xlarge", 1)])
    assert "ring through every rank" in mixed and "NVLS" not in mixed
    assert across("p5.48xlarge:1") == []  # one node: nothing crosses a network
