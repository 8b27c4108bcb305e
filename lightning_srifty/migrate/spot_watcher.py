"""A background thread that watches the instance metadata service for spot interruption notices and rebalance
recommendations (IMDSv2 tokens, refreshed on 401), and never blocks training.

``spot/instance-action`` answers 404 until AWS decides to reclaim the instance, then
``{"action": "terminate" | "stop" | "hibernate", "time": "..."}`` about two minutes ahead;
``events/recommendations/rebalance`` answers ``{"noticeTime": "..."}`` when the capacity is at elevated risk.
Off EC2 (no endpoint, see :func:`.imds.metadata_endpoint`) it does not start; an endpoint that stops
answering is retried quietly.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass

from lightning_srifty.imds import _Client, metadata_endpoint

log = logging.getLogger("lightning_srifty")


@dataclass(frozen=True)
class Notice:
    kind: str  # "interruption" or "rebalance"
    action: str | None  # terminate / stop / hibernate (interruption), None (rebalance)
    time: str | None  # when AWS acts (interruption) or noticed (rebalance), as AWS gives it
    seen_monotonic: float

    def action_unix(self) -> float | None:
        """When AWS acts (an interruption's ``time``), as unix seconds; None without a readable time."""
        return _parse_time(self.time) if self.kind == "interruption" else None

    def describe(self, now: float | None = None) -> str:
        """``spot interruption notice: terminate at 14:02:00 UTC (in 118 s)``; a missing or unreadable time is said
        so, never printed as an empty ``at``."""
        if self.kind == "interruption":
            return f"spot interruption notice: {self.action or 'terminate'} {_when(self.time, now)}"
        return f"rebalance recommendation (noticed {_when(self.time, now).removeprefix('at ')})"


def _parse_time(stamp: str | None) -> float | None:
    """AWS's ``2026-11-22T14:02:00Z`` as unix seconds (UTC when no zone is given); None when absent or unreadable."""
    import datetime as dt

    if not stamp or not str(stamp).strip():
        return None
    try:
        at = dt.datetime.fromisoformat(str(stamp).strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return (at if at.tzinfo is not None else at.replace(tzinfo=dt.timezone.utc)).timestamp()


def _when(stamp: str | None, now: float | None = None) -> str:
    """``at 14:02:00 UTC (in 118 s)`` for AWS's ``2026-11-22T14:02:00Z``; ``(no time given)`` without one."""
    import datetime as dt

    if not stamp or not str(stamp).strip():
        return "(no time given)"
    at = _parse_time(stamp)
    if at is None:
        return f"(time given as {stamp!r})"
    left = at - (time.time() if now is None else now)
    relative = f"in {left:.0f} s" if left >= 0 else f"{-left:.0f} s ago"
    return f"at {dt.datetime.fromtimestamp(at, dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC ({relative})"


class SpotWatcher:
    """Poll every ``interval_s``; call ``on_notice(Notice)`` once per kind. ``endpoint`` None: the standard
    settings decide (``AWS_EC2_METADATA_SERVICE_ENDPOINT``, ``AWS_EC2_METADATA_DISABLED``, the DMI vendor)."""

    def __init__(
        self,
        on_notice: Callable[[Notice], None],
        *,
        endpoint: str | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 1.0,
        watch_rebalance: bool = True,
        owner: str = "lightning-srifty",
    ) -> None:
        self.on_notice = on_notice
        self.owner = owner  # who its log lines name: the class that watches (SpotPreemption, FabricPreemption)
        self.endpoint = endpoint.rstrip("/") if endpoint else metadata_endpoint()
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.watch_rebalance = watch_rebalance
        self.notices: list[Notice] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Start polling; False (and nothing started) when there is no metadata endpoint to ask."""
        if self.endpoint is None:
            return False
        self._thread = threading.Thread(target=self._run, name="srifty-spot-watcher", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * 3 + 1)

    def _run(self) -> None:
        assert self.endpoint is not None
        client = _Client(self.endpoint, self.timeout_s)
        seen: set[str] = set()
        failures = 0
        while not self._stop.is_set():
            try:
                self._poll(client, seen)
                failures = 0
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # the token expired or the service restarted: get a new one
                    client._token = None
                failures += 1
            except (OSError, ValueError) as exc:
                failures += 1
                if failures == 3:
                    log.info("%s: the instance metadata service does not answer (%s); still trying", self.owner, exc)
            self.polls += 1
            self._stop.wait(self.interval_s if failures < 3 else min(60.0, self.interval_s * failures))

    def _poll(self, client: _Client, seen: set[str]) -> None:
        paths = ["meta-data/spot/instance-action"]
        if self.watch_rebalance:
            paths.append("meta-data/events/recommendations/rebalance")
        for path in paths:
            kind = "interruption" if "instance-action" in path else "rebalance"
            if kind in seen:
                continue
            body = client.get(path)
            if body is None:
                continue
            data = json.loads(body)
            notice = Notice(
                kind,
                data.get("action") if kind == "interruption" else None,
                data.get("time") if kind == "interruption" else data.get("noticeTime"),
                time.monotonic(),
            )
            seen.add(kind)
            self.notices.append(notice)
            log.warning("%s: %s", self.owner, notice.describe())
            try:
                self.on_notice(notice)
            except Exception:
                log.exception("%s: the spot notice handler failed", self.owner)
