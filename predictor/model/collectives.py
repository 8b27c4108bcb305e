"""NCCL's collectives as the model prices them: one vectorised time per kind, the only place their factors are written.

A ring over ``n`` ranks takes ``2 (n-1)`` steps for an all-reduce (a reduce-scatter, then an all-gather) and ``n-1``
for either half; each step moves ``S/n`` per rank, so an all-reduce moves ``2 (n-1)/n * S`` per rank (its bus-bandwidth
factor, as nccl-tests defines it), an all-gather or a reduce-scatter ``(n-1)/n * S``, and the latency is the steps
times a hop's. Across nodes NCCL's all-reduce is either the ring or a double binary tree (``2 log2 N`` network hops,
each twice a ring hop's: :data:`TREE_NET_HOP`), whichever costs less (:func:`allreduce_latency`); its all-gather and
reduce-scatter are rings.

What crosses a node's network: over EFA (or RDMA) NCCL is hierarchical, one ring per GPU rail, so the network carries
the node's share (``n`` = nodes); over its socket transport every byte crosses the node's one network as in a flat
ring of every rank (``n`` = ranks: :func:`crossing_ranks`). The fleets' DDP, FSDP and hybrid-shard communication
(:mod:`predictor.model.fleets`) and the link figures (:mod:`predictor.model.network`) are built from these; the
evidence for each is in :mod:`predictor.model.network`'s docstring and BENCHMARKS.md.
"""

from __future__ import annotations

import numpy as np

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"
# a ring's steps over n ranks, in units of (n - 1): the bytes each rank sends, in units of (n - 1)/n x S, too
_RING_STEPS = {ALL_REDUCE: 2, ALL_GATHER: 1, REDUCE_SCATTER: 1}

# A tree hop across nodes relative to a ring hop: NCCL's own model prices it at twice (hwLat, Simple protocol,
# network: 28 us against 14 us; src/graph/tuning.cc, NVIDIA/nccl @ b647562): a tree hop reduces a whole chunk before
# forwarding it, a ring hop pipelines. Inside the node the tree is a chain through the node's GPUs, priced like the
# ring's intra-node hops: NCCL's intra-node tree figure (28 us against 3.4 on NVLink) is the latency of a 256 kB chunk,
# and with it the p5 all-reduces of 32-128 MB at 16-32 nodes came out 2x too slow (bench/collectives.py,
# BENCHMARKS.md), as with the ring alone.
TREE_NET_HOP = 28 / 14

Array = np.ndarray | float


def ring_steps(kind: str, n: Array) -> np.ndarray:
    """The steps of a ring ``kind`` over ``n`` ranks (0 for one rank): ``2 (n-1)`` for an all-reduce, ``n-1`` else."""
    return _RING_STEPS[kind] * (np.asarray(n, dtype=float) - 1)


def bus_factor(kind: str, n: Array) -> np.ndarray:
    """The bytes each rank moves per byte of the collective's buffer: ``2 (n-1)/n`` for an all-reduce, ``(n-1)/n``
    for an all-gather or a reduce-scatter (nccl-tests' bus-bandwidth factor)."""
    return ring_steps(kind, n) / np.maximum(np.asarray(n, dtype=float), 1.0)


def phase_s(kind: str, gb: Array, n: Array, gbps: Array) -> np.ndarray:
    """The bandwidth time (s) of a ring ``kind`` of ``gb`` GB over ``n`` ranks on links of ``gbps`` GB/s; 0 for one."""
    n_a = np.asarray(n, dtype=float)
    return np.where(n_a > 1, bus_factor(kind, n_a) * np.asarray(gb, dtype=float) / gbps, 0.0)


def ring_latency(kind: str, n: Array, hop_s: Array) -> np.ndarray:
    """The latency (s) of a ring ``kind`` over ``n`` ranks whose hops cost ``hop_s`` each."""
    return ring_steps(kind, n) * np.asarray(hop_s, dtype=float)


def crossing_ranks(nodes: Array, ranks: Array, sockets: Array) -> np.ndarray:
    """The ring size across the network: the nodes (EFA, hierarchical) or, over NCCL's sockets (``sockets`` 1),
    every rank (a flat ring)."""
    nodes_a, ranks_a = np.asarray(nodes, dtype=float), np.asarray(ranks, dtype=float)
    return np.where(np.asarray(sockets, dtype=float) > 0, np.maximum(ranks_a, nodes_a), nodes_a)


