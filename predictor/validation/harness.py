"""The held-out harness: each case predicted, leave-one-model-out and leave-one-GPU-out folds, the residual spread and
its coverage; :func:`validate` gives every figure of ``srifty eval``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from predictor.catalog.catalog import Catalog
from predictor.catalog.gpus import GpuTable, bundled_gpus
from predictor.validation.dataset import (
    FLOPS_PER_ITEM,
    Case,
    Point,
    build_cases,
    cached_profile,
    case_catalog,
    interconnect,
    load_points,
    published_matmul_precision,
)
from predictor.validation.training import correction_training_set

if TYPE_CHECKING:
    from predictor.model.network import NetworkModel
    from predictor.model.scaling import ScalingModel


@dataclass
class Report:
    rows: dict[str, dict[str, float]] = field(default_factory=dict)
    cases: list[Case] = field(default_factory=list)


def summarize_cases(cases: list[Case]) -> dict[str, float]:
    if not cases:
        return {"cases": 0}
    apes = sorted(c.ape for c in cases)
    return {
        "cases": len(cases),
        "mape": statistics.fmean(apes),
        "median_ape": statistics.median(apes),
        "p90_ape": apes[min(len(apes) - 1, math.ceil(0.9 * len(apes)) - 1)],
        "coverage_80": sum(c.covered for c in cases) / len(cases),
    }


def evaluate(
    path: str | Path,
    predict_case: Callable[[Case, Catalog], tuple[float, float, float]],
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Run every case through ``predict_case(case, catalog) -> (throughput, lo, hi)``."""
    cases = build_cases(load_points(path))
    catalog = case_catalog(cases)
    for i, case in enumerate(cases):
        case.predicted, case.lo, case.hi = predict_case(case, catalog)
        if progress:
            progress(i + 1, len(cases))
    report = Report(cases=cases)
    for kind in ("scaling", "cross"):
        report.rows[kind] = summarize_cases([c for c in cases if c.kind == kind])
    return report


def cross_validate(
    cases: list[Case], fold_of: Callable[[Case], Iterable[str]], gpus: GpuTable | None = None, cv_floor: float = 0.0
) -> list[Case]:
    """Cross-GPU cases predicted by the learned correction trained without the case's fold(s).

    ``fold_of(case)`` names the groups a case belongs to (its model; or both of its GPUs): the correction that
    predicts it is trained only on cases sharing none of them (for a GPU pair: neither GPU was seen in training).
    """
    from predictor.model.compute import compute_ratio, tf32_kind
    from predictor.model.correction import CrossGpuCorrection
    from predictor.model.uncertainty import interval, model_error

    gpus = gpus or bundled_gpus()
    X, y, kept = correction_training_set(cases, gpus)
    keys = sorted({frozenset(fold_of(c)) for c in kept}, key=sorted)
    out: list[Case] = []
    for key in keys:
        train_idx = [i for i, c in enumerate(kept) if not key & set(fold_of(c))]
        test_idx = [i for i, c in enumerate(kept) if frozenset(fold_of(c)) == key]
        if not train_idx:
            continue
        model = CrossGpuCorrection().fit([X[i] for i in train_idx], [y[i] for i in train_idx])
        for i in test_idx:
            c = kept[i]
            src, dst = gpus.gpus[c.src.gpu], gpus.gpus[c.dst.gpu]
            matmul = published_matmul_precision(c.src.precision)
            log_ratio = math.log(compute_ratio(src, dst, c.src.precision, matmul, None).ratio) + model.predict_one(X[i])
            pred = c.src.throughput / math.exp(log_ratio)
            sd = math.hypot(
                model_error(tf32_kind("cross-corrected", src, dst, c.src.precision)), max(c.src.cv, cv_floor)
            )
            out.append(Case("cross", c.model, c.src, c.dst, pred, *interval(pred, sd)))
    return out


def _fleet_name(p: Point) -> str:
    return f"bench-{p.gpu}-x{p.gpus}-{interconnect(p.interconnect)}:1"


def predict_scaling_case(
    case: Case, catalog: Catalog, network: NetworkModel | None = None, dp_model: ScalingModel | None = None
) -> Case:
    """Predict a same-GPU scaling case (in the published unit); returns a new Case."""
    from predictor.model.network import DEFAULT_NETWORK
    from predictor.model.predict import predict

    p = case.dst
    # the published scaling figures keep the per-GPU batch: predict the training they measured (weak scaling)
    result = predict(
        cached_profile(case),
        _fleet_name(p),
        catalog=catalog,
        scaling="weak",
        network=network or DEFAULT_NETWORK,
        dp_model=dp_model,
        layout="ddp",  # the published runs are data parallel
    )
    unit = p.throughput / p.items_per_s if p.items_per_s else 1.0  # batch items -> the published unit
    lo, hi = result.interval["throughput_samples_s"]
    return Case(case.kind, case.model, case.src, p, result.throughput_samples_s * unit, lo * unit, hi * unit)


