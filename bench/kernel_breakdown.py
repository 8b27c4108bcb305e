"""Where a training step's GPU time goes, per kernel, on a lent GPU, against the operator model's per-class sums.

    python bench/kernel_breakdown.py measure --out DIR [--budget-s 90]   # on a CUDA machine (needs transformers)
    python bench/kernel_breakdown.py score DIR|CSV                        # here, no GPU (the H100's, 2026-11-27)
    python bench/kernel_breakdown.py score bench/data/h200_kernel_breakdown_2026-12-04.csv \
        --profiles bench/data/h200_profiles_2026-12-04.tar.xz --gpu H200-SXM   # the H200's, 2026-12-04

``measure``: Lambda models at their H100 batch (``bench/ops_validation.py``'s ``build``), a plain PyTorch step (AMP
with GradScaler, or FP32 with TF32 matmuls as NGC ran them), three warm-up steps, then torch's profiler (CUDA activity)
over two steps: every kernel's name, calls and GPU time, one CSV row per (case, kernel).

``score``: the kernels sorted into the model's classes by name (GEMM, attention, convolution, normalisation, softmax,
elementwise, reduction, copy, optimizer), per step, beside the operator model's per-class time for the table the
callback recorded on the same GPU (``bench/data/h100_profiles_*.tar.xz``; kernel model without the H100, the absolute
path's leave-one-model-out efficiencies): which class carries the model's error on this GPU.
"""

from __future__ import annotations

import csv
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import devicecli  # noqa: E402

CASES = (
    ("BERT-base finetune-SQuAD", "16-mixed", 320),
    ("BERT-base finetune-SQuAD", "32-true", 172),
    ("BERT-large finetune-SQuAD", "16-mixed", 112),
    ("ResNet-50", "16-mixed", 1280),
    ("ResNet-50", "32-true", 640),
)
STEPS = 2
# kernel name -> class, first match wins (CUDA library and ATen kernel names, as torch's profiler reports them)
CLASSES = (
    ("attention", r"fmha|flash|attention|sdpa|compute_dot_do_o|convert_dq_to_16bits"),
    ("optimizer", r"multi_tensor_apply|foreach|adam|_amp_"),
    ("conv", r"conv(?!ert)|implicit_gemm|wgrad|dgrad|fprop"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|kernel2"),
    ("norm", r"layer_norm|batch_norm|bn_|norm|gammabeta"),
    ("softmax", r"softmax"),
    ("copy", r"nchwtonhwc|nhwctonchw|copy|cast|catarray|index|gather|scatter|fill|memset|memcpy"),
    ("pool", r"pool"),
    ("reduction", r"reduce|sum_|mean"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|dropout|gelu|tanh|relu|add|mul|div"),
)


def classify(name: str) -> str:
    low = name.lower()
    for cls, pattern in CLASSES:
        if re.search(pattern, low):
            return cls
    return "other"


def profile_case(model: str, precision: str, batch: int) -> tuple[dict[str, list[float]], float]:
    """kernel name -> [calls, GPU us] over ``STEPS`` profiled steps, and the wall-clock ms per step."""
    import ops_validation as ov
    import torch

    with torch.device("cuda"):
        net, make_batch, optimizer = ov.build(model)
    data = {k: v.cuda() for k, v in make_batch(batch).items()}
    opt = optimizer(net.parameters())
    half = precision == "16-mixed"
    scaler = torch.amp.GradScaler("cuda", enabled=half)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.float16, enabled=half):
            loss = net(**data).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / STEPS * 1e3
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += 1
            per[e.name][1] += e.device_time
    return per, step_ms


def measure(out: Path, budget_s: float) -> int:
    import torch

    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.benchmark = True
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with (out / "kernels.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["model", "precision", "batch", "kernel", "calls", "gpu_us", "steps", "step_ms"])
        for model, precision, batch in CASES:
            if time.perf_counter() - started > budget_s:
                print(f"budget spent before {model} {precision}", flush=True)
                break
            per, step_ms = profile_case(model, precision, batch)
            for name, (calls, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
                writer.writerow([model, precision, batch, name[:300], calls, f"{us:.1f}", STEPS, f"{step_ms:.2f}"])
            fh.flush()
            total = sum(v[1] for v in per.values()) / STEPS / 1e3
            print(f"{model} {precision} b={batch}: step {step_ms:.1f} ms, kernels {total:.1f} ms", flush=True)
            torch.cuda.empty_cache()
    return 0


def score(path: Path, archive: Path = devicecli.ARCHIVE, gpu_key: str = "H100-SXM") -> int:
    import json

    import ops_validation as ov

    from predictor.catalog.gpus import get_gpu
    from predictor.documents.profile import load_profile
    from predictor.model import kernels, ops

    csv_path = path if path.is_file() else path / "kernels.csv"
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    kernels.load_kernel_model = lambda: ov.kernel_model(("H100-SXM",), str(ROOT.parent / "shared" / "data" / "kernels"))
    folds = json.loads((ROOT / "bench" / "results" / "ops_validation.json").read_text())
    eff = {r["model"]: r["efficiency"] for r in folds["absolute"]["rows"]}
    gpu = get_gpu(gpu_key)
    with devicecli.unpacked(archive) as folder:  # the tables the callback recorded on the same GPU
        profiles = {c: load_profile(folder / f"{c[0].split()[0]}-{c[1]}-{c[2]}.json") for c in CASES}
    # the model's names for the classes this script names otherwise (cuDNN's layout conversions are copies here)
    model_cls = {"memory": "copy", "layout": "copy", "pooling": "pool", "batch_norm": "norm"}
    for model, precision, batch in CASES:
        mine = [r for r in rows if (r["model"], r["precision"], int(r["batch"])) == (model, precision, batch)]
        if not mine:
            continue
        steps = int(mine[0]["steps"])
        measured: dict[str, float] = defaultdict(float)
        for r in mine:
            measured[classify(r["kernel"])] += float(r["gpu_us"]) / steps / 1e3
        prof = profiles[(model, precision, batch)]
        ops.tensor_core_efficiency = lambda kind, path="ratio", m=model: eff[m][kind]
        classified = ops.classify_table(prof.ops.ops)
        t = ops.ops_time(classified, gpu, precision, "high", "absolute", "fa2")
        predicted: dict[str, float] = defaultdict(float)
        for cls, sec in t.by_class.items():
            predicted[model_cls.get(cls, cls)] += sec * 1e3
        print(f"\n{model} {precision} b={batch}: step {float(mine[0]['step_ms']):.1f} ms, GPU kernels "
              f"{sum(measured.values()):.1f} ms; model {t.seconds * 1e3:.1f} ms (its fused attention in its gemm "
              "and elementwise)")  # fmt: skip
        for cls in sorted(set(measured) | set(predicted), key=lambda c: -measured.get(c, 0.0)):
            print(f"  {cls:12s} measured {measured.get(cls, 0.0):7.1f} ms   model {predicted.get(cls, 0.0):7.1f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    def score_options(s) -> None:
        s.add_argument("--profiles", type=Path, default=devicecli.ARCHIVE, help="the same GPU's profiles (archive)")
        s.add_argument("--gpu", default="H100-SXM", help="the catalog key of the GPU the kernels ran on")

    args = devicecli.parse(__doc__ or "", argv, 90.0, score_options=score_options)
    if args.cmd == "measure":
        return measure(args.out, args.budget_s)
    return score(args.path, args.profiles, args.gpu)


if __name__ == "__main__":
    sys.exit(main())