def network_phase_s(
    gb: Array, nodes: Array, ranks: Array, gbps: Array, sockets: Array, kind: str = ALL_REDUCE
) -> np.ndarray:
    """The bandwidth time (s) of a collective ``kind`` of ``gb`` GB per rank across ``nodes`` nodes through a network
    of ``gbps`` GB/s per node; 0 on one node.

    Over EFA (or RDMA) NCCL reduces across nodes hierarchically, each node's network carrying ``2 (N-1)/N`` of an
    all-reduce's data (checked on p5 nccl-tests, 2-32 nodes: :mod:`predictor.model.network`). Over its socket
    transport (``sockets`` 1) every byte crosses the node's one network as in a flat ring of all ``n`` ranks,
    ``2 (n-1)/n`` of the data: bus bandwidth never above the network's rate. NVIDIA/nccl#209 (nccl-tests over TCP on
    32 GbE, NCCL 2.4.7) measured 30.6-31.4 Gbit/s with one GPU per node and 14.5-14.9 (2 nodes) / 22.2-22.9 (4 nodes)
    with eight: the hierarchical form priced those at 57 and 39 Gbit/s, the flat ring at 30.4
    (``bench/tcp_sockets.py``, BENCHMARKS.md). With one GPU per node the two forms agree."""
    nodes_a = np.asarray(nodes, dtype=float)
    n = crossing_ranks(nodes_a, ranks, sockets)
    return np.where(nodes_a > 1, bus_factor(kind, n) * np.asarray(gb, dtype=float) / gbps, 0.0)


def allreduce_latency(nodes: Array, node_gpus: Array, hop_intra_s: Array, hop_net_s: Array) -> np.ndarray:
    """The latency part of one all-reduce call (seconds) over ``nodes`` nodes of ``node_gpus`` GPUs, whose ring hops
    cost ``hop_intra_s`` inside a node and ``hop_net_s`` across nodes: the ``2 (g-1)`` intra-node hops both algorithms
    make, plus the network hops of NCCL's ring or its tree, whichever are fewer in time (``ncclTopoTuneModel``).
    Vectorised over any broadcastable arguments."""
    n = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    g = np.maximum(np.asarray(node_gpus, dtype=float), 1.0)
    net_hops = np.minimum(ring_steps(ALL_REDUCE, n), 2 * np.floor(np.log2(n)) * TREE_NET_HOP)  # ring, tree
    return ring_latency(ALL_REDUCE, g, hop_intra_s) + net_hops * np.asarray(hop_net_s, dtype=float)


def hierarchical_s(
    kind: str,
    gb: Array,
    *,
    node_gpus: Array,
    intra_gbps: Array,
    intra_hop_s: Array,
    nodes: Array,
    ranks: Array,
    net_gbps: Array,
    net_hop_s: Array,
    sockets: Array,
    calls: Array = 1.0,
    across: np.ndarray | None = None,
) -> np.ndarray:
    """One collective ``kind`` of ``gb`` GB over a fleet (0 for one rank), hierarchical as NCCL runs it: the
    intra-node and network phases pipelined chunk by chunk, so the slower bandwidth term sets the pace, and each of
    ``calls`` calls paying its ring's hop latencies inside the node and across nodes; over sockets the bytes cross
    nodes as a flat ring of every rank (:func:`network_phase_s`). ``across``: whether it crosses nodes (default: more
    than one node)."""
    nodes_a = np.asarray(nodes, dtype=float)
    crosses = nodes_a > 1 if across is None else across
    intra = phase_s(kind, gb, node_gpus, intra_gbps)
    inter = np.where(crosses, network_phase_s(gb, nodes_a, ranks, net_gbps, sockets, kind), 0.0)
    hops = ring_latency(kind, node_gpus, intra_hop_s) + np.where(crosses, ring_latency(kind, nodes_a, net_hop_s), 0.0)
    return np.where(np.asarray(ranks) > 1, np.maximum(intra, inter) + calls * hops, 0.0)
