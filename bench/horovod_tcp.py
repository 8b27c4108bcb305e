"""Data-parallel training steps over TCP with four GPUs a node: Horovod's published scaling against the model's
same-GPU scaling path (issue #38's regime "multi-node data parallel over TCP, no EFA, nodes of 4 GPUs, from a
one-GPU profile"), nothing fitted on it.

    pip install --no-deps --target /tmp/tvpkg torchvision==0.28.0   # torchvision beside the CPU torch
    PYTHONPATH=/tmp/tvpkg python bench/horovod_tcp.py [--plot docs/img/horovod_tcp.png]

Data: ``bench/data/horovod_tcp_scaling.csv`` (``scripts/build_horovod_tcp_data.py``: horovod/horovod's README @
d54e3a88, 2017-09-05): Inception V3, ResNet-101 and VGG-16, FP32, batch 64 a GPU, synthetic data, on 4 servers of 4
Pascal GPUs over a 25 Gbit/s network (16 GPUs) and 16 such servers over a plain 40 Gbit/s one (64 GPUs), NCCL 2's
all-reduce over its socket transport ("TCP Horovod, allreduce on GPU with NCCL"), each with the one-GPU throughput of
its own hardware. FP32 and synthetic data are tf_cnn_benchmarks' defaults (no --use_fp16, no --data_dir) in the
command Horovod's author posted for these benchmarks (horovod/horovod#21: ``tf_cnn_benchmarks.py --model resnet101
--batch_size 64 --horovod_device gpu``); its optimizer default is plain SGD.

Each row is priced as a user with a one-GPU profile would have it priced: the operator table of the network
(torchvision's builder on the meta device, FP32, batch 64, plain SGD: ``cnn_zoo.capture_classifier``), the row's own
measured one-GPU step on a GPU taken as a P100-PCIe-16GB (the README says "Pascal"; 134-150 img/s of Inception V3 is
a P100's rate, and a GP102 card's too), and
``predict`` on a catalog extra of the cluster's nodes: 4 GPUs on PCIe, the row's network, no EFA (so NCCL's sockets:
a flat ring, each node's transfers staged through host memory), weak scaling (the batch a GPU fixed, as the
benchmark ran it). Horovod all-reduces 64 MB fusion buffers as gradients become ready in the backward pass; the rows
are priced with DDP's 25 MB buckets, as the model prices every data-parallel step. Forms compared: the shipped
model, and the same without its host-staging term (fitted on 8-GPU nodes' nccl-tests; these are 4-GPU nodes, which
the term takes the 8-GPU figure for).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DATA = ROOT / "bench" / "data" / "horovod_tcp_scaling.csv"
AWS_2018 = ROOT / "bench" / "data" / "horovod_aws_tcp_2018.csv"
TABLES = ROOT / "bench" / "results" / "tables"
GPU = "P100-PCIe-16GB"
IMAGE = {"inception_v3": 299, "resnet50": 224, "resnet101": 224, "vgg16": 224}  # tf_cnn_benchmarks' image sizes
# tf_cnn_benchmarks' Inception V3 has no auxiliary head (23.8M parameters); torchvision's builder adds one by default
INIT = {"inception_v3": {"aux_logits": False, "init_weights": False}}


def rows() -> list[dict[str, Any]]:
    with DATA.open(encoding="utf-8") as fh:
        out = []
        for r in csv.DictReader(fh):
            r = dict(r)
            for key in ("per_gpu_batch", "nodes", "gpus_per_node", "network_gbps"):
                r[key] = int(r[key])
            for key in ("single_img_s", "dp_img_s", "speedup"):
                r[key] = float(r[key])
            out.append(r)
        return out


def table_for(model: str, batch: int) -> dict[str, Any]:
    """The operator table of one FP32 training step at ``batch`` (forward, loss, backward, SGD), cached."""
    path = TABLES / f"horovod-{model}-32-true-{batch}-sgd.json"
    if path.exists():
        return json.loads(path.read_text())
    import torch
    from cnn_zoo import capture_classifier, store_capture

    from lightning_srifty.cli.capture import torchvision_models

    t = time.perf_counter()
    net = getattr(torchvision_models(), model)(**INIT.get(model, {}))
    size = IMAGE[model]
    sgd = functools.partial(torch.optim.SGD, lr=0.1)  # tf_cnn_benchmarks' default --optimizer=sgd: no momentum
    table = capture_classifier(net, torch.zeros(batch, 3, size, size), "32-true", sgd)
    return store_capture(path, table, net, f"{model} b={batch}", t)


def profile(row: dict[str, Any], gpu: str = GPU) -> Any:
    """The one-GPU profile of ``row``'s training: its capture and the row's own measured one-GPU step."""
    from predictor.documents.profile import profile_from_dict

    batch = row["per_gpu_batch"]
    data = table_for(row["model"], batch)
    return profile_from_dict(
        {
            "schema": "srifty.profile/v1",
            "model": {"name": row["model"], "parameters": data["parameters"], "precision": "32-true"},
            "batch": {"per_device": batch},
            "hardware": {"gpu": gpu, "devices": 1, "accelerator": "cuda"},
            "timing": {"step_time_s": {"p50": batch / row["single_img_s"]}},
            "ops": data["table"],
        }
    )


@functools.cache
def catalog() -> Any:
    """The bundled catalog and the two clusters' nodes: 4 P100s on PCIe, 25 or 40 Gbit/s, no EFA."""
    from predictor.catalog.catalog import Catalog, CatalogInfo
    from predictor.catalog.instances import InstanceType

    bundled = Catalog.load()
    instances = {}
    for gbps in (25, 40):
        name = f"uber-p100x4-{gbps}g"
        instances[name] = InstanceType(
            name=name, family="uber", accelerator=GPU, accelerator_kind="cuda", gpu=GPU, gpus=4, gpu_memory_gib=16.0,
            vcpus=32, memory_gib=256.0, network_gbps=gbps, gpu_interconnect="pcie", origin="evaluation",
        )  # fmt: skip
    return Catalog(instances, bundled.gpus, CatalogInfo("evaluation", "-"))


