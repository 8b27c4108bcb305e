"""Build ``bench/data/published_dle_convnets.csv`` from NVIDIA DeepLearningExamples' ConvNets (PyTorch) READMEs.

    git clone https://github.com/NVIDIA/DeepLearningExamples /tmp/dle
    python scripts/build_dle_convnets_data.py /tmp/dle   # reads the pinned commit's files with git show

NVIDIA's own training throughput of five ConvNets in the PyTorch 21.03 NGC container ("Training performance results"
of each README): ResNet-50 v1.5, ResNeXt-101 32x4d, SE-ResNeXt-101 32x4d, EfficientNet-B0 and EfficientNet-B4 on a
DGX-1 (8x V100-SXM2 16GB, NVLink) and a DGX A100 (8x A100-SXM4 80GB, NVSwitch; EfficientNet also 16-64 GPUs over
the DGX SuperPOD's InfiniBand), 1 and 8 GPUs, mixed precision (AMP, channels-last: ``memory_format: nhwc``) and
FP32 (V100) / TF32 (A100). The per-GPU batch, image size and memory format of each row are the repository's own
``configs.yml`` for that platform and precision (the training scripts the README names run ``launch.py`` with them);
the data backend is ``pytorch`` (JPEG decoding and augmentation on the CPU: 8 loader workers a GPU on the DGX-1, 10 on
the DGX A100), so a row can be bound by the input pipeline rather than the GPU. The DGX-1 32GB tables are left out:
their EfficientNet-B4 rows are not self-consistent (one GPU 36 img/s, eight 17.6x that).
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import yaml

COMMIT = "729963dd47e7c8bd462ad10bfac7a7b0b604e6dd"
OUT = Path(__file__).resolve().parents[1] / "bench" / "data" / "published_dle_convnets.csv"
BASE = "PyTorch/Classification/ConvNets"
MODELS = {  # README folder -> (configs.yml model key, README table's model name or None where one model a README)
    "resnet50v1.5": ("resnet50", None),
    "resnext101-32x4d": ("resnext101-32x4d", None),
    "se-resnext101-32x4d": ("se-resnext101-32x4d", None),
    "efficientnet": (None, ("efficientnet-b0", "efficientnet-b4")),
}
PLATFORMS = (  # README table heading -> (configs.yml platform, catalog GPU key, the other precision's name)
    ("NVIDIA DGX A100 (8x A100 80GB)", "DGXA100", "A100-SXM-80GB", "TF32"),
    ("NVIDIA A100 (8x A100 80GB)", "DGXA100", "A100-SXM-80GB", "TF32"),
    ("NVIDIA DGX-1 16GB (8x V100 16GB)", "DGX1V-16G", "V100-SXM2-16GB", "FP32"),
    ("NVIDIA DGX-1 (8x V100 16GB)", "DGX1V-16G", "V100-SXM2-16GB", "FP32"),
)
FIELDS = ("model", "gpu", "platform", "gpus", "precision", "per_gpu_batch", "image_size", "memory_format",
          "throughput_img_s", "repo", "commit", "path")  # fmt: skip


def show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def tables(readme: str) -> dict[str, list[list[str]]]:
    """The training-performance tables of a README, by platform heading: rows of cells (header row first)."""
    section = readme.split("#### Training performance results", 1)[1].split("#### Inference performance", 1)[0]
    out: dict[str, list[list[str]]] = {}
    heading = None
    for line in section.splitlines():
        m = re.match(r"#####\s+Traini\w* performance:\s*(.+?)\s*$", line)
        if m:
            heading = m.group(1)
            out[heading] = []
        elif heading and line.startswith("|") and not set(line) <= set("|:- "):
            out[heading].append([c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")])
    return out


def img_s(cell: str) -> float:
    return float(cell.replace("img/s", "").strip())


def rows_of(repo: Path, folder: str, configs: dict) -> list[dict[str, object]]:
    path = f"{BASE}/{folder}/README.md"
    key, names = MODELS[folder]
    out = []
    for heading, table in tables(show(repo, path)).items():
        platform = next((p for p in PLATFORMS if p[0] == heading), None)
        if platform is None:
            continue  # DGX-1 32GB (inconsistent EfficientNet rows), DGX-2
        _, config_platform, gpu, full = platform
        header, body = table[0], table[1:]
        col = {name: i for i, name in enumerate(header)}
        full_col = next(i for name, i in col.items() if name.endswith(full) or name == f"Throughput - {full}")
        amp_col = col["Throughput - mixed precision"]
        for cells in body:
            model = cells[col["Model"]] if names else key
            if names and model not in names:
                continue
            for precision, c in ((full, full_col), ("AMP", amp_col)):
                config = configs["models"][model][config_platform][precision]
                out.append({
                    "model": model, "gpu": gpu, "platform": config_platform, "gpus": int(cells[col["GPUs"]]),
                    "precision": precision, "per_gpu_batch": config["batch_size"],
                    "image_size": config.get("image_size", 224),
                    "memory_format": "NHWC" if config.get("memory_format") == "nhwc" else "NCHW",
                    "throughput_img_s": img_s(cells[c]), "repo": "NVIDIA/DeepLearningExamples", "commit": COMMIT,
                    "path": path,
                })  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    repo = Path(argv[0])
    configs = yaml.safe_load(show(repo, f"{BASE}/configs.yml"))
    rows = [r for folder in MODELS for r in rows_of(repo, folder, configs)]
    tmp = OUT.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["model"], r["gpu"], r["precision"], r["gpus"])))
    tmp.replace(OUT)
    print(f"{len(rows)} rows -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