# the data-parallel loss constants searched by fit_dp_model (coordinate descent over these grids)
DP_GRIDS = {
    "sigma": (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1),
    "kappa": (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4),
}


def fit_dp_model(cases: list[Case], catalog: Catalog, rounds: int = 2) -> ScalingModel:
    """The :class:`~predictor.model.scaling.ScalingModel` whose constants minimise the mean absolute log error of
    these same-GPU scaling cases (coordinate descent over ``DP_GRIDS``)."""
    from dataclasses import replace

    from predictor.model.scaling import ScalingModel

    def loss(model: ScalingModel) -> float:
        return statistics.fmean(
            abs(math.log(predict_scaling_case(c, catalog, dp_model=model).predicted / c.dst.throughput)) for c in cases
        )

    model = ScalingModel()
    for _ in range(rounds):
        for name, grid in DP_GRIDS.items():
            model = min((replace(model, **{name: v}) for v in grid), key=loss)
    return model


def scaling_leave_one_model_out(cases: list[Case], catalog: Catalog) -> list[Case]:
    """Each model's scaling cases predicted with data-parallel constants fitted on the other models only."""
    out: list[Case] = []
    for model in sorted({c.model for c in cases}):
        dp = fit_dp_model([c for c in cases if c.model != model], catalog)
        out += [predict_scaling_case(c, catalog, dp_model=dp) for c in cases if c.model == model]
    return out


def analytic_cross(case: Case, gpus: GpuTable, with_flops: bool = False) -> Case:
    """A cross-GPU case by the analytic compute/bandwidth split alone (no learned correction); with ``with_flops``
    the compute-bound share comes from the model's FLOPs, as from a profile that counted them."""
    from predictor.model.compute import compute_ratio
    from predictor.model.uncertainty import interval, model_error

    src, dst = gpus.gpus[case.src.gpu], gpus.gpus[case.dst.gpu]
    matmul = published_matmul_precision(case.src.precision)
    achieved = FLOPS_PER_ITEM[case.model] * case.src.throughput / 1e12 if with_flops else None
    pred = case.src.throughput / compute_ratio(src, dst, case.src.precision, matmul, achieved).ratio
    sd = math.hypot(model_error(case_kind("cross-flops" if with_flops else "cross", case, gpus)), case.src.cv)
    return Case("cross", case.model, case.src, case.dst, pred, *interval(pred, sd))


def case_kind(kind: str, case: Case, gpus: GpuTable) -> str:
    """The kind a prediction of ``case`` by the path ``kind`` is, as :func:`predictor.model.basis.type_basis` names
    it: ``kind``, or its ``-tf32`` regime for an FP32 step across the TF32 line."""
    from predictor.model.compute import tf32_kind

    return tf32_kind(kind, gpus.gpus[case.src.gpu], gpus.gpus[case.dst.gpu], case.src.precision)


def log_residuals(cases: Iterable[Case]) -> list[float]:
    """log(predicted / measured) of predicted cases."""
    return [math.log(c.predicted / c.dst.throughput) for c in cases]


def calibrated_sd(residuals: list[float], coverage: float = 0.8) -> float:
    """The relative sd whose central interval (+-1.2816 sd) holds ``coverage`` of these held-out log residuals."""
    from predictor.model.uncertainty import Z80

    if not residuals:
        return float("nan")
    ordered = sorted(abs(r) for r in residuals)
    return ordered[min(len(ordered) - 1, math.ceil(coverage * len(ordered)) - 1)] / Z80


def nested_coverage(cases: list[Case], group_of: Callable[[Case], str], cv_floor: float = 0.0) -> float:
    """Share of cases inside an 80% interval whose width was calibrated on the held-out residuals of the *other*
    groups only (so the coverage is itself a held-out figure, not true by construction)."""
    from predictor.model.uncertainty import Z80

    residuals = {id(c): r for c, r in zip(cases, log_residuals(cases))}
    inside = 0
    for c in cases:
        others = [residuals[id(o)] for o in cases if group_of(o) != group_of(c)]
        sd = math.hypot(calibrated_sd(others), max(c.src.cv, cv_floor))
        inside += abs(residuals[id(c)]) <= Z80 * sd
    return inside / len(cases) if cases else float("nan")


