"""The catalog of GPUs and accelerator instance types the predictor reasons about (torch-free)."""

from predictor.catalog.catalog import Catalog, CatalogInfo, cache_dir
from predictor.catalog.gpus import GPU, GpuTable, canonical_gpu, get_gpu, gpu_table
from predictor.catalog.instances import InstanceType, Price

__all__ = [
    "GPU",
    "Catalog",
    "CatalogInfo",
    "GpuTable",
    "InstanceType",
    "Price",
    "cache_dir",
    "canonical_gpu",
    "get_gpu",
    "gpu_table",
]
