"""Thirty-two torchvision CNNs on six GPUs, none of them fitted on: the operator path's held-out check for vision beyond
ResNet-50 (issue #40's ResNet-18 / VGG / EfficientNet-class captures).

    python bench/cnn_zoo.py            # capture (cached in bench/results/tables), score both paths, plot

Data: ``bench/data/published_cnn_zoo.csv`` (ryujaehun/pytorch-gpu-benchmark @ 3f47a9e2, built by
``scripts/build_cnn_zoo_data.py``): torchvision's ResNet-18-152, ResNeXt, Wide ResNet, VGG-11-19 (with and without
batch norm), DenseNet, SqueezeNet, MobileNetV2, MNASNet and ShuffleNetV2 (the depthwise, EfficientNet-class ones),
one training step (forward, cross-entropy, backward; no optimizer step) at batch 12 on an A100-SXM4-40GB, TITAN RTX,
RTX 2080 Ti, TITAN V, TITAN Xp and GTX 1080 Ti, FP32 and pure FP16 (``model.half()``).

Each architecture is captured on the meta device at batch 12 in both precisions (``capture_ops``; the optimizer's
records are dropped: the published step has none) and predicted with :func:`predictor.model.predict.predict` as it
ships, two ways:
- **absolute** (the laptop user's path: the capture alone, no GPU);
- **ratio**, leave-one-GPU-out: the measured step on every other GPU of the set, re-timed by the ratio of the
  operator sums.
The kernel model that predicts a case is trained without NeuSight's GPUs of the same chip as either GPU (GA100 for
the A100, GV100 for the TITAN V; NeuSight has no TU102 or GP102). The step is a plain PyTorch loop, not Lightning's:
``ops.LIGHTNING_STEP_S`` (Lightning's own host time a step) is set to 0 here, the rest of the host floor
(``HOST_S_PER_KERNEL`` per kernel) is the model's. Baselines for the ratio path: the same time on every GPU, and the
time scaled by the datasheet peak (FP32 or the 16-bit tensor peak). Writes bench/results/cnn_zoo.json and
docs/img/cnn_zoo.png.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

DATA = ROOT / "bench" / "data" / "published_cnn_zoo.csv"
TABLES = ROOT / "bench" / "results" / "tables"
OUT = ROOT / "bench" / "results" / "cnn_zoo.json"
PNG = ROOT / "docs" / "img" / "cnn_zoo.png"
PRECISION = {"FP32": "32-true", "FP16": "16-true"}
FAMILIES = (
    ("depthwise", ("mobilenet", "mnasnet", "shufflenet")),
    ("ResNet", ("resnet", "resnext", "wide_resnet")),
    ("VGG", ("vgg",)),
    ("DenseNet", ("densenet",)),
    ("SqueezeNet", ("squeezenet",)),
)
# NeuSight's kernel devices of each GPU's chip (left out of the kernel model that predicts it)
CHIP = {"A100-SXM-40GB": ("A100-PCIe-80GB", "A100-PCIe-40GB"), "TITAN-V": ("V100-PCIe-32GB",)}

# The five GPUs EC2 does not sell, as the catalog would state them (dense peaks; the A100 is the bundled row).
# Sources: the benchmark's own spec table (README.md @ 3f47a9e2: cores, FP32 peak, bandwidth); SM counts from the
# cores (128 a Pascal SM, 64 a Volta/Turing one); boost clocks from NVIDIA's product pages; tensor peaks with FP32
# accumulation (what PyTorch's FP16 GEMMs and convolutions use) from the NVIDIA Turing architecture whitepaper,
# appendix A (RTX 2080 Ti 53.8 TFLOPS at the 1,545 MHz reference boost: GeForce halves FP32-accumulate; TITAN RTX 130
# at full rate) and NVIDIA's TITAN V page (110 TFLOPS); L2 sizes from the Pascal GP102 / Volta GV100 / Turing TU102
# whitepapers. GP102 runs FP16 arithmetic at 1/64 of FP32; cuDNN and cuBLAS compute FP16 tensors in FP32 there
# ("pseudo-half"), so its FP16 peak is left empty (priced on the FP32 units) rather than set to 0.18 TFLOPS.
ZOO_GPUS = (
    # key, arch, memory GB, GB/s, FP32, FP16 tensor, SMs, boost MHz, L2 MB, compute capability
    ("TITAN-RTX", "Turing", 24, 672.0, 16.31, 130.5, 72, 1770, 6.0, "7.5"),
    ("RTX-2080Ti", "Turing", 11, 616.0, 13.45, 53.8, 68, 1545, 5.5, "7.5"),
    ("TITAN-V", "Volta", 12, 652.8, 14.90, 110.0, 80, 1455, 4.5, "7.0"),
    ("TITAN-Xp", "Pascal", 12, 547.6, 12.15, None, 30, 1582, 3.0, "6.1"),
    ("GTX-1080Ti", "Pascal", 11, 484.0, 11.34, None, 28, 1582, 2.75, "6.1"),
)


def zoo_gpus() -> list[Any]:
    from predictor.catalog.gpus import GPU

    return [
        GPU(key=key, arch=arch, memory_gb=mem, memory_bw_gbps=bw, fp32_tflops=fp32, tf32_tflops=None,
            fp16_tflops=fp16, bf16_tflops=None, nvlink_gbps=None, pcie="PCIe Gen3", aliases=(),
            source="bench/cnn_zoo.py ZOO_GPUS", sms=sms, clock_mhz=clock, l2_mb=l2, compute_capability=cc)
        for key, arch, mem, bw, fp32, fp16, sms, clock, l2, cc in ZOO_GPUS
    ]  # fmt: skip


@functools.cache
def catalog() -> Any:
    from predictor.catalog.catalog import Catalog, CatalogInfo
    from predictor.catalog.gpus import bundled_gpus
    from predictor.catalog.instances import InstanceType

    gpus = bundled_gpus().merged(zoo_gpus())
    instances = {}
    for key in sorted({r["gpu"] for r in rows()}):
        gpu = gpus.get(key)
        instances[f"zoo-{key}"] = InstanceType(
            name=f"zoo-{key}", family="zoo", accelerator=key, accelerator_kind="cuda", gpu=key, gpus=1,
            gpu_memory_gib=gpu.memory_gb, vcpus=16, memory_gib=128, network_gbps=10, gpu_interconnect="single",
            origin="evaluation",
        )  # fmt: skip
    return Catalog(instances, gpus, CatalogInfo("evaluation", "-"))


@functools.cache
def rows() -> list[dict[str, str]]:
    with DATA.open() as fh:
        return list(csv.DictReader(fh))


def family(model: str) -> str:
    return next((name for name, prefixes in FAMILIES if model.startswith(prefixes)), "other")


def torchvision_models() -> Any:
    """torchvision's model builders, as ``srifty capture torchvision:NAME`` finds them (its plain-Python builders where
    its compiled operators do not load against this project's CPU torch)."""
    from lightning_srifty.cli.capture import torchvision_models as product_torchvision_models
    from predictor.exceptions import ConfigError

    try:
        return product_torchvision_models()
    except ConfigError as exc:
        raise SystemExit(f"bench/cnn_zoo.py needs torchvision: {exc}") from None


