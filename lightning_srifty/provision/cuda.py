"""Which CUDA build of torch the nodes install, at generation time: the rows of ``cuda_builds.json`` (NVIDIA's minimum
drivers, the builds each torch release is published with) that the snapshot carries, and what a known image's driver
will pick. The choice itself is the node's (``bootstrap.choose_torch_build``, standard library only), so that the
summary and the boot can never disagree."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from lightning_srifty.provision.bootstrap import choose_torch_build, cuda_release, version_numbers

TABLE = Path(__file__).with_name("cuda_builds.json")


@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads(TABLE.read_text())


def torch_cuda(torch_version: str) -> tuple[dict[str, Any] | None, list[str]]:
    """environment.json's ``torch_cuda`` for a pinned torch (``2.7.0`` or ``2.7.0+cu128``) and the notes a user must
    read: the builds of that release with each one's minimum drivers. A release newer than the table is given the
    newest listed release's builds (said in a note); an older, unlisted one gets None (the index's default build)."""
    data = table()
    release, _, local = torch_version.partition("+")
    key = ".".join(release.split(".")[:2])
    known = sorted(data["torch_builds"], key=version_numbers)
    notes: list[str] = []
    builds = data["torch_builds"].get(key)
    if builds is None and version_numbers(key) > version_numbers(known[-1]):
        builds = data["torch_builds"][known[-1]]
        notes.append(
            f"torch {release} is newer than srifty's table of PyTorch's CUDA builds (cuda_builds.json, newest "
            f"{known[-1]}): GPU nodes choose among {known[-1]}'s builds ({', '.join(builds)}); for a build PyTorch "
            f"did not publish for {release}, pip takes the index's default build"
        )
    elif builds is None:
        notes.append(
            f"srifty's table of PyTorch's CUDA builds does not list torch {release}: the nodes install the index's "
            "default build, whatever their driver"
        )
        return None, notes
    rows = {}
    for build in builds:
        cuda = cuda_release(build)
        rows[build] = {
            "driver": data["toolkit_driver"][cuda],
            "compat_driver": data["minor_compatibility_driver"][cuda.split(".")[0]],
        }
    profiled = local if local in rows else None
    return {"torch": release, "profiled": profiled, "index": data["torch_index"], "builds": rows}, notes


def default_image() -> tuple[str, str]:
    """The default image's name and its NVIDIA driver (the Deep Learning AMI the module resolves by default)."""
    ((_, image),) = table()["images"].items()
    return image["name"], image["driver"]


def ladder(spec: dict[str, Any]) -> str:
    """What a node picks for each driver, from the newest: ``>= 580.65.06 cu130; >= 570.26 cu128; ...; older: the
    boot stops``, computed with the node's own choice at every threshold."""
    cuda = spec["torch_cuda"]
    thresholds = sorted(
        {v for row in cuda["builds"].values() for v in (row["driver"], row["compat_driver"])}, key=version_numbers
    )
    steps: list[tuple[str, str]] = []
    for driver in reversed(thresholds):
        build, why = choose_torch_build(driver, cuda)
        label = f"{build} (minor version compatibility)" if build and "compatibility" in why else str(build)
        if steps and steps[-1][1] == label:
            steps[-1] = (driver, label)  # the same pick from a lower driver: one step
        else:
            steps.append((driver, label))
    return "; ".join(f">= {d} {b}" for d, b in steps) + "; older: the boot stops"


def summary(spec: dict[str, Any], ami_id: str | None) -> list[str]:
    """The summary's lines on torch's CUDA build (``srifty terraform``): the user's index; or the pick on the default
    image's driver (where known) and the rule every GPU node applies to its own."""
    cuda = spec.get("torch_cuda")
    if not cuda:
        return []
    if spec.get("index_url") or spec.get("extra_index_urls"):
        return ["  torch build  what your package index serves (--index-url/--extra-index-url win over srifty's pick)"]
    rule = f"every GPU node picks for its own driver at boot: {ladder(spec)}"
    if ami_id:
        return [f"  torch build  {rule}"]
    name, driver = default_image()
    build, why = choose_torch_build(driver, cuda)
    pick = f"{build} on {name} (NVIDIA driver {driver}): {why}" if build else f"none on {name}: {why}"
    return [f"  torch build  {pick}", f"               {rule}"]


def image_note(spec: dict[str, Any], ami_id: str | None) -> str | None:
    """A note when the default image's known driver runs none of the builds (the boot would stop)."""
    cuda = spec.get("torch_cuda")
    if not cuda or ami_id or spec.get("index_url") or spec.get("extra_index_urls"):
        return None
    _, driver = default_image()
    build, why = choose_torch_build(driver, cuda)
    return None if build else why
