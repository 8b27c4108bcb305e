"""The small JSON objects a training job and ``srifty launch`` exchange beside the checkpoints (torch-free).

They live in the checkpoint folder, local or ``s3://`` (any fsspec URL), because that is the one place both the job on
the fleet and the launcher can reach whatever the provisioner. Each is written to a temporary name and renamed into
place, so a reader never sees half of one.

    MOVE_REQUEST.json  job -> launcher  a trigger (drift, price) advises a move: why, the reason, the re-ranked plan
    LEAVE.json         launcher -> job  the new fleet is up: checkpoint at the next step and leave
    PREEMPTED.json     job -> launcher  the job left (spot notice, SIGTERM, a granted move): step, checkpoint, why
    FINISHED.json      job -> launcher  training ended normally: the last step
    FAILED.json        job -> launcher  training raised: the step and the error (the launcher stops, releases fleets)
    HANDOVER-<fleet>.json  launcher -> new fleet  the checkpoint to resume from (a fleet that boots before the old
                       one has left waits for it)
"""

from __future__ import annotations

import json
import os
from typing import Any

MOVE_REQUEST = "MOVE_REQUEST.json"
LEAVE = "LEAVE.json"
PREEMPTED = "PREEMPTED.json"
FINISHED = "FINISHED.json"
FAILED = "FAILED.json"
CALIBRATION = "calibration.json"  # measured/predicted factors by GPU from the fleets the job ran on (for the triggers)
PROFILE = "profile.json"  # the job's profile, kept for the triggers of later legs (a resumed run does not re-profile)


def handover(fleet_name: str) -> str:
    return f"HANDOVER-{fleet_name}.json"


def _fs(dirpath: str) -> Any:
    from fsspec.core import url_to_fs

    options: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if str(dirpath).startswith(("s3://", "s3a://")) and endpoint:
        # explicit, so that fsspec's cache of filesystems (keyed by these options) never hands out one made for
        # another endpoint
        options["endpoint_url"] = endpoint
    return url_to_fs(dirpath, **options)[0]


def path(dirpath: str, name: str) -> str:
    return f"{str(dirpath).rstrip('/')}/{name}"


def write(dirpath: str, name: str, data: dict[str, Any]) -> str:
    """Write ``data`` as ``dirpath/name`` atomically (temporary name, then a rename)."""
    fs, final = _fs(dirpath), path(dirpath, name)
    fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(final + ".partial", "w") as f:
        json.dump(data, f, indent=1, default=str)
    fs.mv(final + ".partial", final)
    return final


def read(dirpath: str, name: str) -> dict[str, Any] | None:
    fs, where = _fs(dirpath), path(dirpath, name)
    try:
        with fs.open(where, "r") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def present(dirpath: str) -> set[str]:
    """The names in ``dirpath`` now (one listing; what a poll reads before opening only what is there)."""
    fs = _fs(dirpath)
    fs.invalidate_cache()
    try:
        return {str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(str(dirpath).rstrip("/"), detail=False)}
    except FileNotFoundError:
        return set()


def exists(dirpath: str, name: str) -> bool:
    fs = _fs(dirpath)
    fs.invalidate_cache()  # s3fs caches listings: a marker written by another process must be seen
    return bool(fs.exists(path(dirpath, name)))


def clear(dirpath: str, *names: str) -> None:
    fs = _fs(dirpath)
    for name in names:
        if fs.exists(path(dirpath, name)):
            fs.rm(path(dirpath, name))
