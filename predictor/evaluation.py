"""Validation of the performance model on published measurements nobody here wrote (``srifty eval``).

Cases, from ``measurements.csv`` (Lambda's PyTorch benchmarks for scaling and cross-GPU, Gavel's single-GPU job
throughputs for cross-GPU; CM-DARE is asynchronous parameter-server training and is left out):

- same-GPU scaling: the 1-GPU figure of a (model, precision, GPU) is the profile; every 2/4/8-GPU figure of the same
  triple is predicted (one server, the row's interconnect); figures more than 1.25x linear are inconsistent rows
  (Lambda NCF) and are left out;
- cross-GPU: the 1-GPU figure on GPU A is the profile; the 1-GPU figure on GPU B is predicted, per sample (the
  published batch sizes differ by GPU; the batch ratio is a feature of the learned correction).

Repeated runs of one configuration (many Lambda H100 rows) are merged by their median and give the profile its
run-to-run CV. Leave-one-model-out and leave-one-GPU-out folds train the learned correction without the held-out
model or GPU.
"""

from __future__ import annotations

import csv
import hashlib
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from predictor.catalog.catalog import Catalog, CatalogInfo
from predictor.catalog.gpus import GpuTable, bundled_gpus
from predictor.catalog.instances import InstanceType
from predictor.exceptions import ConfigError
from predictor.profile import profile_from_dict

# measurement GPU names -> canonical keys (RTX6000Ada and QuadroRTX8000 have no specs: their rows are skipped)
GPU_NAMES = {
    "H100-SXM": "H100-SXM",
    "H100-PCIe": "H100-PCIe",
    "V100-16GB": "V100-SXM2-16GB",
    "A100-SXM-80GB": "A100-SXM-80GB",
    "A100-PCIe-80GB": "A100-PCIe-80GB",
    "A100-PCIe-40GB": "A100-PCIe-40GB",
    "RTXA6000": "RTX-A6000",
    "RTX3090": "RTX-3090",
    "RTX4090": "RTX-4090",
    "A10": "A10",
    "K80": "K80",
    "P100-16GB": "P100-PCIe-16GB",
}
# parameter counts of the benchmark models (gradient bytes = 4 x parameters: fp32 gradients, AMP included), from the
# models' papers / NVIDIA DeepLearningExamples model cards
# throughput units whose figures convert to batch items per second (the step time the all-reduce competes with):
# items per throughput unit. WaveGlow trains on 16,000-sample audio segments (NVIDIA DeepLearningExamples default);
# tokens/s (GNMT, Transformer-XL) and mels/s (Tacotron2) have no fixed size per item, so their scaling cases are left
# out (their cross-GPU cases, ratios of the same unit, stay).
ITEMS_PER_UNIT = {
    "images/s": 1.0,
    "sequences/s": 1.0,
    "samples/s": 1.0,
    "iterations/s": 1.0,
    "audio samples/s": 1 / 16000,
}
# training FLOPs per item (3 x forward, forward = 2 x multiply-adds) where they are well known: ResNet-50 at 224 px
# (4.1 GMAC, He et al. 2016); BERT at sequence length 384 (2 x parameters x tokens + attention 4 x layers x s^2 x d,
# Devlin et al. 2019 / Kaplan et al. 2020's accounting). Used to give cross-GPU cases what a profile would carry.
FLOPS_PER_ITEM = {
    "ResNet-50": 3 * 8.2e9,
    "BERT-base finetune-SQuAD": 3 * (2 * 110e6 * 384 + 4 * 12 * 384**2 * 768),
    "BERT-large finetune-SQuAD": 3 * (2 * 340e6 * 384 + 4 * 24 * 384**2 * 1024),
}
SUPERLINEAR_LIMIT = 1.25  # a k-GPU figure above 1.25 k x the 1-GPU figure is inconsistent data, not scaling
PARAMETERS = {
    "ResNet-50": 25.6e6,
    "SSD300": 22.9e6,
    "BERT-base finetune-SQuAD": 110e6,
    "BERT-large finetune-SQuAD": 340e6,
    "GNMT": 160e6,
    "NCF": 31.8e6,
    "Tacotron2": 28.2e6,
    "WaveGlow": 87.9e6,
    "Transformer-XL-base": 151e6,
    "Transformer-XL-large": 257e6,
}


