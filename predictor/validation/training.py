"""The learned correction trained on every case (the artefact ``predictor/data/correction.json``, with the data's
sha256)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from predictor.catalog.gpus import GpuTable, bundled_gpus
from predictor.validation.dataset import Case, build_cases, data_path, load_points, published_matmul_precision


def correction_training_set(cases: list[Case], gpus: GpuTable) -> tuple[list[list[float]], list[float], list[Case]]:
    """(X, y, kept cases) from cross-GPU evaluation cases."""
    from predictor.model.correction import analytic_log_ratio, features

    X, y, kept = [], [], []
    for c in cases:
        if c.kind != "cross":
            continue
        src, dst = gpus.gpus[c.src.gpu], gpus.gpus[c.dst.gpu]
        matmul = published_matmul_precision(c.src.precision)
        try:
            x = features(src, dst, c.src.precision, matmul, c.dst.batch / c.src.batch)
        except ValueError:
            continue
        X.append(x)
        y.append(math.log(c.src.throughput / c.dst.throughput) - analytic_log_ratio(src, dst, c.src.precision, matmul))
        kept.append(c)
    return X, y, kept


def train_correction(path: Path | None = None) -> tuple[object, dict[str, object]]:
    """Train on every cross-GPU case of the bundled measurements; returns the model and the artefact."""
    from predictor.model.correction import FEATURES, SCHEMA, CrossGpuCorrection, sklearn_version

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
