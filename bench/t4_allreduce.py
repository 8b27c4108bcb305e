"""The all-reduce of T4 nodes without NVLink: a published data-parallel benchmark on g4dn instances against the
model's all-reduce (issue #38's T4 regime), and the fit of the one constant it gives data for (below), each model
held out of the fit that scores it.

    python bench/t4_allreduce.py

Data: ``bench/data/minicolossal_t4_dp.csv`` (Goutham7358/mini-collosal-ai, a course project's benchmark: GPT-2
Small / Medium and T5-base, FP32, 1,024 tokens a GPU a step, on one g4dn.12xlarge's 4 T4s over PCIe and on 4
g4dn.xlarge over TCP). Its data parallelism all-reduces 25 MB buckets with NCCL after the backward pass, not
overlapped with it, so a step of N GPUs less the one-GPU step is the all-reduce (and a few passes over the
gradients: the buckets' concatenation, copy back and division, priced here at the T4's memory bandwidth). That time
is compared with ``predictor.model.network.allreduce_time`` of the gradients (4 bytes a parameter) on the same
fleet: the all-reduce the predictor prices for it, before any overlap.

The g4dn.12xlarge rows fit ``NetworkModel.pcie_shm_gbps`` (the bus bandwidth of GPUs that meet through host memory,
no PCIe peer-to-peer: ``network.no_pcie_p2p``): the geometric mean of the measured bus bandwidths, each model held
out of the fit that scores it; ``--write`` keeps the fit over all three in ``predictor/data/model_v3.json``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog import Catalog  # noqa: E402
from predictor.model.network import DEFAULT_NETWORK, NetworkModel, allreduce_time, no_pcie_p2p  # noqa: E402

DATA = ROOT / "bench" / "data" / "minicolossal_t4_dp.csv"
GRADIENT_PASSES = 3  # the benchmark's own copies of the gradients: concatenate into buckets, copy back, divide


@functools.cache
def _catalog() -> Catalog:
    return Catalog.load(use_refreshed=False, use_env=False)


def rows(net: NetworkModel = DEFAULT_NETWORK) -> list[dict]:
    """Every row with its measured all-reduce (s) and the model's at ``net`` (s)."""
    catalog = _catalog()
    out = []
    for r in csv.DictReader(DATA.read_text(encoding="utf-8").splitlines()):
        it = catalog.get(r["instance_type"])
        nodes, g = int(r["nodes"]), int(r["gpus_per_node"])
        tokens = float(r["tokens_per_gpu_step"])
        single_s = tokens / float(r["single_tok_s"])
        dp_s = tokens * nodes * g / float(r["dp_tok_s"])
        nbytes = 4.0 * float(r["parameters"])
        copies_s = GRADIENT_PASSES * 2 * nbytes / (catalog.gpu(it.gpu).memory_bw_gbps * 1e9)  # read and write
        measured = dp_s - single_s - copies_s
        est = allreduce_time(nbytes, [(it, nodes)], catalog.gpus, net=net)
        ranks = nodes * g
        busbw = nbytes * 2 * (ranks - 1) / ranks / measured / 1e9  # GB/s, nccl-tests' bus bandwidth
        out.append({**r, "measured_s": measured, "model_s": est.seconds, "limiting": est.limiting, "busbw": busbw,
                    "shm": no_pcie_p2p(it) and nodes == 1})  # fmt: skip
    return out


def fit_shm(busbws: list[float]) -> float:
    """The bus bandwidth (GB/s) that makes the rows right on average: the geometric mean of theirs."""
    return math.exp(sum(math.log(b) for b in busbws) / len(busbws))


def folds() -> float:
    """Leave one model out on the rows without PCIe peer-to-peer: the fit of the others scores each; returns the fit
    over all of them."""
    shm = [r for r in rows() if r["shm"]]
    # the model before this term: the same rows priced with the peer-to-peer constant
    p2p = [
        x for x in rows(dataclasses.replace(DEFAULT_NETWORK, pcie_shm_gbps=DEFAULT_NETWORK.pcie_bus_gbps)) if x["shm"]
    ]
    print("\nPCIe without peer-to-peer (NCCL's shared memory), leave one model out")
    print(
        "| held out | fitted on the others, GB/s | model / measured: the peer-to-peer constant | with the others' fit |"
    )
    print("|---|---|---|---|")
    logs_before, logs_after = [], []
    for i, r in enumerate(shm):
        fit = fit_shm([x["busbw"] for j, x in enumerate(shm) if j != i])
        before = p2p[i]["model_s"] / r["measured_s"]
        after = [x for x in rows(dataclasses.replace(DEFAULT_NETWORK, pcie_shm_gbps=fit)) if x["shm"]][i]["model_s"]
        logs_before.append(abs(math.log(before)))
        logs_after.append(abs(math.log(after / r["measured_s"])))
        print(f"| {r['model']} | {fit:.2f} | x{before:.2f} | x{after / r['measured_s']:.2f} |")
    print(f"mean |log model / measured|: {sum(logs_before) / len(logs_before):.3f} -> "
          f"{sum(logs_after) / len(logs_after):.3f}")  # fmt: skip
    return fit_shm([r["busbw"] for r in shm])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="keep the fit as pcie_shm_gbps in model_v3.json")
    args = parser.parse_args(argv)
    print("| fleet | model (parameters) | one-GPU step | N-GPU step | all-reduce measured | bus bandwidth | model's "
          "all-reduce (its limit) | model / measured |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    by_link: dict[str, list[float]] = {}
    for r in rows():
        ratio = r["model_s"] / r["measured_s"]
        by_link.setdefault(r["limiting"], []).append(math.log(ratio))
        tokens, n = float(r["tokens_per_gpu_step"]), int(r["nodes"]) * int(r["gpus_per_node"])
        print(f"| {r['instance_type']}:{r['nodes']} ({n} T4) | {r['model']} ({float(r['parameters']) / 1e6:.0f}M) | "
              f"{tokens / float(r['single_tok_s']) * 1e3:.0f} ms | {tokens * n / float(r['dp_tok_s']) * 1e3:.0f} ms | "
              f"{r['measured_s'] * 1e3:.0f} ms | {r['busbw']:.2f} GB/s | {r['model_s'] * 1e3:.0f} ms ({r['limiting']}) "
              f"| x{ratio:.2f} |")  # fmt: skip
    for link, logs in by_link.items():
        print(f"{link}: model / measured, geometric mean x{math.exp(sum(logs) / len(logs)):.2f} over {len(logs)} rows")
    pooled = folds()
    print(f"fit over the three (--write): {pooled:.3f} GB/s; in the model: {DEFAULT_NETWORK.pcie_shm_gbps}")
    if args.write:
        from predictor.documents.atomic import atomic_write_json

        path = ROOT / "predictor" / "data" / "model_v3.json"
        artefact = json.loads(path.read_text())
        artefact.setdefault("network", {})["pcie_shm_gbps"] = round(pooled, 4)
        artefact.setdefault("network_from", {})["pcie_shm_gbps"] = (
            "bench/t4_allreduce.py: geometric mean of the bus bandwidths of a published all-reduce of 4 T4s on "
            "g4dn.12xlarge (Goutham7358/mini-collosal-ai, GPT-2 Small / Medium and T5-base), each model also held out"
        )
        atomic_write_json(path, artefact)
        print(f"wrote pcie_shm_gbps = {round(pooled, 4)} into {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
