"""The catalog of GPUs (and, later, instance types) the predictor can reason about."""

from predictor.catalog.gpus import GPU, canonical_gpu, get_gpu, gpu_table

__all__ = ["GPU", "canonical_gpu", "get_gpu", "gpu_table"]
