"""Data-parallel gradient all-reduce time on a fleet: ring inside a node; across nodes as NCCL's algorithms cross.

One node of g GPUs (ring): ``2 (g-1)/g * S / B_intra + 2 (g-1) * a_intra``.
N nodes: NCCL pipelines the intra-node and network phases chunk by chunk, so the slower phase sets the bandwidth term
and the latencies add: ``max(2 (g-1)/g * S / B_intra, f * S / B_net) + L``, with the slowest node's link limiting the
ring, ``L`` the call's latency (below) and ``f`` what each node's network carries per byte
(``collectives.network_phase_s``, by the link's ``crossing``): ``2 (N-1)/N`` on nodes that reduce inside through
NVLink SHARP (NVSwitch, Hopper or later: :func:`nvls`), checked against published nccl-tests all_reduce_perf figures
of p5.48xlarge over EFA (2-32 nodes, 32 MB-8 GB; ``bench/collectives.py``, BENCHMARKS.md: the sum of the two phases was
1.8x too slow at 4-32 nodes, the pipelined form is within 10% there); ``2 (n-1)/n`` of all ``n`` ranks (NCCL's ring)
on other EFA nodes, except 1 on two nodes (its tree), held out on p4d.24xlarge (NVIDIA/nccl#527, 2-4 nodes: 1.10-1.17x
the measured algorithm bandwidth, the hierarchical form 1.14-1.57x; nothing chosen on it). NCCL's own guide to the
figures says the same: a ring's bus bandwidth "should reflect the speed of the hardware bottleneck", the node's
network (nccl-tests ``doc/PERFORMANCE.md``), and on two nodes the tree's "bus BW can get up to 2x the network
bandwidth" (NVIDIA/nccl#209, sjeaugey).

Latency, per collective call (DDP issues one all-reduce per gradient bucket, FSDP one all-gather and one
reduce-scatter per unit): NCCL prices every algorithm it has for the call and runs the cheapest
(``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime`` in NCCL's ``src/graph/tuning.cc``). For an all-reduce that is a ring,
``2 (g-1)`` intra-node hops and ``2 (N-1)`` network hops, or, across nodes, a double binary tree: ``2 (g-1)`` chain
hops inside the node and ``2 log2 N`` network hops, each costing twice a ring's (NCCL's Simple-protocol network hop,
28 us against the ring's 14 us; NVIDIA/nccl @ b647562). ``collectives.allreduce_latency`` prices both with our
calibrated ring hop latencies and takes the shorter: the ring on up to 4 nodes (5: a tie), the tree from 6 (a
434-node ring of 8-GPU nodes pays 43 ms of network hops per call, the tree 1.6 ms).
All-gather and reduce-scatter are rings (NCCL's tree implements all-reduce only). The bandwidth term is the same
for both algorithms (NCCL rates the tree's bus bandwidth at 0.92 of the ring's and both move ``~2 S`` per rank).

Over NCCL's socket transport (TCP through the instance's network: a type without EFA) the all-reduce is not
hierarchical: every byte crosses the node's network as in a flat ring of every rank (``collectives.network_phase_s``; on
nccl-tests over TCP the hierarchical form was 1.74-3.8x optimistic with 8 GPUs a node, the flat ring 1.35-2.04x,
``bench/tcp_sockets.py``), and the prediction of such a fleet carries the host-staged regime's width on its exposed
communication (``net-host-staged``, calibrated there). So does a fleet on EFA without GPUDirect RDMA (every EFA type
but p4d/p4de, p5/p5e/p5en bar p5.4xlarge, p6 onwards, Trainium and Inferentia: :func:`gpudirect_rdma`): its plugin
is taken to stage transfers through host memory as the sockets do, and the EFA constants below were fitted and held
out on GPUDirect RDMA only; published nccl-tests of p3dn.24xlarge over EFA (NVIDIA/nccl#235) score that width there
(``bench/tcp_sockets.py``). On both, nodes of 8 GPUs reach less of the rate than nodes of one (1.27-2.04x below
what the transport's constant gives, against 0.97-0.98x): the staged bytes of several GPUs share the host, priced by
``NetworkModel.host_staged_efficiency`` (:func:`host_staging`), fitted on each source and held out on the other.
AWS caps one TCP flow at 5 Gbit/s outside a cluster placement group and 10 inside
("Amazon EC2 instance network bandwidth",
docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html); NCCL opens 2 threads x 8 sockets
per connection on an ENA device (vendor 0x1d0f; NVIDIA/nccl ``src/transport/net_socket.cc``), so 16 flows:
80 Gbit/s, above every non-EFA CUDA type's network (25 Gbit/s at most), so the per-flow cap never binds in the
catalog and is not a term. Before NCCL 2.4.8 (June 2019, "Fix #209: improve socket transport performance. Split
transfers over multiple sockets. Launch multiple threads to drive sockets. Detect AWS NICs ...") a connection was one
socket driven by one thread: Horovod's p3.16xlarge runs over TCP in 2018 (horovod/horovod#396, ResNet-50 and
ResNet-101 on 2-16 nodes) imply about 6 Gbit/s a node at every node count (5.8-6.5, the rate taken whole), a fixed
per-node ceiling the model, pricing today's sockets, puts 1.5x fast (``bench/horovod_tcp.py``); what set it (the one
thread, AWS's 5 Gbit/s a flow, the runs' Kubernetes overlay) the data do not say, and a placement group gave those
runs +13 % only. Every torch release a fleet installs (1.13 on: ``predictor/data/cuda_builds.json``) bundles a later
NCCL, so that regime is documented, not priced.

A network AWS rates "up to" N Gigabit (4xlarge and smaller) sustains its baseline
(``InstanceType.network_baseline_gbps``: DescribeInstanceTypes' ``BaselineBandwidthInGbps``) once its burst credits
are spent, "typically from 5 to 60 minutes" (the page above). Measured over an hour with 10 iperf3 streams
(cloudonaut.io, "EC2 Network Performance Cheat Sheet", 2018: m5.large-4xlarge, t3.nano-2xlarge) and by an S3 download
loop (c5.xlarge, c5.2xlarge: throttled after 13 / 26 minutes), the sustained rate was 0.91-1.02 of that baseline
(``bench/burst_baseline.py``). A training step whose nodes send more than the baseline carries in a step is held to
it (:attr:`Link.sustained_gbps`, ``fleets.combine``): over a run of hours the average rate cannot exceed the rate the
credits refill at, however fast the bursts.

Bandwidths are effective bus bandwidths in GB/s. The constants live in :class:`NetworkModel`; a profile
that carries measured all-reduce timings replaces them for its own link kind (:func:`calibrate`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from predictor.catalog.gpus import GpuTable
from predictor.catalog.instances import InstanceType
from predictor.documents.checks import check_number
from predictor.model.artefact import model_artefact
from predictor.model.collectives import (
    ALL_REDUCE,
    HIERARCHICAL,
    RING,
    SOCKETS,
    allreduce_latency,
    bus_factor,
    crossing_ranks,
    network_phase_s,
    phase_s,
    ring_latency,
    ring_steps,
)


def _fitted(name: str, default: float) -> float:
    """A network constant the model artefact carries (``network``: written by the bench that fits it), else
    ``default``: so that the model's version (``artefact.model_version``) changes when it is refitted."""
    fitted = model_artefact().get("network", {})
    return float(fitted.get(name, default)) if isinstance(fitted, dict) else default


