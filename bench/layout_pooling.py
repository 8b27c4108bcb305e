"""Pooling and cuDNN's layout conversions in the operator model: the fit on the lent H100, and checks on data it was
not fitted on (issue #40).

    python bench/layout_pooling.py fit      # ops.LAYOUT_CONVERSIONS from the H100's ResNet-50 kernels
    python bench/layout_pooling.py score    # per class on the H100; NCHW vs channels-last on a V100 (published)

``fit``: the lent H100's kernel breakdown (``bench/data/h100_kernel_breakdown_2026-11-27.csv``: ResNet-50 AMP at
1,280, FP32 at 640, NCHW, as Lambda's NGC scripts ran it) gives the time of cuDNN's ``nchwToNhwc`` / ``nhwcToNchw``
kernels per step; the operator model prices, on the table the callback recorded in the same run
(``bench/data/h100_profiles_2026-11-27.tar.xz``), one conversion of every forward convolution's input and output
elements; the constant is the geometric mean of measured / priced over the two precisions (the spread between them
is printed: it is the rule's error on its own data).

``score``: (1) the H100 per class, measured against modelled (conversions in-sample; pooling and batch norm carry no
fitted constant); (2) ``bench/data/published_layout_steps.csv``: ResNet-50 training steps on a V100-SXM2 at batch
128, NCHW and channels-last, FP32 and AMP (torchvision's model, SGD), nothing fitted on them: transformers'
ResNet-50 (the same v1.5 architecture) captured on the meta device in each layout and precision, predicted on the
V100 from the capture alone (the absolute path), and the channels-last / NCHW ratio the model gives beside the
measured one.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import devicecli  # noqa: E402

BREAKDOWN = ROOT / "bench" / "data" / "h100_kernel_breakdown_2026-11-27.csv"
PUBLISHED = ROOT / "bench" / "data" / "published_layout_steps.csv"
H100_CASES = {"16-mixed": ("ResNet-50-16-mixed-1280", 1280), "32-true": ("ResNet-50-32-true-640", 640)}
# kernel name -> the model's class it belongs to (the rest are not scored here)
KERNELS = (
    ("layout", re.compile(r"nchwToNhwc|nhwcToNchw")),
    ("pooling", re.compile(r"max_pool|avg_pool")),
    ("batch_norm", re.compile(r"bn_fw|bn_bw|batch_norm")),
    # cuDNN's implicit GEMMs and the cuBLAS GEMMs it runs 1x1 convolutions (and the classifier) as
    ("conv", re.compile(r"implicit_gemm|fprop|dgrad|wgrad|gemm|nvjet|cutlass|xmma")),
)


def measured_classes(precision: str) -> dict[str, float]:
    """Seconds per step of the H100's kernels of each scored class, ResNet-50 in ``precision``."""
    out = dict.fromkeys((c for c, _ in KERNELS), 0.0)
    with BREAKDOWN.open() as fh:
        for row in csv.DictReader(fh):
            if row["model"] != "ResNet-50" or row["precision"] != precision:
                continue
            for cls, pattern in KERNELS:
                if pattern.search(row["kernel"]):
                    out[cls] += float(row["gpu_us"]) * 1e-6 / int(row["steps"])
                    break
    return out


@functools.cache
def h100_profiles() -> dict[str, object]:
    import json

    from predictor.documents.profile import profile_from_dict

    with devicecli.unpacked(devicecli.ARCHIVE) as folder:
        return {
            precision: profile_from_dict(json.loads((folder / f"{stem}.json").read_text()))
            for precision, (stem, _) in H100_CASES.items()
        }


