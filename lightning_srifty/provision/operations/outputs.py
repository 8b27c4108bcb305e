"""The jobs' outputs beside the checkpoints (torch-free): ``srifty outputs``.

What a job writes in its code folder on a node (Lightning's ``lightning_logs/`` with its metrics and its own
``ModelCheckpoint`` files, a model the script saves at the end, the profile ``SriftyCallback`` measured there) lives on
the instance's disk, which goes when the instance terminates. Every node copies the files its job created or changed
there to ``<checkpoint uri>outputs/<fleet>/<instance id>/`` every 10 minutes while it trains and once more when it
ends (see the module's user_data template); this reads them back, each node's into a folder of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from lightning_srifty.provision.aws import split_s3


@dataclass(frozen=True)
class OutputObject:
    instance_id: str
    path: str  # relative to the node's folder, as the job wrote it relative to its code folder
    key: str
    size: int
    modified_unix: float


class FleetOutputs:
    """The outputs of one fleet's nodes in its checkpoint folder, read through a boto3 S3 client."""

    def __init__(self, s3: Any, checkpoint_uri: str, fleet: str) -> None:
        self.s3 = s3
        self.fleet = fleet
        self.bucket, self.prefix = split_s3(checkpoint_uri)
        self.where = f"{self.prefix}outputs/{fleet}/"
        self.uri = f"s3://{self.bucket}/{self.where}"

    def list(self, instance: str | None = None) -> list[OutputObject]:
        """Every output file (``instance``: that node's alone), by node then path."""
        found = []
        where = self.where + (f"{instance}/" if instance else "")
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=where):
            for obj in page.get("Contents", []):
                node, _, path = obj["Key"][len(self.where) :].partition("/")
                if node and path and not path.endswith("/"):
                    found.append(OutputObject(node, path, obj["Key"], obj["Size"], obj["LastModified"].timestamp()))
        return sorted(found, key=lambda o: (o.instance_id, o.path))

    def fetch(self, objects: Sequence[OutputObject], to: Path, echo: Callable[[str], None] = print) -> tuple[int, int]:
        """Download ``objects`` into ``to/<instance id>/<path>``, each written whole or not at all (a ``.partial``
        renamed into place); a file already there with the same size is kept. Returns (files written, files kept).

        Raises:
            ValueError: a key whose path would leave its node's folder (``..``, an absolute path).
        """
        written = kept = 0
        for obj in objects:
            target = local_path(to, obj)
            if target.is_file() and target.stat().st_size == obj.size:
                kept += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            self.s3.download_file(self.bucket, obj.key, str(partial))
            os.replace(partial, target)
            os.utime(target, (obj.modified_unix, obj.modified_unix))
            written += 1
            echo(f"{obj.instance_id}/{obj.path}  {obj.size:,} bytes")
        return written, kept


def local_path(to: Path, obj: OutputObject) -> Path:
    """Where ``obj`` goes under ``to``: its node's folder and its path, which may not climb out of it.

    Raises:
        ValueError: naming the key.
    """
    parts = PurePosixPath(obj.path).parts
    if not parts or ".." in parts or PurePosixPath(obj.path).is_absolute() or obj.instance_id in (".", ".."):
        raise ValueError(f"the output {obj.key!r} has a path outside its node's folder; it is not fetched")
    return to.joinpath(obj.instance_id, *parts)
