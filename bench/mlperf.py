"""The MLPerf Training set: published training throughput of MLCommons' closed-division submissions (v3.0-v5.1) on
GPUs EC2 sells, against the predictor, from meta-device captures. Nothing in the predictor is fitted on these rows.

    python bench/mlperf.py [--plot docs/img/mlperf_bert.png]

Data: ``bench/data/mlperf_training.csv`` (``scripts/build_mlperf_data.py`` from the results repositories' logs; the
repository, commit and results folder are in every row; ``bench/data/mlperf_training.md`` says how each column is
derived). Rows that republish an earlier round's runs (``duplicate_of``) are dropped.

What is scored, and what is said instead. MLPerf submissions are tuned far past what a Lightning user runs: FP8 GEMMs
through Transformer Engine, CUDA graphs, fused and hand-written kernels, tensor and pipeline parallelism, other
frameworks. Every row gets either a prediction or the reason it has none (:func:`in_scope`), and the counts are
printed. What the predictor can answer today is BERT-large pretraining (PyTorch, fp16 mixed precision, data
parallel, 4-3472 GPUs), and that is still not eager PyTorch; the differences, and what the bench does about each:

- **Unpadded sequences.** NVIDIA's BERT (and every submission derived from it) removes the padding of the 512-token
  Wikipedia sequences (packed or unpadded attention): more than half of those tokens are padding, and removing it
  doubles sequences/s (Krell et al., "Efficient sequence packing without cross-contamination", arXiv 2107.02027,
  2021; Habana's MLPerf packing note: "for MLPerf's BERT dataset the potential speedup is roughly 2"). The capture
  is therefore made at :data:`BERT_TOKENS` = 256 tokens per sample (the linear layers' work per sample; the
  attention of a packed 512-token row is block-diagonal, at most what 256-token samples cost, plus the difference
  E[L^2] - E[L]^2, which is small next to the linear layers of BERT-large).
- **The masked-LM head** runs only on the masked positions in NVIDIA's code (about 15 % of the tokens); the capture
  (``transformers:BertForMaskedLM``, input ids as labels) projects every token onto the 30522-word vocabulary:
  about 9 % more FLOPs per sample than the rows ran. Not corrected: it is a known, stated over-count.
- **CUDA graphs, fused LAMB, fused bias-GELU / layer norm, and the per-step launch overhead they remove** are not
  modelled: the predictor prices eager PyTorch. Where this matters (small per-GPU batches at thousands of GPUs) the
  prediction is expected to be slow, and the rows say so by their scale.
- **The distributed optimizer.** Most multi-node rows (and some single-node ones) run NVIDIA's distributed LAMB
  (``--dwu-*``): ZeRO stage 2, each rank updating its shard. Scored as DDP by default (the predictor's answer for a
  Lightning user's DDP run of this model); ``--zero2`` predicts those rows as FSDP ``shard_grad_op`` (the same
  collectives and bytes), which exposes the ring-latency term of the collectives at hundreds of nodes (BENCHMARKS.md).

Fleets: a node per row from its ``systems`` JSON (``gpu``, ``gpus_per_node``; SXM boards on NVSwitch with 8 GPUs,
NVLink with 4, PCIe boards on PCIe; the compute network's NIC count x rate, RDMA for InfiniBand / Omni-Path /
ConnectX-7, TCP for Ethernet), as catalog extras (``bench/results/mlperf/nodes.yaml``, not EC2 types, never priced).
A multi-node row whose compute network the JSON does not state is out of scope.

Results: ``bench/results/mlperf/scores.csv``, the summary printed (MAPE, median predicted / measured, by GPU, by
scale) and the predicted-vs-measured plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DATA = ROOT / "bench" / "data" / "mlperf_training.csv"
OUT = ROOT / "bench" / "results" / "mlperf"
# tokens per sample of MLPerf's BERT once the padding is removed: 512 x (1 - more than half padding), Krell et al. 2021
BERT_TOKENS = 256
BERT_LARGE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "vocab_size": 30522,
    "attn_implementation": "sdpa",
}
# why a benchmark has no capture here (the predictor captures transformers and LightningModule models)
NOT_CAPTURED = {
    "resnet": "MXNet (every ResNet-50 submission): the predictor models PyTorch",
    "retinanet": "detection model with per-image targets (torchvision RetinaNet, 800 px): no capture in this set yet",
    "maskrcnn": "detection model with per-image targets (Mask R-CNN): no capture in this set yet",
    "stable_diffusion": "UNet of diffusers (not installed) under NeMo: no capture",
    "unet3d": "3D U-Net (KiTS19 volumes): no capture",
    "rnnt": "RNN-T (LSTM speech model): no capture",
    "dlrm_dcnv2": "DLRM DCNv2 (embedding tables, model-parallel; HugeCTR): no capture",
    "rgat": "R-GAT graph network (DGL): no capture",
    "gpt3": "tensor + pipeline parallel Megatron (the predictor's layouts are DDP, FSDP, pipeline): not modelled",
    "llama2_70b_lora": "NeMo LoRA with tensor / context parallelism: not modelled",
    "llama31_405b": "tensor + pipeline + context parallel Megatron: not modelled",
    "llama31_8b": "NeMo pretraining with FP8: not modelled",
}
INTRA = {8: "nvswitch", 4: "nvlink"}
# GPUs with FP8 tensor cores (Hopper, Ada): a row without its config may have run NVIDIA's FP8 layers
FP8_CAPABLE = ("H100", "H200", "L4", "L40S")
RDMA = re.compile(r"infiniband|\bib\b|omni-?path|connectx-7|ndr|hdr|edr|roce", re.I)


def load_rows() -> list[dict]:
    with DATA.open() as fh:
        return [r for r in csv.DictReader(fh) if not r["duplicate_of"]]


def network(row: dict) -> tuple[float, int, bool] | None:
    """(Gbit/s, NICs, RDMA) of the row's compute network from its systems JSON text, None when not stated."""
    text = row["interconnect"]
    compute = re.search(r"compute:\s*([^,]*)", text, re.I)
    part = compute.group(1) if compute else text
    m = re.search(r"(\d+)\s*x\s*[^,;]*?(\d+)\s*gb", part, re.I)
    if not m:
        return None
    nics, rate = int(m.group(1)), float(m.group(2))
    return nics * rate, nics, bool(RDMA.search(part))


