"""Can this instance type run the profiled training at all? CPU architecture, the GPU's support in the profiled torch
build, and the profiled precision on the GPU. Each "no" is a reason, counted in the plan's ``excluded_types`` (the
ranking leaves such types out) and named in a prediction's ``cannot_run`` (a fleet the caller chose is priced all the
same: ``predictor.model.predict``). It lives with the catalog, below the model and the ranking, so both read one rule
(until 2026-12-01 it was the ranking's, and only ``srifty predict``'s table said it, not the service's answer).

The rules (docs/catalog.md, "Which instance types are ranked"):

- CPU architecture: arm64 (Graviton, e.g. g5g) needs an arm64 build of the training image and its wheels; it is
  ranked only with ``allow_arm64=True`` or when the profile itself was measured on arm64/aarch64.
- GPU support in torch: where ``predictor/data/cuda_builds.json`` records the compute capabilities every CUDA build
  of the profiled torch release carries (2.5 onwards), a GPU none of them runs is excluded, naming the newest torch
  that runs it (:mod:`predictor.catalog.torch_builds`; e.g. torch 2.13's cu126 runs Maxwell to Hopper, its cu130 and
  cu132 Turing to Blackwell). For releases the table does not describe: no torch CUDA build has kernels for compute
  capability below 3.7, and from torch 2.0 the official CUDA wheels start at 5.0 (3.7 only in the CUDA 11.8 variant,
  not the default wheel: pytorch/builder ``manywheel/build_cuda.sh``), so a profile made with torch >= 2 excludes
  compute capability < 5.0 (the K80 of p2); an unknown torch version keeps only the 3.7 rule.
- The nodes' image (given its NVIDIA driver: the ranking's ``driver``, else the default image's): a GPU whose every
  build of the profiled torch needs a newer driver is excluded, the node's own rule
  (:func:`~predictor.catalog.torch_builds.image_stops`; torch 2.13 on a B200 needs cu130: driver >= 580.65.06). A
  fleet that already runs (the ranking's current fleet) is not asked.
- Precision: bf16 (``bf16-mixed``, ``bf16-true``) needs compute capability >= 8.0 (Ampere), and transformer-engine
  FP8 needs >= 8.9 (Ada, Hopper): excluded below. fp16 (``16-mixed``, ``16-true``) runs on every supported GPU; below
  7.0 (no tensor cores, e.g. P100, M60) it is slower, which the compute model already prices from the GPU's fp16
  peak, so it is not excluded.

A GPU whose compute capability is unknown (a user-defined GPU without it) is not excluded.
"""

from __future__ import annotations

from predictor.catalog.gpus import GPU
from predictor.catalog.instances import InstanceType
from predictor.catalog.torch_builds import default_image, image_stops, unsupported
from predictor.documents.profile import Profile

MIN_CC_ANY_TORCH = (3, 7)
MIN_CC_TORCH2 = (5, 0)
MIN_CC_PRECISION = {
    "bf16-mixed": ((8, 0), "bf16"),
    "bf16-true": ((8, 0), "bf16"),
    "transformer-engine": ((8, 9), "FP8 for transformer-engine"),
    "transformer-engine-float16": ((8, 9), "FP8 for transformer-engine"),
}
ARM = ("arm64", "aarch64")

ARM64 = "arm64 CPU (Graviton; rank it with --allow-arm64, allow_arm64=True in Python, and an arm64 training image)"
NO_TORCH = "GPU without any torch build (compute capability < 3.7)"
OLD_FOR_TORCH2 = "GPU older than torch 2.x CUDA wheels support (compute capability < 5.0)"


def image_words(driver: str | None) -> str:
    """Which image a driver rule was read for, and how to rank for another."""
    name, default = default_image()
    if driver in (None, default):
        return (
            f"the driver of {name}, the image srifty terraform boots; for an image with a newer one rank with --driver "
            "VERSION (driver= in Python) and give srifty terraform that image (--ami)"
        )
    return "the driver the ranking was given (--driver)"


def torch_major(profile: Profile) -> int | None:
    """The major version of the torch the profile was made with ("2.4.1+cu121" -> 2), None where unknown."""
    version = profile.software.torch if profile.software else None
    try:
        return int(str(version).split(".", 1)[0]) if version else None
    except ValueError:
        return None


def profile_on_arm(profile: Profile) -> bool:
    return (profile.hardware.cpu_arch or "").lower() in ARM


def exclusion(
    it: InstanceType, gpu: GPU | None, profile: Profile, *, allow_arm64: bool, driver: str | None = None
) -> str | None:
    """Why ``it`` cannot run the profiled training (a reason to count), or None when it can; with ``driver`` (the
    NVIDIA driver of the image its nodes boot) also a GPU whose every build of the profiled torch needs a newer
    driver (:func:`~predictor.catalog.torch_builds.image_stops`: the node would stop at boot)."""
    if it.arch.lower() in ARM and not (allow_arm64 or profile_on_arm(profile)):
        return ARM64
    cc = gpu.capability if gpu is not None else None
    if cc is None:
        return None
    if cc < MIN_CC_ANY_TORCH:
        return NO_TORCH
    version = profile.software.torch if profile.software else None
    why = unsupported(str(version), f"{cc[0]}.{cc[1]}") if version else None
    if why:
        return why
    stops = image_stops(str(version), f"{cc[0]}.{cc[1]}", driver) if version and driver else None
    if stops:
        return f"{stops} ({image_words(driver)})"
    major = torch_major(profile)
    if major is not None and major >= 2 and cc < MIN_CC_TORCH2:
        return OLD_FOR_TORCH2
    need = MIN_CC_PRECISION.get(profile.model.precision)
    if need is not None and cc < need[0]:
        return f"no {need[1]} on the GPU (compute capability < {need[0][0]}.{need[0][1]})" + _cpu_bf16(profile)
    return None


def _cpu_bf16(profile: Profile) -> str:
    """Where a bf16-mixed profile was measured on the CPU: Lightning runs ``precision="16-mixed"`` there as
    bf16-mixed (fp16 AMP is not supported on CPU) and the profile records what ran, so a script that asks 16-mixed
    loses the GPUs without bf16 (a trial's V100s and T4s): say how to profile what the GPUs will run."""
    ran_on_cpu = profile.hardware.gpu is None and profile.timing.step_time_s.p50 > 0  # a capture ran no step
    if profile.model.precision != "bf16-mixed" or not ran_on_cpu:
        return ""
    return (
        "; the profile ran on the CPU, where Lightning runs precision='16-mixed' as bf16-mixed: for a script that "
        "asks 16-mixed, profile it on a GPU or capture it with srifty capture --precision 16-mixed"
    )
