"""A convolutional network's kernels timed one by one on a lent GPU: batch norm, cuDNN's layout conversions, pooling and
the convolution's algorithm, over shapes, dtypes and both memory formats (issue #40 item 2).

    python bench/cnn_kernels.py measure --out DIR [--budget-s 90]   # on a CUDA machine
    python bench/cnn_kernels.py score DIR|ARCHIVE                    # here, no GPU

``measure``: every case is one operator of ResNet-50 / VGG (the layers' own shapes at a per-GPU batch of 32 and 128),
built as a Lightning user's model runs it: ``nn.BatchNorm2d`` / ``nn.Conv2d`` in FP32 with the input in the step's
dtype (AMP's autocast for 16-bit), NCHW or ``channels_last``, PyTorch's defaults (``cudnn.benchmark`` off, cuDNN TF32
on) unless the case says otherwise (``fp32-strict``: TF32 off; ``bench``: ``cudnn.benchmark`` on). Forward and
backward are timed apart with CUDA events (the median of up to 20 after two warm-ups), then one forward + backward
runs under torch's profiler, split at a marker kernel (``torch.cuda._sleep``), so each kernel cuDNN chose (and every
layout conversion it inserted) is recorded with its phase and GPU time. Writes ``DIR/cases.csv`` (one row a case)
and ``DIR/kernels.csv`` (one row a case, phase and kernel). Rows are flushed as they are timed: a stage cut off by
its limit keeps what it did. ``--device cpu`` runs the same code on the CPU (wall clock, no kernels): a dry run of
the script, not a measurement.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import devicecli  # noqa: E402

# ResNet-50 v1.5's layers (channels in, channels out, kernel, stride, input side) and VGG-16's 3x3 convolutions
RESNET_CONVS = (
    (3, 64, 7, 2, 224),
    (64, 64, 1, 1, 56),
    (64, 64, 3, 1, 56),
    (64, 256, 1, 1, 56),
    (256, 64, 1, 1, 56),
    (128, 128, 3, 2, 56),
    (512, 128, 1, 1, 28),
    (128, 128, 3, 1, 28),
    (256, 256, 3, 1, 14),
    (1024, 256, 1, 1, 14),
    (256, 1024, 1, 1, 14),
    (512, 512, 3, 1, 7),
    (2048, 512, 1, 1, 7),
    (512, 2048, 1, 1, 7),
)
VGG_CONVS = ((64, 64, 3, 1, 224), (256, 256, 3, 1, 56), (512, 512, 3, 1, 28))
# (channels, side) of ResNet-50's batch norms (every distinct one) and two of VGG-16-BN's
NORMS = ((64, 112), (64, 56), (256, 56), (128, 28), (512, 28), (256, 14), (1024, 14), (512, 7), (2048, 7), (64, 224))
DTYPES = ("fp32", "fp16", "bf16")
LAYOUTS = ("nchw", "nhwc")
FIELDS = ("case", "kind", "dtype", "layout", "batch", "cin", "cout", "kernel", "stride", "side", "mode",
          "fwd_ms", "bwd_ms", "reps", "error", "device")  # fmt: skip


def cases() -> Iterator[dict]:
    """The cases, the most informative first (batch norm and the conversions, then pooling, then convolutions), so a
    budget cut keeps whole groups."""
    for batch in (128, 32):
        for c, side in NORMS:
            if batch == 32 and side == 224:
                continue
            for dtype in DTYPES:
                for layout in LAYOUTS:
                    yield {"kind": "batch_norm", "dtype": dtype, "layout": layout, "batch": batch, "cin": c,
                           "cout": c, "side": side}  # fmt: skip
    for c, side in NORMS[:9]:
        for dtype in ("fp32", "fp16"):
            yield {"kind": "to_nhwc", "dtype": dtype, "layout": "nchw", "batch": 128, "cin": c, "cout": c, "side": side}
            yield {"kind": "to_nchw", "dtype": dtype, "layout": "nhwc", "batch": 128, "cin": c, "cout": c, "side": side}
    for batch in (128, 32):
        for dtype in ("fp32", "fp16"):
            for layout in LAYOUTS:
                yield {"kind": "max_pool", "dtype": dtype, "layout": layout, "batch": batch, "cin": 64, "cout": 64,
                       "kernel": 3, "stride": 2, "side": 112}  # fmt: skip
                for c, side in ((64, 224), (256, 56), (512, 14)):
                    yield {"kind": "max_pool", "dtype": dtype, "layout": layout, "batch": batch, "cin": c, "cout": c,
                           "kernel": 2, "stride": 2, "side": side}  # fmt: skip
                yield {"kind": "adaptive_avg_pool", "dtype": dtype, "layout": layout, "batch": batch, "cin": 2048,
                       "cout": 2048, "kernel": 7, "stride": 1, "side": 7}  # fmt: skip
    for mode in ("default", "bench"):
        for dtype in ("fp16", "fp32", "bf16", "fp32-strict"):
            for layout in LAYOUTS:
                for cin, cout, k, s, side in RESNET_CONVS + VGG_CONVS:
                    batch = 32 if side == 224 and cin > 3 else 64
                    yield {"kind": "conv", "dtype": dtype, "layout": layout, "batch": batch, "cin": cin, "cout": cout,
                           "kernel": k, "stride": s, "side": side, "mode": mode}  # fmt: skip


class Device:
    """CUDA events (and the profiler's CUDA kernels) on a GPU; the wall clock on the CPU (a dry run)."""

    def __init__(self, name: str) -> None:
        import torch

        self.torch, self.name, self.cuda = torch, name, name == "cuda"

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed_ms(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def marker(self) -> None:
        if self.cuda:
            self.torch.cuda._sleep(1000)

    def label(self) -> str:
        if self.cuda:
            return self.torch.cuda.get_device_name()
        return "cpu (dry run)"


def build(case: dict, dev: Device) -> tuple[Callable, Callable]:
    """(forward, backward) of one case: forward returns the output; backward takes it and runs the gradient."""
    import torch
    import torch.nn.functional as F

    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(case["dtype"])
    fmt = torch.channels_last if case["layout"] == "nhwc" else torch.contiguous_format
    n, cin, side = case["batch"], case["cin"], case["side"]
    x = torch.randn(n, cin, side, side, device=dev.name, dtype=half or torch.float32)
    x = x.contiguous(memory_format=fmt).requires_grad_(True)
    kind = case["kind"]
    if kind in ("to_nhwc", "to_nchw"):
        target = torch.channels_last if kind == "to_nhwc" else torch.contiguous_format

        def fwd():
            return x.contiguous(memory_format=target)
    elif kind == "batch_norm":
        bn = torch.nn.BatchNorm2d(cin).to(dev.name, memory_format=fmt)

        def fwd():
            return bn(x)
    elif kind == "max_pool":
        k, s = case["kernel"], case["stride"]

        def fwd():
            return F.max_pool2d(x, k, s, k // 2 if k == 3 else 0)
    elif kind == "adaptive_avg_pool":

        def fwd():
            return F.adaptive_avg_pool2d(x, 1)
    elif kind == "conv":
        conv = torch.nn.Conv2d(cin, case["cout"], case["kernel"], case["stride"], case["kernel"] // 2, bias=False)
        conv = conv.to(dev.name, memory_format=fmt)
        x = x.detach().float().contiguous(memory_format=fmt).requires_grad_(True) if half else x

        def fwd():
            with torch.autocast(dev.name, dtype=half or torch.float32, enabled=half is not None):
                return conv(x)
    else:
        raise ValueError(f"unknown case kind {kind!r}")
    grads: dict[tuple, torch.Tensor] = {}

    def bwd(y):
        key = (tuple(y.shape), y.dtype, y.is_contiguous(memory_format=torch.channels_last))
        if key not in grads:
            grads[key] = torch.randn_like(y)
        y.backward(grads[key])

    return fwd, bwd


def time_case(case: dict, dev: Device, reps: int = 20) -> tuple[float, float, int]:
    import torch

    fwd, bwd = build(case, dev)
    torch.backends.cudnn.benchmark = case.get("mode") == "bench"
    tf32 = case["dtype"] != "fp32-strict"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    for _ in range(2):
        bwd(fwd())
    dev.sync()
    f_ms, b_ms = [], []
    spent = 0.0
    for i in range(reps):
        a = dev.mark()
        y = fwd()
        b = dev.mark()
        bwd(y)
        c = dev.mark()
        f_ms.append(dev.elapsed_ms(a, b))
        b_ms.append(dev.elapsed_ms(b, c))
        spent += f_ms[-1] + b_ms[-1]
        if spent > 150 and i >= 2:  # long cases: fewer repetitions
            break
    return statistics.median(f_ms), statistics.median(b_ms), len(f_ms)


def kernels_of(case: dict, dev: Device) -> list[tuple[str, str, float]]:
    """(phase, kernel, GPU us) of one profiled forward + backward, in launch order (CUDA only)."""
    import torch

    if not dev.cuda:
        return []
    fwd, bwd = build(case, dev)
    bwd(fwd())
    dev.sync()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y = fwd()
        dev.marker()
        bwd(y)
        dev.sync()
    events = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    out, phase = [], "fwd"
    for e in events:
        if "spin_kernel" in e.name or "sleep" in e.name.lower():
            phase = "bwd"
            continue
        out.append((phase, e.name[:300], float(e.device_time)))
    return out


def measure(out: Path, budget_s: float, device: str = "cuda", cap: int = 0) -> int:
    import torch

    dev = Device(device)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    label = dev.label()
    cudnn = torch.backends.cudnn.version() if dev.cuda else None
    print(f"{label}; torch {torch.__version__}; cuDNN {cudnn}", flush=True)
    done = 0
    with (out / "cases.csv").open("w", newline="") as fc, (out / "kernels.csv").open("w", newline="") as fk:
        cw, kw = csv.writer(fc), csv.writer(fk)
        cw.writerow(FIELDS)
        kw.writerow(("case", "phase", "kernel", "gpu_us"))
        fc.write(f"# torch {torch.__version__}, cuDNN {cudnn}\n")
        for i, case in enumerate(cases()):
            if time.perf_counter() - started > budget_s:
                print(f"budget spent after {done} cases", flush=True)
                break
            if cap:  # the dry run's small tensors
                case = {**case, "batch": min(case["batch"], cap), "side": min(case["side"], 4 * cap)}
            row = {"case": i, "mode": "default", "kernel": "", "stride": "", "device": label, **case}
            try:
                f_ms, b_ms, reps = time_case(case, dev)
                row.update(fwd_ms=f"{f_ms:.5g}", bwd_ms=f"{b_ms:.5g}", reps=reps, error="")
                for phase, name, us in kernels_of(case, dev):
                    kw.writerow((i, phase, name, f"{us:.2f}"))
            except Exception as exc:  # noqa: BLE001 -- one case failing (out of memory, say) does not stop the rest
                row.update(fwd_ms="", bwd_ms="", reps=0, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            cw.writerow([row.get(f, "") for f in FIELDS])
            fc.flush()
            fk.flush()
            done += 1
            if dev.cuda:
                torch.cuda.empty_cache()
    print(f"{done} cases in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    def measure_options(m) -> None:
        m.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the script")
        m.add_argument("--cap", type=int, default=0, help="dry run: batch at most this, sides at most 4x it")

    def score_options(s) -> None:
        s.add_argument("--gpu", default="H200-SXM", help="the catalog key of the GPU the cases ran on")

    args = devicecli.parse(__doc__ or "", argv, 90.0, measure_options, score_options)
    if args.cmd == "measure":
        return measure(args.out, args.budget_s, args.device, args.cap)
    return score(args.path, args.gpu)


# a measured kernel's class, as the model names them: cuDNN's layout conversions by name, the rest as the step's
# breakdown sorts them (bench/kernel_breakdown.py)
LAYOUT = re.compile(r"nchwtonhwc|nhwctonchw", re.I)
MODEL_CLASS = {"norm": "batch_norm", "pool": "pooling", "copy": "memory", "layout": "layout", "conv": "conv"}
# the classes each kind of case is scored on (the rest are the harness's own kernels: the loss, x.grad's sum)
SCORED = {
    "batch_norm": ("batch_norm",),
    "to_nhwc": ("memory",),
    "to_nchw": ("memory",),
    "max_pool": ("pooling",),
    "adaptive_avg_pool": ("reduction",),  # a mean over H x W: ATen's reduce kernel, a reduction to the model too
    "conv": ("conv", "layout"),
}
PRECISION = {"fp32": "32-true", "fp32-strict": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def read(folder: Path) -> tuple[list[dict], dict[str, dict[str, float]], str]:
    """The cases, each case's measured GPU ms per model class (both phases), and the header's versions."""
    import kernel_breakdown as kb

    lines = (folder / "cases.csv").read_text().splitlines()
    versions = next((ln.lstrip("# ") for ln in lines if ln.startswith("#")), "")
    cases_ = [r for r in csv.DictReader(ln for ln in lines if not ln.startswith("#")) if not r["error"]]
    measured: dict[str, dict[str, float]] = {}
    with (folder / "kernels.csv").open() as fh:
        for r in csv.DictReader(fh):
            if r["phase"] == "bwd" and "CUDAFunctor_add" in r["kernel"]:
                continue  # the harness's x.grad accumulating over repetitions
            cls = "layout" if LAYOUT.search(r["kernel"]) else kb.classify(r["kernel"])
            cls = MODEL_CLASS.get(cls, cls)
            per = measured.setdefault(r["case"], {})
            per[cls] = per.get(cls, 0.0) + float(r["gpu_us"]) / 1e3
    return cases_, measured, versions


def modelled(case: dict, gpu_key: str) -> dict[str, float]:
    """The operator model's ms per class for the case's operator, captured on the meta device as the product
    captures a user's step (one forward and backward; the loss's and the optimizer's records left out)."""
    import torch

    from lightning_srifty import capture_ops
    from predictor.catalog.gpus import get_gpu
    from predictor.documents.profile import profile_from_dict
    from predictor.documents.schema import to_dict
    from predictor.model import ops

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            kind, cin = case["kind"], int(case["cin"])
            self.kind = kind
            if kind == "batch_norm":
                self.op = torch.nn.BatchNorm2d(cin)
            elif kind == "conv":
                k, s = int(case["kernel"]), int(case["stride"])
                self.op = torch.nn.Conv2d(cin, int(case["cout"]), k, s, k // 2, bias=False)
            else:
                self.op = None
            # the batch needs no gradient, an activation does: a scale makes the input one (an elementwise record,
            # not in the classes scored), as the harness's input with requires_grad
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            x = x * self.w.to(x.dtype)
            if self.kind == "to_nhwc":
                y = x.contiguous(memory_format=torch.channels_last)
            elif self.kind == "to_nchw":
                y = x.contiguous()
            elif self.kind == "max_pool":
                k, s = int(case["kernel"]), int(case["stride"])
                y = torch.nn.functional.max_pool2d(x, k, s, k // 2 if k == 3 else 0)
            elif self.kind == "adaptive_avg_pool":
                y = torch.nn.functional.adaptive_avg_pool2d(x, 1)
            else:
                y = self.op(x)
            return y.float().square().sum()  # its gradient (2y) keeps y's layout, as a next layer's does

    n, cin, side = int(case["batch"]), int(case["cin"]), int(case["side"])
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(case["dtype"])
    dtype = half if half is not None and case["kind"] != "conv" else torch.float32
    x = torch.zeros(n, cin, side, side, dtype=dtype, requires_grad=True)
    net = One()
    if case["layout"] == "nhwc":
        x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_(True)
        net = net.to(memory_format=torch.channels_last)
    table = capture_ops(net, x, precision=PRECISION[case["dtype"]], optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    prof = profile_from_dict({
        "schema": "srifty.profile/v1",
        "model": {"name": "one-op", "parameters": 1, "precision": PRECISION[case["dtype"]]},
        "batch": {"per_device": n},
        "hardware": {"devices": 1, "accelerator": "meta"},
        "timing": {"step_time_s": {"p50": 0.0}},
        "ops": to_dict(table),
    })  # fmt: skip
    classified = [c for c in ops.classify_table(prof.ops.ops) if c.phase != "optimizer"]
    matmul = "highest" if case["dtype"] == "fp32-strict" else "high"
    t = ops.ops_time(classified, get_gpu(gpu_key), PRECISION[case["dtype"]], matmul, "absolute", "fa2")
    return {cls: sec * 1e3 for cls, sec in t.by_class.items()}


def score(path: Path, gpu_key: str = "H200-SXM") -> int:
    """Each case's measured GPU time per class against the operator model's, on the GPU timed (not fitted on)."""
    import numpy as np

    with devicecli.unpacked(path) as folder:
        cases_, measured, versions = read(folder)
    print(f"{cases_[0]['device']}; {versions}; {len(cases_)} cases; model: as it ships, on {gpu_key}")
    rows = []
    for c in cases_:
        if c["kind"] == "conv" and c["mode"] == "bench":
            continue  # cudnn.benchmark's choices: reported beside, not scored (the model prices the default's)
        got = measured.get(c["case"], {})
        want = modelled(c, gpu_key)
        for cls in SCORED[c["kind"]]:
            m, p = got.get(cls, 0.0), want.get(cls, 0.0)
            rows.append({**c, "cls": cls, "measured_ms": m, "model_ms": p})
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kind"], r["cls"], r["dtype"], r["layout"]), []).append(r)
    print("kind | class | dtype | layout | cases | measured ms (sum) | model ms (sum) | model/measured (sum) | "
          "median ratio | time-weighted error")  # fmt: skip
    for (kind, cls, dtype, layout), rs in sorted(groups.items()):
        m = np.array([r["measured_ms"] for r in rs])
        p = np.array([r["model_ms"] for r in rs])
        ok = m > 0
        ratio = float(np.median(p[ok] / m[ok])) if ok.any() else float("nan")
        err = float(np.sum(np.abs(p - m)) / np.sum(m)) if m.sum() > 0 else float("nan")
        print(f"{kind} | {cls} | {dtype} | {layout} | {len(rs)} | {m.sum():.2f} | {p.sum():.2f} | "
              f"{p.sum() / max(m.sum(), 1e-9):.2f} | {ratio:.2f} | {err:.1%}")  # fmt: skip
    out = ROOT / "bench" / "results" / "cnn_kernels_score.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"rows: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