@dataclass(frozen=True)
class Point:
    """One configuration's throughput (median of its repeated runs), in samples/s over all GPUs."""

    source: str
    model: str
    precision: str  # Lightning name: 16-mixed or 32-true
    gpu: str
    gpus: int
    batch: int
    throughput: float
    cv: float
    interconnect: str
    repeats: int
    unit: str

    @property
    def items_per_s(self) -> float | None:
        """Batch items per second over all GPUs, when the unit allows it."""
        factor = ITEMS_PER_UNIT.get(self.unit)
        return self.throughput * factor if factor is not None else None


MEASUREMENT_COLUMNS = (
    "source_repo",
    "model",
    "precision",
    "gpu",
    "gpus_per_node",
    "nodes",
    "per_gpu_batch",
    "throughput",
    "throughput_unit",
)


def load_points(path: str | Path, gpus: GpuTable | None = None) -> list[Point]:
    """Measurements merged into points; rows of unknown GPUs or non-all-reduce sources are dropped."""
    gpus = gpus or bundled_gpus()
    groups: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    if not Path(path).is_file():
        raise ConfigError(
            f"The measurements file {str(path)!r} does not exist or is not a file: give the path of a measurements "
            "CSV, or leave data out for the copy bundled with the package.",
            parameter="data",
            value=str(path),
        )
    with open(path, encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in MEASUREMENT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(
                f"The measurements file {str(path)!r} is not a measurements CSV: it has no {', '.join(missing)} "
                "column(s). Give a file with the columns of predictor/data/measurements.csv, or leave data out.",
                parameter="data",
                value=str(path),
            )
        for row in reader:
            source = row["source_repo"].split("/")[0]
            if source not in ("lambdal", "stanford-futuredata") or row["gpu"] not in GPU_NAMES:
                continue
            if not row["gpus_per_node"] or int(row["nodes"] or 1) != 1:
                continue  # Gavel "unconsolidated" rows: the per-server split is not recorded
            groups[
                (
                    source,
                    row["model"],
                    row["precision"],
                    GPU_NAMES[row["gpu"]],
                    int(row["gpus_per_node"]),
                    row["per_gpu_batch"],
                )
            ].append(row)
    # rows without a batch inherit the batch of the same configuration when there is exactly one
    batches: dict[tuple, set[str]] = defaultdict(set)
    for key in groups:
        if key[5]:
            batches[key[:5]].add(key[5])
    merged: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for key, rows in groups.items():
        batch = key[5] or (next(iter(batches[key[:5]])) if len(batches[key[:5]]) == 1 else "")
        if batch:
            merged[(*key[:5], int(batch))].extend(rows)
    points = []
    for (source, model, precision, gpu, n, batch), rows in merged.items():
        values = []
        for r in rows:
            value = float(r["throughput"])
            values.append(value * batch * n if r["throughput_unit"] == "iterations/s" else value)
        mid = statistics.median(values)
        cv = statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0
        points.append(
            Point(
                source,
                model,
                "16-mixed" if precision == "AMP" else "32-true",
                gpu,
                n,
                batch,
                mid,
                cv,
                rows[0]["interconnect"],
                len(values),
                "samples/s" if rows[0]["throughput_unit"] == "iterations/s" else rows[0]["throughput_unit"],
            )
        )
    return points


@dataclass
class Case:
    kind: str  # "scaling" or "cross"
    model: str
    src: Point
    dst: Point
    predicted: float = 0.0
    lo: float = 0.0
    hi: float = 0.0

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.dst.throughput) / self.dst.throughput

    @property
    def covered(self) -> bool:
        return self.lo <= self.dst.throughput <= self.hi


