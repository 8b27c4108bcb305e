"""A job's way out on a notice, whatever drives its loop: the notice's state, the leaving checkpoint and the record.

:class:`Leaving` is what :class:`~.preemption.SpotPreemption` (a Trainer's callback) and
:class:`~.fabric.FabricPreemption` (a Lightning Fabric loop) share: a :class:`~.spot_watcher.SpotWatcher` per node and
a SIGTERM handler set a flag; at a step boundary the ranks agree, every rank takes part in the save, and the process
exits with :data:`~lightning_srifty.protocol.PREEMPTED_EXIT_CODE` (75) after rank 0 wrote ``PREEMPTED.json``. Each
caller hands it its run as a Trainer-like object (``global_step``, ``strategy``, ``save_checkpoint``, the ranks):
the Trainer itself, or :class:`~.fabric.FabricRun`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from lightning_srifty import protocol
from lightning_srifty.migrate.launch_watch import LaunchWatch
from lightning_srifty.migrate.spot_watcher import Notice, SpotWatcher
from lightning_srifty.migrate.writer import CheckpointWriter, check_store, default_local_fallback
from lightning_srifty.protocol import LaunchEnv, Preempted
from predictor.documents.checks import Setting, check_settings

log = logging.getLogger("lightning_srifty")

PREEMPTED_EXIT_CODE = protocol.PREEMPTED_EXIT_CODE  # 75, EX_TEMPFAIL (sysexits.h): run again, elsewhere
# a spot notice names when AWS acts (its disk vanishes then): the leaving save is budgeted back from that time, so
# that the record and the exit still fit (issue #23 item 10: an upload in an S3 outage ended at 119.9 s of 120)
EXIT_MARGIN_S = 10.0  # after the record: Lightning's teardown, the exit, torchrun's shutdown
RECORD_MARGIN_S = 5.0  # the PREEMPTED.json record, after the upload


class Leaving:
    """The notice's state and the leaving save of one job (the options: :class:`~.preemption.SpotPreemption`'s)."""

    SETTINGS: ClassVar[dict[str, Setting]] = {  # declared once (predictor.documents.checks.Setting): checked when made
        "interval_s": Setting("number", minimum=0, exclusive=True, optional=True),
        "on_rebalance": Setting("choice", choices=("checkpoint", "ignore")),
        "every_s": Setting("number", minimum=0, optional=True),  # 0: at every step
        "keep": Setting("int", minimum=1),
        "leave_deadline_s": Setting("number", minimum=0, exclusive=True),
        "periodic_deadline_s": Setting("number", minimum=0, exclusive=True, optional=True),
        "progress_s": Setting("number", minimum=0, exclusive=True, optional=True),
    }

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
        check_settings(f"{type(self).__name__}()", self.SETTINGS, locals())
        self.launch = LaunchEnv.from_env()  # None outside srifty launch; refuses another protocol version
        self._launch_id = self.launch.launch_id if self.launch is not None else ""
        if dirpath is None:
            dirpath = self.launch.checkpoint_uri if self.launch is not None else "srifty/checkpoints"
        self.dirpath = str(dirpath).rstrip("/")
        self.endpoint = endpoint
        self.interval_s = interval_s if interval_s is not None else float(os.environ.get("SRIFTY_SPOT_POLL_S", "5"))
        self.on_rebalance, self.handle_sigterm, self.exit_process = on_rebalance, handle_sigterm, exit_process
        self.every_s = _default_every_s(every_s, self.launch)
        self.leave_deadline_s = float(leave_deadline_s)
        self.periodic_deadline_s = (
            float(periodic_deadline_s) if periodic_deadline_s is not None else self.leave_deadline_s - RECORD_MARGIN_S
        )
        self.local_fallback = local_fallback or default_local_fallback(self.dirpath)
        self.writer = CheckpointWriter(self.dirpath, self.local_fallback, keep)
        self.checkpoints = self.writer.checkpoints  # the ones saved and not pruned, oldest first (the writer's list)
        self.progress_s = progress_s
        self.watch: LaunchWatch | None = None  # under srifty launch: the reports to the launcher and its watch
        if self.launch is not None:
            self.watch = LaunchWatch(
                self.dirpath,
                self.launch,
                interval_s=self.interval_s,
                progress_s=progress_s,
                leave=self._leave_asked,
                leaving=lambda: self._stop.is_set(),
            )
        self._stop, self._rebalance = threading.Event(), threading.Event()
        self._why: str | None = None
        self._trigger = "spot"
        self._notice_at: float | None = None
        self._acts_at: float | None = None  # when AWS acts on a spot notice (monotonic), when the notice says
        self._watcher: SpotWatcher | None = None
        self._previous_sigterm: Any = None
        self.preempted = False
        self.timings: dict[str, float] = {}
        self._leave_details: dict[str, Any] = {}

    # --- the writer's state, where scripts read it -------------------------------------------------------------------

    @property
    def stored(self) -> str:
        """``"durable"``, or ``"local <host>:<path>"`` when the store did not take the newest checkpoint in time."""
        return self.writer.stored

    def save(
        self, trainer: Any, reason: str = "manual", deadline_s: float | None = None, *, interrupt: Any = None
    ) -> str:
        """Save a checkpoint now (every rank; ``trainer``: the Trainer, or a Fabric loop's :class:`~.fabric.FabricRun`):
        see :meth:`CheckpointWriter.save`."""
        return self.writer.save(trainer, reason, deadline_s, interrupt=interrupt)

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

    def _leave_asked(self, why: str, trigger: str, move: bool, to_fleet: str | None) -> None:
        self.request_leave(why, trigger=trigger, move=move, to_fleet=to_fleet)

    def _sigterm(self, signum: int, frame: Any) -> None:
        self._notice_at = self._notice_at or time.monotonic()
        self._why, self._trigger = "SIGTERM", "sigterm"
        self._stop.set()

    # --- watching, and the end of it ---------------------------------------------------------------------------------

    def _start_watching(self, rank_zero: bool) -> None:
        """Before the first step: the store (a missing bucket now, not at the first save), the node's notices, and
        under a launch the launcher's heartbeat."""
        check_store(self.dirpath, self.periodic_deadline_s)
        self._watcher = SpotWatcher(
            self._notice, endpoint=self.endpoint, interval_s=self.interval_s, owner=type(self).__name__
        )
        self._watcher.start()
        if self.watch is not None and self.watch.needed(rank_zero):
            self.watch.start(rank_zero)

    def _take_sigterm(self) -> None:
        """SIGTERM is a notice from now on (the main thread only: Python's signal handlers live there)."""
        if self.handle_sigterm and threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._sigterm)

    def _restore(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self._watcher is not None:
            self._watcher.stop()
        # ours still: at on_fit_end Lightning's teardown has put the original back, and a SIGTERM after the fit (the
        # watchdog's stop, torchrun ending a rank) reached Lightning's stale handler, which never ended the process
        ours = signal.getsignal(signal.SIGTERM) == self._sigterm
        if self._previous_sigterm is not None and ours and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self._previous_sigterm = None

    # --- the step boundary -------------------------------------------------------------------------------------------

    def _agree(self, run: Any, boundary: bool = True) -> tuple[bool, bool, bool]:
        """Whether any rank has a notice, any rank's node a rebalance recommendation, and a periodic checkpoint is due
        on any rank's clock: one all-reduce of the three flags (every rank calls it at every step end), so that every
        rank takes the same path. Two votes before, on a notice and on "a checkpoint", let a rebalance that one node
        saw send its rank to the rebalance save and the others to a periodic save: collectives each side never
        matched, and the job hung (a rebalance recommendation is each instance's own). Off an optimizer step's end
        (``boundary`` False) no checkpoint is wanted."""
        import torch
        import torch.distributed as dist

        flags = [self._stop.is_set(), boundary and self._rebalance.is_set(), boundary and self.writer.due(self.every_s)]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = getattr(run.strategy, "root_device", torch.device("cpu"))
            voted = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=device)
            dist.all_reduce(voted, op=dist.ReduceOp.MAX)
            flags = [bool(v) for v in voted.tolist()]
        return flags[0], flags[1], flags[2]

    def _at_step_end(self, run: Any, stop: bool, rebalance: bool, due: bool, step_end: float) -> None:
        """A step ended and the ranks agreed (:meth:`_agree`): the leaving checkpoint on a notice, else the rebalance
        one, else a periodic one, each on every rank."""
        if not (stop or rebalance) and due:
            # its upload is bounded (a store that accepts and never answers held each one ~400 s) and cut short by a
            # notice or SIGTERM on this rank: the leave below comes first, within its window
            self.save(run, reason="periodic", deadline_s=self.periodic_deadline_s, interrupt=self._stop)
            self.writer.prune(run)
            self._saved(run)
            stop = run.strategy.reduce_boolean_decision(self._stop.is_set(), all=False)
        if stop or rebalance:
            self._rebalance.clear()
            self._checkpoint_on_notice(run, stop, step_end)

    def _saved(self, run: Any) -> None:
        """A periodic save is done: a sign of life (a long save is not a hang to a stall watch)."""

    # --- the leaving save --------------------------------------------------------------------------------------------

    def _checkpoint_on_notice(self, run: Any, stop: bool, step_end: float) -> None:
        """The notice's checkpoint within its window; on a stop (not a rebalance) the record, and leave."""
        start = time.monotonic()
        # the window counts from the first rank's notice, whichever node had it
        self._notice_at, self._acts_at = earliest_notice(run, self._notice_at, self._acts_at)
        leave_by = self._leave_by(start)
        # the upload gets what is left before the record's margin (nothing when it is gone: the save stays local)
        path = self.save(run, reason="preempt" if stop else "rebalance", deadline_s=leave_by - RECORD_MARGIN_S - start)
        durable = time.monotonic()
        self.timings = {"save_s": durable - start, "notice_to_durable_s": durable - (self._notice_at or start)}
        log.warning(
            "%s: %s: checkpoint %s %s %.2f s after the notice (save %.2f s)",
            type(self).__name__,
            self._why or ("a peer's notice" if stop else "a peer's rebalance recommendation"),
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
        if run.is_global_zero:  # what `srifty launch` reads (torchrun does not pass a worker's exit status on)
            record = Preempted(
                launch_id=self._launch_id,
                step=run.global_step,
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
            self.writer.write_record(record, deadline_s=max(1.0, leave_by - time.monotonic()))
        self._restore()
        mark_preempted(path)
        if self.exit_process:
            raise SystemExit(PREEMPTED_EXIT_CODE)
        self._stopped(run)

    def _stopped(self, run: Any) -> None:
        """Left without ending the process (``exit_process=False``): the caller's loop ends."""


def check_options(who: str, options: dict[str, Any]) -> None:
    """Refuse an option :class:`Leaving` does not take, in its caller's name (a typo met Python's "Leaving.__init__()
    got an unexpected keyword argument", a class the user never named)."""
    import inspect

    known = [p for p in inspect.signature(Leaving.__init__).parameters if p not in ("self", "dirpath")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        from predictor.exceptions import ConfigError

        raise ConfigError(
            f"{who}() takes no option {unknown[0]!r}: its options are {', '.join(known)}.",
            parameter=unknown[0],
            value=options[unknown[0]],
        )


def _default_every_s(every_s: float | None, launch: LaunchEnv | None) -> float | None:
    """``every_s`` as given, else under ``srifty launch`` or on a fleet ``srifty terraform`` wrote the plan's checkpoint
    interval for the fleet (``LaunchEnv.checkpoint_every_s``; a trial: the SpotPreemption every Trainer gets on a fleet
    saved only on a notice, so a node lost without one lost everything since the start), else None."""
    return every_s if every_s is not None or launch is None else launch.checkpoint_every_s


def earliest_notice(
    run: Any, notice_at: float | None, acts_at: float | None = None
) -> tuple[float | None, float | None]:
    """The earliest notice of any rank and the earliest time AWS acts on any rank's node (monotonic, on this rank's
    clock; wall clock all-reduced): only the noticed node's rank knows when its notice came and when its instance
    goes, and rank 0 uploads the leaving checkpoint and writes the record within what is left of that window (a
    review: rank 0 budgeted a full window when another node was reclaimed sooner). Unchanged outside a process
    group of two or more. ``run``: the Trainer, or anything with its ``strategy.root_device``."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return notice_at, acts_at
    now_unix, now = time.time(), time.monotonic()
    mine = [now_unix - (now - t) if t is not None else float("inf") for t in (notice_at, acts_at)]
    device = getattr(run.strategy, "root_device", torch.device("cpu"))
    earliest = torch.tensor(mine, dtype=torch.float64, device=device)
    dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
    first_notice, first_acts = (float(v) for v in earliest.tolist())
    if first_notice != float("inf"):
        notice_at = min(notice_at or now, now - max(0.0, now_unix - first_notice))
    if first_acts != float("inf"):
        acts_at = now + (first_acts - now_unix)
    return notice_at, acts_at


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
        log.warning("lightning-srifty: could not mark the node as preempted in %s: %s", folder, exc)
