"""Fit the performance model's constants on the bundled measurements and write its artefacts.

    python scripts/fit_model.py [--check]

Writes ``predictor/data/correction.json`` (the cross-GPU correction, Ridge) and ``predictor/data/model_v3.json``:
the data-parallel loss constants fitted on every same-GPU scaling case, and the error of each kind of prediction
from held-out residuals only (scaling: leave-one-model-out; cross-GPU with the correction: leave-one-GPU-out; the
analytic paths fit nothing). Deterministic (grids and Ridge, no randomness); both record the data's sha256 and the
library versions. ``--check`` exits 1 when the committed artefacts differ from a fresh fit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.catalog.gpus import bundled_gpus  # noqa: E402
from predictor.documents.atomic import atomic_write_text  # noqa: E402
from predictor.model.artefact import SCHEMA  # noqa: E402
from predictor.model.correction import sklearn_version  # noqa: E402
from predictor.validation import (  # noqa: E402
    FLOPS_PER_ITEM,
    analytic_cross,
    build_cases,
    calibrated_sd,
    case_catalog,
    cross_validate,
    data_path,
    fit_dp_model,
    load_points,
    log_residuals,
    scaling_leave_one_model_out,
    train_correction,
)
from predictor.validation.harness import case_kind  # noqa: E402

# the regime of FP32 steps whose convolutions (and allowed matmuls) change pipe between the two GPUs
ACROSS = (
    "of FP32 steps across the TF32 line: one GPU runs convolutions (and allowed matmuls) on TF32 tensor cores, the "
    "other on CUDA cores"
)


def fit(say=print) -> tuple[dict, dict]:
    """(correction artefact, model artefact)."""
    path = data_path()
    _, correction = train_correction(path)
    gpus = bundled_gpus()
    cases = build_cases(load_points(path, gpus), gpus)
    catalog = case_catalog(cases)
    scaling_cases = [c for c in cases if c.kind == "scaling"]
    cross = [c for c in cases if c.kind == "cross"]
    with_flops = [c for c in cross if c.model in FLOPS_PER_ITEM]
    t = time.perf_counter()
    dp = fit_dp_model(scaling_cases, catalog)
    say(f"data-parallel constants {dp} ({time.perf_counter() - t:.1f} s)")
    # each path without an operator table, and its regime across the TF32 line (its own width)
    paths = {
        "cross": [analytic_cross(c, gpus) for c in cross],
        "cross-flops": [analytic_cross(c, gpus, True) for c in with_flops],
        "cross-corrected": cross_validate(cases, lambda c: [c.src.gpu, c.dst.gpu], gpus),
    }
    held_out = {"scaling": log_residuals(scaling_leave_one_model_out(scaling_cases, catalog))}
    for base, predicted in paths.items():
        for kind in (base, f"{base}-tf32"):
            held_out[kind] = log_residuals(c for c in predicted if case_kind(base, c, gpus) == kind)
    errors = {kind: round(calibrated_sd(r), 6) for kind, r in held_out.items()}
    say(f"held-out errors (relative sd for an 80% interval): {errors}")
    model = {
        "schema": SCHEMA,
        "data_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "fitted_with": {"python": platform.python_version(), "scikit-learn": sklearn_version()},
        "scaling": {"sigma": dp.sigma, "kappa": dp.kappa, "cases": len(scaling_cases)},
        "errors": errors,
        "errors_from": {
            "scaling": "leave-one-model-out residuals of the same-GPU scaling cases",
            "cross": "residuals of the analytic split on one side of the TF32 line (nothing fitted)",
            "cross-tf32": f"residuals of the analytic split {ACROSS} (nothing fitted)",
            "cross-flops": "residuals of the split from FLOPs on one side of the TF32 line (nothing fitted)",
            "cross-flops-tf32": f"residuals of the split from FLOPs {ACROSS} (nothing fitted)",
            "cross-corrected": "leave-one-GPU-out residuals of the learned correction on one side of the TF32 line",
            "cross-corrected-tf32": f"leave-one-GPU-out residuals of the learned correction {ACROSS}",
        },
        "cases": {kind: len(r) for kind, r in held_out.items()},
        "median_abs_log_residual": {
            kind: round(sorted(abs(x) for x in r)[len(r) // 2], 6) for kind, r in held_out.items() if r
        },
    }
    assert all(math.isfinite(v) for v in errors.values())
    # the tensor-core efficiencies need operator tables captured with torch + transformers: fitted and written by
    # `python bench/ops_validation.py --write-artefact`, kept here as they are
    current = ROOT / "predictor" / "data" / "model_v3.json"
    kept = json.loads(current.read_text()) if current.exists() else {}
    if "tensor_core" in kept:
        model["tensor_core"] = kept["tensor_core"]
    # the host staging of multi-GPU nodes (`python bench/tcp_sockets.py --write`, on nccl-tests), and the GPUs an
    # operator path's width was calibrated on (`bench/mpt_fsdp.py --write-errors`): kept as they are
    for key in ("network", "network_from", "errors_gpus"):
        if key in kept:
            model[key] = kept[key]
    # the operator paths' errors come from their benches (`bench/mpt_fsdp.py --write-errors`): kept as they are
    for kind in sorted(set(kept.get("errors", {})) - set(held_out)):
        for key in ("errors", "errors_from", "cases", "median_abs_log_residual"):
            if kind in kept.get(key, {}):
                model[key][kind] = kept[key][kind]
    return correction, model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the artefacts differ from a fresh fit")
    args = parser.parse_args()
    correction, model = fit()
    targets = {
        ROOT / "predictor" / "data" / "correction.json": correction,
        ROOT / "predictor" / "data" / "model_v3.json": model,
    }
    if args.check:
        stale = [
            p for p, data in targets.items() if not p.exists() or not _same(json.loads(p.read_text()), _normal(data))
        ]
        for p in stale:
            print(f"{p} is out of date: run python scripts/fit_model.py")
        return 1 if stale else 0
    for p, data in targets.items():
        atomic_write_text(p, json.dumps(data, indent=2) + "\n")
        print(f"wrote {p}")
    return 0


def _normal(data: dict) -> dict:
    return json.loads(json.dumps(data))


def _same(a: object, b: object, rel: float = 1e-9) -> bool:
    """Equal artefacts, numbers to ``rel``: a refit on another machine differs in the last digits (BLAS summation
    order: the Ridge coefficients by 1e-14), which is not a stale artefact."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, rel) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
    return a == b


if __name__ == "__main__":
    raise SystemExit(main())