@dataclass(frozen=True)
class NetworkModel:
    """The link constants of the all-reduce model (bus bandwidths in GB/s, latencies in s); pluggable so that
    calibration and tests can vary them without touching module state."""

    pcie_bus_gbps: float = 10.0  # GPU-to-GPU through the PCIe host bridge (no NVLink)
    # GPU-to-GPU on a VM without PCIe peer-to-peer (no_pcie_p2p): NCCL's shared-memory transport through host memory.
    # Bus bandwidth fitted on a published all-reduce of 4 T4s on g4dn.12xlarge (bench/t4_allreduce.py --write, which
    # keeps it in the model artefact; three models, each held out of the others' fit)
    pcie_shm_gbps: float = field(default_factory=lambda: _fitted("pcie_shm_gbps", 4.3))
    nvlink_efficiency: float = 0.7  # share of the per-GPU NVLink figure (bidirectional datasheet / 2) NCCL reaches
    latency_intra_s: float = 10e-6
    # EFA: calibrated on nccl-tests all_reduce_perf of 2-32 p5.48xlarge with the ring-or-tree latency
    # (bench/collectives.py --folds: every leave-one-node-count-out fold chose 0.7 / 50 us; held-out MAPE 6-19%, 12.3%
    # mean; ring only, 0.7 / 30 us, scored 15.2%); not yet checked on p4d-class hosts
    latency_efa_s: float = 50e-6
    latency_tcp_s: float = 60e-6
    efa_efficiency: float = 0.7
    # gloo's all-reduce over a tc-shaped veth link reaches 0.955 of the configured rate (bench/netns_validation.py,
    # BENCHMARKS.md); real ENA networks add per-flow limits and cross traffic that this lab does not have
    tcp_efficiency: float = 0.95
    # the share of an "up to N Gigabit" network's headline rate NCCL's sockets reach while its burst credits last: a
    # judgement of version 1, checked once since (a 90-second all-reduce benchmark of 4 g4dn.xlarge, one T4 each,
    # over TCP: the model within 0.77-0.83x, bench/t4_allreduce.py). iperf3's 10 streams reach the whole headline
    # (cloudonaut.io, m5 and t3); NCCL's proxy threads on 4 vCPUs do not. What the network sustains once the credits
    # are spent is the type's baseline (Link.sustained_gbps), not a share of this.
    up_to_burst: float = 0.4
    # host-staged transfers (NCCL's sockets, EFA without GPUDirect RDMA) of nodes with several GPUs: the share of the
    # transport's rate they reach, every byte copied GPU -> host -> NIC and back by the proxies, the GPUs' copies and
    # the network sharing the host's memory and PCIe root. Pooled over two independent published nccl-tests sources
    # of 8-GPU nodes (NVIDIA/nccl#209 over TCP, NVIDIA/nccl#235 over p3dn's EFA), each held out of the other's fit
    # (bench/tcp_sockets.py, which writes it into the model artefact: fitted 0.60 / 0.69, held-out mean |log|
    # 0.51 -> 0.21 and 0.37 -> 0.14); one-GPU nodes reach the rate (0.97-0.98 of it on nccl#209), so they never pay
    # it. Bound: (0, 1].
    host_staged_efficiency: float = field(default_factory=lambda: _fitted("host_staged_efficiency", 0.65))
    # the most bus bandwidth NCCL's socket transport has been seen to move a node, GB/s: its proxy threads copy every
    # byte through the kernel's TCP stack, so a faster NIC stops paying off. Measured, not fitted: nccl-tests over
    # 100 Gbit/s TCP between two p3dn.24xlarge, one GPU each, NCCL 2.4.8's AWS default of 2 threads x 8 sockets:
    # 4.7 GB/s whatever NCCL_SOCKET_NTHREADS (NVIDIA/nccl#398); another 100 Gbit/s TCP network, tuned (4 channels,
    # 2 threads), 4.5-5.2 GB/s at 8-16 MiB (NVIDIA/nccl#450). It binds only above ~40 Gbit/s of line rate: every
    # socket measurement the model was checked on (<= 32 Gbit/s, nccl#209; Horovod's 25 and 40) lies below it, and
    # so do the catalog's types without EFA (<= 25 Gbit/s); the tcp transport (no EFA) of a 50-3200 Gbit/s type
    # reaches it. Bound: below the line rate.
    socket_ceiling_gbps: float = 4.7

    def __post_init__(self) -> None:
        """Every efficiency is a share of a rate: in (0, 1] (a zero would divide a transfer by nothing).

        Raises:
            ConfigError: an efficiency out of (0, 1].
        """
        for name in ("nvlink_efficiency", "efa_efficiency", "tcp_efficiency", "up_to_burst",
                     "host_staged_efficiency"):  # fmt: skip
            check_number("NetworkModel", name, getattr(self, name), minimum=0.0, exclusive=True, maximum=1.0)
        for name in ("pcie_bus_gbps", "pcie_shm_gbps", "socket_ceiling_gbps"):
            check_number("NetworkModel", name, getattr(self, name), minimum=0.0, exclusive=True)


