"""What the launcher watches while the job runs: its own heartbeat, which the jobs read (a launcher killed outright
leaves nothing running for long: :class:`HeartbeatWriter`), another launch live in the same folder
(:func:`refuse_a_live_launch`), a fleet that never reports (:class:`Silence`), and a job that stopped moving after it
did (:class:`StallWatch`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shlex
import threading
import time
from typing import Any

from lightning_srifty import protocol, store
from lightning_srifty.protocol import Heartbeat, Preempted, Progress, Started
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


DEFAULT_STALL_TIMEOUT_S = protocol.STALL_TIMEOUT_S  # a job that trained, then showed no sign of life this long, hangs
STALL_READ_S = 15.0  # the job's records are read for it this often, not at every poll (an S3 GET each)
CLOCK_SLACK_S = 300.0  # the job's clock may differ from the launcher's by minutes (as in Silence)


class StallWatch:
    """A job that took its first step on a leg and then stopped moving: its ``PROGRESS.json`` (rank 0's thread
    rewrites it every ``every_s`` whatever the training loop does) shows neither a new step nor any other sign of life
    (a validation batch, an epoch's start, a checkpoint save: ``active_unix``), or stops coming, for longer than the
    limit. What hangs a job that way: a GPU that stopped answering without a fault its node can see (a kernel that
    never completes holds the process in the driver), a collective waiting on a rank that hangs, a data read or a
    store call that never returns. NCCL's own timeout (the process group's 30 min) is there only with more than one
    rank, and ends the job as a failure; a one-GPU job hung in the driver runs until the fleet's life cap.

    The limit is ``timeout_s``, or longer where the job's own numbers need it: three of its record's periods, and four
    of its measured steps (a model whose step takes minutes). Only the launcher's clock measures the silence; the job's
    ``first_step_unix`` only tells this leg's first step from an earlier leg's (with :data:`CLOCK_SLACK_S`).
    """

    def __init__(self, timeout_s: float | None, read_s: float | None = None) -> None:
        self.timeout_s, self.read_s = timeout_s, STALL_READ_S if read_s is None else read_s
        self.fleet: str | None = None  # the leg watched (LaunchedFleet.name)
        self.wall = 0.0  # the launcher's clock when that leg was started
        self.mark: tuple[Any, ...] | None = None  # what the job last showed: first step, step, its end, last sign
        self.changed = 0.0  # monotonic: when the mark last changed (or the leg's first step was seen)
        self.read_at: float | None = None
        self.limit_s = timeout_s or 0.0
        self.hung_at: list[int | None] = []  # the steps past which the job hung, one per leave

    def started(self, fleet: LaunchedFleet) -> None:
        """A leg starts on ``fleet``: nothing is watched until its first step."""
        self.fleet, self.wall, self.mark, self.read_at = fleet.name, time.time(), None, None

    def check(self, fleet: LaunchedFleet, read: Any, now: float | None = None) -> str | None:
        """Why the job on ``fleet`` is taken for hung (a line), or None. ``read(cls)`` reads one of the launch's
        records (None when absent)."""
        now = time.monotonic() if now is None else now
        if self.timeout_s is None or fleet.name != self.fleet:
            return None
        if self.read_at is not None and now - self.read_at < self.read_s:
            return None
        self.read_at = now
        started: Started | None = read(Started)
        first = None if started is None else started.first_step_unix
        if first is None or first < self.wall - CLOCK_SLACK_S:
            return None  # no first step on this leg yet: the start-up's (Silence's) to watch
        progress: Progress | None = read(Progress)
        if progress is None or progress.unix is None or progress.unix < first:
            return None  # none of this leg's (the same clock, the job's): a job that writes none is not watched
        mark = (first, progress.step, progress.unix, progress.active_unix)
        self.limit_s = max(self.timeout_s, 3 * (progress.every_s or 0.0), 4 * (progress.step_time_s or 0.0))
        if mark != self.mark:
            self.mark, self.changed = mark, now
            return None
        quiet = now - self.changed
        if quiet <= self.limit_s:
            return None
        step = "" if mark[1] is None else f" past step {mark[1]}"
        return (
            f"the job on {fleet.entry.fleet} ({fleet.name}) has shown no progress{step} for {_span(quiet)} "
            f"(no step, validation batch or checkpoint; the limit: {_span(self.limit_s)}, "
            "--stall-timeout-min): it hangs (a GPU that stopped answering, a collective or a read that never returns)"
        )

    def leave(self, fleet: LaunchedFleet, read: Any, launch_id: str, now: float | None = None) -> Preempted | None:
        """The job's leave when it hangs (:meth:`check`), a ``stall`` leave from its last step.

        Raises:
            MigrationError: it hung past the same step on an earlier leg too: the job, not a machine (a deadlock, a
                read that never returns), so not round the plan's fleets.
        """
        why = self.check(fleet, read, now)
        if why is None:
            return None
        if self.step in self.hung_at:
            raise MigrationError(
                f"The job hung past step {self.step} again ({why}): it did so on an earlier leg too, so it is the "
                "job (a deadlock, a read that never returns), not a machine. Its fleets are released; see what its "
                "processes were doing in its logs (srifty logs), and raise stall_timeout_s (`srifty launch "
                "--stall-timeout-min`) if a step, a validation or a save really takes that long."
            )
        self.hung_at.append(self.step)
        return Preempted(launch_id=launch_id, step=self.step, why=why, trigger="stall", last_step_unix=self.step_unix)

    @property
    def step(self) -> int | None:
        """The step the watched job last reported (None: none on this leg)."""
        return None if self.mark is None else self.mark[1]

    @property
    def step_unix(self) -> float | None:
        """When that step ended (the job's clock): a move's downtime counts from it."""
        return None if self.mark is None else self.mark[2]


def _span(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


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