def capture_classifier(net: Any, images: Any, precision: str, optimizer: Any, label_smoothing: float = 0.0) -> dict:
    """The operator table (as a dict) of one training step of an image classifier ``net`` on ``images``: forward,
    cross-entropy over its classes (``srifty capture``'s classifier), backward and ``optimizer``'s step, on meta."""
    import torch

    from lightning_srifty import capture_ops
    from lightning_srifty.cli.capture import vision_classifier
    from predictor.documents.schema import to_dict

    batch = {"pixel_values": images, "labels": torch.zeros(images.shape[0], dtype=torch.long)}
    module = vision_classifier(net, label_smoothing)
    return to_dict(capture_ops(module, batch, precision=precision, device="meta", optimizer=optimizer))


def store_capture(path: Path, table: dict, net: Any, what: str, started: float) -> dict[str, Any]:
    """Keep a captured ``table`` of ``net`` at ``path`` (with its parameter count) and say so: every bench's cache of
    a classifier's capture."""
    data = {"table": table, "parameters": sum(p.numel() for p in net.parameters())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    print(f"  captured {what}: {len(table['ops'])} records, {time.perf_counter() - started:.1f} s", file=sys.stderr,
          flush=True)  # fmt: skip
    return data


def table_for(model: str, precision: str) -> dict[str, Any]:
    """The operator table of one step (forward, loss, backward) at batch 12, cached."""
    path = TABLES / f"zoo-{model}-{precision}-12.json"
    if path.exists():
        return json.loads(path.read_text())
    import torch

    t = time.perf_counter()
    net = getattr(torchvision_models(), model)()
    sgd = functools.partial(torch.optim.SGD, lr=0.1)  # required by capture_ops; its records are dropped below
    table = capture_classifier(net, torch.randn(12, 3, 224, 224), precision, sgd)
    table["ops"] = [r for r in table["ops"] if r["phase"] != "optimizer"]
    return store_capture(path, table, net, f"{model} {precision}", t)


def profile(model: str, precision: str, src: dict[str, str] | None) -> Any:
    return _profile(model, precision, src["gpu"] if src else None, float(src["step_ms"]) if src else 0.0)


@functools.cache
def _profile(model: str, precision: str, gpu: str | None, step_ms: float) -> Any:
    from predictor.documents.profile import profile_from_dict

    data = table_for(model, precision)
    return profile_from_dict(
        {
            "schema": "srifty.profile/v1",
            # PyTorch 1.7-1.11 allowed TF32 for FP32 matmuls by default (the A100 run's 1.7); convolutions always
            "model": {
                "name": model,
                "parameters": data["parameters"],
                "precision": precision,
                "float32_matmul_precision": "high",
            },
            "batch": {"per_device": 12},
            "hardware": {"gpu": gpu, "devices": 1, "accelerator": "cuda" if gpu else "meta"},
            "timing": {"step_time_s": {"p50": step_ms * 1e-3}},
            "ops": data["table"],
        }
    )


def predict_row(dst: dict[str, str], src: dict[str, str] | None) -> tuple[float, float, float, str]:
    """(predicted step s, interval low, high, bottleneck) of ``dst`` from ``src``'s measured step (None: absolute)."""
    import ops_validation

    from predictor.model import kernels, ops
    from predictor.model.predict import predict

    excluded = tuple(sorted(set(CHIP.get(dst["gpu"], ())) | set(CHIP.get(src["gpu"], ()) if src else ())))
    kernels.load_kernel_model = lambda: ops_validation.kernel_model(excluded, str(KERNEL_DATA))
    ops.LIGHTNING_STEP_S = 0.0  # a plain PyTorch loop: no Lightning step on the host
    r = predict(
        profile(dst["model"], PRECISION[dst["precision"]], src), f"zoo-{dst['gpu']}:1", catalog=catalog(), layout="ddp"
    )
    lo, hi = r.interval["iteration_time_s"]
    return r.iteration_time_s, lo, hi, r.bottleneck


KERNEL_DATA = ROOT.parent / "shared" / "data" / "kernels"


def peak(gpu_key: str, precision: str) -> float:
    gpu = catalog().gpus.get(gpu_key)
    if precision == "FP16" and gpu.fp16_tflops:
        return gpu.fp16_tflops
    return (gpu.tf32_tflops if gpu.tf32_tflops else gpu.fp32_tflops) or 1.0


def score(models: set[str] | None) -> dict[str, Any]:
    cases: list[dict[str, Any]] = []
    data = [r for r in rows() if models is None or r["model"] in models]
    by_key = defaultdict(list)
    for r in data:
        by_key[(r["model"], r["precision"])].append(r)
    t0 = time.perf_counter()
    for i, ((model, precision), group) in enumerate(sorted(by_key.items())):
        for dst in group:
            measured = float(dst["step_ms"]) * 1e-3
            base = {"model": model, "family": family(model), "precision": precision, "gpu": dst["gpu"],
                    "measured": measured}  # fmt: skip
            step, lo, hi, bottleneck = predict_row(dst, None)
            cases.append(base | {"path": "absolute", "src": None, "predicted": step, "lo": lo, "hi": hi,
                                 "host_bound": bottleneck.startswith("the host")})  # fmt: skip
            for src in group:
                if src is dst:
                    continue
                step, lo, hi, bottleneck = predict_row(dst, src)
                src_s = float(src["step_ms"]) * 1e-3
                peak_ratio = src_s * peak(src["gpu"], precision) / peak(dst["gpu"], precision)
                cases.append(base | {"path": "ratio", "src": src["gpu"], "predicted": step, "lo": lo, "hi": hi,
                                     "host_bound": bottleneck.startswith("the host"), "same_time": src_s,
                                     "peak_ratio": peak_ratio})  # fmt: skip
        print(f"  [{i + 1}/{len(by_key)}] {model} {precision}: {len(cases)} cases, "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    return {"cases": cases}


def ape(c: dict[str, Any], key: str = "predicted") -> float:
    return abs(c[key] / c["measured"] - 1.0)


def summarise(cases: list[dict[str, Any]]) -> list[str]:
    lines = []

    def line(label: str, group: list[dict[str, Any]], baselines: bool = False) -> None:
        if not group:
            return
        ratios = sorted(c["predicted"] / c["measured"] for c in group)
        inside = sum(c["lo"] <= c["measured"] <= c["hi"] for c in group) / len(group)
        text = (f"{label}: {len(group)} cases, MAPE {100 * statistics.mean(ape(c) for c in group):.1f} %, median "
                f"pred/meas {statistics.median(ratios):.2f} (10-90 % {ratios[len(ratios) // 10]:.2f}-"
                f"{ratios[(9 * len(ratios)) // 10]:.2f}), 80 % interval holds {100 * inside:.0f} %")  # fmt: skip
        if baselines:
            text += (f"; same time everywhere {100 * statistics.mean(ape(c, 'same_time') for c in group):.1f} %, "
                     f"peak ratio {100 * statistics.mean(ape(c, 'peak_ratio') for c in group):.1f} %")  # fmt: skip
        lines.append(text)

    for path in ("absolute", "ratio"):
        group = [c for c in cases if c["path"] == path]
        line(f"{path}", group, path == "ratio")
        for precision in PRECISION:
            line(f"  {precision}", [c for c in group if c["precision"] == precision], path == "ratio")
        for fam, _ in (*FAMILIES, ("other", ())):
            line(f"  {fam}", [c for c in group if c["family"] == fam], path == "ratio")
        for gpu in sorted({c["gpu"] for c in group}):
            line(f"  on {gpu}", [c for c in group if c["gpu"] == gpu], path == "ratio")
        hb = [c for c in group if c["host_bound"]]
        line("  predicted host-bound", hb, path == "ratio")
        line("  predicted GPU-bound", [c for c in group if not c["host_bound"]], path == "ratio")
    return lines


def host_bound_steps() -> list[str]:
    """The measured steps the model takes as the host's, per GPU (its time per kernel of the table), and the steps
    over ``GPU_EXPLAINS_AT_MOST`` times the model's GPU time that are not (over ``HOST_S_PER_KERNEL_MAX``)."""
    import ops_validation

    from predictor.model import kernels, ops

    per_gpu: dict[str, list[float]] = defaultdict(list)
    refused = []
    for r in rows():
        excluded = tuple(sorted(CHIP.get(r["gpu"], ())))
        kernels.load_kernel_model = lambda e=excluded: ops_validation.kernel_model(e, str(KERNEL_DATA))
        prof = profile(r["model"], PRECISION[r["precision"]], r)
        classified = ops.classify_table(prof.ops.ops)
        gpu = ops.ops_time(classified, catalog().gpus.get(r["gpu"]), prof.model.precision, "high", "absolute").seconds
        step, count = float(r["step_ms"]) * 1e-3, ops.kernel_count(classified)
        if step > ops.GPU_EXPLAINS_AT_MOST * gpu:
            if step / count <= ops.HOST_S_PER_KERNEL_MAX:
                per_gpu[r["gpu"]].append(step / count * 1e6)
            else:
                refused.append(f"{r['model']} {r['precision']} on {r['gpu']} ({step / gpu:.2f}x, "
                               f"{step / count * 1e6:.0f} us a kernel)")  # fmt: skip
    lines = [f"host-bound by GPU_EXPLAINS_AT_MOST on {g}: {len(v)} steps, {statistics.median(v):.0f} us a kernel "
             f"(median; {min(v):.0f}-{max(v):.0f})" for g, v in sorted(per_gpu.items())]  # fmt: skip
    return [*lines, f"over the multiple but not a host's time a kernel: {', '.join(refused) or 'none'}"]


def plot(cases: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    colours = dict(zip([f for f, _ in FAMILIES] + ["other"], plt.cm.tab10.colors, strict=False))
    for ax, path in zip(axes, ("absolute", "ratio"), strict=True):
        group = [c for c in cases if c["path"] == path]
        for fam, colour in colours.items():
            for precision, marker in (("FP32", "o"), ("FP16", "^")):
                sel = [c for c in group if c["family"] == fam and c["precision"] == precision]
                if sel:
                    label = f"{fam} {precision} ({len(sel)})"
                    ax.scatter([c["measured"] * 1e3 for c in sel], [c["predicted"] * 1e3 for c in sel], s=9,
                               color=colour, marker=marker, alpha=0.6, label=label)  # fmt: skip
        lo = min(min(c["measured"], c["predicted"]) for c in group) * 1e3 * 0.8
        hi = max(max(c["measured"], c["predicted"]) for c in group) * 1e3 * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.8, 1.25):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        mape = 100 * statistics.mean(ape(c) for c in group)
        title = "capture only (no GPU)" if path == "absolute" else "another GPU's measured step (leave-one-GPU-out)"
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms per step (batch 12)",
               ylabel="predicted ms", title=f"{title}: MAPE {mape:.1f} %")  # fmt: skip
        ax.legend(fontsize=6, loc="upper left", ncol=2)
    fig.suptitle("torchvision CNNs on six GPUs (ryujaehun/pytorch-gpu-benchmark), held out", fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="only these architectures (default: all in the data)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a sensitivity check: a constant of predictor/model/ops.py set to VALUE (nothing "
                        "written; what ships is scored otherwise), e.g. GPU_EXPLAINS_AT_MOST=3")  # fmt: skip
    args = parser.parse_args(argv)
    if args.set:
        from predictor.model import ops

        for item in args.set:
            name, _, value = item.partition("=")
            if not hasattr(ops, name):
                parser.error(f"--set {item}: predictor/model/ops.py has no constant {name}")
            setattr(ops, name, float(value))
        ratio = [c for c in score(set(args.models) if args.models else None)["cases"] if c["path"] == "ratio"]
        print(f"{', '.join(args.set)}: ratio path MAPE {100 * statistics.mean(ape(c) for c in ratio):.1f} % over "
              f"{len(ratio)} cases")  # fmt: skip
        return 0
    result = score(set(args.models) if args.models else None)
    lines = summarise(result["cases"]) + ([] if args.models else host_bound_steps())
    print("\n".join(lines))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result | {"summary": lines}, indent=1))
    if not args.no_plot:
        plot(result["cases"], PNG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