DEFAULT_NETWORK = NetworkModel()


@dataclass(frozen=True)
class Link:
    """An effective bandwidth and per-hop latency."""

    gbps: float  # GB/s
    latency_s: float
    kind: str
    crossing: float = RING  # how collectives cross nodes through it (collectives.HIERARCHICAL, RING or SOCKETS)
    staged: bool = False  # EFA without GPUDirect RDMA: transfers taken to be staged in host memory (gpudirect_rdma)
    staging: float = 1.0  # the share of the transport's rate its node's host staging leaves (host_staging; in gbps)
    # GB/s the link sustains on average over a run (an "up to" network's baseline, through the same efficiencies as
    # gbps); inf: the rate itself. A step whose nodes send more than this carries in a step is held to it
    sustained_gbps: float = math.inf

    @property
    def host_staged(self) -> float:
        """1.0 where the catalog's link is taken to stage transfers through host memory (NCCL's sockets, or EFA
        without GPUDirect RDMA), else 0.0: the prediction then carries the host-staged regime's width
        (``net-host-staged``, calibrated on sockets, scored on EFA without GPUDirect RDMA: ``bench/tcp_sockets.py``),
        not the tenth the links calibrated on GPUDirect RDMA and NVLink carry; a link the profile measured carries
        that tenth."""
        return 1.0 if self.kind == "tcp" or self.staged else 0.0

    @property
    def label(self) -> str:
        """The link in a prediction's words: its kind, and for EFA without GPUDirect RDMA that it lacks it."""
        return f"{self.kind} without GPUDirect RDMA" if self.staged else self.kind


