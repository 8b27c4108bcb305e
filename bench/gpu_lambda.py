"""The Lambda models trained for real on a lent GPU: the product's profile of a measured step, then the ratio path
from that profile to every other GPU Lambda measured, and the absolute path against the step measured here.

    python bench/gpu_lambda.py measure --out DIR [--budget-s 240]   # on a CUDA machine (needs transformers)
    python bench/gpu_lambda.py score DIR|ARCHIVE                      # here, no GPU
    python bench/gpu_lambda.py score bench/data/h100_profiles_2026-11-27.tar.xz  # the H100 session's, 2026-11-27

``measure``: for every (model, precision, per-GPU batch) of the Lambda single-GPU set (``bench/ops_validation.py``'s
points: ResNet-50, BERT-base and BERT-large SQuAD; FP32 with TF32 matmuls as NGC ran them, and AMP), a Lightning
``fit`` on the GPU with ``SriftyCallback`` (CUDA-event clock, operator table recorded by the callback, no plan): the
profile JSON a user's run writes, one per case, plus a wall-clock cross-check of the CUDA-event step (synchronised
``perf_counter`` around the profiled window). The batch is made on the GPU once and fed again (no loader cost).

``score``: each measured profile predicts the Lambda points of the same model, precision and batch on the other GPUs
(ratio path, the real measured step and operator table; kernel model leave-one-chip-out as in ops_validation, the
tensor-core efficiencies of the leave-one-model-out fold), and the measured step on the lent GPU is compared with
(a) Lambda's published figure for the same GPU model (software drift: NGC PyTorch 1.x then, today's PyTorch here) and
(b) the absolute path (the meta-device capture, no GPU). Writes ``bench/results/gpu_lambda_score.json`` and prints
the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import devicecli  # noqa: E402

WARMUP, PROFILE = 5, 10


def cases() -> list[tuple[str, str, int]]:
    import ops_validation as ov

    every = sorted({(p.model, p.precision, p.batch) for p in ov.points()}, key=lambda c: (c[0], c[1], -c[2]))
    largest = {}  # the largest batch of each model and precision first (the H100's: Lambda's same-GPU figure)
    for c in every:
        largest.setdefault(c[:2], c)
    return list(largest.values()) + [c for c in every if c not in largest.values()]


def measure(out: Path, budget_s: float, accelerator: str = "cuda", only: str = "", batch_cap: int = 0) -> int:
    import lightning.pytorch as pl
    import ops_validation as ov
    import torch

    from lightning_srifty import SriftyCallback

    out.mkdir(parents=True, exist_ok=True)
    torch.set_float32_matmul_precision("high")  # NGC's TF32 for FP32 matmuls (ops_validation.profile says why)
    started = time.perf_counter()
    cuda = accelerator == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    log = (out / "measure.jsonl").open("a")
    built: dict[str, tuple] = {}
    seen: set[tuple[str, str, int]] = set()

    class Step(pl.LightningModule):
        def __init__(self, net, optimizer) -> None:
            super().__init__()
            self.net, self.optimizer = net, optimizer

        def training_step(self, batch, batch_idx):
            return self.net(**batch).loss

        def configure_optimizers(self):
            return self.optimizer(self.net.parameters())

    class Feed(torch.utils.data.IterableDataset):
        def __init__(self, batch) -> None:
            self.batch = batch

        def __iter__(self):
            while True:
                yield self.batch

    class WallClock(pl.Callback):  # synchronised perf_counter at the window's ends: checks the CUDA-event clock
        def __init__(self) -> None:
            self.t: dict[str, float] = {}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == WARMUP:
                sync()
                self.t["start"] = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == WARMUP + PROFILE - 1:
                sync()
                self.t["end"] = time.perf_counter()

    for model, precision, batch in cases():
        if only and only not in f"{model} {precision}":
            continue
        batch = min(batch, batch_cap) if batch_cap else batch
        if (model, precision, batch) in seen:  # a cap folds several cases into one
            continue
        seen.add((model, precision, batch))
        if time.perf_counter() - started > budget_s:
            print(f"budget spent: {model} {precision} b={batch} and after not measured", flush=True)
            break
        name = f"{model.split()[0]}-{precision}-{batch}"
        try:
            if model not in built:  # kept on the device across cases (weights only: a case's optimizer goes with it)
                net, make_batch, optimizer = ov.build(model)
                built[model] = (net.to(accelerator), make_batch, optimizer)
            net, make_batch, optimizer = built[model]
            data = {k: v.to(accelerator) for k, v in make_batch(batch).items()}
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            wall = WallClock()
            cb = SriftyCallback(
                warmup_steps=WARMUP,
                profile_steps=PROFILE,
                output=out / f"{name}.json",
                recommend=False,
                measure_checkpoint=False,
                verbose=False,
                model_name=model,
            )
            trainer = pl.Trainer(
                accelerator=accelerator,
                devices=1,
                precision=precision,
                max_steps=WARMUP + PROFILE,
                benchmark=True,  # cuDNN autotuning, as NGC's scripts run ResNet-50
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                callbacks=[wall, cb],  # the wall clock's hooks first: its window holds none of the callback's work
            )
            t = time.perf_counter()
            trainer.fit(
                Step(net, optimizer), train_dataloaders=torch.utils.data.DataLoader(Feed(data), batch_size=None)
            )
            prof = cb.profile
            row = {
                "case": name,
                "model": model,
                "precision": precision,
                "batch": batch,
                "gpu": prof.hardware.gpu,
                "device_name": torch.cuda.get_device_name() if cuda else "cpu",
                "step_p50_s": prof.timing.step_time_s.p50,
                "step_mean_s": prof.timing.step_time_s.mean,
                "wall_mean_s": (wall.t["end"] - wall.t["start"]) / PROFILE,
                "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0,
                "fit_s": time.perf_counter() - t,
            }
            row["samples_per_s"] = batch / row["step_p50_s"]
            del trainer, cb
        except Exception as exc:  # noqa: BLE001 - one case's failure (memory, say) must not lose the others
            row = {"case": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
            if cuda:
                torch.cuda.empty_cache()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        log.write(json.dumps(row) + "\n")
        log.flush()
        print(json.dumps(row), flush=True)
    return 0


def score(path: Path, data: str) -> int:
    """Score the measured profiles in ``path``: a folder, or a session's archive (bench/data/h100_profiles_*)."""
    with devicecli.unpacked(path) as folder:
        return _score(folder, data)


