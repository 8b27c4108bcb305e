"""NCCL's collectives as the model prices them: one vectorised time per kind, the only place their factors are written.

A ring over ``n`` ranks takes ``2 (n-1)`` steps for an all-reduce (a reduce-scatter, then an all-gather) and ``n-1``
for either half; each step moves ``S/n`` per rank, so an all-reduce moves ``2 (n-1)/n * S`` per rank (its bus-bandwidth
factor, as nccl-tests defines it), an all-gather or a reduce-scatter ``(n-1)/n * S``, and the latency is the steps
times a hop's. Across nodes NCCL's all-reduce is either the ring or a double binary tree (``2 log2 N`` network hops,
each twice a ring hop's: :data:`TREE_NET_HOP`), whichever costs less (:func:`allreduce_latency`); its all-gather and
reduce-scatter are rings.

What crosses a node's network (:func:`crossing_ranks`, one crossing per link): on nodes whose GPUs
reduce inside the node through NVLink SHARP (NVSwitch with Hopper or later: NCCL's NVLS and NVLS-tree algorithms) the
network carries the node's share, a ring of the nodes (``n`` = nodes, :data:`HIERARCHICAL`); elsewhere NCCL's ring runs
through every rank and each node's network carries ``2 (n-1)/n`` of an all-reduce with ``n`` = ranks, except on two
nodes, where its double binary tree sends each node's data across once (``n`` = nodes = 2: :data:`RING`); over its
socket transport every byte crosses the node's one network as in a flat ring of every rank at any node count
(:data:`SOCKETS`). The fleets' DDP, FSDP and hybrid-shard communication
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

# How a collective's bytes cross nodes (a link's ``crossing``; a fleet takes its groups' largest): ordered so that the
# larger code never moves fewer bytes through a node's network.
HIERARCHICAL = 0.0  # NVLink SHARP inside the node (NVSwitch, Hopper or later), the nodes' ring across
RING = 1.0  # NCCL's ring through every rank (its tree on two nodes, all-reduce only): RDMA/EFA without NVLS
SOCKETS = 2.0  # NCCL's socket transport: a flat ring of every rank at any node count


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


def crossing_ranks(nodes: Array, ranks: Array, crossing: Array, kind: str = ALL_REDUCE) -> np.ndarray:
    """The ring size whose bus factor a node's network carries, by ``crossing``: the nodes (:data:`HIERARCHICAL`),
    every rank (:data:`SOCKETS`), or every rank except an all-reduce on two nodes, which NCCL runs as its tree
    (:data:`RING`: each node's data crosses once, the two-node ring's ``2 (2-1)/2``)."""
    nodes_a, ranks_a = np.asarray(nodes, dtype=float), np.asarray(ranks, dtype=float)
    c = np.asarray(crossing, dtype=float)
    flat = np.maximum(ranks_a, nodes_a)
    tree = (c == RING) & (nodes_a == 2) if kind == ALL_REDUCE else np.zeros(np.shape(c), dtype=bool)
    return np.where((c > HIERARCHICAL) & ~tree, flat, nodes_a)


def network_phase_s(
    gb: Array, nodes: Array, ranks: Array, gbps: Array, crossing: Array, kind: str = ALL_REDUCE
) -> np.ndarray:
    """The bandwidth time (s) of a collective ``kind`` of ``gb`` GB per rank across ``nodes`` nodes through a network
    of ``gbps`` GB/s per node; 0 on one node; ``crossing`` (below) says how its bytes cross nodes.

    :data:`HIERARCHICAL` (NVLink SHARP nodes): each node's network carries ``2 (N-1)/N`` of an all-reduce's data
    (p5 nccl-tests, 2-32 nodes, within 10 %: :mod:`predictor.model.network`). :data:`RING` (EFA without NVLS): NCCL's
    ring through every rank, ``2 (n-1)/n``, its tree on two nodes (``1``): on p4d.24xlarge (NVIDIA/nccl#527, 1 GiB) the
    hierarchical form was 1.14 / 1.57 / 1.51x the measured algorithm bandwidth at 2 / 3 / 4 nodes, this form 1.14 /
    1.10 / 1.17x (``bench/collectives.py``; nothing chosen on them). :data:`SOCKETS`: a flat ring of all ``n`` ranks at
    any node count, bus bandwidth never above the network's rate: NVIDIA/nccl#209 (nccl-tests over TCP on 32 GbE, NCCL
    2.4.7) measured 30.6-31.4 Gbit/s with one GPU per node and 14.5-14.9 (2 nodes) / 22.2-22.9 (4 nodes) with eight:
    the hierarchical form priced those at 57 and 39 Gbit/s, the flat ring at 30.4 (``bench/tcp_sockets.py``; the tree's
    two-node gain is not seen over sockets). With one GPU per node the forms agree."""
    nodes_a = np.asarray(nodes, dtype=float)
    n = crossing_ranks(nodes_a, ranks, crossing, kind)
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
    crossing: Array,
    calls: Array = 1.0,
    across: np.ndarray | None = None,
) -> np.ndarray:
    """One collective ``kind`` of ``gb`` GB over a fleet (0 for one rank), hierarchical as NCCL runs it: the
    intra-node and network phases pipelined chunk by chunk, so the slower bandwidth term sets the pace, and each of
    ``calls`` calls paying its ring's hop latencies inside the node and across nodes; ``crossing`` says how the bytes
    cross nodes (:func:`network_phase_s`). ``across``: whether it crosses nodes (default: more
    than one node)."""
    nodes_a = np.asarray(nodes, dtype=float)
    crosses = nodes_a > 1 if across is None else across
    intra = phase_s(kind, gb, node_gpus, intra_gbps)
    inter = np.where(crosses, network_phase_s(gb, nodes_a, ranks, net_gbps, crossing, kind), 0.0)
    hops = ring_latency(kind, node_gpus, intra_hop_s) + np.where(crosses, ring_latency(kind, nodes_a, net_hop_s), 0.0)
    return np.where(np.asarray(ranks) > 1, np.maximum(intra, inter) + calls * hops, 0.0)