def host_staging(gpus_per_node: int, net: NetworkModel = DEFAULT_NETWORK) -> float:
    """The share of a host-staged transport's rate (NCCL's sockets, EFA without GPUDirect RDMA) a node of
    ``gpus_per_node`` GPUs reaches: ``net.host_staged_efficiency`` with several GPUs a node, 1.0 with one (its single
    GPU's copies are the host's only traffic: nccl-tests over TCP reach the line rate there)."""
    return net.host_staged_efficiency if gpus_per_node > 1 else 1.0


def intra_node_link(instance: InstanceType, gpus: GpuTable, net: NetworkModel = DEFAULT_NETWORK) -> Link | None:
    """The GPU-to-GPU link inside one instance (None for single-GPU types): NVLink, PCIe peer-to-peer, or on a VM
    without PCIe peer-to-peer (:func:`no_pcie_p2p`) NCCL's shared-memory transport through host memory."""
    if instance.gpus <= 1:
        return None
    if instance.gpu_interconnect in ("nvlink", "nvswitch"):
        gpu = gpus.gpus.get(instance.gpu or "")
        nvlink = gpu.nvlink_gbps if gpu and gpu.nvlink_gbps else 300.0
        return Link(nvlink / 2 * net.nvlink_efficiency, net.latency_intra_s, instance.gpu_interconnect)
    if no_pcie_p2p(instance):
        return Link(net.pcie_shm_gbps, net.latency_intra_s, "pcie without P2P")
    return Link(net.pcie_bus_gbps, net.latency_intra_s, "pcie")