FLOPS_ROW = "cross-GPU, split from FLOPs per sample (ResNet-50, BERT-base, BERT-large)"
ANALYTIC_ROW = "cross-GPU, analytic compute/bandwidth split only"
LOGO_ROW = "cross-GPU + learned correction, leave-one-GPU-out"
# each path without an operator table has two regimes (predictor.model.compute.tf32_kind), each with its own width
ACROSS_TF32 = ", FP32 across the TF32 line (TF32 tensor cores on one GPU, CUDA cores on the other)"
WITHIN_TF32 = ", the rest (16-bit, or FP32 on one side of the TF32 line)"


def regime_rows(
    title: str, kind: str, cases: list[Case], gpus: GpuTable, group_of: Callable[[Case], str]
) -> dict[str, dict[str, float]]:
    """A path's row and its two regimes' (``title`` + ``ACROSS_TF32``, ``title`` + ``WITHIN_TF32``),
    each regime's coverage held out by ``group_of`` with its own width, the path's the two together."""
    across = {id(c) for c in cases if case_kind(kind, c, gpus) != kind}
    parts = {
        title + ACROSS_TF32: [c for c in cases if id(c) in across],
        title + WITHIN_TF32: [c for c in cases if id(c) not in across],
    }
    parts = {name: part for name, part in parts.items() if part}
    rows = {title: summarize_cases(cases)} | {name: summarize_cases(part) for name, part in parts.items()}
    for name, part in parts.items():
        rows[name]["coverage_80_nested"] = nested_coverage(part, group_of)
    inside = sum(rows[name]["coverage_80_nested"] * len(part) for name, part in parts.items())
    rows[title]["coverage_80_nested"] = inside / max(1, len(cases))
    return rows


def validate(data: str | Path, progress: Callable[[str], None] | None = None) -> dict[str, object]:
    """Every held-out validation of the model on the published measurements: rows of figures, and the cases.

    Same-GPU scaling: the data-parallel loss constants fitted leave-one-model-out, next to no losses at all (the
    perfect-overlap model). Cross-GPU: the analytic split, the split from FLOPs, and the learned correction
    leave-one-model-out and leave-one-GPU-out.
    """
    from predictor.model.scaling import ScalingModel

    say = progress or (lambda _: None)
    gpus = bundled_gpus()
    cases = build_cases(load_points(data, gpus), gpus)
    catalog = case_catalog(cases)
    cross = [c for c in cases if c.kind == "cross"]
    scaling_cases = [c for c in cases if c.kind == "scaling"]
    say("same-GPU scaling without data-parallel losses")
    perfect = [predict_scaling_case(c, catalog, dp_model=ScalingModel(0.0, 0.0)) for c in scaling_cases]
    say("same-GPU scaling, data-parallel losses fitted leave-one-model-out")
    scaling_lomo = scaling_leave_one_model_out(scaling_cases, catalog)
    say("cross-GPU")
    cross_analytic = [analytic_cross(c, gpus) for c in cross]
    flops_cases = [analytic_cross(c, gpus, with_flops=True) for c in cross if c.model in FLOPS_PER_ITEM]
    lomo = cross_validate(cases, lambda c: [c.model], gpus)
    logo = cross_validate(cases, lambda c: [c.src.gpu, c.dst.gpu], gpus)
    by_model = lambda c: c.model  # noqa: E731
    rows = {
        "same-GPU scaling, no data-parallel losses (perfect overlap)": summarize_cases(perfect),
        "same-GPU scaling, data-parallel losses fitted leave-one-model-out": summarize_cases(scaling_lomo),
        **regime_rows(ANALYTIC_ROW, "cross", cross_analytic, gpus, by_model),
        **regime_rows(FLOPS_ROW, "cross-flops", flops_cases, gpus, by_model),
        "cross-GPU + learned correction, leave-one-model-out": summarize_cases(lomo),
        **regime_rows(LOGO_ROW, "cross-corrected", logo, gpus, lambda c: c.dst.gpu),
    }
    rows["same-GPU scaling, data-parallel losses fitted leave-one-model-out"]["coverage_80_nested"] = nested_coverage(
        scaling_lomo, by_model
    )
    return {
        "rows": rows,
        "cases": {
            "scaling": scaling_lomo,
            "scaling-perfect": perfect,
            "cross": cross_analytic,
            "cross-flops": flops_cases,
            "cross-flops-tf32": [c for c in flops_cases if case_kind("cross-flops", c, gpus) != "cross-flops"],
            "lomo": lomo,
            "logo": logo,
        },
    }
