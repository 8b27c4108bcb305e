"""Build ``bench/data/horovod_tcp_scaling.csv`` from Horovod's README as it stood on 2017-09-05.

    git clone https://github.com/horovod/horovod /tmp/horovod
    python scripts/build_horovod_tcp_data.py /tmp/horovod   # reads the pinned commit's README with git show

Uber's published data parallelism over TCP: TensorFlow's tf_cnn_benchmarks (their fork with Horovod), Inception V3,
ResNet-101 and VGG-16, batch 64 a GPU, on servers of 4 Pascal GPUs (FP32 and synthetic data are tf_cnn_benchmarks'
defaults in the command Horovod's author posted for them, horovod/horovod#21; the README does not say), "TCP Horovod
(allreduce on GPU with NCCL)": NCCL 2 over its socket transport. Two clusters, each with its own one-GPU baseline
measured on its hardware: 4 servers "connected by RoCE-capable 25 Gbit/s network" (16 GPUs) and 16 servers
"connected by plain 40 Gbit/s network" (64 GPUs). The README gives throughput (img/s) and the speedup over its
one-GPU baseline; the rows keep both and are checked to agree. The other rows of the tables (distributed
TensorFlow's parameter servers, Horovod's CPU all-reduce, RDMA) are not this regime and are left out.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

COMMIT = "d54e3a886486decc8cd21f5fbdfc34da9b16d7ee"  # "Update README (#19)", 2017-09-05
OUT = Path(__file__).resolve().parents[1] / "bench" / "data" / "horovod_tcp_scaling.csv"
MODELS = ("inception_v3", "resnet101", "vgg16")  # the tables' columns, as torchvision names them
CLUSTERS = (  # the sentence that opens each table -> (nodes, GPUs a node, network Gbit/s, its words)
    ("4 servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s network", 4, 4, 25),
    ("16 servers with 4 Pascal GPUs each connected by plain 40 Gbit/s network", 16, 4, 40),
)
ROW = "TCP Horovod (allreduce on GPU with NCCL)"


def _numbers(line: str) -> list[tuple[float, float | None]]:
    """The table row's cells as (value, speedup or None): ``1,990.7 (14.8x)`` -> (1990.7, 14.8)."""
    cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")[1:]]
    out = []
    for cell in cells:
        m = re.fullmatch(r"\**([\d,.]+)\**(?:\s*\(([\d.]+)x\))?", cell.replace("**", ""))
        if not m:
            raise ValueError(f"cannot read the cell {cell!r} of {line!r}")
        out.append((float(m.group(1).replace(",", "")), float(m.group(2)) if m.group(2) else None))
    return out


def rows(readme: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for sentence, nodes, per_node, gbps in CLUSTERS:
        table = readme[readme.index(sentence) :].split("\n\n")[1].splitlines()
        baseline = next(_numbers(x) for x in table if "Baseline single-GPU (batch size=64)" in x)
        scaled = next(_numbers(x) for x in table if ROW in x)
        for model, (single, _), (dp, speedup) in zip(MODELS, baseline, scaled, strict=True):
            gpus = nodes * per_node
            if speedup is None or abs(dp / single - speedup) > 0.06:
                raise ValueError(f"{model} on {gpus} GPUs: {dp} / {single} is not the README's {speedup}x")
            out.append({"source": f"horovod/horovod README.md @ {COMMIT[:8]} (2017-09-05): {sentence}",
                        "model": model, "per_gpu_batch": 64, "precision": "FP32", "nodes": nodes,
                        "gpus_per_node": per_node, "network_gbps": gbps, "single_img_s": single, "dp_img_s": dp,
                        "speedup": speedup})  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    readme = subprocess.run(["git", "-C", argv[0], "show", f"{COMMIT}:README.md"], check=True, capture_output=True,
                            text=True).stdout  # fmt: skip
    data = rows(readme)
    with OUT.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(data[0]))
        writer.writeheader()
        writer.writerows(data)
    print(f"wrote {len(data)} rows to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