# The EC2 types whose GPUs cannot reach each other by PCIe peer-to-peer, so that NCCL moves intra-node traffic through
# host memory (its SHM transport), measured here: g4dn's virtualised sizes (4 T4 on g4dn.12xlarge; NCCL needed P2P
# disabled there, ray-project/ray#15495; bench/t4_allreduce.py measures 3.6-4.7 GB/s of bus bandwidth: "on PCI
# systems, the performance you get is usually determined by the bandwidth your CPU and memory can deliver", NCCL's
# maintainer in NVIDIA/nccl#1639). g5 and g6 are
# reported the same ("peer access is not supported between these two devices" on g5.48xlarge, NVIDIA/TensorRT-LLM#1034;
# "AWS g6 series does not have NVLink/NVSwitch or PCIe P2P", llm-d-incubation/llm-d-infra#181), but their PCIe 4.0
# GPUs were not measured: the T4's figure is not carried to them, and they keep the peer-to-peer constant.
_NO_PCIE_P2P = re.compile(r"^g4dn\.(?!metal$)")


def no_pcie_p2p(instance: InstanceType) -> bool:
    """Whether ``instance``'s GPUs meet through host memory, not PCIe peer-to-peer (``_NO_PCIE_P2P``)."""
    return bool(instance.gpus > 1 and _NO_PCIE_P2P.match(instance.name))


def nvls(instance: InstanceType, gpus: GpuTable | None) -> bool:
    """Whether NCCL can run NVLink SHARP (its NVLS and NVLS-tree algorithms) on ``instance``: GPUs on an NVSwitch
    with compute capability 9.0 or later ("NVLS ... is available on systems with third-generation NVSwitch (NVLink4)
    with Hopper and later GPU architectures", NCCL's ``NCCL_NVLS_ENABLE``): p5, p5e, p5en, p6-b200, p6-b300, not
    the A100s of p4d / p4de. Unknown architecture: False (the ring, the larger traffic)."""
    if instance.gpu_interconnect != "nvswitch" or gpus is None:
        return False
    gpu = gpus.gpus.get(instance.gpu or "")
    return gpu is not None and (gpu.capability or (0, 0)) >= (9, 0)


# The EC2 types on which AWS's NCCL plugin requires GPUDirect RDMA over EFA (``gdr_required`` in aws/aws-ofi-nccl
# ``src/platform-aws.cpp``, ``platform_data_map``, first match wins: p4d.24xlarge, p4de.24xlarge, p5/p5e but the
# p5.4xlarge entry before them, p5en.48xlarge, every p6 and later, and Trainium / Inferentia's device memory; not
# p5.4xlarge, p3dn.24xlarge, g5.48xlarge or the g families it does not list): the NIC reads and writes the
# accelerator's memory. ``gdr_required`` is the plugin's refusal to run without it, not a statement that the others
# lack it; on them the model assumes what the plugin does not promise, transfers staged through host memory as the
# socket transport stages them, a regime the EFA constants (calibrated on p5, held out on p4d) were never checked in:
# the interval widens, and nodes of several GPUs reach host_staging() of the rate (nccl-tests over p3dn's EFA and TCP).
_GPUDIRECT_RDMA = re.compile(
    r"^(p4de?\.24xlarge|p5\.(?!4xlarge$).*|p5e\..*|p5en\.48xlarge|p([6-9]|\d{2,})\D.*|trn[12].*|inf.*)$"
)


def gpudirect_rdma(instance: InstanceType) -> bool:
    """Whether NCCL's EFA plugin moves ``instance``'s inter-node traffic by GPUDirect RDMA (NIC to GPU memory, no
    host copy): EFA on a type whose platform entry requires it (``_GPUDIRECT_RDMA``), or where its catalog entry says
    so (``InstanceType.gpudirect_rdma``: a catalog extra's RoCE or InfiniBand nodes)."""
    if not instance.efa:
        return False
    if instance.gpudirect_rdma is not None:
        return instance.gpudirect_rdma
    return bool(_GPUDIRECT_RDMA.match(instance.name))