def scored(case: str, gpu: str, prediction, here: float) -> dict:
    """One absolute-path row: the prediction against the step measured here, and whether its interval holds it."""
    e = math.log(prediction.throughput_samples_s / here)
    lo, hi = prediction.interval["throughput_samples_s"]
    return {"case": case, "gpu": gpu, "pred": prediction.throughput_samples_s, "here": here, "log_residual": e,
            "ape": abs(math.exp(e) - 1), "inside": lo <= here <= hi}  # fmt: skip


def _score(folder: Path, data: str) -> int:
    import ops_validation as ov

    from predictor.catalog.gpus import gpu_table
    from predictor.documents.profile import load_profile
    from predictor.model import kernels, ops
    from predictor.model.predict import predict
    from predictor.validation import Case, case_catalog

    # the model as it ships (the bundled kernel model, whose training data has NeuSight's FP32 H100 kernels, and the
    # shipped tensor-core efficiencies): what a user's prediction is, scored beside the held-out protocol
    shipped_kernels, shipped_efficiency = kernels.load_kernel_model, ops.tensor_core_efficiency
    log = folder / "measure.jsonl" if (folder / "measure.jsonl").exists() else folder / "measure-lambda.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    measured = {r["case"]: r for r in rows if "error" not in r}
    folds = json.loads((ROOT / "bench" / "results" / "ops_validation.json").read_text())
    eff_of = {r["model"]: r["efficiency"] for r in folds["ratio"]["rows"]}  # the leave-one-model-out fold's
    abs_eff = {r["model"]: r["efficiency"] for r in folds["absolute"]["rows"]}
    pts = ov.points()

    def efficiency(model: str, only: str | None = None):
        """Each path's leave-one-model-out tensor-core efficiencies (the ratio path asks the absolute path's of a
        host-bound step); ``only`` pins one path's for every caller."""
        return lambda kind, path="ratio": (abs_eff if (only or path) == "absolute" else eff_of)[model][kind]

    lent = {r["gpu"] for r in measured.values()}
    result: dict = {
        "measured": list(measured.values()),
        "ratio": [],
        "same_gpu": [],
        "absolute": [],
        "shipped": [],
        "no_table": [],
    }
    for name, m in sorted(measured.items()):
        prof = load_profile(folder / f"{name}.json")
        src = m["gpu"]
        chip = ov.CHIP.get(src, ("H100-SXM",) if src.startswith("H") else ())
        for p in pts:
            if (p.model, p.precision, p.batch) != (m["model"], m["precision"], m["batch"]):
                continue
            if p.gpu == src:
                same = {"case": name, "gpu": p.gpu, "lambda": p.throughput, "here": m["samples_per_s"]}
                result["same_gpu"].append(same | {"ratio": m["samples_per_s"] / p.throughput})
                continue
            excluded = tuple(sorted(set(chip) | set(ov.CHIP[p.gpu])))
            kernels.load_kernel_model = lambda ex=excluded: ov.kernel_model(ex, data)
            ops.tensor_core_efficiency = efficiency(p.model)
            r = predict(
                prof, f"bench-{p.gpu}-x1-pcie:1", catalog=case_catalog([Case("cross", p.model, p, p)]), layout="ddp"
            )
            e = math.log(r.throughput_samples_s / p.throughput)
            row = {"case": name, "src": src, "dst": p.gpu, "pred": r.throughput_samples_s, "lambda": p.throughput}
            result["ratio"].append(row | {"log_residual": e, "ape": abs(math.exp(e) - 1)})
            # the same profile without its operator table (issue #38 item 6: parameters, FLOPs, one step time), as
            # shipped, beside the naive rules a user might apply instead
            kernels.load_kernel_model, ops.tensor_core_efficiency = shipped_kernels, shipped_efficiency
            bare = predict(dataclasses.replace(prof, ops=None), f"bench-{p.gpu}-x1-pcie:1",
                           catalog=case_catalog([Case("cross", p.model, p, p)]), layout="ddp")  # fmt: skip
            lo, hi = bare.interval["throughput_samples_s"]
            here, a, b = m["samples_per_s"], gpu_table()[src], gpu_table()[p.gpu]
            half = p.precision != "32-true"
            peak = (lambda g: g.fp16_tflops) if half else (lambda g: g.tf32_tflops or g.fp32_tflops)
            guesses = {
                "no table (FLOPs split)": bare.throughput_samples_s,
                "same speed everywhere": here,
                "peak FLOPS ratio": here * peak(b) / peak(a),
                "memory bandwidth ratio": here * b.memory_bw_gbps / a.memory_bw_gbps,
            }
            for rule, guess in guesses.items():
                e = math.log(guess / p.throughput)
                inside = lo <= p.throughput <= hi if rule.startswith("no table") else None
                result["no_table"].append(row | {"rule": rule, "ape": abs(math.exp(e) - 1), "inside": inside})
        # absolute: the meta capture's operator sum on the lent GPU, against the step measured here
        table = ov.table_for(m["model"], m["precision"], m["batch"])
        here = next(p for p in pts if (p.model, p.precision, p.batch) == (m["model"], m["precision"], m["batch"]))
        here = dataclasses.replace(here, gpu=src, throughput=m["samples_per_s"])
        held = tuple(sorted(chip))
        kernels.load_kernel_model = lambda ex=held: ov.kernel_model(ex, data)
        ops.tensor_core_efficiency = efficiency(m["model"], "absolute")
        catalog = case_catalog([Case("cross", m["model"], here, here)])
        r = predict(
            ov.profile(m["model"], here, table, False, None), f"bench-{src}-x1-pcie:1", catalog=catalog, layout="ddp"
        )
        result["absolute"].append(scored(name, src, r, m["samples_per_s"]))
        kernels.load_kernel_model, ops.tensor_core_efficiency = shipped_kernels, shipped_efficiency
        r = predict(
            ov.profile(m["model"], here, table, False, None), f"bench-{src}-x1-pcie:1", catalog=catalog, layout="ddp"
        )
        result["shipped"].append(scored(name, src, r, m["samples_per_s"]))

    def table(title: str, rs: list[dict], key: str) -> None:
        if not rs:
            return
        by = defaultdict(list)
        for r in rs:
            by[r[key]].append(r["ape"])
        print(f"\n{title}: {len(rs)} cases, MAPE {statistics.fmean(r['ape'] for r in rs):.1%}, "
              f"median {statistics.median(r['ape'] for r in rs):.1%}")  # fmt: skip
        for k, v in sorted(by.items()):
            print(f"  {k}: {statistics.fmean(v):.1%} over {len(v)}")

    print(f"lent GPU(s): {sorted(lent)}; measured {len(measured)} of {len(rows)} cases")
    for m in measured.values():
        print(f"  {m['case']}: {m['samples_per_s']:.1f}/s (CUDA-event p50 {m['step_p50_s'] * 1e3:.1f} ms, wall mean "
              f"{m['wall_mean_s'] * 1e3:.1f} ms, peak {m['peak_allocated_gb']:.1f} GB)")  # fmt: skip
    for r in result["same_gpu"]:
        print(f"  same GPU as Lambda's {r['gpu']}: {r['case']} here {r['here']:.1f}/s vs {r['lambda']:.1f}/s "
              f"(x{r['ratio']:.2f})")  # fmt: skip
    table("ratio path from the step measured here, by target", result["ratio"], "dst")
    table("the same cases without the operator table, and naive rules, by rule", result["no_table"], "rule")
    bare = [r["inside"] for r in result["no_table"] if r["inside"] is not None]
    if bare:
        print(f"  the no-table path's 80% interval holds {statistics.fmean(bare):.0%} of them")
    table("absolute path (meta capture) against the step measured here", result["absolute"], "case")
    table("the same as the model ships (bundled kernel model, shipped efficiencies)", result["shipped"], "case")
    if result["shipped"]:
        inside = statistics.fmean(r["inside"] for r in result["shipped"])
        print(f"  its 80% interval holds {inside:.0%} of the steps measured here")
    for kind in ("ratio", "absolute", "shipped"):
        rs = result[kind]
        if rs:
            result[f"{kind}_mape"] = statistics.fmean(r["ape"] for r in rs)
    out = ROOT / "bench" / "results" / "gpu_lambda_score.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    def measure_options(m: argparse.ArgumentParser) -> None:
        m.add_argument("--accelerator", default="cuda", help="cpu: a dry run of the harness (with --only, --batch-cap)")
        m.add_argument("--only", default="", help="only the cases whose 'model precision' contains this")
        m.add_argument("--batch-cap", type=int, default=0, help="cap every batch (1 or 4: the host-bound runs)")

    def score_options(s: argparse.ArgumentParser) -> None:
        s.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "kernels"))

    args = devicecli.parse(__doc__ or "", argv, 240.0, measure_options, score_options)
    if args.cmd == "measure":
        return measure(args.out, args.budget_s, args.accelerator, args.only, args.batch_cap)
    return score(args.path, args.data)


if __name__ == "__main__":
    sys.exit(main())
