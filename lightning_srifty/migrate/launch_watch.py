"""What a job under ``srifty launch`` tells its launcher, and how it notices that it should leave on its own.

:class:`LaunchWatch` is :class:`~.preemption.SpotPreemption`'s side of the protocol with the launcher
(:mod:`lightning_srifty.protocol`): rank 0 writes ``STARTED.json`` at the first step (the end of a move's downtime)
and ``PROGRESS.json`` (the global step and the measured step time) at most every ``progress_s``; a thread reads
``HEARTBEAT.json`` (older than its ``max_age_s``: "launcher heartbeat lost"), the fleet's life cap
(``max_life_until_unix``) and, on rank 0, ``LEAVE.json`` (the launcher's spot guard moving the job), and asks the
callback to checkpoint and leave. The step hook only notes two numbers; every write happens on the thread, so a slow
checkpoint store never holds a training step.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from lightning_srifty import protocol
from lightning_srifty.launch_checks import launch_mismatches, plan_data
from lightning_srifty.profiling.recommendation import planned_steps
from lightning_srifty.profiling.steps import batches_stepped, optimizer_steps_per_batch
from lightning_srifty.protocol import Heartbeat, LaunchEnv, Leave, Started

log = logging.getLogger("lightning_srifty")

# leave(why, trigger, move, to_fleet): checkpoint at the next step boundary and leave
LeaveRequest = Callable[[str, str, bool, "str | None"], None]


class LaunchWatch:
    """Rank 0's reports to the launcher and every rank's watch of it (one per :class:`SpotPreemption`).

    Args:
        dirpath: the checkpoint folder, where the launcher's and the job's records live.
        launch: the launch's environment.
        interval_s: how often the watch looks at most (a quarter of the heartbeat's max age, 30 s at most).
        progress_s: rank 0 rewrites ``PROGRESS.json`` at most this often (None: never).
        leave: called to checkpoint and leave at the next step boundary.
        leaving: whether the job is already leaving (a move it asked for says why itself).
    """

    def __init__(
        self,
        dirpath: str,
        launch: LaunchEnv,
        *,
        interval_s: float,
        progress_s: float | None,
        leave: LeaveRequest,
        leaving: Callable[[], bool],
    ) -> None:
        self.dirpath, self.launch, self.interval_s, self.progress_s = dirpath, launch, interval_s, progress_s
        self._leave, self._leaving = leave, leaving
        self._leg_first: tuple[int, float] | None = None  # (global step, unix) at this leg's first step end
        self._progress_at: float | None = None  # monotonic time of the last PROGRESS.json
        self._latest: tuple[int, float] | None = None  # (global step, unix) of the newest step end, for the watch
        self._active: float | None = None  # unix: the training loop's last sign of life (a step, a validation batch)
        self.training_over = False  # the last step is done: what runs until fit() ends is not a hang (an export)
        self._started_written = False
        self._per_batch = 1.0  # Lightning's global steps a step of the work makes (a manual loop's optimizers a batch)
        self._thread: threading.Thread | None = None
        self.stop_event = threading.Event()

    # --- rank 0's reports --------------------------------------------------------------------------------------------

    def step_ended(self, step: int, unix: float, trainer: Any = None, *, trained: dict[str, Any] | None = None) -> None:
        """Rank 0's step hook: ``STARTED.json`` at the leg's first step (with how ``trainer`` trains, or ``trained``:
        those fields, from a loop that is not a Trainer's), then the progress noted for the thread."""
        if trainer is not None:
            self._per_batch = optimizer_steps_per_batch(trainer)
        if not self._started_written:
            self._started_written = True  # the end of a move's downtime, for the launcher's report
            started = Started(
                launch_id=self.launch.launch_id,
                fleet=self.launch.fleet,
                step=step,
                first_step_unix=unix,
                resumed_from=self.launch.resume,
                **(trained if trained is not None else {} if trainer is None else trained_as(trainer, self.launch)),
            )
            try:
                protocol.write_record(self.dirpath, started)
            except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop training
                log.warning("SpotPreemption: could not write %s: %s", protocol.STARTED, exc)
        self.note_progress(step, unix)

    def note_progress(self, step: int, unix: float) -> None:
        """The step hook's part of progress reporting: two numbers in memory, written by the thread
        (:meth:`report_progress`)."""
        if self._leg_first is None:
            self._leg_first = (step, unix)
        self._latest = (step, unix)
        self.note_active(unix)

    def note_active(self, unix: float) -> None:
        """The training loop is alive without a step ending (a validation batch, an epoch's start or end, a full
        save's start, a periodic save's end): the launcher's stall watch must not take a long validation or save for
        a hung job."""
        self._active = unix if self._active is None else max(self._active, unix)

    def report_progress(self, step: int, unix: float, now: float | None = None) -> bool:
        """Rewrite ``PROGRESS.json`` when ``progress_s`` has passed since the last one (the first step of a leg
        always writes one); True when written. The step time is measured from the leg's first step, so a leg's
        start-up and restore never count as training."""
        now = time.monotonic() if now is None else now
        if self._leg_first is None:
            self._leg_first = (step, unix)
        if self.progress_s is None:
            return False
        if self._progress_at is not None and now - self._progress_at < self.progress_s:
            return False
        self._progress_at = now
        first_step, first_unix = self._leg_first
        step_time = (unix - first_unix) / (step - first_step) if step > first_step else None
        record = protocol.Progress(
            launch_id=self.launch.launch_id,
            fleet=self.launch.fleet,
            step=step,
            unix=unix,
            step_time_s=step_time,
            active_unix=time.time() if self.training_over else max(unix, self._active or unix),
            every_s=self.progress_s,
            steps_per_batch=self._per_batch,
        )
        try:
            protocol.write_record(self.dirpath, record)
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop training
            log.warning("SpotPreemption: could not write %s: %s", protocol.PROGRESS, exc)
            return False
        return True

    # --- the watch ---------------------------------------------------------------------------------------------------

    def needed(self, rank_zero: bool) -> bool:
        """Whether this rank has anything to watch or report (a life cap, a heartbeat, rank 0's progress)."""
        progress = self.progress_s is not None and rank_zero
        return self.launch.max_life_until_unix is not None or bool(self.launch.heartbeat_max_age_s) or progress

    def start(self, rank_zero: bool) -> None:
        heartbeat = bool(self.launch.heartbeat_max_age_s) and rank_zero  # rank 0 reads; the step agrees
        self.stop_event.clear()
        self._thread = threading.Thread(
            target=self.run, args=(heartbeat, rank_zero), name="srifty-launcher-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()

    def run(self, heartbeat: bool, rank_zero: bool = False) -> None:
        """Leave when the launcher's heartbeat is older than its max age, at the fleet's life cap, or (rank 0) when
        the launcher asks with ``LEAVE.json`` on its own: its spot guard moving the job to on-demand or back to spot
        (a move the job asked for is answered in :class:`~lightning_srifty.migrate.MigrationTriggers`)."""
        launch = self.launch
        max_age = float(launch.heartbeat_max_age_s or 0)
        period = max(0.05, min(self.interval_s, max_age / 4 if max_age else 30.0, 30.0))
        last_seen = time.time()  # the job's start counts as a sighting: a launcher gone before it is noticed too
        warned = False
        acted = False  # a leave asked for: from then on the thread only reports (the leave's save shows life)
        while not self.stop_event.wait(period):
            if rank_zero and self._latest is not None:  # the progress the step hook noted, written off the step
                self.report_progress(*self._latest)
            now = time.time()
            if acted:
                continue
            if launch.max_life_until_unix is not None and now >= launch.max_life_until_unix:
                cap = time.strftime("%H:%M:%S UTC", time.gmtime(launch.max_life_until_unix))
                self._on_own("max-life", f"the fleet's life cap was reached ({cap}; srifty launch --max-life-h)")
                acted = True
                continue
            if rank_zero and self.says_leave():
                acted = True
                continue
            if not heartbeat:
                continue
            try:
                beat = protocol.read_record(self.dirpath, Heartbeat, launch.launch_id or None)
            except Exception as exc:  # noqa: BLE001 - unreadable counts as unseen; only its age decides
                if not warned:
                    log.warning("SpotPreemption: the launcher's heartbeat could not be read: %s", exc)
                warned, beat = True, None
            if beat is not None:
                last_seen, max_age = max(last_seen, beat.written_unix), beat.max_age_s
            if now - last_seen > max_age:
                self._on_own(
                    "heartbeat",
                    f"launcher heartbeat lost: {protocol.HEARTBEAT} last written {now - last_seen:.1f} s ago "
                    f"(max age {max_age:g} s)",
                )
                acted = True

    def says_leave(self) -> bool:
        """A ``LEAVE.json`` of this launch: checkpoint at the next step and leave as a granted move."""
        try:
            granted = protocol.read_record(self.dirpath, Leave, self.launch.launch_id or None)
        except Exception:  # noqa: BLE001 - unreadable now: asked again at the next look
            return False
        if granted is None:
            return False
        if self._leaving():  # already leaving (a move the job asked for says why itself)
            return True
        why = f"the launcher moves the job to {granted.to_fleet or 'another fleet'}"
        self._leave(why, "leave", True, granted.to_fleet or None)
        return True

    def _on_own(self, trigger: str, why: str) -> None:
        log.warning("SpotPreemption: %s: checkpoint and leave", why)
        self._leave(why, trigger, False, None)


def trained_as(trainer: Any, launch: LaunchEnv) -> dict[str, Any]:
    """How ``trainer`` trains, for ``STARTED.json``: its world size, its strategy and what it does otherwise than the
    plan (never raises: a report)."""
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    strategy = trainer.strategy
    name = "fsdp" if isinstance(strategy, FSDPStrategy) else "ddp" if isinstance(strategy, DDPStrategy) else ""
    try:
        mismatches = tuple(launch_mismatches(trainer, launch))
    except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop training
        mismatches = (f"not checked: {type(exc).__name__}: {exc}",)
    other_work = work_mismatch(trainer, launch)  # the node's log says it (a rehearsal's short run is no failure)
    if other_work:
        log.warning("SpotPreemption: %s", other_work)
    return {
        "world_size": int(trainer.world_size),
        "strategy": name or type(strategy).__name__,
        "mismatches": mismatches,
        "steps_per_batch": optimizer_steps_per_batch(trainer),
    }


# a run this much longer or shorter than the plan's work is said: the plan's time, cost and deadline are another run's
WORK_TOLERANCE = 0.05


def work_mismatch(trainer: Any, launch: LaunchEnv) -> str | None:
    """The Trainer's steps against the work the plan priced (``constraints.work_samples`` at the entry's global
    batch), said where they differ by more than :data:`WORK_TOLERANCE`, with both ways to agree; None where they
    agree or either is unknown. A plan of 20,000 steps on a script of max_steps=100,000 had every figure of the plan,
    the deadline's chance and the spot guard's on-demand finish 5x short, in silence. Never raises (a report); a
    warning, not a mismatch: a rehearsal runs a few hundred steps of a plan's run on purpose."""
    try:
        data = plan_data(launch)
        entries = data.get("entries") if isinstance(data, dict) else None
        choice = launch.choice if launch.choice is not None else (data or {}).get("chosen", 0)
        work = float((data.get("constraints") or {}).get("work_samples") or 0) if isinstance(data, dict) else 0.0
        if not isinstance(entries, list) or not isinstance(choice, int) or not 0 <= choice < len(entries) or work <= 0:
            return None
        batch = entries[choice].get("global_batch") or (data.get("constraints") or {}).get("global_batch")
        steps = planned_steps(trainer)
        if not batch or not steps:
            return None
        planned = math.ceil(work / float(batch) - 1e-9)
        # a move's plan prices the rest of the run (predictor.ranking.replan): the steps left agree with it too
        left = steps - batches_stepped(trainer)
        if min(abs(steps / planned - 1), abs(left / planned - 1)) <= WORK_TOLERANCE:
            return None
        k = optimizer_steps_per_batch(trainer)
        max_steps = f"max_steps={math.ceil(planned * k - 1e-9):,}" + (
            f" (its {k:g} optimizer steps a batch included)" if k > 1 else ""
        )
    except Exception:  # noqa: BLE001 - a report, never a reason to stop training
        return None
    return (
        f"this Trainer runs {steps:,} steps of {int(batch):,} samples, the plan prices {planned:,} ({work:,.0f} "
        f"samples): its time, cost and deadline chance, and the spot guard's on-demand finish, are for "
        f"{planned / steps:.3g}x this run. Plan this run (srifty recommend --steps {steps}), or set {max_steps}"
    )