def inter_node_link(instance: InstanceType, net: NetworkModel = DEFAULT_NETWORK, gpus: GpuTable | None = None) -> Link:
    """The instance's network as seen by an all-reduce between nodes: the interfaces a multi-node srifty fleet
    attaches (:meth:`InstanceType.network_interfaces`, what the Terraform module creates) times the per-card rate,
    not the instance's headline figure; how collectives cross it (``crossing``): hierarchically on NVLink SHARP
    nodes (:func:`nvls`, from ``gpus``), as NCCL's ring (its tree on two nodes) on other EFA nodes, as a flat ring
    over sockets (:func:`~predictor.model.collectives.network_phase_s`). A host-staged transport (sockets, EFA
    without GPUDirect RDMA) of a node with several GPUs reaches :func:`host_staging` of its rate."""
    gbps = (instance.provisioned_network_gbps(multi_node=True) or 10.0) / 8.0
    sustained = math.inf
    if instance.network_up_to:
        gbps *= net.up_to_burst
        if instance.network_baseline_gbps:  # once the burst credits are spent: never above the burst's rate
            sustained = min(instance.network_baseline_gbps / 8.0, gbps)
    if instance.efa:
        crossing = HIERARCHICAL if nvls(instance, gpus) else RING
        if gpudirect_rdma(instance):
            eff = net.efa_efficiency
            return Link(gbps * eff, net.latency_efa_s, "efa", crossing, sustained_gbps=sustained * eff)
        share = host_staging(instance.gpus, net)
        # bound below by the same card's sockets: both stage every byte through host memory, and EFA's SRD leaves
        # out the kernel's TCP stack the sockets pay. EFA's efficiency is p5's (RDMA), its staging p3dn's at 100
        # Gbit/s (nccl#235); carried to a 40-50 Gbit/s card they priced EFA 25 % slower than the sockets the socket
        # data measured there (an audit: g5.12xlarge:2 at 134 s a step on EFA, 101 s over TCP)
        socket = min(gbps * net.tcp_efficiency * share, net.socket_ceiling_gbps)
        rate = max(gbps * net.efa_efficiency * share, socket)
        eff = rate / gbps
        return Link(rate, net.latency_efa_s, "efa", crossing, True, share, sustained * eff)
    share = host_staging(instance.gpus, net)
    eff = net.tcp_efficiency * share
    rate = min(gbps * eff, net.socket_ceiling_gbps)  # NCCL's sockets move a node no faster than their ceiling
    return Link(
        rate,
        net.latency_tcp_s,
        "tcp",
        SOCKETS,
        staging=share,
        sustained_gbps=min(sustained * eff, rate) if math.isfinite(sustained) else sustained,
    )


def link_words(
    crossing: float,
    rate: str,
    without_efa: list[str],
    how: str | None = None,
    staged: list[str] | None = None,
    declared: list[str] | None = None,
    staged_declared: bool = False,
    unused: list[str] | None = None,
) -> str:
    """How a fleet's nodes are priced to meet, in words (a prediction's assumption): the transport (``crossing``:
    TCP sockets, naming the types ``without_efa``, or EFA with the plugin it needs, naming the types ``staged``
    through host memory, without GPUDirect RDMA), its ``rate``, and how the collectives cross it (``how`` where the
    layout says otherwise: a pipeline's point-to-point sends, HSDP's rings of nodes). Where every group is a catalog
    extra's RDMA node (``declared``: ``gpudirect_rdma: true``, RoCE or InfiniBand, not EC2), its fabric is named as
    such: NCCL's own InfiniBand / RoCE transport carries it, not AWS's EFA plugin; ``staged_declared``: the staged
    types are so because their catalog entries say ``gpudirect_rdma: false``, not by AWS's plugin table; ``unused``:
    the types of ``without_efa`` that have EFA, on sockets because the request said transport tcp (a cluster without
    EFA)."""
    if crossing == SOCKETS:
        unused = [n for n in unused or () if n in without_efa]
        none = [n for n in without_efa if n not in unused]
        said = [f"{', '.join(none)}: no EFA"] if none else []
        said += [f"{', '.join(unused)}: EFA not used, transport tcp"] if unused else []
        return (
            f"across nodes: TCP through NCCL's socket transport ({'; '.join(said) or 'no EFA'}), "
            f"{rate}, {how or 'a flat ring through every rank'}"
        )
    algorithm = (
        "NVLink SHARP inside each node (NCCL's NVLS), the nodes' ring across"
        if crossing == HIERARCHICAL
        else "NCCL's ring through every rank (its tree on two nodes)"
    )
    through = (
        f" without GPUDirect RDMA ({', '.join(staged)}: "
        + ("as the catalog entry declares" if staged_declared else "AWS's NCCL plugin does not require it there")
        + ", so transfers are taken to be staged through host memory, a regime priced at its nodes' host staging and "
        "with the wider interval of host-staged networks)"
        if staged
        else ""
    )
    if declared:
        return (
            f"across nodes: RDMA with GPUDirect ({', '.join(declared)}: as the catalog extra declares, RoCE or "
            f"InfiniBand), {rate}, {how or algorithm}; NCCL's own InfiniBand / RoCE transport carries it (without "
            "working RDMA NCCL falls back to TCP sockets, slower than priced)"
        )
    # without the plugin NCCL runs its sockets: slower than GPUDirect RDMA; on staged nodes another host-staged
    # transport, priced alike (the same staging and width; its own per-byte constant)
    fallback = "another host-staged transport" if staged else "slower than priced"
    return (
        f"across nodes: EFA{through}, {rate}, {how or algorithm}; it needs NCCL's aws-ofi-nccl plugin on the image "
        f"(the Deep Learning AMI has it; without it NCCL falls back to TCP sockets, {fallback})"
    )


