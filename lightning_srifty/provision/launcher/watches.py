"""What the launcher watches while the job runs: its own heartbeat, which the jobs read (a launcher killed outright
leaves nothing running for long: :class:`HeartbeatWriter`), another launch live in the same folder
(:func:`refuse_a_live_launch`), and a fleet that never reports (:class:`Silence`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shlex
import threading
import time
from typing import Any

from lightning_srifty import protocol, store
from lightning_srifty.protocol import Heartbeat
from lightning_srifty.provision.base import LaunchedFleet
from predictor.exceptions import MigrationError
from predictor.runs import startup


class HeartbeatWriter:
    """Rewrites ``HEARTBEAT.json`` every ``every_s`` in a thread (a terraform apply of minutes must not stop it)."""

    def __init__(self, ckpt: str, launch_id: str, every_s: float, max_age_s: float, echo: Any) -> None:
        self.ckpt, self.launch_id, self.every_s, self.max_age_s, self.echo = ckpt, launch_id, every_s, max_age_s, echo
        self.max_life_until_unix: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="srifty-heartbeat", daemon=True)
        self._failing = False

    def beat(self) -> None:
        record = Heartbeat(
            launch_id=self.launch_id,
            written_unix=time.time(),
            max_age_s=self.max_age_s,
            max_life_until_unix=self.max_life_until_unix,
        )
        try:
            protocol.write_record(self.ckpt, record)
            self._failing = False
        except Exception as exc:  # noqa: BLE001 - keep trying: the jobs leave only when it stays away max_age_s
            if not self._failing:
                self.echo(f"srifty launch: the heartbeat could not be written ({exc}); retrying every {self.every_s} s")
            self._failing = True

    def start(self) -> None:
        self.beat()  # there before any job starts
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.every_s + 5)
        with contextlib.suppress(Exception):
            protocol.clear_records(self.ckpt, Heartbeat)  # this launch is over: nobody should wait for it


DEFAULT_START_TIMEOUT_S = 1800.0  # provisioning, boot, setup and the first step of a remote fleet, at most


class Silence:
    """A fleet that never reports (failed boot or setup, OOM, the store unreachable) is detected: progress every
    minute while the job has not taken its first step, and a MigrationError after ``timeout_s`` (the launcher then
    releases every fleet)."""

    def __init__(self, timeout_s: float | None, echo: Any) -> None:
        self.timeout_s, self.echo = timeout_s, echo
        self.since: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.heard: set[str] = set()
        self.next_note = 0.0

    def started(self, fleet: LaunchedFleet) -> None:
        self.since[fleet.name], self.wall[fleet.name] = time.monotonic(), time.time()
        self.next_note = time.monotonic() + 60

    def check(self, fleet: LaunchedFleet, started: Any) -> None:
        if self.timeout_s is None or fleet.name in self.heard or fleet.name not in self.since:
            return
        # the job's first step on this leg (its clock may differ from ours by minutes: 300 s of slack)
        if started is not None and (started.first_step_unix or 0) >= self.wall[fleet.name] - 300:
            self.heard.add(fleet.name)
            if "up_unix" in fleet.data and not started.resumed_from:  # a cloud fleet's first leg: a node's boot
                ready = started.first_step_unix - fleet.data["up_unix"] - fleet.data["provision_s"]
                startup.record_ready([g.instance_type for g in fleet.entry.groups], ready)
            return
        waited = time.monotonic() - self.since[fleet.name]
        if waited > self.timeout_s:
            folder = fleet.data.get("folder")  # a root module: its nodes' logs outlive it, beside the checkpoints
            if "process" in fleet.data:  # local processes write to this terminal: no log file of their own (#37 L)
                why = "its output is above: the local processes write to this terminal"
            elif folder:
                why = (
                    "what its nodes logged (boot, setup, training) stays beside the checkpoints: "
                    f"srifty logs --dir {shlex.quote(str(folder))}"
                )
            else:
                why = "the instances' console output and /var/log/srifty-user-data.log on them say why"
            raise MigrationError(
                f"The job on {fleet.entry.fleet} ({fleet.name}) has not reported in {waited / 60:.0f} min (no first "
                "step, no record): its boot or setup failed, it ran out of memory, or it cannot reach the checkpoint "
                f"folder. The fleet is released; {why}. Raise the limit (start_timeout_s; `srifty launch "
                "--start-timeout-min`) if the setup really takes longer."
            )
        if time.monotonic() >= self.next_note:
            self.next_note = time.monotonic() + 60
            self.echo(
                f"srifty launch: waiting for the job on {fleet.entry.fleet} to take its first step: "
                f"{waited / 60:.0f} of at most {self.timeout_s / 60:.0f} min"
            )


def refuse_a_live_launch(ckpt: str, launch_id: str) -> None:
    """Two launches in one checkpoint folder would take each other's checkpoints: refuse while another one's
    heartbeat is fresh."""
    other = protocol.read_record(ckpt, Heartbeat)
    if other is not None and other.launch_id != launch_id and not other.stale():
        until = dt.datetime.fromtimestamp(other.written_unix + other.max_age_s, dt.timezone.utc)
        raise MigrationError(
            f"Another srifty launch ({other.launch_id}) is live in {ckpt}: its heartbeat was written "
            f"{other.age_s():.0f} s ago. Give this run another checkpoint folder, or stop that launch; if it was "
            f"killed, its jobs leave by {until:%H:%M:%S} UTC and then delete {store.path(ckpt, protocol.HEARTBEAT)}."
        )