def known_gpus() -> set[str]:
    from predictor.catalog.gpus import bundled_gpus

    return set(bundled_gpus().gpus)


def in_scope(row: dict) -> str | None:
    """None when the predictor should answer this row, else why not."""
    if row["pytorch_based"] != "true":
        return f"framework {row['framework_family'] or row['framework']} (the predictor models PyTorch)"
    if row["fp8"] == "true" or row["precision"] == "fp8":
        # BERT's --use_transformer_engine2 included (the builder flags it)
        return "FP8 GEMMs through Transformer Engine (the predictor models fp16/bf16 and FP32)"
    if row["benchmark"] != "bert":
        return NOT_CAPTURED.get(row["benchmark"], "no capture")
    if not row["config_file"] and row["gpu"].startswith(FP8_CAPABLE):
        return "no published config on an FP8-capable GPU (Hopper / Ada): FP8 layers cannot be ruled out"
    if row["gpu"] not in known_gpus():
        return f"GPU {row['gpu'] or row['accelerator']} not in the catalog's GPU table"
    if not row["per_gpu_batch"]:
        return "per-GPU batch not stated"
    if int(row["nodes"] or 1) > 1 and network(row) is None:
        return "multi-node, compute network not stated in the systems JSON"
    return None


def node_type(row: dict) -> dict:
    """The catalog extra entry of the row's node (see the module docstring)."""
    gpn = int(row["gpus_per_node"])
    sxm = "SXM" in row["gpu"]
    link = INTRA.get(gpn, "nvswitch" if gpn > 8 else "nvlink") if sxm and gpn > 1 else ("pcie" if gpn > 1 else "single")
    net = network(row) or (100.0, 1, False)
    gbps, nics, rdma = net
    name = f"mlperf-{row['gpu']}-x{gpn}-{link}-{int(gbps)}g{'-rdma' if rdma else ''}".lower()
    entry = {
        "name": name,
        "gpu": row["gpu"],
        "gpus": gpn,
        "vcpus": 16 * gpn,
        "memory_gib": 128 * gpn,
        "network_gbps": gbps,
        "gpu_interconnect": link,
    }
    if rdma:
        entry.update(efa=True, efa_interfaces=nics, network_cards=nics, gpudirect_rdma=True)
    return entry