@dataclass(frozen=True)
class AllReduceEstimate:
    seconds: float
    intra_s: float
    inter_s: float
    limiting: str  # which link limits: "none", "intra-node <kind>", "network <kind>"


def allreduce_time(
    nbytes: float,
    groups: list[tuple[InstanceType, int]],
    gpus: GpuTable,
    net_override: Link | None = None,
    net: NetworkModel = DEFAULT_NETWORK,
) -> AllReduceEstimate:
    """All-reduce time of ``nbytes`` per rank over ``groups`` of (instance type, count)."""
    ranks = sum(it.gpus * n for it, n in groups)
    nodes = sum(n for _, n in groups)
    if ranks <= 1 or nbytes <= 0:
        return AllReduceEstimate(0.0, 0.0, 0.0, "none")
    gb = nbytes / 1e9
    intra_s, intra_bw, intra_kind, hop_intra, node_gpus = 0.0, 0.0, "", 0.0, 1
    for it, _ in groups:
        link = intra_node_link(it, gpus, net)
        if link is None:
            continue
        g = it.gpus
        bw, lat = float(phase_s(ALL_REDUCE, gb, g, link.gbps)), float(ring_latency(ALL_REDUCE, g, link.latency_s))
        if bw + lat > intra_s:
            intra_s, intra_bw, intra_kind = bw + lat, bw, link.kind
        hop_intra, node_gpus = max(hop_intra, link.latency_s), max(node_gpus, g)
    inter_s, inter_bw, inter_kind, hop_net = 0.0, 0.0, "", 0.0
    if nodes > 1:
        links = [net_override or inter_node_link(it, net, gpus) for it, _ in groups]
        slow = min(links, key=lambda link: link.gbps)
        inter_bw = float(network_phase_s(gb, nodes, ranks, slow.gbps, max(x.crossing for x in links)))
        hop_net = max(x.latency_s for x in links)
        inter_s = inter_bw + float(ring_latency(ALL_REDUCE, nodes, hop_net))
        inter_kind = slow.label
    limiting = f"network {inter_kind}" if inter_bw >= intra_bw else f"intra-node {intra_kind}"
    latency = float(allreduce_latency(nodes, node_gpus, hop_intra, hop_net))
    seconds = max(intra_bw, inter_bw) + latency
    return AllReduceEstimate(seconds, intra_s, inter_s, limiting)


