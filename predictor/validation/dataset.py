"""The validation data: published measurements as points, the held-out cases built from them (same-GPU scaling,
cross-GPU), and the catalog and profile each case starts from."""

from __future__ import annotations

import csv
import hashlib
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from predictor.catalog.catalog import Catalog, CatalogInfo
from predictor.catalog.gpus import GpuTable, bundled_gpus
from predictor.catalog.instances import InstanceType
from predictor.documents.profile import Profile, profile_from_dict
from predictor.exceptions import ConfigError

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
    if not Path(path).is_file():
        raise ConfigError(
            f"The measurements file {str(path)!r} does not exist or is not a file: give the path of a measurements "
            "CSV, or leave data out for the copy bundled with the package.",
            parameter="data",
            value=str(path),
        )
    try:
        return _read_points(path, gpus)
    except ConfigError:
        raise
    except (UnicodeDecodeError, csv.Error, ValueError, KeyError, statistics.StatisticsError) as exc:
        raise ConfigError(  # binary bytes, a field over csv's limit, a number that is not one (the hardening probe)
            f"The measurements file {str(path)!r} cannot be read as a measurements CSV ({type(exc).__name__}: "
            f"{str(exc)[:200]}). Give a UTF-8 CSV with the columns of predictor/data/measurements.csv, or leave data "
            "out.",
            parameter="data",
            value=str(path),
        ) from None


def _read_points(path: str | Path, gpus: GpuTable) -> list[Point]:
    """The single-node measurements of ``path`` as points: rows of one configuration grouped
    (:func:`_grouped_rows`), a row without a batch given the batch of its configuration when it has exactly one,
    each group's median throughput and spread (:func:`_point`)."""
    groups = _grouped_rows(path)
    # rows without a batch inherit the batch of the same configuration when there is exactly one
    batches: dict[tuple, set[str]] = defaultdict(set)
    for key in groups:
        if key[5]:
            batches[key[:5]].add(key[5])
    merged: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for key, rows in groups.items():
        batch = key[5] or (next(iter(batches[key[:5]])) if len(batches[key[:5]]) == 1 else "")
        if batch:
            batched = (*key[:5], int(batch))  # not inside merged[...]: mypy reads a starred subscript as 3.11 syntax
            merged[batched].extend(rows)
    return [_point(key, rows) for key, rows in merged.items()]


def _grouped_rows(path: str | Path) -> dict[tuple, list[dict[str, str]]]:
    """The Lambda and Gavel single-node rows of a measurements CSV, by (source, model, precision, GPU, GPUs, batch)."""
    groups: dict[tuple, list[dict[str, str]]] = defaultdict(list)
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
            key = (source, row["model"], row["precision"], GPU_NAMES[row["gpu"]], int(row["gpus_per_node"]))
            keyed = (*key, row["per_gpu_batch"])  # not inside groups[...]: mypy reads a starred subscript as 3.11
            groups[keyed].append(row)
    return groups


def _point(key: tuple, rows: list[dict[str, str]]) -> Point:
    """One configuration's point: the median of its rows' throughputs in samples/s (iterations/s x batch x GPUs)
    and their coefficient of variation."""
    source, model, precision, gpu, n, batch = key
    values = []
    for r in rows:
        value = float(r["throughput"])
        values.append(value * batch * n if r["throughput_unit"] == "iterations/s" else value)
    mid = statistics.median(values)
    cv = statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0
    return Point(
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


def interconnect(text: str) -> str:
    t = text.lower()
    return "nvswitch" if "nvswitch" in t else ("nvlink" if "nvlink" in t else "pcie")


def case_catalog(cases: Iterable[Case]) -> Catalog:
    """A catalog of one-server 'instance types' matching the measured machines."""
    instances = {}
    for c in cases:
        p = c.dst
        name = f"bench-{p.gpu}-x{p.gpus}-{interconnect(p.interconnect)}"
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
            gpu_interconnect=interconnect(p.interconnect) if p.gpus > 1 else "single",
            origin="evaluation",
        )
    return Catalog(instances, bundled_gpus(), CatalogInfo("evaluation", "-"))


def cached_profile(case: Case) -> Profile:
    key = (case.model, case.src, case.dst.batch)
    if key not in _PROFILES:
        _PROFILES[key] = profile_for(case)
    return _PROFILES[key]


_PROFILES: dict[tuple, Profile] = {}


def published_matmul_precision(precision: str) -> str:
    """How the published FP32 figures ran their matmuls: in NGC containers, whose ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``
    makes them TF32 on Ampere and newer ("high"); other precisions "highest" (no TF32 to speak of)."""
    return "high" if precision == "32-true" else "highest"


def profile_for(case: Case) -> Profile:
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
                "float32_matmul_precision": published_matmul_precision(src.precision),
            },
            "batch": {"per_device": dst.batch},
            "hardware": {"gpu": src.gpu, "devices": 1, "nodes": 1},
            "timing": {"step_time_s": {"p50": per_sample * dst.batch, "cv": src.cv}},
        }
    )


def data_path() -> Path:
    """The bundled measurements (predictor/data/measurements.csv)."""
    from importlib import resources

    return Path(str(resources.files("predictor.data").joinpath("measurements.csv")))


def data_sha256() -> str:
    return hashlib.sha256(data_path().read_bytes()).hexdigest()
