"""What the run is on: accelerator, device name and canonical GPU key, CPU, topology, peak memory."""

from __future__ import annotations

import os
import platform
import resource
import sys
from typing import Any

import torch

from predictor.catalog.gpus import canonical_gpu
from predictor.exceptions import UnknownNameError


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_arch() -> str | None:
    """The CPU architecture as the OS names it (x86_64, aarch64, arm64)."""
    return platform.machine() or None


def device_info(device: torch.device) -> dict[str, Any]:
    """Accelerator kind, device name, canonical GPU key (None if unknown, with a note) and GPU memory."""
    info: dict[str, Any] = {"accelerator": device.type if device.type in ("cpu", "cuda", "mps") else "other"}
    notes: list[str] = []
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        memory_gb = props.total_memory / 2**30
        info["device_name"] = props.name
        info["gpu_memory_gb"] = round(memory_gb, 2)
        try:
            info["gpu"] = canonical_gpu(props.name, memory_gb)
        except UnknownNameError as exc:
            notes.append(f"GPU {props.name!r} is not in the bundled GPU table, so hardware.gpu is empty: {exc}")
    elif device.type == "cpu":
        info["device_name"] = cpu_model()
    else:
        info["device_name"] = str(device)
    info["notes"] = notes
    return info


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, int]:
    """Peak CUDA memory since the last reset, and the process's peak RSS."""
    out: dict[str, int] = {}
    if device.type == "cuda":
        out["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        out["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["peak_rss_bytes"] = int(rss if sys.platform == "darwin" else rss * 1024)
    return out


def software_versions() -> dict[str, str | None]:
    import lightning

    from lightning_srifty._version import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cuda": torch.version.cuda,
        "lightning_srifty": __version__,
    }
