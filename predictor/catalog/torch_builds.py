"""Which GPUs a torch release can run: the CUDA builds PyTorch publishes each release with and the compute
capabilities each build carries code for (``predictor/data/cuda_builds.json``, sources in the file).

A GPU runs a build when the build has a cubin of the same major compute capability and a minor at most the GPU's
(a cubin for 8.6 runs on 8.9), or PTX for a compute capability at most the GPU's (the driver compiles it): NVIDIA's
CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility". The node's choice among the builds (its
driver, its GPU) is ``lightning_srifty/provision/bootstrap.py``'s; this module answers the workstation's question:
can *any* published build of the profiled torch run this GPU, and if not, which torch would.

Standard library only, no torch: the catalog's rule of what a type can run (``predictor.catalog.feasible``) and
``srifty terraform`` read it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parents[1] / "data" / "cuda_builds.json"


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads(TABLE.read_text())


def numbers(version: str) -> tuple[int, ...]:
    """``"2.13"`` -> ``(2, 13)``; ``"570.133.20"`` -> ``(570, 133, 20)``."""
    return tuple(int(p) for p in version.split("."))


def release_of(torch_version: str) -> str | None:
    """``"2.13.0+cu130"`` -> ``"2.13"``; None when it does not read as a version."""
    parts = torch_version.split("+", 1)[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return f"{int(parts[0])}.{int(parts[1])}"


def cc_numbers(cc: str) -> tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


def runs(cc: str, arches: list[str]) -> bool:
    """Whether a GPU of compute capability ``cc`` ("8.9") runs a build compiled for ``arches`` (["8.6", "12.0+PTX"])."""
    have = cc_numbers(cc)
    for arch in arches:
        code, ptx = arch.removesuffix("+PTX"), arch.endswith("+PTX")
        built = cc_numbers(code)
        if (built[0] == have[0] and built[1] <= have[1]) or (ptx and built <= have):
            return True
    return False


def builds(torch_version: str) -> dict[str, list[str] | None] | None:
    """The CUDA builds of the release of ``torch_version`` and the compute capabilities of each (None where the
    table does not record them); None when the table does not know the release."""
    release = release_of(torch_version)
    return table()["torch_builds"].get(release) if release else None


def running_builds(torch_version: str, cc: str) -> list[str] | None:
    """The builds of the release that run a GPU of compute capability ``cc``, oldest CUDA first; None when that is not
    known (the release, or its builds' architectures, are not in the table)."""
    rows = builds(torch_version)
    if rows is None or any(arches is None for arches in rows.values()):
        return None
    return [b for b, arches in rows.items() if arches is not None and runs(cc, arches)]


def newest_release_running(cc: str) -> tuple[str, str] | None:
    """(release, build) of the newest torch in the table that runs compute capability ``cc``; None when none does."""
    for release in sorted(table()["torch_builds"], key=numbers, reverse=True):
        for build, arches in table()["torch_builds"][release].items():
            if arches is not None and runs(cc, arches):
                return release, build
    return None


def unsupported(torch_version: str, cc: str) -> str | None:
    """Why no published build of ``torch_version`` runs a GPU of compute capability ``cc`` (a reason to count, with the
    torch that would run it), or None when one does or the table cannot tell."""
    running = running_builds(torch_version, cc)
    if running is None or running:
        return None
    release = release_of(torch_version)
    older = newest_release_running(cc)
    would = f"; torch {older[0]} ({older[1]}) runs it" if older else "; no torch release in srifty's table runs it"
    return f"no torch {release} build for its GPU (compute capability {cc}){would}"


def default_image() -> tuple[str, str]:
    """The name and NVIDIA driver of the image srifty terraform's module boots when given no --ami (the Deep Learning
    AMI it resolves: ``images`` in ``predictor/data/cuda_builds.json``)."""
    ((_, image),) = table()["images"].items()
    return image["name"], image["driver"]


def image_stops(torch_version: str, cc: str, driver: str) -> str | None:
    """Why no published build of ``torch_version`` that runs a GPU of compute capability ``cc`` runs on NVIDIA driver
    ``driver`` (a node of that image would stop at boot: the rule it applies, ``bootstrap.choose_torch_build``, takes
    a build whose CUDA release the driver supports in full or through CUDA minor version compatibility), or None when
    one does or the table cannot tell. Torch 2.13 on a B200 (compute capability 10.0) has only cu130 and cu132,
    which need driver 580.65.06; the Deep Learning AMI's is 570.133.20."""
    running = running_builds(torch_version, cc)
    if not running:  # None: the table cannot tell; []: no build runs the GPU at all (unsupported() says so)
        return None
    compat = table()["minor_compatibility_driver"]
    need = {build: compat[build[2:-1]] for build in running}  # cu130 -> CUDA 13's minimum driver
    if any(numbers(driver) >= numbers(v) for v in need.values()):
        return None
    lowest = min(need.values(), key=numbers)
    return (
        f"no torch {release_of(torch_version)} build for its GPU (compute capability {cc}: {', '.join(running)}) runs "
        f"on NVIDIA driver {driver}: they need >= {lowest}"
    )


def unknown_release(torch_version: str) -> str | None:
    """A sentence when the table does not know the release of ``torch_version`` (newer than the table, or unreadable),
    else None: a node could not choose a CUDA build that exists."""
    release = release_of(torch_version)
    known = sorted(table()["torch_builds"], key=numbers)
    if release in known:
        return None
    return (
        f"torch {torch_version} is not in srifty's table of PyTorch's CUDA builds (cuda_builds.json: {known[0]} to "
        f"{known[-1]}), so no node can be told which CUDA build exists for it and runs on its driver and GPU"
    )
