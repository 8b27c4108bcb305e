"""The host's seconds per launched kernel in an eager Lightning step (``ops.HOST_S_PER_KERNEL``), fitted on steps
where the GPU waits on the host, and checked on steps it was not fitted on.

    python bench/host_floor.py [bench/data/h100_profiles_2026-11-27.tar.xz]

The archive holds the profiles ``SriftyCallback`` wrote on a lent H100 (``bench/gpu_session.sh``: the Lambda models
at batch 1 and 4 and at Lambda's batches, and ``srifty demo``'s CNN and LM). **Fit**: the batch-1 steps of BERT-base,
BERT-large and ResNet-50, FP32 and AMP (6 steps of 466-1,919 kernels whose GPU work is a few ms): the median of
(step - Lightning's own time per step, ``ops.LIGHTNING_STEP_S``, measured apart by ``bench/lightning_overhead.py``)
/ kernels, an upper bound of the host's cost per kernel (the GPU's share is not taken out). **Held out**: the same
models at batch 4 (another run), the two demos (other models; their data-loading phase taken out), and the
Lambda-batch steps through the absolute path (the operator model's GPU time, at least the floor), before (6 us, the
judgement it replaces) and after. Prints the tables; writes nothing.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import devicecli  # noqa: E402

ARCHIVE = devicecli.ARCHIVE
BEFORE = 6e-6  # the judgement the fit replaces (no measurement behind it)


def load(archive: Path) -> dict[str, dict]:
    """case -> {kernels, step_s, data_s, profile} for every profile in the archive."""
    from predictor.documents.profile import profile_from_dict
    from predictor.model import ops

    out = {}
    with devicecli.unpacked(archive) as folder:
        for path in sorted(folder.glob("*.json")):
            data = json.loads(path.read_text())
            if data.get("schema") != "srifty.profile/v1":
                continue
            prof = profile_from_dict(data)
            phases = prof.timing.phases_s or {}
            out[path.stem] = {
                "kernels": ops.kernel_count(ops.classify_table(prof.ops.ops)),
                "step_s": prof.timing.step_time_s.p50,
                "data_s": phases["data"].p50 if "data" in phases else 0.0,
                "batch": prof.batch.per_device,
                "profile": prof,
            }
    return out


def fitted(case: str) -> bool:
    """The steps the host's cost per kernel is fitted on: the Lambda models at batch 1."""
    return case.endswith("-1") and not case.startswith("demo")


def mape(pairs: list[tuple[float, float]]) -> float:
    return statistics.fmean(abs(p / m - 1) for p, m in pairs)


def main(argv: list[str] | None = None) -> int:
    archive = Path((argv or sys.argv[1:] or [str(ARCHIVE)])[0])
    cases = load(archive)
    from predictor.model.ops import LIGHTNING_STEP_S as lightning

    fit = {k: v for k, v in cases.items() if fitted(k)}
    per_kernel = {k: (v["step_s"] - lightning) / v["kernels"] for k, v in fit.items()}
    c = statistics.median(per_kernel.values())
    alone = statistics.median(v["step_s"] / v["kernels"] for v in fit.values())
    print(f"fit on {len(fit)} batch-1 steps, Lightning's {lightning * 1e3:.2f} ms a step taken out: "
          + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in per_kernel.items()))  # fmt: skip
    print(f"host seconds per kernel (median): {c * 1e6:.1f} us (without the Lightning term {alone * 1e6:.1f} us; the "
          f"judgement before both: {BEFORE * 1e6:.0f} us)\n")  # fmt: skip
    held = {k: v for k, v in cases.items() if k.endswith("-4")}
    demos = {k: v for k, v in cases.items() if k.startswith("demo")}
    for title, group, minus_data in (("batch 4 (another run)", held, False), ("the demos", demos, True)):
        rows = []
        for k, v in group.items():
            measured = v["step_s"] - (v["data_s"] if minus_data else 0.0)
            rows.append((k, v["kernels"], measured, v["kernels"] * BEFORE, lightning + v["kernels"] * c))
        print(f"{title}: floor vs measured host-bound step, MAPE {mape([(r[3], r[2]) for r in rows]):.1%} before, "
              f"{mape([(r[4], r[2]) for r in rows]):.1%} after")  # fmt: skip
        for k, n, m, b, a in rows:
            print(f"  {k}: {n} kernels, measured {m * 1e3:.1f} ms, floor {b * 1e3:.1f} -> {a * 1e3:.1f} ms")
    lambda_batches = {k: v for k, v in cases.items() if k not in fit and k not in held and k not in demos}
    if lambda_batches:
        absolute(lambda_batches, c, lightning)
    return 0


def absolute(cases: dict[str, dict], c: float, lightning: float) -> None:
    """The absolute path at Lambda's batches on the H100 (the operator model's GPU time from the table recorded on the
    GPU, kernel model without the H100), with the floor before and after."""
    import ops_validation as ov

    from predictor.catalog.gpus import get_gpu
    from predictor.model import kernels, ops

    kernels.load_kernel_model = lambda: ov.kernel_model(("H100-SXM",), str(ROOT.parent / "shared" / "data" / "kernels"))
    folds = json.loads((ROOT / "bench" / "results" / "ops_validation.json").read_text())
    eff = {r["model"]: r["efficiency"] for r in folds["absolute"]["rows"]}  # the leave-one-model-out fold's
    gpu = get_gpu("H100-SXM")
    before, after = [], []
    print("\nLambda batches on the H100, absolute path: max(floor, operator sum) vs measured")
    for k, v in sorted(cases.items()):
        prof = v["profile"]
        ops.tensor_core_efficiency = lambda kind, path="ratio", e=eff[prof.model.name]: e[kind]
        t = ops.ops_time(ops.classify_table(prof.ops.ops), gpu, prof.model.precision,
                         prof.model.float32_matmul_precision, "absolute", "fa2").seconds  # fmt: skip
        b, a = max(t, v["kernels"] * BEFORE), max(t, lightning + v["kernels"] * c)
        before.append((b, v["step_s"]))
        after.append((a, v["step_s"]))
        print(f"  {k}: measured {v['step_s'] * 1e3:.1f} ms, predicted {b * 1e3:.1f} -> {a * 1e3:.1f} ms")
    print(f"MAPE {mape(before):.1%} -> {mape(after):.1%} over {len(after)}")


if __name__ == "__main__":
    sys.exit(main())