def batches(row: dict) -> tuple[int, int]:
    """(micro-batch, samples per GPU per optimizer step) of a row: ``per_gpu_batch`` is the global batch over the
    GPUs, gradient accumulation included."""
    per_gpu, accum = int(row["per_gpu_batch"]), int(row["gradient_accumulation_steps"] or 1)
    return per_gpu // accum, per_gpu


def capture_key(row: dict) -> str:
    micro, per_gpu = batches(row)
    return f"bert-large-t{BERT_TOKENS}-mb{micro}-ga{per_gpu // micro}"


def capture(row: dict) -> str:
    """Capture BERT-large at the row's per-GPU batch (cached); '' or the error."""
    path = OUT / "captures" / f"{capture_key(row)}.json"
    if path.exists():
        return ""
    path.parent.mkdir(parents=True, exist_ok=True)
    micro, per_gpu = batches(row)
    cmd = [
        sys.executable,
        "-m",
        "lightning_srifty.cli",
        "capture",
        "transformers:BertForMaskedLM",
        "--config",
        json.dumps(BERT_LARGE),
        "--seq-len",
        str(BERT_TOKENS),
        "--batch-size",
        str(micro),
        "--global-batch",
        str(per_gpu),
        "--precision",
        "16-mixed",
        "--name",
        "bert-large",
        "--out",
        str(path),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        return ((res.stderr or res.stdout).strip().splitlines() or ["?"])[-1]
    return ""


def layout_of(row: dict) -> str:
    """The predictor's layout for what the row ran: NVIDIA's distributed LAMB (``--dwu-*``: gradients
    reduce-scattered, each rank updating its shard of the parameters and optimizer state, the parameters all-gathered)
    is ZeRO stage 2, which FSDP's SHARD_GRAD_OP is (the same collectives and bytes per step); else DDP."""
    return "fsdp:shard_grad_op" if row["dist_optimizer"] == "true" else "ddp"


def score(rows: list[dict], sharded_optimizer: bool = False) -> list[dict]:
    import yaml

    from predictor.catalog.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.exceptions import SriftyError
    from predictor.model.predict import predict

    nodes = {}
    for row in rows:
        if in_scope(row) is None:
            entry = node_type(row)
            nodes[entry["name"]] = entry
    OUT.mkdir(parents=True, exist_ok=True)
    extra = OUT / "nodes.yaml"
    extra.write_text(
        "# bench/mlperf.py: the MLPerf submissions' nodes (not EC2 types, never priced)\n"
        + yaml.safe_dump({"instance_types": sorted(nodes.values(), key=lambda e: e["name"])}, sort_keys=False)
    )
    catalog = Catalog.load(extra=[str(extra)])
    out = []
    for row in rows:
        rec = {
            k: row[k]
            for k in ("round", "submitter", "system", "benchmark", "gpu", "gpus_per_node", "nodes", "total_gpus")
        }
        rec.update(
            per_gpu_batch=row["per_gpu_batch"],
            cuda_graphs=row["cuda_graphs"] == "true",
            measured=float(row["samples_per_s_per_gpu"] or "nan"),
        )
        why = in_scope(row)
        if why:
            out.append({**rec, "status": "out of scope: " + why})
            continue
        error = capture(row)
        if error:
            out.append({**rec, "status": "capture failed: " + error})
            continue
        profile = load_profile(OUT / "captures" / f"{capture_key(row)}.json")
        gpus = int(row["total_gpus"])
        node = node_type(row)
        fleet = f"{node['name']}:{max(1, gpus // node['gpus'])}"
        layout = layout_of(row) if sharded_optimizer else "ddp"
        try:
            p = predict(profile, fleet, catalog=catalog, scaling="weak", layout=layout)
        except SriftyError as exc:
            out.append({**rec, "status": f"error: {exc}"})
            continue
        per_gpu = p.throughput_samples_s / gpus
        lo, hi = (x / gpus for x in p.interval["throughput_samples_s"])
        out.append(
            {
                **rec,
                "status": "ok",
                "fleet": fleet,
                "layout": layout,
                "predicted": per_gpu,
                "lo": lo,
                "hi": hi,
                "ape": abs(per_gpu - rec["measured"]) / rec["measured"],
                "ratio": per_gpu / rec["measured"],
                "inside": lo <= rec["measured"] <= hi,
                "step_s": p.iteration_time_s,
                "compute_s": p.breakdown["compute_s"],
                "exposed_comm_s": p.breakdown["exposed_comm_s"],
            }
        )
    return out


def scale_of(s: dict) -> str:
    n = int(s["total_gpus"])
    return "1-8 GPUs" if n <= 8 else ("9-64 GPUs" if n <= 64 else "over 64 GPUs")


def summary(scores: list[dict]) -> str:
    from _validation_sets import summary_line

    ok = [s for s in scores if s["status"] == "ok"]
    reasons = Counter(s["status"] for s in scores if s["status"] != "ok")
    lines = [f"distinct rows {len(scores)}; scored {len(ok)}; not scored {len(scores) - len(ok)}:"]
    lines += [f"  {n:4d}  {why}" for why, n in reasons.most_common()]
    if not ok:
        return "\n".join(lines)
    lines.append(summary_line("all scored", ok))
    by: dict[str, list] = defaultdict(list)
    for s in ok:
        by["gpu " + s["gpu"]].append(s)
        by["scale " + scale_of(s)].append(s)
        by["CUDA graphs " + ("yes" if s["cuda_graphs"] else "not stated")].append(s)
    lines += [summary_line(k, by[k]) for k in sorted(by)]
    return "\n".join(lines)


def plot(scores: list[dict], path: Path) -> None:
    from _validation_sets import predicted_vs_measured

    ok = [s for s in scores if s["status"] == "ok"]
    markers = {"1-8 GPUs": "o", "9-64 GPUs": "s", "over 64 GPUs": "^"}
    groups = [
        (
            f"{gpu}, {scale}",
            [s for s in ok if s["gpu"] == gpu and scale_of(s) == scale],
            {"color": f"C{i}", "marker": m},
        )
        for i, gpu in enumerate(sorted({s["gpu"] for s in ok}))
        for scale, m in markers.items()
    ]
    for _, _, style in groups:
        style.update(s=20, alpha=0.8)
    mape = 100 * statistics.mean(s["ape"] for s in ok)
    predicted_vs_measured(
        groups,
        path,
        xlabel="measured samples/s per GPU (MLPerf Training v3.0-v5.1 logs)",
        ylabel="predicted samples/s per GPU (meta capture, 256 tokens)",
        title=f"MLPerf BERT-large, fp16, 4-3472 GPUs: MAPE {mape:.1f}% over {len(ok)} rows",
        legend_size=6.5,
        dpi=120,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot", type=Path, help="write the predicted-vs-measured plot here")
    ap.add_argument(
        "--zero2",
        action="store_true",
        help="predict the distributed-optimizer rows as FSDP SHARD_GRAD_OP (layout_of), the others as DDP",
    )
    args = ap.parse_args(argv)
    scores = score(load_rows(), sharded_optimizer=args.zero2)
    OUT.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for s in scores for k in s}, key=lambda k: (k not in scores[0], k))
    with (OUT / "scores.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for s in scores:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else v) for k, v in s.items()})
    print(summary(scores))
    if args.plot:
        plot(scores, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
