"""Checkpoint and leave on a spot interruption notice or SIGTERM, and find a sound checkpoint to resume from.

``SpotPreemption(dirpath)`` is a Lightning callback: a :class:`~.spot_watcher.SpotWatcher` per node
(each node sees only its own notice) and a SIGTERM handler set a flag; at the next step boundary the ranks agree
(any rank's flag stops all of them, one boolean all-reduce per step), every rank takes part in
``trainer.save_checkpoint`` to a temporary name, rank 0 renames it into place once complete (so no half-written
checkpoint is ever picked up), and the process exits with :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL``), which
``srifty launch`` reads as "preempted: resume elsewhere". (Lightning alone would exit 0 after SIGTERM.)

Under ``srifty launch`` (a :class:`~lightning_srifty.protocol.LaunchEnv` in the environment) rank 0 also watches the
launcher: a ``HEARTBEAT.json`` older than its ``max_age_s`` ("launcher heartbeat lost") and the fleet's life cap
(``max_life_until_unix``) are notices too: checkpoint and leave with exit 75. It writes ``STARTED.json`` at the
first step (the end of a move's downtime), ``PROGRESS.json`` (the global step) at most every ``progress_s``
while it trains, and ``PREEMPTED.json`` / ``FINISHED.json`` / ``FAILED.json`` as it ends.

:func:`find_checkpoint` picks the newest checkpoint that loads, warning about (and skipping) a corrupted or
truncated newer one. Paths are local or any fsspec URL (``s3://bucket/prefix`` with s3fs).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_srifty import protocol
from lightning_srifty.migrate.checkpoints import (  # noqa: F401 - re-exported: their home before sharded checkpoints
    DIGEST_SUFFIX,
    find_checkpoint,
    owned_files,
    read_digest,
    rm_checkpoint,
    sha256_of,
    unsafe_globals,
    upload_files,
    write_digest,
    write_manifest,
    writes_directory,
)
from lightning_srifty.migrate.spot_watcher import Notice, SpotWatcher
from lightning_srifty.protocol import Failed, Finished, Heartbeat, LaunchEnv, Leave, Preempted, Started, filesystem

log = logging.getLogger("lightning_srifty")

PREEMPTED_EXIT_CODE = protocol.PREEMPTED_EXIT_CODE  # 75, EX_TEMPFAIL (sysexits.h): run again, elsewhere
PREEMPTED_MARKER = protocol.PREEMPTED  # written beside the checkpoints by rank 0 when it leaves on a notice
# a spot notice names when AWS acts (its disk vanishes then): the leaving save is budgeted back from that time, so
# that the record and the exit still fit (issue #23 item 10: an upload in an S3 outage ended at 119.9 s of 120)
EXIT_MARGIN_S = 10.0  # after the record: Lightning's teardown, the exit, torchrun's shutdown
RECORD_MARGIN_S = 5.0  # the PREEMPTED.json record, after the upload


class SpotPreemption(Callback):
    """Checkpoint at the next step on a spot notice (or SIGTERM), then exit with code 75.

    Args:
        dirpath: where checkpoints go: a local folder or an fsspec URL such as ``s3://bucket/run-1/`` (default: the
            launcher's ``LaunchEnv.checkpoint_uri``, else ``srifty/checkpoints``).
        endpoint: the instance metadata endpoint (default: the standard settings; off EC2 nothing is polled).
        interval_s: how often the metadata service is polled (default ``$SRIFTY_SPOT_POLL_S`` or 5 s).
        on_rebalance: ``"checkpoint"`` also checkpoints (and keeps training) on a rebalance recommendation;
            ``"ignore"`` only logs it.
        handle_sigterm: treat SIGTERM as a notice (the spot two-minute warning reaches containers this way).
        exit_process: raise ``SystemExit(75)`` after the checkpoint (False: stop the Trainer and return normally,
            with ``callback.preempted`` set).
        every_s: also checkpoint every this many seconds (the plan's Young-Daly interval: :meth:`from_plan`),
            keeping the newest ``keep`` periodic checkpoints.
        leave_deadline_s: a leaving checkpoint and its record must be written this many seconds after the notice,
            and, for a spot notice that names when AWS acts, :data:`EXIT_MARGIN_S` before that time: with a remote
            ``dirpath`` it is saved to local disk first and uploaded within what is left less
            :data:`RECORD_MARGIN_S` for the record; if the store does not take it in time (an outage), it stays on
            local disk at ``local_fallback``, the ``PREEMPTED.json`` record says so (``stored``), and it is written
            locally if the store refuses it too. The window counts from the first notice of any rank.
        periodic_deadline_s: a periodic checkpoint's upload holds the training at most this long (default
            ``leave_deadline_s`` less :data:`RECORD_MARGIN_S`: a store that accepts connections and never answers
            costs no more than a notice's window), and no longer than until a notice or SIGTERM reaches this rank;
            an upload not done by then leaves that checkpoint on local disk, said. Raise it for checkpoints whose
            upload takes longer on a healthy store.
        local_fallback: the local folder for that (default: ``$TMPDIR/srifty-checkpoints/<12 hex digits of the
            checkpoint folder's sha256>``, one per folder); a file checkpoint for a remote store is saved there first.
        progress_s: under ``srifty launch``, rank 0 rewrites ``PROGRESS.json`` (the global step and the measured
            step time) at most this often: the launcher's spot guard weighs the work left against the deadline from
            it (None: never).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        *,
        endpoint: str | None = None,
        interval_s: float | None = None,
        on_rebalance: str = "checkpoint",
        handle_sigterm: bool = True,
        exit_process: bool = True,
        every_s: float | None = None,
        keep: int = 2,
        leave_deadline_s: float = 100.0,
        periodic_deadline_s: float | None = None,
        local_fallback: str | None = None,
        progress_s: float | None = 60.0,
    ) -> None:
        if on_rebalance not in ("checkpoint", "ignore"):
            from predictor.exceptions import ConfigError

            raise ConfigError(
                "The 'on_rebalance' parameter of SpotPreemption() must be 'checkpoint' or 'ignore'. "
                f"Got {on_rebalance!r}.",
                parameter="on_rebalance",
                value=on_rebalance,
            )
        self.launch = LaunchEnv.from_env()  # None outside srifty launch; refuses another protocol version
        if dirpath is None:
            dirpath = self.launch.checkpoint_uri if self.launch is not None else "srifty/checkpoints"
        self.dirpath = str(dirpath).rstrip("/")
        self.endpoint = endpoint
        self.interval_s = interval_s if interval_s is not None else float(os.environ.get("SRIFTY_SPOT_POLL_S", "5"))
        self.on_rebalance, self.handle_sigterm, self.exit_process = on_rebalance, handle_sigterm, exit_process
        self.every_s, self.keep = every_s, max(1, keep)
        # a leaving save must be durable within leave_deadline_s of the notice (AWS gives 120 s): a remote store
        # that does not take it by then is given up on, and the checkpoint stays on local disk (said in the record)
        self.leave_deadline_s = float(leave_deadline_s)
        # a periodic upload may hold the training this long at most (default: a leave's own budget, so that a store
        # that hangs costs no more than a notice allows); a notice on this rank ends the wait at once
        self.periodic_deadline_s = (
            float(periodic_deadline_s) if periodic_deadline_s is not None else self.leave_deadline_s - RECORD_MARGIN_S
        )
        self._interrupt: threading.Event | None = None
        # one folder per checkpoint folder: two jobs on one machine (a sweep) never hash or remove each other's files
        self.local_fallback = local_fallback or os.path.join(
            tempfile.gettempdir(), "srifty-checkpoints", hashlib.sha256(self.dirpath.encode()).hexdigest()[:12]
        )
        self.stored = "durable"
        self.progress_s = progress_s
        self._leg_first: tuple[int, float] | None = None  # (global step, unix) at this leg's first step end
        self._progress_at: float | None = None  # monotonic time of the last PROGRESS.json
        self._latest: tuple[int, float] | None = None  # (global step, unix) of the newest step end, for the watch
        self._last_save = time.monotonic()
        self._stop = threading.Event()
        self._rebalance = threading.Event()
        self._why: str | None = None
        self._trigger = "spot"
        self._started_written = False
        self._watch: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._notice_at: float | None = None
        self._acts_at: float | None = None  # when AWS acts on a spot notice (monotonic), when the notice says
        self._watcher: SpotWatcher | None = None
        self._previous_sigterm: Any = None
        self.preempted = False
        self.checkpoints: list[str] = []
        self.timings: dict[str, float] = {}
        self._leave_details: dict[str, Any] = {}

    # --- signals -----------------------------------------------------------------------------------------------------

    def _notice(self, notice: Notice) -> None:
        self._notice_at = self._notice_at or notice.seen_monotonic
        self._why = notice.describe()
        if notice.kind == "interruption":
            acts = notice.action_unix()
            if acts is not None:  # the wall clock's time, on the monotonic clock the deadlines use
                self._acts_at = notice.seen_monotonic + (acts - time.time())
            self._trigger = "spot"
            self._stop.set()
        elif self.on_rebalance == "checkpoint":
            self._rebalance.set()

    def _leave_by(self, start: float) -> float:
        """When the leaving save's record must be written (monotonic): ``leave_deadline_s`` after the notice, and
        :data:`EXIT_MARGIN_S` before AWS acts when the notice says when."""
        by = (self._notice_at or start) + self.leave_deadline_s
        return by if self._acts_at is None else min(by, self._acts_at - EXIT_MARGIN_S)

    def request_leave(
        self, why: str, *, trigger: str = "leave", move: bool = False, to_fleet: str | None = None
    ) -> None:
        """Checkpoint at the next step boundary and leave, as on a notice (a granted voluntary move: ``move=True``).
        Any rank may call it; ``trigger``, ``move`` and ``to_fleet`` go into the PREEMPTED.json record."""
        self._notice_at = self._notice_at or time.monotonic()
        self._why, self._trigger = why, trigger
        self._leave_details = {"move": move, "to_fleet": to_fleet}
        self._stop.set()

    def _sigterm(self, signum: int, frame: Any) -> None:
        self._notice_at = self._notice_at or time.monotonic()
        self._why, self._trigger = "SIGTERM", "sigterm"
        self._stop.set()

    # --- added by the package to every Trainer under a launch (launch_callbacks) -----------------------------------

    _auto = False  # made by launch_callbacks(), not by the script
    _inactive = False  # an automatic one that found the script's own SpotPreemption: it does nothing

    def _stand_down(self, trainer: pl.Trainer) -> bool:
        """An automatic SpotPreemption steps aside for one the script configured (its options win)."""
        if self._auto and any(isinstance(c, SpotPreemption) and not c._auto for c in trainer.callbacks):
            self._inactive = True
        return self._inactive

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stand_down(trainer):
            return
        from lightning_srifty.ddp.plan_strategy import refuse_idle_gpus

        refuse_idle_gpus(trainer)  # before anything starts: a fleet paid for its GPUs never trains on its CPUs
        check_store(self.dirpath, self.periodic_deadline_s)  # a missing bucket: now, not at the first save
        self._watcher = SpotWatcher(self._notice, endpoint=self.endpoint, interval_s=self.interval_s)
        self._watcher.start()
        launch = self.launch
        progress = self.progress_s is not None and trainer.is_global_zero
        if launch is not None and (launch.max_life_until_unix is not None or launch.heartbeat_max_age_s or progress):
            heartbeat = bool(launch.heartbeat_max_age_s) and trainer.is_global_zero  # rank 0 reads; the step agrees
            self._watch_stop.clear()
            self._watch = threading.Thread(
                target=self._watch_launcher,
                args=(launch, heartbeat, trainer.is_global_zero),
                name="srifty-launcher-watch",
                daemon=True,
            )
            self._watch.start()

    def _watch_launcher(self, launch: LaunchEnv, heartbeat: bool, leave: bool = False) -> None:
        """Leave when the launcher's heartbeat is older than its max age, at the fleet's life cap, or (``leave``,
        rank 0) when the launcher asks with ``LEAVE.json`` on its own: its spot guard moving the job to on-demand or
        back to spot (a move the job asked for is answered in :class:`~lightning_srifty.migrate.MigrationTriggers`)."""
        max_age = float(launch.heartbeat_max_age_s or 0)
        period = max(0.05, min(self.interval_s, max_age / 4 if max_age else 30.0, 30.0))
        last_seen = time.time()  # the job's start counts as a sighting: a launcher gone before it is noticed too
        warned = False
        while not self._watch_stop.wait(period):
            if leave and self._latest is not None:  # rank 0: the progress the step hook noted, written off the step
                self.report_progress(*self._latest)
            now = time.time()
            if launch.max_life_until_unix is not None and now >= launch.max_life_until_unix:
                cap = time.strftime("%H:%M:%S UTC", time.gmtime(launch.max_life_until_unix))
                self._leave_on_own("max-life", f"the fleet's life cap was reached ({cap}; srifty launch --max-life-h)")
                return
            if leave and self._launcher_says_leave(launch):
                return
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
                self._leave_on_own(
                    "heartbeat",
                    f"launcher heartbeat lost: {protocol.HEARTBEAT} last written {now - last_seen:.1f} s ago "
                    f"(max age {max_age:g} s)",
                )
                return

    def _launcher_says_leave(self, launch: LaunchEnv) -> bool:
        """A ``LEAVE.json`` of this launch: checkpoint at the next step and leave as a granted move."""
        try:
            granted = protocol.read_record(self.dirpath, Leave, launch.launch_id or None)
        except Exception:  # noqa: BLE001 - unreadable now: asked again at the next look
            return False
        if granted is None:
            return False
        if self._stop.is_set():  # already leaving (a move the job asked for says why itself)
            return True
        why = f"the launcher moves the job to {granted.to_fleet or 'another fleet'}"
        self.request_leave(why, trigger="leave", move=True, to_fleet=granted.to_fleet or None)
        return True

    def _leave_on_own(self, trigger: str, why: str) -> None:
        log.warning("SpotPreemption: %s: checkpoint and leave", why)
        self._notice_at = self._notice_at or time.monotonic()
        self._why, self._trigger = why, trigger
        self._stop.set()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._inactive:
            return
        if self.handle_sigterm and threading.current_thread() is threading.main_thread():
            # replaces the handler Lightning registered just before (it would raise SIGTERMException and exit 0)
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._sigterm)

    def _restore(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.stop()
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._inactive:
            return
        self._restore()
        if trainer.is_global_zero and not self.preempted:  # what a launcher that cannot see the process waits for
            protocol.write_record(self.dirpath, Finished(launch_id=self._launch_id, step=trainer.global_step))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._inactive:
            return
        self._restore()
        if trainer.is_global_zero and not self.preempted:  # a launcher watching a remote fleet must not wait forever
            try:
                error = f"{type(exception).__name__}: {exception}"[:2000]
                record = Failed(launch_id=self._launch_id, step=trainer.global_step, error=error)
                protocol.write_record(self.dirpath, record)
            except Exception as exc:  # noqa: BLE001 - the original exception is what matters
                log.warning("SpotPreemption: could not write %s: %s", protocol.FAILED, exc)

    @property
    def _launch_id(self) -> str:
        return self.launch.launch_id if self.launch is not None else ""

    # --- the step boundary -------------------------------------------------------------------------------------------

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._inactive:
            return
        step_end = time.time()
        if not self._started_written and self.launch is not None and trainer.is_global_zero:
            self._started_written = True  # the end of a move's downtime, for the launcher's report
            try:
                started = Started(
                    launch_id=self.launch.launch_id,
                    fleet=self.launch.fleet,
                    step=trainer.global_step,
                    first_step_unix=step_end,
                    resumed_from=self.launch.resume,
                )
                protocol.write_record(self.dirpath, started)
            except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop training
                log.warning("SpotPreemption: could not write %s: %s", protocol.STARTED, exc)
        if self.launch is not None and trainer.is_global_zero:
            self.note_progress(trainer.global_step, step_end)
        due = self.every_s is not None and time.monotonic() - self._last_save >= self.every_s
        stop = trainer.strategy.reduce_boolean_decision(self._stop.is_set(), all=False)
        rebalance = not stop and trainer.strategy.reduce_boolean_decision(self._rebalance.is_set() or due, all=False)
        if not (stop or rebalance):
            return
        if not self._rebalance.is_set() and not stop:  # a periodic checkpoint, not a notice
            # its upload is bounded (a store that accepts and never answers held each one ~400 s) and cut short by a
            # notice or SIGTERM on this rank: the leave below comes first, within its window
            self.save(trainer, reason="periodic", deadline_s=self.periodic_deadline_s, interrupt=self._stop)
            self._prune(trainer)
            stop = trainer.strategy.reduce_boolean_decision(self._stop.is_set(), all=False)
            if not stop:
                return
        self._rebalance.clear()
        start = time.monotonic()
        self._share_notice(trainer)  # the window counts from the first rank's notice, whichever node had it
        leave_by = self._leave_by(start)
        # the upload gets what is left before the record's margin (nothing when it is gone: the save stays local)
        path = self.save(
            trainer, reason="preempt" if stop else "rebalance", deadline_s=leave_by - RECORD_MARGIN_S - start
        )
        durable = time.monotonic()
        self.timings = {
            "save_s": durable - start,
            "notice_to_durable_s": durable - (self._notice_at or start),
        }
        log.warning(
            "SpotPreemption: %s: checkpoint %s %s %.2f s after the notice (save %.2f s)",
            self._why or "a peer's notice",
            path,
            "durable in the store"
            if self.stored == "durable"
            else "kept on this machine's disk only (the store did not take it in time: not durable)",
            self.timings["notice_to_durable_s"],
            self.timings["save_s"],
        )
        if not stop:
            return
        self.preempted = True
        if trainer.is_global_zero:  # what `srifty launch` reads (torchrun does not pass a worker's exit status on)
            record = Preempted(
                launch_id=self._launch_id,
                step=trainer.global_step,
                checkpoint=path,
                why=self._why or "a peer's notice",
                trigger=self._trigger,
                last_step_unix=step_end,
                durable_unix=time.time(),
                save_s=self.timings["save_s"],
                notice_to_durable_s=self.timings["notice_to_durable_s"],
                stored=self.stored,
                **self._leave_details,
            )
            # the store gets at least a second for the record; then it is written locally
            self._write_status(record, deadline_s=max(1.0, leave_by - time.monotonic()))
        self._restore()
        mark_preempted(path)
        if self.exit_process:
            raise SystemExit(PREEMPTED_EXIT_CODE)
        trainer.should_stop = True

    def note_progress(self, step: int, unix: float) -> None:
        """The step hook's part of progress reporting: two numbers in memory. The launcher-watch thread writes them
        (:meth:`report_progress`), so a slow checkpoint store never holds a training step."""
        if self._leg_first is None:
            self._leg_first = (step, unix)
        self._latest = (step, unix)

    def report_progress(self, step: int, unix: float, now: float | None = None) -> bool:
        """Rewrite ``PROGRESS.json`` when ``progress_s`` has passed since the last one (the first step of a leg
        always writes one); True when written. The step time is measured from the leg's first step, so a leg's
        start-up and restore never count as training."""
        now = time.monotonic() if now is None else now
        if self._leg_first is None:
            self._leg_first = (step, unix)
        if self.progress_s is None or self.launch is None:
            return False
        if self._progress_at is not None and now - self._progress_at < self.progress_s:
            return False
        self._progress_at = now
        first_step, first_unix = self._leg_first
        step_time = (unix - first_unix) / (step - first_step) if step > first_step else None
        record = protocol.Progress(
            launch_id=self.launch.launch_id, fleet=self.launch.fleet, step=step, unix=unix, step_time_s=step_time
        )
        try:
            protocol.write_record(self.dirpath, record)
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop training
            log.warning("SpotPreemption: could not write %s: %s", protocol.PROGRESS, exc)
            return False
        return True

    @classmethod
    def from_plan(cls, plan: Any, choice: int = 0, dirpath: str | None = None, **kwargs: Any) -> SpotPreemption:
        """Checkpoint at the interval the plan recommends for its chosen fleet (spot fleets only)."""
        from predictor.documents.plan import load_plan

        plan = plan if hasattr(plan, "entries") else load_plan(plan)
        entry = plan.entries[choice]
        return cls(dirpath, every_s=entry.checkpoint_interval_s, **kwargs)

    def _prune(self, trainer: pl.Trainer) -> None:
        """Keep the newest ``keep`` periodic checkpoints in the store and, apart, the newest ``keep`` of those an
        upload left on local disk: a checkpoint kept locally in an outage never costs the store one of its durable
        ones (the local ones die with the instance). A removal that fails is said and tried again at the next prune;
        it never stops the training."""
        if not trainer.is_global_zero:
            return
        periodic = [p for p in self.checkpoints if "/periodic-step=" in p]
        stored = [p for p in periodic if p.startswith(self.dirpath + "/")]
        local = [p for p in periodic if not p.startswith(self.dirpath + "/")]
        for old in stored[: -self.keep] + local[: -self.keep]:
            try:
                rm_checkpoint(filesystem(old), old)  # a file or a sharded directory, with its digest
            except Exception as exc:  # noqa: BLE001 - the store may be out: keep it listed, prune it later
                log.warning("SpotPreemption: could not remove the old checkpoint %s (%s); tried again later", old, exc)
                continue
            self.checkpoints.remove(old)

    def _share_notice(self, trainer: pl.Trainer) -> None:
        """Every rank takes the earliest notice of any rank (wall clock, all-reduced): only the noticed node's rank
        knows when its notice came, and rank 0 uploads the leaving checkpoint within what is left of that window."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        now_unix, now = time.time(), time.monotonic()
        mine = now_unix - (now - self._notice_at) if self._notice_at is not None else float("inf")
        device = getattr(trainer.strategy, "root_device", torch.device("cpu"))
        earliest = torch.tensor([mine], dtype=torch.float64, device=device)
        dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
        first = float(earliest.item())
        if first != float("inf"):
            self._notice_at = min(self._notice_at or now, now - max(0.0, now_unix - first))

    def save(
        self,
        trainer: pl.Trainer,
        reason: str = "manual",
        deadline_s: float | None = None,
        *,
        interrupt: threading.Event | None = None,
    ) -> str:
        """Save on every rank to a temporary name; rank 0 records its sha256 and renames it into place when complete
        (the digest is written before the rename, so a published checkpoint always has it).

        A remote folder (``s3://``...) gets the checkpoint saved and hashed on local disk first, then its digest and
        then the checkpoint uploaded (one upload of the final key on an object store, atomic there: no temporary
        object, no server-side copy, and a published checkpoint always has its digest), within ``deadline_s`` when
        given; if the store does not take it (an outage, or in time), it stays on local disk, the returned path is
        the local one and ``self.stored`` says so.

        ``interrupt`` (a periodic save: the notice event) ends the wait for the upload as soon as it is set on this
        rank; the checkpoint then stays on local disk as when the time runs out.

        A sharded strategy (FSDP ``state_dict_type="sharded"``) writes a directory: see :meth:`_save_directory`."""
        final = f"{self.dirpath}/{reason}-step={trainer.global_step}.ckpt"
        self.stored = "durable"
        self._interrupt = interrupt
        if writes_directory(trainer.strategy):
            final = self._save_directory(trainer, final, deadline_s)
        elif "://" not in self.dirpath or self.dirpath.startswith("file://"):
            partial = final + ".partial"
            trainer.save_checkpoint(partial, weights_only=False)
            trainer.strategy.barrier("srifty-preempt-save")
            if trainer.is_global_zero:
                fs = filesystem(final)
                write_digest(fs, final, sha256_of(fs, partial))
                fs.mv(partial, final)
            trainer.strategy.barrier("srifty-preempt-renamed")
        else:
            final = self._save_remote(trainer, final, deadline_s)
        self.checkpoints.append(final)
        self._last_save = time.monotonic()
        return final

    def _save_directory(self, trainer: pl.Trainer, final: str, deadline_s: float | None) -> str:
        """Every rank writes its shards into ``<name>.partial/``; after a barrier each rank hashes the files it wrote,
        rank 0 gathers the digests, writes the manifest ``<name>.sha256`` and renames the directory into place.

        A remote folder gets the same, on local disk first (Lightning writes sharded checkpoints to local paths
        only); then every rank uploads its own files (within the deadline when there is one) and rank 0, once every
        rank's upload succeeded, uploads the manifest last: an object store has no directory rename, so there the
        manifest is what publishes it (:func:`find_checkpoint` refuses files that do not match it, and a directory
        without one is checked against its own index). If a rank's upload fails or runs out of time, the checkpoint
        stays on local disk, as for a file."""
        started = time.monotonic()
        remote = "://" in self.dirpath and not self.dirpath.startswith("file://")
        name = final.rsplit("/", 1)[-1]
        local = os.path.join(self.local_fallback, name) if remote else final.removeprefix("file://")
        digests = self._publish_local_directory(trainer, local)
        if not remote:
            return final
        rank = trainer.global_rank
        mine = owned_files(local, rank)
        budget = None if deadline_s is None else deadline_s - (time.monotonic() - started)
        error = _within(budget, lambda: upload_files(local, final, mine), self._interrupt)
        uploaded = trainer.strategy.reduce_boolean_decision(error is None, all=True)
        where = final
        if trainer.is_global_zero:
            if uploaded:
                budget = None if deadline_s is None else deadline_s - (time.monotonic() - started)
                error = _within(budget, lambda: write_manifest(filesystem(final), final, digests), self._interrupt)
                uploaded = error is None
            if not uploaded:
                where = local
                self.stored = f"local {socket.gethostname()}:{local}"
                log.error(
                    "SpotPreemption: the sharded checkpoint did not reach %s (%s); it is kept on local disk at %s "
                    "(each node holds the shards its ranks wrote), and the next fleet resumes from the newest "
                    "checkpoint that did.",
                    final,
                    error or "another rank's upload failed",
                    local,
                )
        where = trainer.strategy.broadcast(where)
        self.stored = trainer.strategy.broadcast(self.stored)
        if where == final:  # durable in the store: the local copy is not needed any more
            trainer.strategy.barrier("srifty-sharded-uploaded")
            if trainer.is_global_zero:
                shutil.rmtree(local, ignore_errors=True)
                with contextlib.suppress(OSError):
                    os.remove(local + DIGEST_SUFFIX)
        return where

    def _publish_local_directory(self, trainer: pl.Trainer, final: str) -> dict[str, str]:
        """Save into ``final + ".partial"``, hash (each rank its own files), write the manifest, rename; return the
        digests (complete on rank 0)."""
        import torch.distributed as dist

        partial = final + ".partial"
        if trainer.is_global_zero:  # a save cut short earlier (maybe on another world size) leaves stale shards
            shutil.rmtree(partial, ignore_errors=True)
        trainer.strategy.barrier("srifty-sharded-clean")
        trainer.save_checkpoint(partial, weights_only=False)
        trainer.strategy.barrier("srifty-preempt-save")
        fs = filesystem(partial)
        mine = {rel: sha256_of(fs, os.path.join(partial, rel)) for rel in owned_files(partial, trainer.global_rank)}
        gathered: list[Any] = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        digests = {rel: h for part in gathered for rel, h in (part or {}).items()}
        if trainer.is_global_zero:
            write_manifest(fs, final, digests)  # before the rename: a published directory always has it
            if os.path.isdir(final):
                shutil.rmtree(final)
            os.replace(partial, final)
        trainer.strategy.barrier("srifty-preempt-renamed")
        return digests

    def _save_remote(self, trainer: pl.Trainer, final: str, deadline_s: float | None) -> str:
        started = time.monotonic()
        local = os.path.join(self.local_fallback, final.rsplit("/", 1)[-1])
        os.makedirs(self.local_fallback, exist_ok=True)
        if not trainer.strategy.broadcast(_room_for(trainer, self.local_fallback) if trainer.is_global_zero else True):
            return self._save_streamed(trainer, final)
        trainer.save_checkpoint(local + ".partial", weights_only=False)
        trainer.strategy.barrier("srifty-preempt-save")
        where = final
        if trainer.is_global_zero:
            local_fs = filesystem(local)
            digest = sha256_of(local_fs, local + ".partial")
            write_digest(local_fs, local, digest)
            os.replace(local + ".partial", local)

            def upload() -> None:
                fs = filesystem(final)
                write_digest(fs, final, digest)  # first: the checkpoint is never visible without it
                try:
                    protocol.put_file(fs, local, final)
                except BaseException:
                    # best effort: a digest left without its checkpoint would fail an older one of the same name
                    with contextlib.suppress(Exception):
                        fs.rm(final + DIGEST_SUFFIX)
                    raise

            budget = None if deadline_s is None else deadline_s - (time.monotonic() - started)
            error = _within(budget, upload, self._interrupt)
            if error is None:
                with contextlib.suppress(OSError):
                    os.remove(local)
                    os.remove(local + DIGEST_SUFFIX)
            else:
                where = local
                self.stored = f"local {socket.gethostname()}:{local}"
                log.error(
                    "SpotPreemption: the checkpoint did not reach %s (%s); it is kept on this machine's disk at %s, "
                    "and the next fleet resumes from the newest checkpoint that did.",
                    final,
                    error,
                    local,
                )
        where = trainer.strategy.broadcast(where)
        self.stored = trainer.strategy.broadcast(self.stored)
        return where

    def _save_streamed(self, trainer: pl.Trainer, final: str) -> str:
        """Local disk has no room for the checkpoint: Lightning writes it into the store directly (one object, whole or
        absent on S3), and rank 0 reads it back for its digest. Not bounded by a deadline, and no local copy if the
        store fails: the second failure of two."""
        log.warning(
            "SpotPreemption: %s has no room for the checkpoint (about %.1f GB): writing it to %s directly",
            self.local_fallback,
            _checkpoint_bytes(trainer) / 1e9,
            final,
        )
        trainer.save_checkpoint(final, weights_only=False)
        if trainer.is_global_zero:
            fs = filesystem(final)
            write_digest(fs, final, sha256_of(fs, final))
        trainer.strategy.barrier("srifty-preempt-streamed")
        return final

    def _write_status(self, record: Any, deadline_s: float) -> None:
        """The status record, in the checkpoint folder within the deadline; else on local disk, and said loudly."""
        error = _within(deadline_s, lambda: protocol.write_record(self.dirpath, record))
        if error is None:
            return
        local = protocol.write_record(self.local_fallback, record)
        log.error(
            "SpotPreemption: %s could not be written to %s within %.0f s (%s); written to %s instead.",
            type(record).__name__,
            self.dirpath,
            deadline_s,
            error,
            local,
        )


def _checkpoint_bytes(trainer: pl.Trainer) -> int:
    """About what a full checkpoint of this run takes: its weights and buffers and the optimizers' state tensors."""
    import torch

    tensors = [t for t in trainer.lightning_module.state_dict().values() if isinstance(t, torch.Tensor)]
    for optimizer in trainer.optimizers:
        tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _room_for(trainer: pl.Trainer, folder: str) -> bool:
    """Whether ``folder``'s disk can take the checkpoint with a margin (1.2x its estimate, and 1 GB kept free)."""
    return shutil.disk_usage(folder).free > 1.2 * _checkpoint_bytes(trainer) + 2**30


def check_store(dirpath: str, seconds: float) -> None:
    """Refuse a checkpoint folder in an object store whose bucket does not exist, before the first step (issue #36
    L8: outside ``srifty launch``, which checks it itself, it was found at the first save, after that much training).

    One listing of the folder itself (what an instance role's policy grants: ListBucket under the run's prefix, which
    a HeadBucket would not be), bounded by ``seconds``. Only the store's own answer that the bucket does not exist is
    an error; a store that does not answer in time, or refuses a listing, is a warning (the saves will say more)."""
    if "://" not in dirpath or dirpath.startswith("file://"):
        return
    missing: list[str] = []

    def look() -> None:
        fs = filesystem(dirpath)
        try:
            fs.ls(dirpath, detail=False, refresh=True)
        except FileNotFoundError as exc:  # an empty folder (a first start) too: only the bucket's absence counts
            cause: BaseException | None = exc
            while cause is not None:
                text = f"{getattr(cause, 'response', {}).get('Error', {}).get('Code', '')} {cause}"
                if "NoSuchBucket" in text or "bucket does not exist" in text:
                    missing.append(str(cause))
                    return
                cause = cause.__cause__ or cause.__context__
        except PermissionError:
            pass  # the policy lets the run write its prefix, not list what is above it (s3fs looks there too)
        finally:
            fs.invalidate_cache(dirpath)  # no listing of now may be served to a later look for checkpoints

    failed = _within(max(1.0, min(seconds, 60.0)), look)
    if missing:
        from predictor.exceptions import ConfigError

        bucket = dirpath.split("://", 1)[1].split("/", 1)[0]
        raise ConfigError(
            f"SpotPreemption: the checkpoint folder {dirpath!r} is in a bucket that does not exist ({bucket!r}): no "
            "checkpoint could be saved. Create the bucket (or give dirpath= a folder in one that exists; under "
            "`srifty launch` or a srifty fleet the module's bucket is passed for you).",
            parameter="dirpath",
            value=dirpath,
        )
    if failed:
        log.warning("SpotPreemption: the checkpoint folder %s could not be checked (%s)", dirpath, failed)


def _within(seconds: float | None, work: Callable[[], None], interrupt: threading.Event | None = None) -> str | None:
    """Run ``work`` in a daemon thread for at most ``seconds`` (None: as long as it takes), and no longer than until
    ``interrupt`` is set (a notice or SIGTERM on this rank: the leave comes first): None when it finished, else what
    went wrong, with how long it was given (its error, the time running out, or the interruption: the thread is
    left behind; a finished upload is still a sound checkpoint, its digest went first)."""
    if seconds is not None and seconds <= 0:  # no time left: not started (a thread would go on writing meanwhile)
        return "no time left before the deadline"
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            failure.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, name="srifty-deadline", daemon=True)
    thread.start()
    while thread.is_alive():
        left = None if seconds is None else seconds - (time.monotonic() - started)
        if left is not None and left <= 0:
            return f"no answer within {_secs(seconds)} s"
        if interrupt is not None and interrupt.is_set():
            return f"a notice came first, {_secs(time.monotonic() - started)} s into it"
        thread.join(0.25 if left is None else min(0.25, left))
    if failure:
        return f"gave up after {_secs(time.monotonic() - started)} s: {type(failure[0]).__name__}: {failure[0]}"
    return None


def _secs(seconds: float) -> str:
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}"


