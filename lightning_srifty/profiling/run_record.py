"""What a profile records of the run besides its timings: the model (sizes, precision, FLOPs, structure) and the
machine (device, CPUs, the EC2 instance when there is one)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lightning_srifty.profiling import hardware as hw
from lightning_srifty.profiling.model_info import (
    gradient_bytes,
    normalize_precision,
    optimizer_names,
    optimizer_state_bytes,
    parameter_counts,
)
from lightning_srifty.profiling.sharded import full_sizes, structure


def model_record(
    trainer: pl.Trainer, pl_module: pl.LightningModule, flops: dict[str, Any], name: str | None, notes: list[str]
) -> dict[str, Any]:
    """The profile's ``model``: the whole model's sizes (a sharded module holds one rank's shard), its precision,
    optimizer, FLOPs per sample (``flops``, counted or the reason not) and structure."""
    total, trainable = parameter_counts(pl_module)
    grads = gradient_bytes(pl_module)
    optimizer_state = optimizer_state_bytes(trainer.optimizers)
    wrapped = trainer.strategy.model or pl_module
    full = full_sizes(wrapped)
    if full is not None:  # sharded: the module holds this rank's shard; the profile records the whole model
        total, trainable, grads = full["parameters"], full["trainable"], full["gradient_bytes"]
        optimizer_state *= full["shard_group"]  # each rank holds 1/shard_group of it (padding aside)
    precision = normalize_precision(trainer.precision)
    if precision is None:
        notes.append(f"precision {trainer.precision!r} is not a known Lightning setting; recorded as 32-true")
    return {
        "name": name or type(pl_module).__name__,
        "parameters": total,
        "trainable_parameters": trainable,
        "precision": precision or "32-true",
        "float32_matmul_precision": matmul_precision(),
        "gradient_bytes": sum(grads.values()),
        "gradient_bytes_by_dtype": grads,
        "optimizer": optimizer_names(trainer.optimizers),
        "optimizer_state_bytes": optimizer_state,
        "flops": flops,
        "structure": structure(wrapped),
    }


def hardware_record(trainer: pl.Trainer, device: torch.device, meta: Any, notes: list[str]) -> dict[str, Any]:
    """The profile's ``hardware``: the device, the world, the CPUs and (``meta``, the instance metadata: None off
    EC2) the instance type, zone and market; the device's notes go into ``notes``."""
    info = hw.device_info(device)
    notes.extend(info.pop("notes"))
    return {
        **info,
        "devices": trainer.num_devices,
        "nodes": trainer.num_nodes,
        "world_size": trainer.world_size,
        "cpu_count": hw.cpu_count(),
        "cpu_model": hw.cpu_model(),
        "cpu_arch": hw.cpu_arch(),
        "instance_type": meta.instance_type if meta else None,
        "availability_zone": meta.availability_zone if meta else None,
        "lifecycle": meta.lifecycle if meta else None,
    }


def matmul_precision() -> str:
    """What fp32 matmuls run at: ``torch.get_float32_matmul_precision()``, except that TF32 enabled another way
    (``torch.backends.cuda.matmul.allow_tf32``, or ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`` as NVIDIA's NGC containers
    set it, which the precision getter does not show) counts as ``"high"``."""
    precision = torch.get_float32_matmul_precision()
    if precision == "highest" and torch.backends.cuda.matmul.allow_tf32:
        return "high"
    return precision
