"""The all-reduce model against published nccl-tests figures of EC2 hosts (nothing fitted on them).

    python bench/collectives.py

Data: ``bench/data/nccl_tests_p5_allreduce.csv`` (nccl-tests ``all_reduce_perf`` on 2-32 p5.48xlarge over EFA,
32 MB-8 GB; source in ``bench/data/README.md``). For every row, ``predictor.model.network.allreduce_time`` of that
many bytes over ``p5.48xlarge x nodes`` from the bundled catalog, as algorithm bandwidth (bytes / time) against the
measured out-of-place algbw. Prints the table and MAPE; also the same with the two phases summed (the v2 model).

The EFA constants (``NetworkModel.efa_efficiency``, ``latency_efa_s``: the ring hop; a tree hop costs two) were
chosen on this data: ``--folds`` shows how: for each node count, the pair that fits the other node counts best
(grid, mean |log ratio|) and its MAPE on the held-out node count.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog.catalog import Catalog  # noqa: E402
from predictor.model.network import DEFAULT_NETWORK, NetworkModel, allreduce_time  # noqa: E402

DATA = ROOT / "bench" / "data" / "nccl_tests_p5_allreduce.csv"
# held out: never used to choose a constant (NVIDIA/nccl#527: 1-4 p4d.24xlarge, 1 GiB, NCCL 2.9.9 over EFA)
P4D = ROOT / "bench" / "data" / "nccl_tests_p4d_allreduce.csv"


def rows() -> list[dict]:
    with DATA.open() as fh:
        return list(csv.DictReader(fh))


def score(net: NetworkModel = DEFAULT_NETWORK, keep=lambda r: True) -> list[dict]:
    cat = Catalog.load()
    p5 = cat.get("p5.48xlarge")
    out = []
    for r in rows():
        if not keep(r):
            continue
        nodes, size = int(r["Nodes"]), float(r["size(MB)"]) * 2**20
        est = allreduce_time(size, [(p5, nodes)], cat.gpus, net=net)
        summed = est.intra_s + est.inter_s
        measured = float(r["out algbw(GB/s)"])
        out.append(
            {
                "nodes": nodes,
                "mb": int(r["size(MB)"]),
                "measured": measured,
                "predicted": size / est.seconds / 1e9,
                "summed": size / summed / 1e9,
            }
        )
    return out


def folds() -> None:
    """Leave one node count out: the EFA constants chosen on the others, scored on it."""
    import math
    from dataclasses import replace

    grid = [
        replace(DEFAULT_NETWORK, efa_efficiency=e, latency_efa_s=a)
        for e in (0.6, 0.7, 0.8, 0.85, 0.9, 1.0)
        for a in (15e-6, 30e-6, 50e-6, 75e-6, 100e-6, 150e-6)
    ]

    def loss(net: NetworkModel, keep) -> float:
        return statistics.mean(abs(math.log(r["predicted"] / r["measured"])) for r in score(net, keep))

    apes = []
    for held in sorted({int(r["Nodes"]) for r in rows()}):
        best = min(grid, key=lambda n, h=held: loss(n, lambda r: int(r["Nodes"]) != h))
        res = score(best, lambda r, h=held: int(r["Nodes"]) == h)
        ape = statistics.mean(abs(r["predicted"] / r["measured"] - 1) for r in res)
        apes.append(ape)
        print(
            f"held out {held:>2} nodes: chose efa_efficiency {best.efa_efficiency}, latency "
            f"{best.latency_efa_s * 1e6:.0f} us; held-out MAPE {100 * ape:.1f}%"
        )
    print(f"mean held-out MAPE {100 * statistics.mean(apes):.1f}%")


def score_p4d(net: NetworkModel = DEFAULT_NETWORK) -> list[dict]:
    """The p4d rows (A100 on NVSwitch without NVLink SHARP, four 100 Gbit/s EFA cards): the model's algorithm
    bandwidth against the measured one. Nothing was chosen on them."""
    cat = Catalog.load()
    out = []
    with P4D.open() as fh:
        for r in csv.DictReader(fh):
            nodes, size = int(r["nodes"]), float(r["size_bytes"])
            it = cat.get(r["instance"])
            est = allreduce_time(size, [(it, nodes)], cat.gpus, net=net)
            out.append({"nodes": nodes, "measured": float(r["out_algbw_gbs"]), "predicted": size / est.seconds / 1e9})
    return out


def main() -> None:
    if "--folds" in sys.argv:
        folds()
        return
    res = score()
    print("nodes  MB     measured algbw  predicted  (phases summed)  GB/s")
    for r in res:
        print(f"{r['nodes']:>5} {r['mb']:>5} {r['measured']:>14.1f} {r['predicted']:>10.1f} {r['summed']:>12.1f}")

    def mape(key: str, keep=lambda r: True) -> float:
        return 100 * statistics.mean(abs(r[key] / r["measured"] - 1) for r in res if keep(r))

    big = lambda r: r["mb"] >= 256  # noqa: E731
    for name, keep in (("all", lambda r: True), (">= 256 MB", big), ("< 256 MB", lambda r: not big(r))):
        print(f"{name}: MAPE pipelined {mape('predicted', keep):.1f}%, phases summed {mape('summed', keep):.1f}%")
    print("\nheld out: p4d.24xlarge, 1 GiB (NVIDIA/nccl#527)")
    print("nodes  measured algbw  predicted  GB/s  (predicted / measured)")
    p4d = score_p4d()
    for r in p4d:
        print(f"{r['nodes']:>5} {r['measured']:>14.1f} {r['predicted']:>10.1f}  x{r['predicted'] / r['measured']:.2f}")
    multi = [r for r in p4d if r["nodes"] > 1]
    ape = statistics.mean(abs(r["predicted"] / r["measured"] - 1) for r in multi)
    print(f"p4d across nodes: MAPE {100 * ape:.1f}%")


if __name__ == "__main__":
    main()
