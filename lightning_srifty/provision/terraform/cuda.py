"""Which CUDA build of torch the nodes install, at generation time: the rows of ``cuda_builds.json`` (NVIDIA's minimum
drivers, the builds each torch release is published with) that the snapshot carries, and what a known image's driver
will pick. The choice itself is the node's (``bootstrap.choose_torch_build``, standard library only), so that the
summary and the boot can never disagree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_srifty.provision.terraform.bootstrap import choose_torch_build, cuda_release, version_numbers
from predictor.catalog.torch_builds import (  # the one copy: predictor/data/cuda_builds.json
    TABLE,
    default_image,
    release_of,
    table,
)

__all__ = ["TABLE", "default_image", "image_note", "ladder", "summary", "table", "torch_cuda"]


def torch_cuda(torch_version: str) -> tuple[dict[str, Any] | None, list[str]]:
    """environment.json's ``torch_cuda`` for a pinned torch (``2.7.0`` or ``2.7.0+cu128``) and the notes a user must
    read: the builds of that release with each one's minimum drivers and the compute capabilities it carries code for.
    A release the table does not list gets None (the node installs the index's default build): ``srifty terraform``
    refuses that unless the user's index or image provides torch
    (:func:`lightning_srifty.provision.terraform.generate`)."""
    data = table()
    release, _, local = torch_version.partition("+")
    key = release_of(torch_version)
    builds = data["torch_builds"].get(key) if key else None
    if builds is None:
        return None, [
            f"srifty's table of PyTorch's CUDA builds does not list torch {release}: the nodes install the index's "
            "default build, whatever their driver and GPU"
        ]
    rows = {}
    for build, arches in builds.items():
        cuda = cuda_release(build)
        rows[build] = {
            "driver": data["toolkit_driver"][cuda],
            "compat_driver": data["minor_compatibility_driver"][cuda.split(".")[0]],
            "arches": arches,
        }
    profiled = local if local in rows else None
    return {"torch": release, "profiled": profiled, "index": data["torch_index"], "builds": rows}, []


def ladder(spec: dict[str, Any], cc: str | None = None) -> str:
    """What a node picks for each driver, from the newest: ``>= 580.65.06 cu130; >= 570.26 cu128; ...; older: the
    boot stops``, computed with the node's own choice at every threshold (for a GPU of compute capability ``cc``)."""
    cuda = spec["torch_cuda"]
    thresholds = sorted(
        {v for row in cuda["builds"].values() for v in (row["driver"], row["compat_driver"])}, key=version_numbers
    )
    steps: list[tuple[str, str]] = []
    for driver in reversed(thresholds):
        build, why = choose_torch_build(driver, cuda, cc)
        label = f"{build} (minor version compatibility)" if build and "compatibility" in why else str(build)
        if build is None:
            break  # below here nothing runs either
        if steps and steps[-1][1] == label:
            steps[-1] = (driver, label)  # the same pick from a lower driver: one step
        else:
            steps.append((driver, label))
    if not steps:
        return "no driver: no build of this torch runs the GPU"
    return "; ".join(f">= {d} {b}" for d, b in steps) + "; older: the boot stops"


def summary(spec: dict[str, Any], ami_id: str | None, gpus: Sequence[tuple[str, str | None]] = ()) -> list[str]:
    """The summary's lines on torch's CUDA build (``srifty terraform``): the user's index; or, for each GPU of the
    fleet (``gpus``: label and compute capability), the pick on the default image's driver (where known) and the rule
    every GPU node of that kind applies to its own driver."""
    cuda = spec.get("torch_cuda")
    if not cuda:
        return []
    if spec.get("index_url") or spec.get("extra_index_urls"):
        return ["  torch build  what your package index serves (--index-url/--extra-index-url win over srifty's pick)"]
    lines: list[str] = []
    for label, cc in list(gpus) or [("", None)]:
        head = "  torch build  " if not lines else "               "
        who = f"{label}: " if label else ""
        rule = f"every GPU node picks for its own driver at boot: {ladder(spec, cc)}"
        if ami_id:
            lines += [f"{head}{who}{rule}"]
            continue
        name, driver = default_image()
        build, why = choose_torch_build(driver, cuda, cc)
        pick = f"{build} on {name} (NVIDIA driver {driver}): {why}" if build else f"none on {name}: {why}"
        lines += [f"{head}{who}{pick}", f"               {rule}"]
    return lines


def image_note(spec: dict[str, Any], ami_id: str | None, gpus: Sequence[tuple[str, str | None]] = ()) -> str | None:
    """Why the default image's known driver runs no build of the profiled torch for one of the fleet's GPUs (its boot
    would stop), or None."""
    cuda = spec.get("torch_cuda")
    if not cuda or ami_id or spec.get("index_url") or spec.get("extra_index_urls"):
        return None
    name, driver = default_image()
    for label, cc in list(gpus) or [("", None)]:
        build, why = choose_torch_build(driver, cuda, cc)
        if build is None:
            return f"{label + ': ' if label else ''}on {name} (NVIDIA driver {driver}): {why}"
    return None


def fleet_gpus(groups: Sequence[tuple[str, str | None]], catalog: Any) -> list[tuple[str, str | None]]:
    """Each group's GPU (``groups``: instance type and GPU key) as the summary names it (``g5.xlarge (A10G, compute
    capability 8.6)``) and its compute capability (None where the catalog does not know it)."""
    out = []
    for instance_type, key in groups:
        gpu = catalog.gpus.get(key) if key else None
        cc = gpu.compute_capability if gpu is not None else None
        label = f"{instance_type} ({key or 'unknown GPU'}" + (f", compute capability {cc})" if cc else ")")
        out.append((label, cc))
    return out