def modelled_classes(profile: object, gpu_key: str) -> dict[str, float]:
    """The operator model's seconds per step by class for the profile's table on ``gpu_key`` (absolute constants)."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model import ops

    table = profile.ops  # type: ignore[attr-defined]
    classified = ops.classify_table(table.ops)
    precision = profile.model.precision  # type: ignore[attr-defined]
    matmul = profile.model.float32_matmul_precision  # type: ignore[attr-defined]
    t = ops.ops_time(classified, get_gpu(gpu_key), precision, matmul, "absolute")
    per_step = profile.batch.per_device / table.samples  # type: ignore[attr-defined]
    out = {k: v * per_step for k, v in t.by_class.items()} | {"total": t.seconds * per_step}
    out["conv"] = out.get("conv", 0.0) + out.pop("gemm", 0.0)  # as the kernels are named: 1x1 convolutions as GEMMs
    return out


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def fit() -> int:
    """Both constants from the H100's ResNet-50 steps: the geometric mean over the two precisions, and their spread
    (the rule's error on its own data)."""
    from predictor.catalog.gpus import get_gpu
    from predictor.model import ops

    h100 = get_gpu("H100-SXM")
    conversions, passes = {}, {}
    for precision, prof in h100_profiles().items():
        measured = measured_classes(precision)
        priced = modelled_classes(prof, "H100-SXM")["layout"] / ops.LAYOUT_CONVERSIONS  # one conversion of each
        conversions[precision] = measured["layout"] / priced
        per_step = prof.batch.per_device / prof.ops.samples  # type: ignore[attr-defined]
        bn = [c for c in ops.classify_table(prof.ops.ops) if c.cls == "batch_norm"]  # type: ignore[attr-defined]
        element_passes = sum(c.scale * c.dims["elements"] * c.dims["passes"] for c in bn) * per_step
        passes[precision] = element_passes / measured["batch_norm"] / (h100.sms * h100.clock_mhz * 1e6)
        print(f"{precision}: conversions {measured['layout'] * 1e3:.1f} ms a step against {priced * 1e3:.1f} ms for "
              f"one conversion of every forward convolution's input and output: {conversions[precision]:.2f}; "
              f"batch norm {measured['batch_norm'] * 1e3:.1f} ms for {element_passes / 1e9:.1f} G element passes: "
              f"{passes[precision]:.2f} per SM-cycle")  # fmt: skip
    for name, values, shipped in (
        ("LAYOUT_CONVERSIONS", conversions, ops.LAYOUT_CONVERSIONS),
        ("BN_PASSES_PER_SM_CYCLE", passes, ops.BN_PASSES_PER_SM_CYCLE),
    ):
        spread = max(values.values()) / min(values.values())
        print(f"{name} = {geometric_mean(list(values.values())):.2f} (the precisions {spread:.2f}x apart; "
              f"shipped {shipped})")  # fmt: skip
    return 0


def published_rows() -> list[dict[str, str]]:
    with PUBLISHED.open() as fh:
        return [r for r in csv.DictReader(fh) if not r["source"].startswith("#")]


def capture(batch: int, precision: str, channels_last: bool) -> object:
    """transformers' ResNet-50 (torchvision's v1.5 architecture) captured on meta: one SGD step, 224 px."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from lightning_srifty import capture_ops
    from predictor.documents.profile import profile_from_dict
    from predictor.documents.schema import to_dict

    net = ResNetForImageClassification(ResNetConfig(num_labels=1000))
    pixels = torch.zeros(batch, 3, 224, 224)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        pixels = pixels.to(memory_format=torch.channels_last)
    sgd = functools.partial(torch.optim.SGD, lr=1e-3, momentum=0.9, weight_decay=1e-4)
    table = capture_ops(
        net, {"pixel_values": pixels, "labels": torch.zeros(batch, dtype=torch.long)}, precision=precision,
        optimizer=sgd,
    )  # fmt: skip
    return profile_from_dict(
        {
            "schema": "srifty.profile/v1",
            "model": {"name": "ResNet-50", "parameters": 25_557_032, "precision": precision},
            "batch": {"per_device": batch},
            "hardware": {"devices": 1, "accelerator": "meta"},
            "timing": {"step_time_s": {"p50": 0.0}},
            "ops": to_dict(table),
        }
    )


def score() -> int:
    print("H100, ResNet-50, per class: measured / modelled ms a step (conversions: the fit's own data)")
    for precision, prof in h100_profiles().items():
        measured = measured_classes(precision)
        modelled = modelled_classes(prof, "H100-SXM")
        cells = ", ".join(
            f"{cls} {measured[cls] * 1e3:.1f} / {modelled.get(cls, 0.0) * 1e3:.1f} "
            f"({modelled.get(cls, 0.0) / measured[cls]:.2f}x)"
            for cls in measured
        )
        print(f"  {precision}: {cells}")
    h100_rows = []
    for precision, prof in h100_profiles().items():
        measured, modelled = measured_classes(precision), modelled_classes(prof, "H100-SXM")
        h100_rows += [(f"H100 {precision}\n{cls}", measured[cls], modelled.get(cls, 0.0)) for cls in measured]
    print("\npublished steps, NCHW vs channels-last (bench/data/published_layout_steps.csv), capture only:")
    rows = published_rows()
    predicted: dict[tuple[str, str, str], float] = {}
    for r in rows:
        precision = "16-mixed" if r["precision"] == "AMP" else "32-true"
        prof = capture(int(r["batch"]), precision, r["memory_format"] == "NHWC")
        from predictor.model import ops

        classes = modelled_classes(prof, r["gpu"])
        # the step as the predictor prices a capture: the GPU's sum, never under the host's launch floor
        kernels = ops.kernel_count(ops.classify_table(prof.ops.ops))  # type: ignore[attr-defined]
        host = ops.LIGHTNING_STEP_S + kernels * ops.HOST_S_PER_KERNEL
        step = max(classes["total"], host)
        predicted[(r["gpu"], r["precision"], r["memory_format"])] = step
        measured = float(r["step_ms"]) * 1e-3
        parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(classes.items()) if k != "total" and v > 0)
        print(f"  {r['gpu']} {r['precision']} {r['memory_format']} b={r['batch']}: measured {measured * 1e3:.1f} ms, "
              f"predicted {step * 1e3:.1f} ({step / measured:.2f}x) [{parts}]")  # fmt: skip
    published = [(f"{r['gpu'].split('-')[0]} {r['precision']}\n{r['memory_format']}", float(r["step_ms"]) * 1e-3,
                  predicted[(r["gpu"], r["precision"], r["memory_format"])]) for r in rows]  # fmt: skip
    plot(h100_rows, published, ROOT / "docs" / "img" / "cnn_layout.png")
    for gpu, precision in sorted({(r["gpu"], r["precision"]) for r in rows}):
        m = {r["memory_format"]: float(r["step_ms"]) for r in rows if (r["gpu"], r["precision"]) == (gpu, precision)}
        if {"NCHW", "NHWC"} <= set(m):
            p = predicted[(gpu, precision, "NHWC")] / predicted[(gpu, precision, "NCHW")]
            print(f"  {gpu} {precision}: channels-last / NCHW step measured {m['NHWC'] / m['NCHW']:.2f}, "
                  f"predicted {p:.2f}")  # fmt: skip
    return 0


def plot(h100: list[tuple[str, float, float]], published: list[tuple[str, float, float]], png: Path) -> None:
    """Measured beside predicted: the H100's per-class kernel time (left) and the published V100 steps (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    titles = ("lent H100, ResNet-50 per class (conversions, batch norm: fitted here)",
              "V100, ResNet-50 b=128 (published; held out)")  # fmt: skip
    for ax, rows, title in zip(axes, (h100, published), titles, strict=True):
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [m * 1e3 for _, m, _ in rows], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [p * 1e3 for _, _, p in rows], 0.4, label="predicted")
        ax.set_xticks(list(xs), [name for name, _, _ in rows], fontsize=7)
        ax.set(title=title, ylabel="ms per step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cmd", choices=("fit", "score"))
    args = parser.parse_args(argv)
    return fit() if args.cmd == "fit" else score()


if __name__ == "__main__":
    sys.exit(main())
