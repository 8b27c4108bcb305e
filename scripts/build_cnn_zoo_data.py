"""Build ``bench/data/published_cnn_zoo.csv`` from ryujaehun/pytorch-gpu-benchmark's per-step CSVs.

    git clone https://github.com/ryujaehun/pytorch-gpu-benchmark /tmp/pgb
    python scripts/build_cnn_zoo_data.py /tmp/pgb   # checks out the pinned commit's files with git show

The repository times torchvision's CNNs at batch 12 (224 px, random images, cross-entropy over 1,000 classes) on
one GPU: ``model.zero_grad()``, forward, loss, backward between two ``torch.cuda.synchronize()`` calls, 50 timed steps
after 5 warm-up ones (20 in the 2018 runs), FP32 (``float``), pure FP16 (``model.half()``: no autocast) and FP64.
One row per (GPU, precision, model): the median, 10th and 90th percentile of the published steps; FP64 is left out
(no EC2 GPU trains in it). The 2020-2021 runs set ``cudnn.benchmark`` and copy the batch to the GPU inside the
timed step (pageable memory); the 2018 runs (TITAN V, GTX 1080 Ti) kept the batch on the GPU and left cuDNN's
heuristics on.
"""

from __future__ import annotations

import csv
import io
import statistics
import subprocess
import sys
from pathlib import Path

COMMIT = "3f47a9e2a43ca751ffade0add700b54b00e44bf0"
OUT = Path(__file__).resolve().parents[1] / "bench" / "data" / "published_cnn_zoo.csv"
# (GPU key of bench/cnn_zoo.py, path prefix, precision -> file stem, software as the run's system_info states it)
RUNS = (
    ("A100-SXM-40GB", "results/dgx-a100/A100-SXM4-40GB_1_gpus__", {"FP32": "float", "FP16": "half"},
     "_model_train_benchmark.csv", "2021-01-03; NGC pytorch:20.10 (PyTorch 1.7), CUDA 11.1, cuDNN 8.0.4; TF32 on"),
    ("TITAN-RTX", "results/TitanRTX/TITAN RTX_1_gpus__", {"FP32": "float", "FP16": "half"},
     "_model_train_benchmark.csv", "2021-01-03; CUDA 10.2, cuDNN 7.6.5"),
    ("TITAN-Xp", "results/TITANXP/TITAN Xp_1_gpus__", {"FP32": "float", "FP16": "half"},
     "_model_train_benchmark.csv", "2021-01-07; CUDA 10.2, cuDNN 7.6.5"),
    ("RTX-2080Ti", "new_results/GeForce RTX 2080 Ti_1_gpus__", {"FP32": "float", "FP16": "half"},
     "_model_train_benchmark.csv", "2020-01-17; CUDA 10.0, cuDNN 7.6.0"),
    ("TITAN-V", "results/TitanV/TITAN V_", {"FP32": "single", "FP16": "half"},
     "_model_training_benchmark.csv", "2018-10-02 code (no cudnn.benchmark, batch already on the GPU)"),
    ("GTX-1080Ti", "results/1080TI/GeForce GTX 1080 Ti_", {"FP32": "single", "FP16": "half"},
     "_model_training_benchmark.csv", "2018-12 code (no cudnn.benchmark, batch already on the GPU)"),
)  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    repo = Path(argv[0])
    rows = []
    for gpu, prefix, stems, suffix, software in RUNS:
        for precision, stem in stems.items():
            path = f"{prefix}{stem}{suffix}"
            text = subprocess.run(
                ["git", "-C", str(repo), "show", f"{COMMIT}:{path}"], capture_output=True, text=True, check=True
            ).stdout
            table = list(csv.reader(io.StringIO(text)))
            header, samples = table[0], [[float(v) for v in r] for r in table[1:] if r]
            for i, model in enumerate(header):
                steps = [s[i] for s in samples]
                rows.append({
                    "gpu": gpu, "model": model, "precision": precision, "batch": 12,
                    "step_ms": f"{statistics.median(steps):.3f}", "p10_ms": f"{percentile(steps, 10):.3f}",
                    "p90_ms": f"{percentile(steps, 90):.3f}", "steps": len(steps), "software": software,
                    "repo": "ryujaehun/pytorch-gpu-benchmark", "commit": COMMIT, "path": path,
                })  # fmt: skip
    tmp = OUT.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(OUT)
    print(f"wrote {OUT} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