def mark_preempted(checkpoint: str) -> None:
    """On a srifty fleet node (``SRIFTY_NODE_STATE`` set by user_data), leave a marker that this job left on a
    notice with its checkpoint: torchrun turns the workers' exit 75 into its own 1, so the node's status record said
    "exit 1", and its watchdog read a preemption as the end of the run. Never fatal."""
    folder = os.environ.get(protocol.NODE_STATE)
    if not folder:
        return
    try:
        Path(folder, protocol.PREEMPTED_MARKER).write_text(checkpoint + "\n")
    except OSError as exc:
        log.warning("SriftyCallback: could not mark the node as preempted in %s: %s", folder, exc)


def launch_callbacks() -> list[pl.Callback]:
    """Lightning's ``lightning.pytorch.callbacks_factory`` entry point (pyproject.toml): under ``srifty launch`` or on a
    srifty fleet (a checkpoint location in the environment), every Trainer gets a :class:`SpotPreemption`, so that a
    spot notice, SIGTERM or the launcher's move checkpoints and leaves (exit 75) whether or not the script added one:
    the quick start's script (``SriftyCallback`` alone) trained through a notice to the end, and on EC2 the instance
    went with its progress (issue #37 H3). One the script configured wins (this one stands aside); outside a launch,
    nothing is added."""
    try:
        launch = LaunchEnv.from_env()
    except Exception:  # noqa: BLE001 - another protocol version: srifty_auto and SpotPreemption(...) say so
        return []
    if launch is None:
        return []
    auto = SpotPreemption()
    auto._auto = True
    return [auto]
