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

The data (:mod:`.dataset`), the harness (:mod:`.harness`) and the correction's training (:mod:`.training`)."""

from predictor.validation.dataset import (
    FLOPS_PER_ITEM,
    GPU_NAMES,
    ITEMS_PER_UNIT,
    MEASUREMENT_COLUMNS,
    PARAMETERS,
    SUPERLINEAR_LIMIT,
    Case,
    Point,
    build_cases,
    case_catalog,
    data_path,
    data_sha256,
    load_points,
    profile_for,
    published_matmul_precision,
)
from predictor.validation.harness import (
    DP_GRIDS,
    Report,
    analytic_cross,
    calibrated_sd,
    cross_validate,
    evaluate,
    fit_dp_model,
    log_residuals,
    nested_coverage,
    predict_scaling_case,
    scaling_leave_one_model_out,
    summarize_cases,
    validate,
)
from predictor.validation.training import correction_training_set, train_correction

__all__ = [
    "DP_GRIDS",
    "FLOPS_PER_ITEM",
    "GPU_NAMES",
    "ITEMS_PER_UNIT",
    "MEASUREMENT_COLUMNS",
    "PARAMETERS",
    "SUPERLINEAR_LIMIT",
    "Case",
    "Point",
    "Report",
    "analytic_cross",
    "build_cases",
    "calibrated_sd",
    "case_catalog",
    "correction_training_set",
    "cross_validate",
    "data_path",
    "data_sha256",
    "evaluate",
    "fit_dp_model",
    "load_points",
    "log_residuals",
    "nested_coverage",
    "predict_scaling_case",
    "profile_for",
    "published_matmul_precision",
    "scaling_leave_one_model_out",
    "summarize_cases",
    "train_correction",
    "validate",
]
