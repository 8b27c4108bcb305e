"""What an "up to" EC2 network sustains over a run: published hour-long measurements against the model's rate.

    python bench/burst_baseline.py

AWS rates the network of its 4xlarge-and-smaller types "up to" N Gigabit: a burst that lasts "typically from 5 to 60
minutes" on network I/O credits, then the type's baseline ("Amazon EC2 instance network bandwidth", EC2 User
Guide; DescribeInstanceTypes' ``NetworkCards[].BaselineBandwidthInGbps``). A training run is hours long, so after its
first minutes a step's traffic is held to the baseline (``predictor.model.network.Link.sustained_gbps``,
``fleets.combine``'s ``baseline_wait_s``). Until this term the model priced every "up to" network for the whole run
at one share of its headline (``NetworkModel.up_to_burst``, 0.4: 3.8 Gbit/s effective on every "up to 10" type,
whatever its baseline).

Data (``bench/data/ec2_network_baseline.csv``): the rate held over an hour with 10 iperf3 streams (cloudonaut.io's
cheat sheet, 2018: the 10th percentile of 60 one-minute points, m5.large-4xlarge and t3.nano-2xlarge) and the rate an
S3 download loop was throttled to (a 2019 thread: c5.xlarge after 13 minutes, c5.2xlarge after 26). The baselines
are AWS's (``BaselineBandwidthInGbps`` as the EC2 User Guide's network specifications tables list them, typed
here; m5.xlarge's 1.25 is also quoted by ivanvari.com's 2025 benchmark). None of these types has a GPU: the
term's one claim, that the rate a node sustains is its API baseline, is a property of the network, and each row is
priced through the shipped code path (a one-GPU catalog type of that network, ``network.inter_node_link``). Nothing
is fitted: the baseline is AWS's figure and the per-byte efficiency the one the network lab measured
(``NetworkModel.tcp_efficiency``), so every row is held out.
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog.instances import InstanceType  # noqa: E402
from predictor.model.network import DEFAULT_NETWORK, inter_node_link  # noqa: E402

DATA = ROOT / "bench" / "data" / "ec2_network_baseline.csv"


def node(row: dict) -> InstanceType:
    """A one-GPU catalog type with the row's network (one GPU: no host staging, so the row scores the network's term
    alone)."""
    return InstanceType(
        name=row["instance_type"], family=row["instance_type"].split(".")[0], accelerator="NVIDIA T4",
        accelerator_kind="cuda", gpu="T4", gpus=1, gpu_memory_gib=15.0, vcpus=int(row["vcpus"]), memory_gib=16.0,
        network_gbps=float(row["headline_gbps"]), network_up_to=True,
        network_baseline_gbps=float(row["baseline_gbps"]),
    )  # fmt: skip


def rows() -> list[dict]:
    """Every row with the rate the model held for the whole run before this term (the burst share) and now (the
    baseline once the credits are spent), Gbit/s."""
    out = []
    for r in csv.DictReader(DATA.read_text(encoding="utf-8").splitlines()):
        link = inter_node_link(node(r), DEFAULT_NETWORK)
        out.append({**r, "before": link.gbps * 8, "after": link.sustained_gbps * 8})
    return out


def main() -> None:
    data = rows()
    print("| type | headline ('up to'), Gbit/s | AWS baseline | sustained, measured | model before (burst share) "
          "| / measured | model now (the baseline, at most the burst's rate) | / measured "
          "| burst measured |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in data:
        m = float(r["sustained_gbps"])
        burst = (f"{float(r['burst_gbps']):g}" if r["burst_gbps"] else "-") + (
            f" ({r['burst_minutes']} min)" if r["burst_minutes"] else ""
        )
        print(
            f"| {r['instance_type']} | {float(r['headline_gbps']):g} | {float(r['baseline_gbps']):g} | {m:g} | "
            f"{r['before']:.3g} | x{r['before'] / m:.2f} | {r['after']:.3g} | x{r['after'] / m:.2f} | {burst} |"
        )
    for label in ("before", "after"):
        logs = [abs(math.log(r[label] / float(r["sustained_gbps"]))) for r in data]
        ratios = [r[label] / float(r["sustained_gbps"]) for r in data]
        print(
            f"{label}: mean |log model/measured| {statistics.fmean(logs):.3f}, model/measured "
            f"x{min(ratios):.2f}-x{max(ratios):.2f} over {len(data)} types"
        )
    shares = [float(r["sustained_gbps"]) / float(r["baseline_gbps"]) for r in data]
    median = statistics.median(shares)
    print(f"measured sustained / AWS baseline: {min(shares):.3f}-{max(shares):.3f} (median {median:.3f}); the "
          f"model's per-byte efficiency {DEFAULT_NETWORK.tcp_efficiency:g}")  # fmt: skip
    bursts = [float(r["burst_gbps"]) / float(r["headline_gbps"]) for r in data if r["burst_gbps"]]
    share = DEFAULT_NETWORK.up_to_burst
    print(f"burst measured / headline: {min(bursts):.3f}-{max(bursts):.3f} (iperf3, 10 streams): the headline is "
          f"reached while the credits last; the model's burst share for NCCL is {share:g}")  # fmt: skip


if __name__ == "__main__":
    main()
