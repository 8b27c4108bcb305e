"""The nodes' logs beside the checkpoints (torch-free): ``srifty logs``.

Every node copies its boot log (boot, setup and the torchrun output, ``/var/log/srifty-user-data.log``) to
``<checkpoint uri>logs/<fleet>/<instance id>.log`` every 30 s and once more when its boot script ends, just before it
writes its status record ``<checkpoint uri>status/<fleet>-<instance id>.json`` (see the module's user_data template).
Following a log reads only the bytes past what was printed (an S3 ranged GET) and ends once the status record is
there: the last copy has landed by then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_srifty.provision.aws import split_s3


@dataclass(frozen=True)
class LogObject:
    instance_id: str
    key: str
    size: int
    modified_unix: float


class FleetLogs:
    """The logs of one fleet in its checkpoint folder, read through a boto3 S3 client."""

    def __init__(self, s3: Any, checkpoint_uri: str, fleet: str) -> None:
        self.s3 = s3
        self.fleet = fleet
        self.bucket, self.prefix = split_s3(checkpoint_uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}logs/{fleet}/"

    def list(self) -> list[LogObject]:
        """Every node's log, oldest first."""
        found = []
        where = f"{self.prefix}logs/{self.fleet}/"
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=where):
            for obj in page.get("Contents", []):
                name = obj["Key"][len(where) :]
                if "/" in name or not name.endswith(".log"):
                    continue
                found.append(LogObject(name[:-4], obj["Key"], obj["Size"], obj["LastModified"].timestamp()))
        return sorted(found, key=lambda o: (o.modified_unix, o.instance_id))

    def read(self, log: LogObject, offset: int = 0) -> bytes:
        """The bytes of ``log`` from ``offset`` on (empty when there are none yet)."""
        if offset >= log.size:
            return b""
        extra = {"Range": f"bytes={offset}-"} if offset else {}
        return self.s3.get_object(Bucket=self.bucket, Key=log.key, **extra)["Body"].read()

    def finished(self, instance_id: str) -> bool:
        """Whether the node's status record is there (its boot script has ended; its last log copy is in)."""
        key = f"{self.prefix}status/{self.fleet}-{instance_id}.json"
        return self.s3.list_objects_v2(Bucket=self.bucket, Prefix=key).get("KeyCount", 0) > 0


def follow(
    logs: FleetLogs,
    write: Callable[[str, bytes], None],
    *,
    instance: str | None = None,
    keep_going: bool = True,
    interval_s: float = 5.0,
    sleep: Callable[[float], None] | None = None,
) -> set[str]:
    """Print the logs (``instance``: that node's alone) through ``write(instance_id, new_bytes)``; with
    ``keep_going``, poll every ``interval_s`` for new bytes and new nodes until every log followed has its status
    record (or Ctrl-C). Returns the instance ids whose logs were printed."""

    sleep = sleep or time.sleep
    offsets: dict[str, int] = {}
    done: set[str] = set()
    while True:
        for log in logs.list():
            if instance and log.instance_id != instance:
                continue
            ended = keep_going and log.instance_id not in done and logs.finished(log.instance_id)
            if ended:  # the record comes after the last copy: list again so as not to miss its bytes
                log = next((o for o in logs.list() if o.instance_id == log.instance_id), log)
            offset = offsets.get(log.instance_id, 0)
            if log.size < offset:  # rewritten shorter (should not happen): start it again
                write(log.instance_id, f"[srifty: {log.key} was rewritten; printing it again]\n".encode())
                offset = 0
            data = logs.read(log, offset)
            if data:
                write(log.instance_id, data)
            offsets[log.instance_id] = offset + len(data)
            if ended:
                done.add(log.instance_id)
        if not keep_going or (offsets and done >= set(offsets)):
            return set(offsets)
        sleep(interval_s)