def calibrate(
    bucket_bytes: list[int],
    bucket_seconds: list[float],
    world: int,
    nodes: int | None = None,
    crossing: float = SOCKETS,
) -> Link | None:
    """Effective bandwidth and latency of the profiled link, fitted from measured bucket all-reduces over ``world``
    ranks on ``nodes`` nodes whose collectives cross as ``crossing`` says (:func:`collectives.crossing_ranks`; default:
    a flat ring of every rank), so that the model prices the profiled fleet at the time it measured.

    Each bucket of S bytes took ``t = f * S / B + a`` (``f``: the bytes the node's network carries per byte,
    ``2 (n-1)/n`` of the crossing's ring size ``n``); a least-squares line through (volume, t) gives B and a. With one
    bucket size only, the latency is taken as 0 and B = volume / t.
    """
    if world < 2 or not bucket_bytes:
        return None
    across = float(crossing_ranks(nodes, world, crossing)) if nodes is not None and nodes > 1 else world
    factor = float(bus_factor(ALL_REDUCE, across))
    xs = [factor * b / 1e9 for b in bucket_bytes]
    ys = list(bucket_seconds)
    if len(set(xs)) >= 2:
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        intercept = my - slope * mx
        if slope > 0:
            hop_s = max(0.0, intercept) / max(1.0, float(ring_steps(ALL_REDUCE, world)))
            return Link(1 / slope, hop_s, "measured", crossing)
    total_x, total_y = sum(xs), sum(ys)
    return Link(total_x / total_y, 0.0, "measured", crossing) if total_y > 0 else None


DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel(bucket_cap_mb=25)


Buckets = list[tuple[float, int]]  # runs of equal buckets in the order they become ready: (bytes each, how many)


def ddp_buckets(total_bytes: float, first: float = DDP_FIRST_BUCKET_BYTES, cap: float = DDP_BUCKET_BYTES) -> Buckets:
    """DDP's buckets as runs (the first capped at 1 MiB, then 25 MiB ones, then the rest): a closed form, so a
    parameter count of 10^15 costs what 10^6 does (a list of one entry per bucket took 60 s and 1.3 GB)."""
    total = float(total_bytes)
    if not total > 0:
        return []
    head = min(first, total)
    left = total - head
    full = math.floor(left / cap)
    tail = left - full * cap
    runs = [(head, 1)] + ([(float(cap), int(full))] if full else []) + ([(tail, 1)] if tail > 0 else [])
    return runs


def ddp_bucket_sizes(total_bytes: float) -> list[float]:
    """Every bucket's size (small totals; tests and reports): :func:`ddp_buckets` expanded."""
    return [size for size, n in ddp_buckets(total_bytes) for _ in range(n)]


def exposed_many(allreduce: np.ndarray, backward: np.ndarray, buckets: Buckets) -> np.ndarray:
    """Communication left after backward ends, for arrays of candidates.

    Buckets become ready as backward progresses (in proportion to their bytes) and are reduced one after another,
    each taking its share of the all-reduce time ``A``. The last reduction ends at
    ``max over buckets i of (ready_i + the reductions of i and every later bucket)`` =
    ``max_i (B c_i / T + A (T - c_i + s_i) / T)`` (``c_i`` bytes ready up to and including bucket i, ``s_i`` its size,
    ``T`` the total, ``B`` backward). The term is linear in ``c_i`` for a fixed size, so within a run of equal
    buckets only its first and last can be the maximum: the cost is per run, not per bucket.
    """
    total = sum(size * n for size, n in buckets)
    if total <= 0:
        return np.zeros_like(allreduce)
    sizes, ends = [], []
    done = 0.0
    for size, n in buckets:
        sizes += [size, size]
        ends += [done + size, done + size * n]  # c_i at the run's first and last bucket
        done += size * n
    s_i, c_i = np.asarray(sizes)[:, None], np.asarray(ends)[:, None]
    free = np.max(backward[None, :] * c_i / total + allreduce[None, :] * (total - c_i + s_i) / total, axis=0)
    return np.where(allreduce > 0, np.maximum(0.0, free - backward), 0.0)


def exposed_time(allreduce_s: float, backward_s: float, sizes: list[float]) -> float:
    """:func:`exposed_many` for one candidate and a list of bucket sizes."""
    runs = [(float(size), 1) for size in sizes]
    return float(exposed_many(np.array([float(allreduce_s)]), np.array([float(backward_s)]), runs)[0])
