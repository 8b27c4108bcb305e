"""NCCL's socket transport (TCP, no EFA) across nodes: the network term against published nccl-tests bus bandwidths,
and the width of the regime's interval (issue #38 item 3).

    python bench/tcp_sockets.py [--write]

Data: ``bench/data/nccl_tcp_busbw.csv`` (NVIDIA/nccl#209: all_reduce_perf over TCP on 32 GbE, 1 and 8 GPUs per node,
2 and 4 nodes, three runs each, messages of 32-128 MiB). For each row the model's bus bandwidth of a large all-reduce
(``predictor.model.collectives.network_phase_s`` at the model's TCP efficiency, the ring's latency over the row's
smallest message added) is compared with the measured one, in the hierarchical form the model used for every network
until 2026-11-29 and in the flat-ring form it now uses for sockets. ``--write`` stores the width that holds 80 % of the
flat-ring form's log residuals as ``net-sockets`` in ``predictor/data/model_v3.json``: the relative sd of a socket
network's bus bandwidth, which the prediction of a multi-node fleet over sockets carries in proportion to its exposed
communication (``fleets._model_sd``). It is calibrated here and nowhere scored here: the regime it is for (training
steps of multi-GPU nodes over TCP) is not in this project's data.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.model.collectives import HIERARCHICAL, SOCKETS, allreduce_latency, network_phase_s  # noqa: E402
from predictor.model.network import DEFAULT_NETWORK  # noqa: E402
from predictor.validation import calibrated_sd  # noqa: E402

DATA = ROOT / "bench" / "data" / "nccl_tcp_busbw.csv"


def model_busbw(nodes: int, g: int, nic_gbit: float, mib: float, sockets: bool) -> float:
    """The model's bus bandwidth (Gbit/s) of an all-reduce of ``mib`` MiB over ``nodes`` x ``g`` ranks."""
    n = nodes * g
    gb = mib * 2**20 / 1e9
    gbps = nic_gbit / 8 * DEFAULT_NETWORK.tcp_efficiency
    t = float(network_phase_s(gb, nodes, n, gbps, SOCKETS if sockets else HIERARCHICAL))
    t += float(allreduce_latency(nodes, g, DEFAULT_NETWORK.latency_intra_s, DEFAULT_NETWORK.latency_tcp_s))
    return gb / t * 2 * (n - 1) / n * 8  # nccl-tests' busbw: algbw x 2 (n-1)/n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the width as net-sockets in model_v3.json")
    args = parser.parse_args(argv)
    rows = list(csv.DictReader(DATA.open(encoding="utf-8")))
    residuals = {"hierarchical": [], "flat ring (sockets)": []}
    print("| nodes x GPUs | measured busbw, Gbit/s | hierarchical form (/ median run) | flat ring (/ median run) |")
    print("|---|---|---|---|")
    seen = set()
    for r in rows:
        nodes, g, nic, mib = int(r["nodes"]), int(r["gpus_per_node"]), float(r["nic_gbit"]), float(r["message_min_mib"])
        measured = float(r["busbw_gbit"])
        old, new = model_busbw(nodes, g, nic, mib, False), model_busbw(nodes, g, nic, mib, True)
        residuals["hierarchical"].append(math.log(old / measured))
        residuals["flat ring (sockets)"].append(math.log(new / measured))
        if (nodes, g) not in seen:
            seen.add((nodes, g))
            same = [float(x["busbw_gbit"]) for x in rows if (int(x["nodes"]), int(x["gpus_per_node"])) == (nodes, g)]
            mid = sorted(same)[len(same) // 2]  # the median run: the ratios below are model / it
            print(f"| {nodes} x {g} | {min(same):.1f}-{max(same):.1f} | {old:.1f} (x{old / mid:.2f}) | "
                  f"{new:.1f} (x{new / mid:.2f}) |")  # fmt: skip
    for name, res in residuals.items():
        mean = sum(abs(x) for x in res) / len(res)
        print(f"{name}: mean |log residual| {mean:.3f}, width holding 80 %: relative sd {calibrated_sd(res):.3f}")
    sd = round(calibrated_sd(residuals["flat ring (sockets)"]), 6)
    if args.write:
        from predictor.documents.atomic import atomic_write_json

        path = ROOT / "predictor" / "data" / "model_v3.json"
        artefact = json.loads(path.read_text())
        artefact["errors"]["net-sockets"] = sd
        artefact["cases"]["net-sockets"] = len(rows)
        artefact.setdefault("errors_from", {})["net-sockets"] = (
            "bench/tcp_sockets.py: log residuals of the flat-ring socket form against NVIDIA/nccl#209's nccl-tests "
            "bus bandwidths over TCP (1 and 8 GPUs per node, 2 and 4 nodes); calibrated, not scored, there"
        )
        atomic_write_json(path, artefact)
        print(f"wrote net-sockets = {sd} into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