def predict_row(row: dict[str, Any], network: Any) -> dict[str, Any]:
    from predictor.model import ops
    from predictor.model.predict import predict

    ops.LIGHTNING_STEP_S = 0.0  # tf_cnn_benchmarks' own loop: no Lightning step on the host
    fleet = f"uber-p100x4-{row['network_gbps']}g:{row['nodes']}"
    r = predict(profile(row), fleet, catalog=catalog(), scaling="weak", network=network, layout="ddp")
    lo, hi = r.interval["throughput_samples_s"]
    return {"predicted": r.throughput_samples_s, "lo": lo, "hi": hi, "exposed_s": r.breakdown["exposed_comm_s"],
            "dp_loss_s": r.breakdown["dp_loss_s"], "step_s": r.iteration_time_s}  # fmt: skip


def score() -> dict[str, list[dict[str, Any]]]:
    from predictor.model.network import DEFAULT_NETWORK

    forms = {"shipped": DEFAULT_NETWORK,
             "without host staging": dataclasses.replace(DEFAULT_NETWORK, host_staged_efficiency=1.0)}  # fmt: skip
    out: dict[str, list[dict[str, Any]]] = {}
    for form, net in forms.items():
        out[form] = [r | predict_row(r, net) for r in rows()]
    return out


def summary(cases: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(MAPE, share inside the 80 % interval, geometric mean predicted / measured)."""
    ape = [abs(c["predicted"] / c["dp_img_s"] - 1.0) for c in cases]
    inside = [c["lo"] <= c["dp_img_s"] <= c["hi"] for c in cases]
    gm = math.exp(sum(math.log(c["predicted"] / c["dp_img_s"]) for c in cases) / len(cases))
    return 100 * sum(ape) / len(ape), 100 * sum(inside) / len(inside), gm


def report(scored: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["| model | GPUs (nodes x 4) | network | one GPU, img/s | measured, img/s (speedup) | "
             + " | ".join(f"{f}: predicted (80 % interval) | / measured" for f in scored) + " |"]  # fmt: skip
    lines.append("|---" * (5 + 2 * len(scored)) + "|")
    first = next(iter(scored.values()))
    for i, r in enumerate(first):
        cells = [r["model"], f"{r['nodes'] * r['gpus_per_node']} ({r['nodes']} x 4)", f"{r['network_gbps']} Gbit/s",
                 f"{r['single_img_s']:.1f}", f"{r['dp_img_s']:,.0f} ({r['speedup']}x)"]  # fmt: skip
        for cases in scored.values():
            c = cases[i]
            ratio = c["predicted"] / r["dp_img_s"]
            cells += [f"{c['predicted']:,.0f} ({c['lo']:,.0f}-{c['hi']:,.0f})", f"x{ratio:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Where the shipped model's step goes (ms; the one-GPU step is the row's measured one):", "",
              "| model | GPUs | one-GPU step | measured step | predicted step | exposed communication | "
              "data-parallel losses |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in next(iter(scored.values())):
        n = c["nodes"] * c["gpus_per_node"]
        lines.append(f"| {c['model']} | {n} | {c['per_gpu_batch'] * 1e3 / c['single_img_s']:.0f} | "
                     f"{c['per_gpu_batch'] * n * 1e3 / c['dp_img_s']:.0f} | {c['step_s'] * 1e3:.0f} | "
                     f"{c['exposed_s'] * 1e3:.0f} | {c['dp_loss_s'] * 1e3:.0f} |")  # fmt: skip
    lines.append("")
    lines.append("| form | cases | MAPE | inside the 80 % interval | predicted / measured (geometric mean) |")
    lines.append("|---|---|---|---|---|")
    for form, cases in scored.items():
        mape, inside, gm = summary(cases)
        lines.append(f"| {form} | {len(cases)} | {mape:.1f} % | {inside:.0f} % | x{gm:.2f} |")
    return lines


def plot(scored: dict[str, list[dict[str, Any]]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    first = next(iter(scored.values()))
    for k, ((form, cases), marker) in enumerate(zip(scored.items(), "os", strict=False)):
        x = [i + 0.15 * (k - 0.5) for i in range(len(cases))]
        y = [c["predicted"] / c["dp_img_s"] for c in cases]
        err = [[(c["predicted"] - c["lo"]) / c["dp_img_s"] for c in cases],
               [(c["hi"] - c["predicted"]) / c["dp_img_s"] for c in cases]]  # fmt: skip
        ax.errorbar(x, y, yerr=err, fmt=marker, capsize=3, label=f"{form} (80 % interval)")
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set_xticks(range(len(first)))
    ax.set_xticklabels([f"{c['model']}\n{c['nodes']} x 4, {c['network_gbps']} Gb/s" for c in first], fontsize=7)
    ax.set(ylabel="predicted / measured throughput", ylim=(0.6, 1.5),
           title="Horovod over TCP, 4 P100s a node (README, 2017), from the one-GPU step")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


def implied_rate(row: dict[str, Any]) -> float | None:
    """The per-node network rate (Gbit/s, taken whole: no host staging, no TCP efficiency) at which the model's step
    of ``row`` (an AWS 2018 row: nodes of p3.16xlarge) is the measured one; None outside 0.25-400 Gbit/s. The
    one-GPU step is the node's per-GPU rate, which already holds the node's own all-reduce and 8-rank losses that
    the model adds again: the implied rate is biased up by that much."""
    from predictor.catalog.catalog import Catalog, CatalogInfo
    from predictor.model import ops
    from predictor.model.network import DEFAULT_NETWORK
    from predictor.model.predict import predict

    ops.LIGHTNING_STEP_S = 0.0
    bundled = Catalog.load()
    node = bundled.get(row["instance_type"])
    net = dataclasses.replace(DEFAULT_NETWORK, host_staged_efficiency=1.0, tcp_efficiency=1.0)
    prof = profile({"model": row["model"], "per_gpu_batch": row["per_gpu_batch"],
                    "single_img_s": row["node_img_s"] / node.gpus}, gpu=node.gpu)  # fmt: skip

    def throughput(gbps: float) -> float:
        it = dataclasses.replace(node, name="aws-2018", network_gbps=gbps, origin="evaluation")
        cat = Catalog({"aws-2018": it}, bundled.gpus, CatalogInfo("evaluation", "-"))
        return predict(
            prof, f"aws-2018:{row['nodes']}", catalog=cat, scaling="weak", network=net, layout="ddp"
        ).throughput_samples_s

    lo, hi = 0.25, 400.0
    if throughput(hi) < row["dp_img_s"] or throughput(lo) > row["dp_img_s"]:
        return None  # outside the bracket: no rate in it explains the step
    for _ in range(40):  # bisection in log space: throughput rises with the rate
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if throughput(mid) < row["dp_img_s"] else (lo, mid)
    return math.sqrt(lo * hi)


def aws_2018() -> list[str]:
    """Horovod on p3.16xlarge over TCP in 2018 (NCCL before 2.4.8: one socket a connection): the shipped model's
    prediction and the per-node rate the measured step implies."""
    from predictor.catalog import Catalog
    from predictor.model import ops
    from predictor.model.predict import predict

    ops.LIGHTNING_STEP_S = 0.0
    catalog = Catalog.load()
    lines = ["| source | model | nodes x 8 V100 | one node, img/s | measured, img/s | shipped: predicted "
             "(80 % interval) | / measured | per-node rate the measured step implies |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    with AWS_2018.open(encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            r = dict(r) | {"per_gpu_batch": int(r["per_gpu_batch"]), "nodes": int(r["nodes"]),
                           "node_img_s": float(r["node_img_s"]), "dp_img_s": float(r["dp_img_s"])}  # fmt: skip
            node = catalog.get(r["instance_type"])
            prof = profile({"model": r["model"], "per_gpu_batch": r["per_gpu_batch"],
                            "single_img_s": r["node_img_s"] / node.gpus}, gpu=node.gpu)  # fmt: skip
            p = predict(prof, f"{r['instance_type']}:{r['nodes']}", catalog=catalog, scaling="weak", layout="ddp")
            lo, hi = p.interval["throughput_samples_s"]
            rate = implied_rate(r)
            lines.append(f"| {r['source']} | {r['model']} | {r['nodes']} | {r['node_img_s']:,.0f} | "
                         f"{r['dp_img_s']:,.0f} | {p.throughput_samples_s:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
                         f"x{p.throughput_samples_s / r['dp_img_s']:.2f} | "
                         f"{'-' if rate is None else f'{rate:.1f} Gbit/s'} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path, help="write predicted against measured throughput to this PNG")
    args = parser.parse_args(argv)
    scored = score()
    print("\n".join(report(scored)))
    print("\nOn AWS in 2018 (not scored: NCCL before 2.4.8, batch assumed, Kubernetes networking):\n")
    print("\n".join(aws_2018()))
    if args.plot:
        plot(scored, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
