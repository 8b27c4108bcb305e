"""EC2 instance metadata (IMDSv2) with short timeouts, in a background thread: never blocks training. Shared by
``profiling`` (the instance type) and ``migrate`` (spot notices), so that neither imports the other for it.

Honours the standard botocore settings: ``AWS_EC2_METADATA_DISABLED=true`` turns it off,
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` points it elsewhere (tests use a server on 127.0.0.1). Off EC2 (judged from
the DMI vendor) it sends nothing unless an endpoint was set explicitly.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ENDPOINT = "http://169.254.169.254"
_DMI_FILES = ("/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/board_vendor", "/sys/hypervisor/uuid")


@dataclass(frozen=True)
class InstanceMetadata:
    instance_type: str | None
    availability_zone: str | None
    lifecycle: str | None


def metadata_endpoint() -> str | None:
    """The IMDS endpoint to query, or None when disabled or evidently not on EC2."""
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        return None
    explicit = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
    if explicit:
        return explicit.rstrip("/")
    return DEFAULT_ENDPOINT if _looks_like_ec2() else None


def _looks_like_ec2() -> bool:
    readable = False
    for name in _DMI_FILES:
        try:
            text = Path(name).read_text(encoding="utf-8", errors="replace").strip().lower()
        except OSError:
            continue
        readable = True
        if "amazon" in text or text.startswith("ec2"):
            return True
    return not readable  # cannot tell: ask (bounded by the timeout)


class _Client:
    def __init__(self, endpoint: str, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # IMDS is never proxied
        self._token: str | None = None

    def token(self) -> str:
        if self._token is None:
            req = urllib.request.Request(
                f"{self.endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
            )
            with self._opener.open(req, timeout=self.timeout) as resp:
                self._token = resp.read().decode()
        return self._token

    def get(self, path: str) -> str | None:
        req = urllib.request.Request(
            f"{self.endpoint}/latest/{path}", headers={"X-aws-ec2-metadata-token": self.token()}
        )
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.read().decode().strip()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


def fetch_instance_metadata(endpoint: str | None = None, timeout: float = 0.5) -> InstanceMetadata | None:
    """Instance type, AZ and life cycle, or None off EC2 / on any error."""
    endpoint = endpoint or metadata_endpoint()
    if endpoint is None:
        return None
    client = _Client(endpoint, timeout)
    try:
        return InstanceMetadata(
            instance_type=client.get("meta-data/instance-type"),
            availability_zone=client.get("meta-data/placement/availability-zone"),
            lifecycle=client.get("meta-data/instance-life-cycle"),
        )
    except (OSError, urllib.error.URLError, ValueError):
        return None


class MetadataLookup:
    """Fetches instance metadata in a daemon thread; ``result()`` never waits longer than asked."""

    def __init__(self, endpoint: str | None = None, timeout: float = 0.5) -> None:
        self._result: InstanceMetadata | None = None
        self._thread = threading.Thread(target=self._run, args=(endpoint, timeout), name="srifty-imds", daemon=True)
        self._thread.start()

    def _run(self, endpoint: str | None, timeout: float) -> None:
        self._result = fetch_instance_metadata(endpoint, timeout)

    def result(self, wait: float = 0.0) -> InstanceMetadata | None:
        self._thread.join(wait)
        return self._result