def build_cases(points: Iterable[Point], gpus: GpuTable | None = None) -> list[Case]:
    """Scaling and cross-GPU cases. Cross-GPU cases need the memory bandwidth of both GPUs (the RTX cards have
    none in the shared specs and are left out of them)."""
    gpus = gpus or bundled_gpus()
    by_triple: dict[tuple, list[Point]] = defaultdict(list)
    by_pair: dict[tuple, list[Point]] = defaultdict(list)
    for p in points:
        by_triple[(p.source, p.model, p.precision, p.gpu)].append(p)
        if p.gpus == 1:
            by_pair[(p.source, p.model, p.precision, p.batch if p.source != "lambdal" else 0)].append(p)
    cases = []
    for (source, model, _, _), pts in sorted(by_triple.items()):
        singles = [p for p in pts if p.gpus == 1]
        if source != "lambdal" or model not in PARAMETERS or not singles or singles[0].items_per_s is None:
            continue  # Gavel's multi-GPU rows are internally inconsistent (see the shared data README)
        src = max(singles, key=lambda p: p.repeats)
        for p in pts:
            if p.gpus == 1:
                continue
            if p.throughput / src.throughput > SUPERLINEAR_LIMIT * p.gpus:
                continue  # e.g. Lambda NCF: 8 GPUs 300x one GPU: the rows measured different configurations
            cases.append(Case("scaling", model, src, p))
    for (_, model, _, _), pts in sorted(by_pair.items()):
        best: dict[str, Point] = {}
        for p in pts:
            if not gpus.gpus[p.gpu].memory_bw_gbps:
                continue
            if p.gpu not in best or p.repeats > best[p.gpu].repeats:
                best[p.gpu] = p
        for a in best.values():
            for b in best.values():
                if a.gpu != b.gpu:
                    cases.append(Case("cross", model, a, b))
    return cases


def _interconnect(text: str) -> str:
    t = text.lower()
    return "nvswitch" if "nvswitch" in t else ("nvlink" if "nvlink" in t else "pcie")


def case_catalog(cases: Iterable[Case]) -> Catalog:
    """A catalog of one-server 'instance types' matching the measured machines."""
    instances = {}
    for c in cases:
        p = c.dst
        name = f"bench-{p.gpu}-x{p.gpus}-{_interconnect(p.interconnect)}"
        instances[name] = InstanceType(
            name=name,
            family="bench",
            accelerator=p.gpu,
            accelerator_kind="cuda",
            gpu=p.gpu,
            gpus=p.gpus,
            gpu_memory_gib=80,
            vcpus=16 * p.gpus,
            memory_gib=512,
            network_gbps=100,
            gpu_interconnect=_interconnect(p.interconnect) if p.gpus > 1 else "single",
            origin="evaluation",
        )
    return Catalog(instances, bundled_gpus(), CatalogInfo("evaluation", "-"))


def _profile_cached(case: Case) -> object:
    key = (case.model, case.src, case.dst.batch)
    if key not in _PROFILES:
        _PROFILES[key] = profile_for(case)
    return _PROFILES[key]


_PROFILES: dict[tuple, object] = {}


def profile_for(case: Case) -> object:
    """The profile the case starts from: the source point, at the target's per-GPU batch (in batch items; for
    cross-GPU cases of other units the step time is nominal, which a ratio does not see)."""
    src, dst = case.src, case.dst
    per_sample = 1.0 / ((src.items_per_s or src.throughput) / src.gpus)
    params = PARAMETERS.get(case.model, 25e6)
    return profile_from_dict(
        {
            "schema": "srifty.profile/v1",
            "model": {
                "name": case.model,
                "parameters": int(params),
                "precision": src.precision,
                "gradient_bytes": int(params * 4),
                "float32_matmul_precision": "high" if src.precision == "32-true" else "highest",
            },
            "batch": {"per_device": dst.batch},
            "hardware": {"gpu": src.gpu, "devices": 1, "nodes": 1},
            "timing": {"step_time_s": {"p50": per_sample * dst.batch, "cv": src.cv}},
        }
    )


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
    from predictor.perf.compute import compute_ratio
    from predictor.perf.correction import CrossGpuCorrection
    from predictor.perf.uncertainty import interval, model_error

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
            matmul = "high" if c.src.precision == "32-true" else None
            log_ratio = math.log(compute_ratio(src, dst, c.src.precision, matmul, None).ratio) + model.predict_one(X[i])
            pred = c.src.throughput / math.exp(log_ratio)
            sd = math.hypot(model_error("cross-corrected"), max(c.src.cv, cv_floor))
            out.append(Case("cross", c.model, c.src, c.dst, pred, *interval(pred, sd)))
    return out


