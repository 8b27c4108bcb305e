"""NVIDIA's own ConvNet training throughput (DeepLearningExamples, PyTorch 21.03) on a DGX-1 and a DGX A100, none of
it fitted on: issue #40's EfficientNet-class and grouped-convolution check, each path of the operator model.

    python bench/dle_convnets.py            # capture (cached in bench/results/tables), score, plot

Data: ``bench/data/published_dle_convnets.csv`` (NVIDIA/DeepLearningExamples @ 729963dd, built by
``scripts/build_dle_convnets_data.py``): ResNet-50 v1.5, ResNeXt-101 32x4d (grouped 3x3 convolutions), SE-ResNeXt-101
32x4d (with squeeze-and-excitation), EfficientNet-B0 (224 px) and EfficientNet-B4 (380 px; depthwise convolutions,
SiLU, squeeze-and-excitation) on V100-SXM2-16GB and A100-SXM4-80GB, 1 and 8 GPUs (EfficientNet on the A100 also
16-64 over InfiniBand), AMP with channels-last and FP32 (V100) / TF32 (A100) with NCHW, each at the repository's own
per-GPU batch. Each architecture is built as the repository builds it (torchvision's ResNet with DLE's widths and
cardinality; the SE block DLE's: mean over the pixels, a 16-unit bottleneck, sigmoid, ``addcmul`` into the
residual; torchvision's EfficientNet-B0/B4) and captured on the meta device with its optimizer (SGD with momentum
for the ResNets, RMSprop for EfficientNet), then predicted with :func:`predictor.model.predict.predict` as it ships:

- **absolute**: the capture alone (the laptop user's path), one GPU;
- **ratio**: the other GPU's measured one-GPU throughput, re-timed by the operator sums (V100 <-> A100). The two
  platforms' per-GPU batches differ for most models (the repository sized each to its GPU's memory); the profile
  keeps its own batch, so throughput is compared, and the equal-batch cases are reported apart;
- **scaling**: the same GPU's measured one-GPU step to 8 GPUs in one server (p3.16xlarge is a DGX-1's V100 NVLink
  mesh; p4de.24xlarge a DGX A100's NVSwitch) and, for EfficientNet on the A100, 2-8 servers (p4de's EFA, 4 x 100
  Gbit/s, where the published runs had a DGX SuperPOD's 8 x 200 Gbit/s InfiniBand), per-GPU batch kept.

The capture steps the optimizer every iteration (DLE: once per ``optimizer_batch_size`` images, every 8-256
iterations; 0.3-0.9 % of a priced step) and torchvision's EfficientNet-B0 has stochastic depth DLE's has not
(0.2-0.6 %).
The kernel model that predicts a case is trained without NeuSight's GPUs of the chip of either GPU (GA100 for the
A100, GV100 for the V100). The ResNet-50 rows are not independent of the shipped tensor-core efficiencies: Lambda's
ResNet-50 figures they were fitted on ran these same scripts (on other GPUs and batches). The published runs load
ImageNet JPEGs through PyTorch's DataLoader on the CPU (8 workers a GPU on the DGX-1, 10 on the DGX A100): a row the
input pipeline bounds is slower than any GPU model says, and the bench cannot tell which rows those are.
Writes bench/results/dle_convnets.json and docs/img/dle_convnets.png.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

DATA = ROOT / "bench" / "data" / "published_dle_convnets.csv"
TABLES = ROOT / "bench" / "results" / "tables"
OUT = ROOT / "bench" / "results" / "dle_convnets.json"
PNG = ROOT / "docs" / "img" / "dle_convnets.png"
KERNEL_DATA = ROOT.parent / "shared" / "data" / "kernels"
PRECISION = {"AMP": "16-mixed", "FP32": "32-true", "TF32": "32-true"}
# NeuSight's kernel devices of each GPU's chip (left out of the kernel model that predicts it)
CHIP = {"A100-SXM-80GB": ("A100-PCIe-40GB", "A100-PCIe-80GB"), "V100-SXM2-16GB": ("V100-PCIe-32GB",)}
SERVER = {"A100-SXM-80GB": "p4de.24xlarge", "V100-SXM2-16GB": "p3.16xlarge"}  # 8 GPUs a server, as the DGX's


@functools.cache
def rows() -> list[dict[str, Any]]:
    with DATA.open() as fh:
        out = []
        for r in csv.DictReader(fh):
            r = dict(r)
            for key in ("gpus", "per_gpu_batch", "image_size"):
                r[key] = int(r[key])
            r["throughput_img_s"] = float(r["throughput_img_s"])
            out.append(r)
        return out


def build(model: str) -> Any:
    """The network as DeepLearningExamples builds it (``image_classification/models``)."""
    import torch
    from cnn_zoo import torchvision_models

    models = torchvision_models()
    if model == "resnet50":
        return models.resnet50()
    if model.startswith("efficientnet-"):
        return getattr(models, model.replace("-", "_"))()
    from torchvision.models.resnet import Bottleneck, ResNet

    if model == "resnext101-32x4d":  # DLE: widths 128-1024, expansion 2, cardinality 32 = torchvision's 32 x 4
        return ResNet(Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4)

    class SEBottleneck(Bottleneck):  # DLE's SqueezeAndExcitation: 16 hidden units, fused into the residual add
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            channels = self.bn3.num_features
            self.squeeze, self.expand = torch.nn.Linear(channels, 16), torch.nn.Linear(16, channels)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            se = torch.sigmoid(self.expand(self.relu(self.squeeze(out.mean((2, 3))))))
            residual = x if self.downsample is None else self.downsample(x)
            return self.relu(torch.addcmul(residual, out, se[:, :, None, None]))

    assert model == "se-resnext101-32x4d", model
    return ResNet(SEBottleneck, [3, 4, 23, 3], groups=32, width_per_group=4)


def table_for(model: str, precision: str, batch: int, size: int, channels_last: bool) -> dict[str, Any]:
    """The operator table of one training step (forward, loss, backward, optimizer), cached."""
    layout = "nhwc" if channels_last else "nchw"
    path = TABLES / f"dle-{model}-{precision}-{batch}-{size}-{layout}.json"
    if path.exists():
        return json.loads(path.read_text())
    import torch
    from cnn_zoo import capture_classifier, store_capture

    t = time.perf_counter()
    net = build(model)
    images = torch.zeros(batch, 3, size, size)
    if channels_last:
        net, images = net.to(memory_format=torch.channels_last), images.to(memory_format=torch.channels_last)
    if model.startswith("efficientnet"):  # configs.yml: rmsprop, alpha 0.9, eps 0.01, momentum 0.9
        opt = functools.partial(torch.optim.RMSprop, lr=0.08, alpha=0.9, eps=0.01, momentum=0.9, weight_decay=1e-5)
    else:
        opt = functools.partial(torch.optim.SGD, lr=0.256, momentum=0.875, weight_decay=3.0517578125e-05)
    table = capture_classifier(net, images, precision, opt, label_smoothing=0.1)
    return store_capture(path, table, net, f"{model} {precision} b={batch} {size}px {layout}", t)


def profile(row: dict[str, Any], timed: bool) -> Any:
    """The profile of ``row``'s training: the capture, and (timed) the row's own measured one-GPU step."""
    from predictor.documents.profile import profile_from_dict

    precision = PRECISION[row["precision"]]
    data = table_for(row["model"], precision, row["per_gpu_batch"], row["image_size"], row["memory_format"] == "NHWC")
    step = row["per_gpu_batch"] / row["throughput_img_s"] if timed else 0.0
    return profile_from_dict(
        {
            "schema": "srifty.profile/v1",
            # NGC containers enable TF32 for FP32 matmuls on Ampere (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1)
            "model": {
                "name": row["model"],
                "parameters": data["parameters"],
                "precision": precision,
                "float32_matmul_precision": "high",
            },
            "batch": {"per_device": row["per_gpu_batch"]},
            "hardware": {
                "gpu": row["gpu"] if timed else None,
                "devices": 1,
                "accelerator": "cuda" if timed else "meta",
            },
            "timing": {"step_time_s": {"p50": step}},
            "ops": data["table"],
        }
    )


@functools.cache
def catalog() -> Any:
    """The bundled catalog's two eight-GPU servers, and one-GPU instances of their GPUs (EC2 sells neither alone)."""
    from predictor.catalog.catalog import Catalog, CatalogInfo
    from predictor.catalog.instances import InstanceType

    bundled = Catalog.load()
    instances = {name: bundled.get(name) for name in SERVER.values()}
    for gpu in SERVER:
        server = bundled.get(SERVER[gpu])
        instances[f"dle-{gpu}"] = InstanceType(
            name=f"dle-{gpu}", family="dle", accelerator=gpu, accelerator_kind="cuda", gpu=gpu, gpus=1,
            gpu_memory_gib=server.gpu_memory_gib, vcpus=server.vcpus // 8, memory_gib=server.memory_gib / 8,
            network_gbps=25, gpu_interconnect="single", origin="evaluation",
        )  # fmt: skip
    return Catalog(instances, bundled.gpus, CatalogInfo("evaluation", "-"))


