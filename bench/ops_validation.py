"""End-to-end validation of the operator path on published measurements, with operator tables captured on the meta
device from the real architectures (transformers configurations: no weights, no downloads).

    python bench/ops_validation.py [--data ../shared/data/kernels]

Models with a published architecture and a per-sample unit in the Lambda figures: ResNet-50 (224 px, SGD), BERT-base
and BERT-large SQuAD fine-tuning (384 tokens, AdamW), FP32 and AMP, one GPU. For every pair of measured GPUs:
- **ratio** (a profile measured on the source GPU, with its operator table): the measured time x the ratio of the
  operator sums, target / source;
- **absolute** (a capture-only profile, no GPU at all): the operator sum on the target.
Leave-one-GPU-out: the kernel model that predicts a case is trained without every NeuSight GPU of the same chip as
either GPU of the case (GA100, GV100, GH100). The tensor-core efficiency (AMP, TF32 convolutions) is fitted
leave-one-model-out: on the other models' cases only; one the model ships at its bound (``AT_BOUND``: the absolute
path's 16-bit efficiency) is held there in every fold too, so the folds score the model as it ships (until
2026-11-28 they fitted it, and the absolute figures were of a model that did not ship). Writes
bench/results/ops_validation.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from predictor.validation import Point, load_points  # noqa: E402

MODELS = ("ResNet-50", "BERT-base finetune-SQuAD", "BERT-large finetune-SQuAD")
# measurement GPU key -> the chip's NeuSight kernel devices (excluded from the kernel model that predicts it)
CHIP = {
    "H100-SXM": ("H100-SXM",),
    "H100-PCIe": ("H100-SXM",),
    "A100-SXM-80GB": ("A100-PCIe-80GB", "A100-PCIe-40GB"),
    "A100-PCIe-80GB": ("A100-PCIe-80GB", "A100-PCIe-40GB"),
    "A100-PCIe-40GB": ("A100-PCIe-80GB", "A100-PCIe-40GB"),
    "V100-SXM2-16GB": ("V100-PCIe-32GB",),
    "A10": (),
}
TABLES = ROOT / "bench" / "results" / "tables"
# Constants that ship at their physical bound (1.0: no tensor-core loss beyond the FP32-learned utilisation) instead
# of the fit on these models: the fit failed its validation in another regime. The absolute path's 16-bit efficiency
# fitted here (0.7, on BERT and ResNet-50 AMP, one GPU) put the MPT FSDP set (bench/mpt_fsdp.py, bf16 on 8-512 GPUs,
# never fitted on) at 19.8 % MAPE and 0.81 x the measured throughput, against 8.7 % at the bound (2026-11-25).
AT_BOUND = {
    "absolute": {
        "half": "the fit on these models (0.7) failed on the MPT FSDP set (19.8 % vs 8.7 % at 1.0); bound kept"
    }
}
# Constants held at a shipped value rather than fitted here, with why. Since 2026-11-29 16-bit GEMMs are priced by
# waves at measured ceilings (predictor/model/tensor_gemm.py), and since 2026-11-29 (issue #40) tensor-core
# convolutions too, as implicit GEMMs: the 16-bit efficiency acts only on GPUs the wave model cannot price (no SM
# count or bandwidth in the catalog, or no tensor cores), none of which is in these sets, so it is not fitted here.
HELD = {
    "ratio": {
        "half": (0.85, "acts on no GPU of these sets since convolutions are implicit GEMMs (issue #40): not fitted")
    }
}


def held_value(kind: str, name: str) -> float | None:
    """The value a constant is held at on ``kind`` (1.0 at its bound, or HELD's), None when it is fitted."""
    if name in AT_BOUND.get(kind, {}):
        return 1.0
    return HELD.get(kind, {}).get(name, (None, ""))[0]


def build(model: str):
    import torch
    from transformers import BertConfig, BertForQuestionAnswering, ResNetConfig, ResNetForImageClassification

    if model == "ResNet-50":
        net = ResNetForImageClassification(ResNetConfig(num_labels=1000))
        return (
            net,
            lambda b: {
                "pixel_values": torch.randn(b, 3, 224, 224),
                "labels": torch.randint(0, 1000, (b,)),
            },
            functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
        )
    large = "large" in model
    config = BertConfig(
        hidden_size=1024 if large else 768,
        num_hidden_layers=24 if large else 12,
        num_attention_heads=16 if large else 12,
        intermediate_size=4096 if large else 3072,
    )
    net = BertForQuestionAnswering(config)
    return (
        net,
        lambda b: {
            "input_ids": torch.randint(0, 30522, (b, 384)),
            "attention_mask": torch.ones(b, 384, dtype=torch.long),
            "start_positions": torch.randint(0, 384, (b,)),
            "end_positions": torch.randint(0, 384, (b,)),
        },
        functools.partial(torch.optim.AdamW, lr=3e-5),
    )


def table_for(model: str, precision: str, batch: int) -> dict:
    """The operator table of one step (cached in bench/results/tables)."""
    path = TABLES / f"{model.split()[0]}-{precision}-{batch}.json"
    if path.exists():
        return json.loads(path.read_text())
    from lightning_srifty import capture_ops
    from predictor.documents.schema import to_dict

    t = time.perf_counter()
    net, make_batch, optimizer = build(model)
    table = capture_ops(net, make_batch(batch), precision=precision, device="meta", optimizer=optimizer)
    data = to_dict(table)
    TABLES.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    print(f"  captured {model} {precision} b={batch}: {len(data['ops'])} records, {time.perf_counter() - t:.1f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return data


@functools.cache
def kernel_model(excluded: tuple[str, ...], folder: str):
    import train_kernel_model as tk

    from predictor.model.kernels import KernelModel

    name = f"without-{'+'.join(excluded) or 'nothing'}.v{tk.SCRIPT_VERSION}.json"  # a new script version retrains
    cache = ROOT / "bench" / "results" / "kernel_models" / name
    if cache.exists():  # a re-run reuses the held-out models (same script, same seeds)
        return KernelModel.from_json(json.loads(cache.read_text()))
    t = time.perf_counter()
    model = tk.train(Path(folder), set(excluded))
    print(f"  kernel model without {excluded or 'nothing'}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(model.to_json()))
    return model


def points() -> list[Point]:
    out = []
    for p in load_points(ROOT / "predictor" / "data" / "measurements.csv"):
        if p.source == "lambdal" and p.model in MODELS and p.gpus == 1 and p.gpu in CHIP:
            out.append(p)
    return out


def profile(model: str, p: Point, table: dict, timed: bool, gpu: str | None):
    from predictor.documents.profile import profile_from_dict

    return profile_from_dict(
        {
            "schema": "srifty.profile/v1",
            # Lambda ran NVIDIA's scripts in NGC containers, which enable TF32 for fp32 matmuls on Ampere and newer
            # (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1; PyTorch 1.7-1.11 did by default): what the callback records then
            "model": {
                "name": model,
                "parameters": 25_000_000,
                "precision": p.precision,
                "float32_matmul_precision": "high",
            },
            "batch": {"per_device": table["samples"]},
            "hardware": {"gpu": gpu, "devices": 1, "accelerator": "cuda" if gpu else "meta"},
            "timing": {"step_time_s": {"p50": (table["samples"] / p.throughput) if timed else 0.0, "cv": p.cv}},
            "ops": table,
        }
    )


def predict_case(src: Point | None, dst: Point, table: dict, efficiency: dict, folder: str) -> float:
    """Predicted throughput of ``dst`` (ratio from ``src``, or absolute when ``src`` is None)."""
    from predictor.model import kernels, ops
    from predictor.model.predict import predict
    from predictor.validation import case_catalog

    excluded = tuple(sorted(set(CHIP[dst.gpu]) | (set(CHIP[src.gpu]) if src else set())))
    kernels.load_kernel_model = lambda: kernel_model(excluded, folder)  # the held-out kernel model
    ops.tensor_core_efficiency = lambda kind, path="ratio": efficiency[kind]  # the fold's, on either path
    from predictor.validation import Case

    catalog = case_catalog([Case("cross", dst.model, dst, dst)])
    prof = profile(dst.model, src or dst, table, src is not None, src.gpu if src else None)
    r = predict(prof, f"bench-{dst.gpu}-x1-pcie:1", catalog=catalog, layout="ddp")
    return r.throughput_samples_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "kernels"))
    parser.add_argument(
        "--write-artefact",
        action="store_true",
        help="also fit the tensor-core efficiencies on every model's cases and write them into model_v3.json",
    )
    parser.add_argument("--plot-only", action="store_true", help="redraw the figure from the last results")
    parser.add_argument(
        "--fit-only", action="store_true", help="with --write-artefact: keep the last validation, only fit and write"
    )
    args = parser.parse_args()
    out = ROOT / "bench" / "results" / "ops_validation.json"
    if args.plot_only:
        plot(json.loads(out.read_text()), ROOT / "docs" / "img" / "ops_validation.png")
        return 0
    pts = points()
    tables = {(p.model, p.precision, p.batch): table_for(p.model, p.precision, p.batch) for p in pts}
    by_key: dict[tuple, list[Point]] = defaultdict(list)
    for p in pts:
        by_key[(p.model, p.precision)].append(p)
    grid = (0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0)

    def cases_of(models, kind):
        out = []
        for (model, _precision), group in by_key.items():
            if model not in models:
                continue
            for dst in group:
                srcs = [s for s in group if s.gpu != dst.gpu] if kind == "ratio" else [None]
                out += [(s, dst) for s in srcs]
        return out

    def errors(cases, efficiency):
        return [
            math.log(predict_case(s, d, tables[(d.model, d.precision, d.batch)], efficiency, args.data) / d.throughput)
            for s, d in cases
        ]

    result: dict[str, dict] = json.loads(out.read_text()) if args.fit_only else {}
    for kind in () if args.fit_only else ("ratio", "absolute"):
        rows = []
        for held in MODELS:
            train = cases_of([m for m in MODELS if m != held], kind)
            eff = {"half": 1.0, "tf32": 1.0}
            for name in ("half", "tf32"):
                if (fixed := held_value(kind, name)) is not None:
                    eff[name] = fixed  # shipped at its bound or held, not fitted: the folds score the model as it ships
                    continue
                eff[name] = min(
                    grid, key=lambda v, n=name: statistics.fmean(abs(e) for e in errors(train, {**eff, n: v}))
                )
            test = cases_of([held], kind)
            for (s, d), e in zip(test, errors(test, eff)):
                rows.append({"model": held, "src": s.gpu if s else None, "dst": d.gpu, "precision": d.precision,
                             "ape": abs(math.exp(e) - 1), "log_residual": e, "efficiency": eff})  # fmt: skip
            print(f"{kind} {held}: efficiency {eff}", file=sys.stderr, flush=True)
        apes = [r["ape"] for r in rows]
        result[kind] = {"cases": len(rows), "mape": statistics.fmean(apes), "median_ape": statistics.median(apes),
                        "rows": rows}  # fmt: skip
        per_model = defaultdict(list)
        for r in rows:
            per_model[(r["model"], r["precision"])].append(r["ape"])
        print(f"\n{kind}: {len(rows)} cases, MAPE {result[kind]['mape']:.1%}")
        for key, v in sorted(per_model.items()):
            print(f"  {key[0]} {key[1]}: {statistics.fmean(v):.1%} over {len(v)}")
    if args.write_artefact:  # the shipped constants: per path, fitted on every model's cases (nothing held out)
        from predictor.documents.atomic import atomic_write_json

        shipped: dict[str, Any] = {"fitted_by": "bench/ops_validation.py --write-artefact"}
        for kind in ("ratio", "absolute"):
            every = cases_of(list(MODELS), kind)
            eff = {"half": 1.0, "tf32": 1.0}
            for name in ("half", "tf32"):
                if (fixed := held_value(kind, name)) is not None:
                    eff[name] = fixed
                    continue
                eff[name] = min(
                    grid, key=lambda v, n=name: statistics.fmean(abs(e) for e in errors(every, {**eff, n: v}))
                )
            shipped[kind] = eff | {"cases": len(every)}
            if kind in AT_BOUND:
                shipped[kind]["at_bound"] = AT_BOUND[kind]
            if kind in HELD:
                shipped[kind]["held"] = {name: why for name, (_, why) in HELD[kind].items()}
        path = ROOT / "predictor" / "data" / "model_v3.json"
        artefact = json.loads(path.read_text())
        artefact["tensor_core"] = shipped
        atomic_write_json(path, artefact)
        result["shipped_tensor_core"] = shipped
        print(f"wrote tensor-core efficiencies {shipped} into {path}")
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    plot(result, ROOT / "docs" / "img" / "ops_validation.png")
    return 0


def plot(result: dict, png: Path) -> None:
    """Predicted / measured per held-out GPU: one panel per path (ratio from another GPU, absolute from meta)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in ("ratio", "absolute") if k in result]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.6), squeeze=False)
    markers = {"32-true": "o", "16-mixed": "^"}
    for ax, kind in zip(axes[0], kinds, strict=True):
        gpus = sorted({r["dst"] for r in result[kind]["rows"]})
        for i, gpu in enumerate(gpus):
            for prec, marker in markers.items():
                ys = [math.exp(r["log_residual"]) for r in result[kind]["rows"] if r["dst"] == gpu
                      and r["precision"] == prec]  # fmt: skip
                xs = [i + (0.12 if prec == "16-mixed" else -0.12)] * len(ys)
                ax.plot(xs, ys, marker, ls="", alpha=0.6, color=f"C{i}", label=f"{prec}" if i == 0 else None)
        ax.axhline(1.0, color="k", lw=0.8)
        for band in (0.9, 1.1):
            ax.axhline(band, color="k", lw=0.5, ls=":")
        ax.set_yscale("log")
        ax.set_xticks(range(len(gpus)), gpus, rotation=20, fontsize=8)
        title = "ratio from a measured GPU" if kind == "ratio" else "absolute, meta-device capture only"
        ax.set(title=f"{title}: MAPE {result[kind]['mape']:.1%}", ylabel="predicted / measured throughput")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    raise SystemExit(main())