def _fleet_name(p: Point) -> str:
    return f"bench-{p.gpu}-x{p.gpus}-{_interconnect(p.interconnect)}:1"


def predict_scaling_case(
    case: Case, catalog: Catalog, network: object | None = None, dp_model: object | None = None
) -> Case:
    """Predict a same-GPU scaling case (in the published unit); returns a new Case."""
    from predictor.perf.network import DEFAULT_NETWORK
    from predictor.predict import predict

    p = case.dst
    # the published scaling figures keep the per-GPU batch: predict the training they measured (weak scaling)
    result = predict(
        _profile_cached(case),
        _fleet_name(p),
        catalog=catalog,
        scaling="weak",
        network=network or DEFAULT_NETWORK,
        dp_model=dp_model,
    )
    unit = p.throughput / p.items_per_s if p.items_per_s else 1.0  # batch items -> the published unit
    lo, hi = result.interval["throughput_samples_s"]
    return Case(case.kind, case.model, case.src, p, result.throughput_samples_s * unit, lo * unit, hi * unit)


# the data-parallel loss constants searched by fit_dp_model (coordinate descent over these grids)
DP_GRIDS = {
    "sigma": (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1),
    "kappa": (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4),
}


def fit_dp_model(cases: list[Case], catalog: Catalog, rounds: int = 2) -> object:
    """The :class:`~predictor.perf.scaling.ScalingModel` whose constants minimise the mean absolute log error of
    these same-GPU scaling cases (coordinate descent over ``DP_GRIDS``)."""
    from dataclasses import replace

    from predictor.perf.scaling import ScalingModel

    def loss(model: object) -> float:
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
    from predictor.perf.compute import compute_ratio
    from predictor.perf.uncertainty import interval, model_error

    src, dst = gpus.gpus[case.src.gpu], gpus.gpus[case.dst.gpu]
    matmul = "high" if case.src.precision == "32-true" else None
    achieved = FLOPS_PER_ITEM[case.model] * case.src.throughput / 1e12 if with_flops else None
    pred = case.src.throughput / compute_ratio(src, dst, case.src.precision, matmul, achieved).ratio
    sd = math.hypot(model_error("cross-flops" if with_flops else "cross"), case.src.cv)
    return Case("cross", case.model, case.src, case.dst, pred, *interval(pred, sd))


def log_residuals(cases: Iterable[Case]) -> list[float]:
    """log(predicted / measured) of predicted cases."""
    return [math.log(c.predicted / c.dst.throughput) for c in cases]


def calibrated_sd(residuals: list[float], coverage: float = 0.8) -> float:
    """The relative sd whose central interval (+-1.2816 sd) holds ``coverage`` of these held-out log residuals."""
    from predictor.perf.uncertainty import Z80

    if not residuals:
        return float("nan")
    ordered = sorted(abs(r) for r in residuals)
    return ordered[min(len(ordered) - 1, math.ceil(coverage * len(ordered)) - 1)] / Z80


def nested_coverage(cases: list[Case], group_of: Callable[[Case], str], cv_floor: float = 0.0) -> float:
    """Share of cases inside an 80% interval whose width was calibrated on the held-out residuals of the *other*
    groups only (so the coverage is itself a held-out figure, not true by construction)."""
    from predictor.perf.uncertainty import Z80

    residuals = {id(c): r for c, r in zip(cases, log_residuals(cases))}
    inside = 0
    for c in cases:
        others = [residuals[id(o)] for o in cases if group_of(o) != group_of(c)]
        sd = math.hypot(calibrated_sd(others), max(c.src.cv, cv_floor))
        inside += abs(residuals[id(c)]) <= Z80 * sd
    return inside / len(cases) if cases else float("nan")