def predict_row(dst: dict[str, Any], src: dict[str, Any] | None, path: str) -> tuple[float, float, float, str]:
    """(predicted img/s, interval low, high, bottleneck) of ``dst`` by ``path`` (from ``src``'s measured step)."""
    import ops_validation

    from predictor.model import kernels, ops
    from predictor.model.predict import predict

    excluded = tuple(sorted(set(CHIP[dst["gpu"]]) | set(CHIP[src["gpu"]] if src else ())))
    kernels.load_kernel_model = lambda: ops_validation.kernel_model(excluded, str(KERNEL_DATA))
    ops.LIGHTNING_STEP_S = 0.0  # DLE's own training loop: no Lightning step on the host
    if path == "scaling":
        fleet = f"{SERVER[dst['gpu']]}:{dst['gpus'] // 8}"
        r = predict(profile(src, True), fleet, catalog=catalog(), scaling="weak", layout="ddp")  # type: ignore[arg-type]
    else:
        r = predict(profile(src or dst, src is not None), f"dle-{dst['gpu']}:1", catalog=catalog(), layout="ddp")
    lo, hi = r.interval["throughput_samples_s"]
    return r.throughput_samples_s, lo, hi, r.bottleneck


def score() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    data = rows()
    one = {(r["model"], r["gpu"], r["precision"]): r for r in data if r["gpus"] == 1}
    t0 = time.perf_counter()
    for i, dst in enumerate(data):
        base = {k: dst[k] for k in ("model", "gpu", "gpus", "precision", "per_gpu_batch")}
        base["measured"] = dst["throughput_img_s"]
        if dst["gpus"] == 1:
            plans: list[tuple[str, dict[str, Any] | None]] = [("absolute", None)]
            other = next(g for g in SERVER if g != dst["gpu"])
            twin = "AMP" if dst["precision"] == "AMP" else ("FP32" if other.startswith("V100") else "TF32")
            plans.append(("ratio", one[(dst["model"], other, twin)]))
        else:
            plans = [("scaling", one[(dst["model"], dst["gpu"], dst["precision"])])]
        for path, src in plans:
            value, lo, hi, bottleneck = predict_row(dst, src, path)
            extra = {"src_gpu": src["gpu"], "src_batch": src["per_gpu_batch"]} if src else {}
            cases.append(base | extra | {"path": path, "predicted": value, "lo": lo, "hi": hi,
                                         "bottleneck": bottleneck})  # fmt: skip
        print(f"  [{i + 1}/{len(data)}] {dst['model']} {dst['precision']} {dst['gpu']} x{dst['gpus']}, "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    return cases


def ape(c: dict[str, Any]) -> float:
    return abs(c["predicted"] / c["measured"] - 1.0)


def line(label: str, group: list[dict[str, Any]]) -> str | None:
    if not group:
        return None
    ratios = sorted(c["predicted"] / c["measured"] for c in group)
    inside = sum(c["lo"] <= c["measured"] <= c["hi"] for c in group) / len(group)
    return (f"{label}: {len(group)} cases, MAPE {100 * statistics.mean(ape(c) for c in group):.1f} %, predicted / "
            f"measured throughput {ratios[0]:.2f}-{ratios[-1]:.2f} (median {statistics.median(ratios):.2f}), "
            f"80 % interval holds {100 * inside:.0f} %")  # fmt: skip


def summarise(cases: list[dict[str, Any]]) -> list[str]:
    out: list[str | None] = []
    for path in ("absolute", "ratio", "scaling"):
        group = [c for c in cases if c["path"] == path]
        out.append(line(path, group))
        for model in sorted({c["model"] for c in group}):
            out.append(line(f"  {model}", [c for c in group if c["model"] == model]))
        for precision in ("AMP", "FP32", "TF32"):
            out.append(line(f"  {precision}", [c for c in group if c["precision"] == precision]))
        for gpu in SERVER:
            out.append(line(f"  on {gpu}", [c for c in group if c["gpu"] == gpu]))
        if path == "ratio":
            out.append(line("  same per-GPU batch", [c for c in group if c["src_batch"] == c["per_gpu_batch"]]))
        if path == "scaling":
            out.append(line("  one server (8 GPUs)", [c for c in group if c["gpus"] == 8]))
            out.append(line("  across servers (16-64 GPUs)", [c for c in group if c["gpus"] > 8]))
    return [s for s in out if s]


def table(cases: list[dict[str, Any]]) -> list[str]:
    head = "| model | GPU | GPUs | precision | batch | measured img/s | path | predicted (80 % interval) | / measured |"
    out = [head, "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        src = f" from {c['src_gpu'].split('-')[0]} b={c['src_batch']}" if c["path"] == "ratio" else ""
        out.append(f"| {c['model']} | {c['gpu']} | {c['gpus']} | {c['precision']} | {c['per_gpu_batch']} | "
                   f"{c['measured']:g} | {c['path']}{src} | {c['predicted']:.0f} ({c['lo']:.0f}-{c['hi']:.0f}) | "
                   f"x{c['predicted'] / c['measured']:.2f} |")  # fmt: skip
    return out


def plot(cases: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({c["model"] for c in cases})
    colours = dict(zip(models, plt.cm.tab10.colors, strict=False))
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.0))
    titles = {"absolute": "capture only (no GPU), 1 GPU", "ratio": "the other GPU's measured step, 1 GPU",
              "scaling": "the same GPU's 1-GPU step -> 8-64 GPUs"}  # fmt: skip
    for ax, path in zip(axes, titles, strict=True):
        group = [c for c in cases if c["path"] == path]
        for model in models:
            for precision, marker in (("AMP", "^"), ("FP32", "o"), ("TF32", "s")):
                sel = [c for c in group if c["model"] == model and c["precision"] == precision]
                if not sel:
                    continue
                x = [c["measured"] for c in sel]
                y = [c["predicted"] for c in sel]
                err = [[c["predicted"] - c["lo"] for c in sel], [c["hi"] - c["predicted"] for c in sel]]
                ax.errorbar(x, y, yerr=err, fmt=marker, ms=4, color=colours[model], alpha=0.7, lw=0.6,
                            label=f"{model} {precision}")  # fmt: skip
        lo = min(min(c["measured"], c["lo"]) for c in group) * 0.8
        hi = max(max(c["measured"], c["hi"]) for c in group) * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.8, 1.25):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        mape = 100 * statistics.mean(ape(c) for c in group)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured images/s",
               ylabel="predicted images/s (80 % interval)", title=f"{titles[path]}: MAPE {mape:.1f} %")  # fmt: skip
        ax.title.set_fontsize(9)
    axes[0].legend(fontsize=6, loc="upper left", ncol=1)
    fig.suptitle("NVIDIA DeepLearningExamples ConvNets (PyTorch 21.03) on DGX-1 V100 and DGX A100, held out",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--table", action="store_true", help="also print every case as a Markdown table")
    args = parser.parse_args(argv)
    cases = score()
    lines = summarise(cases)
    print("\n".join(lines))
    if args.table:
        print("\n".join(table(cases)))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"cases": cases, "summary": lines}, indent=1))
    if not args.no_plot:
        plot(cases, PNG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