def validate(data: str | Path, progress: Callable[[str], None] | None = None) -> dict[str, object]:
    """Every held-out validation of the model on the published measurements: rows of figures, and the cases.

    Same-GPU scaling: the data-parallel loss constants fitted leave-one-model-out, next to no losses at all (the
    perfect-overlap model). Cross-GPU: the analytic split, the split from FLOPs, and the learned correction
    leave-one-model-out and leave-one-GPU-out.
    """
    from predictor.perf.scaling import ScalingModel

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
    rows = {
        "same-GPU scaling, no data-parallel losses (perfect overlap)": summarize_cases(perfect),
        "same-GPU scaling, data-parallel losses fitted leave-one-model-out": summarize_cases(scaling_lomo),
        "cross-GPU, analytic compute/bandwidth split only": summarize_cases(cross_analytic),
        "cross-GPU, split from FLOPs per sample (ResNet-50, BERT-base, BERT-large)": summarize_cases(flops_cases),
        "cross-GPU + learned correction, leave-one-model-out": summarize_cases(lomo),
        "cross-GPU + learned correction, leave-one-GPU-out": summarize_cases(logo),
    }
    by_model = lambda c: c.model  # noqa: E731
    nested = {
        "same-GPU scaling, data-parallel losses fitted leave-one-model-out": nested_coverage(scaling_lomo, by_model),
        "cross-GPU, analytic compute/bandwidth split only": nested_coverage(cross_analytic, by_model),
        "cross-GPU, split from FLOPs per sample (ResNet-50, BERT-base, BERT-large)": nested_coverage(
            flops_cases, by_model
        ),
        "cross-GPU + learned correction, leave-one-GPU-out": nested_coverage(logo, lambda c: c.dst.gpu),
    }
    for name, value in nested.items():
        rows[name]["coverage_80_nested"] = value
    return {
        "rows": rows,
        "cases": {
            "scaling": scaling_lomo,
            "scaling-perfect": perfect,
            "cross": cross_analytic,
            "cross-flops": flops_cases,
            "lomo": lomo,
            "logo": logo,
        },
    }


def correction_training_set(cases: list[Case], gpus: GpuTable) -> tuple[list[list[float]], list[float], list[Case]]:
    """(X, y, kept cases) from cross-GPU evaluation cases."""
    from predictor.perf.correction import analytic_log_ratio, features

    X, y, kept = [], [], []
    for c in cases:
        if c.kind != "cross":
            continue
        src, dst = gpus.gpus[c.src.gpu], gpus.gpus[c.dst.gpu]
        matmul = "high" if c.src.precision == "32-true" else None
        try:
            x = features(src, dst, c.src.precision, matmul, c.dst.batch / c.src.batch)
        except ValueError:
            continue
        X.append(x)
        y.append(math.log(c.src.throughput / c.dst.throughput) - analytic_log_ratio(src, dst, c.src.precision, matmul))
        kept.append(c)
    return X, y, kept


def data_path() -> Path:
    """The bundled measurements (predictor/data/measurements.csv)."""
    from importlib import resources

    return Path(str(resources.files("predictor.data").joinpath("measurements.csv")))


def data_sha256() -> str:
    return hashlib.sha256(data_path().read_bytes()).hexdigest()


def train_correction(path: Path | None = None) -> tuple[object, dict[str, object]]:
    """Train on every cross-GPU case of the bundled measurements; returns the model and the artefact."""
    from predictor.perf.correction import FEATURES, SCHEMA, CrossGpuCorrection, sklearn_version

    path = path or data_path()
    gpus = bundled_gpus()
    X, y, kept = correction_training_set(build_cases(load_points(path, gpus), gpus), gpus)
    model = CrossGpuCorrection().fit(X, y)
    model.gpus_ = sorted({g for c in kept for g in (c.src.gpu, c.dst.gpu)})
    artefact = {
        "schema": SCHEMA,
        "features": list(FEATURES),
        "sklearn_version": sklearn_version(),
        "data_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
        **model.to_dict(),
    }
    return model, artefact
