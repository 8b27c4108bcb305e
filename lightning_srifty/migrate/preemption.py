"""Checkpoint and leave on a spot interruption notice or SIGTERM, and find a sound checkpoint to resume from.

``SpotPreemption(dirpath)`` is a Lightning callback: a :class:`~.spot_watcher.SpotWatcher` per node
(each node sees only its own notice) and a SIGTERM handler set a flag; at the next step boundary the ranks agree
(any rank's flag stops all of them: one all-reduce of three flags a step), every rank takes part in
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

import logging
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_srifty import protocol
from lightning_srifty.migrate import exit_mark
from lightning_srifty.migrate.alive import NodeAlive
from lightning_srifty.migrate.checkpoints import (  # noqa: F401 - re-exported: their home before sharded checkpoints
    DIGEST_SUFFIX,
    find_checkpoint,
    install_resume,
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
from lightning_srifty.migrate.launch_watch import LaunchWatch
from lightning_srifty.migrate.leaving import (  # noqa: F401 - re-exported: their home before Fabric's
    EXIT_MARGIN_S,
    PREEMPTED_EXIT_CODE,
    RECORD_MARGIN_S,
    Leaving,
    check_options,
    earliest_notice,
    mark_preempted,
)
from lightning_srifty.protocol import Failed, Finished, LaunchEnv

log = logging.getLogger("lightning_srifty")

PREEMPTED_MARKER = protocol.PREEMPTED  # written beside the checkpoints by rank 0 when it leaves on a notice
# a leaving save's time before any save was timed (a checkpoint of a few GB to S3 at a few hundred MB/s, with its
# hashing): what finishing a step's micro-batches before leaving must leave room for
LEAVING_SAVE_S = 30.0


class StepPace:
    """Where an optimizer step ends, and how long its micro-batches take.

    A checkpoint between the micro-batches of a step loses their gradients (Lightning keeps none in it) while the
    data position counts them as consumed, so the resumed step takes the rest only: not the same training (a
    review). :class:`SpotPreemption` makes its checkpoints at a step's end: a periodic or rebalance one always, a
    leaving one when the step's other micro-batches and a save (the last one's time, else :data:`LEAVING_SAVE_S`)
    fit in the notice's window; else at once, as before."""

    def __init__(self) -> None:
        self.ended_at: float | None = None  # monotonic, the last batch's end
        self.micro_s: float | None = None  # a micro-batch's time, smoothed

    def batch_ended(self, trainer: pl.Trainer) -> bool:
        """Called at each batch's end: whether it ended an optimizer step (Lightning's own test: the accumulation is
        done, or the epoch's last batch)."""
        now = time.monotonic()
        if self.ended_at is not None:
            took = now - self.ended_at
            self.micro_s = took if self.micro_s is None else 0.7 * self.micro_s + 0.3 * took
        self.ended_at = now
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        should_accumulate = getattr(loop, "_should_accumulate", None)
        return True if should_accumulate is None else not should_accumulate()

    def finishes_first(self, trainer: pl.Trainer, leaving: SpotPreemption) -> bool:
        """Whether every rank can train the step's remaining micro-batches and still save (the last save's time) by
        when ``leaving`` must have left (a collective: every rank calls it at the same batch). A rank that may not
        wait (a SIGTERM: its sender's grace is not known here, the watchdog's may be 40 s) says no for all."""
        now = time.monotonic()
        fits = leaving._trigger != "sigterm" and self.micro_s is not None
        if fits:
            k = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
            left = k - trainer.fit_loop.epoch_loop.batch_progress.current.ready % k
            save = leaving.writer.last_save_s or LEAVING_SAVE_S
            fits = now + left * (self.micro_s or 0.0) + save + RECORD_MARGIN_S <= leaving._leave_by(now)
        return bool(trainer.strategy.reduce_boolean_decision(fits, all=True))


def at_step_start(checkpoint: dict[str, Any], in_flight: int, callbacks: list[Any]) -> None:
    """A checkpoint saved ``in_flight`` micro-batches into an optimizer step, set back to the step's start, where its
    weights and optimizer are: Lightning's batch progress (as if saved at the end of the step's last batch before,
    which its restart completes and counts as stepped, hence ``_batches_that_stepped`` one less) and each
    :class:`~lightning_srifty.strategies.hetero.ExactResume`'s samples consumed (a callback with ``batch_samples``
    whose state has ``consumed``). The resumed run trains the step's micro-batches again, from the same samples:
    Lightning keeps no accumulated gradient in a checkpoint, so a position past them lost their gradients (a trial: a
    SIGTERM between micro-batches, weights 0.08 off)."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit.get("epoch_loop.batch_progress")
    if not in_flight or progress is None:
        return
    for scope in ("total", "current"):
        for count in ("ready", "started", "processed", "completed"):
            progress[scope][count] -= in_flight
    state = fit.get("epoch_loop.state_dict", {})
    if "_batches_that_stepped" in state:
        state["_batches_that_stepped"] -= 1
    for callback in callbacks:
        kept = checkpoint.get("callbacks", {}).get(getattr(callback, "state_key", None))
        samples = getattr(callback, "batch_samples", 0)
        if isinstance(samples, int) and samples > 0 and isinstance(kept, dict) and "consumed" in kept:
            kept["consumed"] = max(0, kept["consumed"] - in_flight * samples)


class SignsOfLife(Callback):
    """The training loop's signs of life between its steps (an epoch's start and end, a validation batch, a full
    save), noted for rank 0's ``PROGRESS.json`` (``active_unix``) and, on a srifty fleet node, by each node's local
    rank 0 in the node's alive file (:mod:`.alive`, its boot script's stall watch), and the end of training, after
    which the job is alive while its process is: neither stall watch must take a long validation, save or export for
    a hung job. :class:`SpotPreemption`'s part, in a class of its own."""

    _inactive = False  # an automatic SpotPreemption that found the script's own: it does nothing
    watch: LaunchWatch | None = None
    _node: NodeAlive | None = None  # this node's alive file (local rank 0 on a srifty fleet node), made at first use

    def _on_node(self, trainer: pl.Trainer) -> NodeAlive | None:
        """The node's alive file, for its stall watch (:mod:`.alive`): local rank 0's, None on the other ranks."""
        if self._inactive or trainer.local_rank != 0:
            return None
        if self._node is None:
            self._node = NodeAlive.from_env()
        return self._node

    def _alive(self, trainer: pl.Trainer, *, save: bool = False) -> None:
        if not self._inactive and self.watch is not None and trainer.is_global_zero:
            self.watch.note_active(time.time())
        if (node := self._on_node(trainer)) is not None:
            node.sign(force=save)  # a save's always written: the silence it may start counts from it

    def _stepped(self, trainer: pl.Trainer, step_end: float, boundary: bool) -> None:
        """A batch ended: at an optimizer step's end (``boundary``) rank 0's report to the launcher, at a micro-batch's
        a sign of life (with accumulation the first batch's global step is the checkpoint's: a rehearsal read "first
        step 11 after the checkpoint of step 11"); the node's alive file either way."""
        if self.watch is not None and trainer.is_global_zero:
            if boundary:
                self.watch.step_ended(trainer.global_step, step_end, trainer)
            else:
                self.watch.note_active(step_end)
        if (node := self._on_node(trainer)) is not None:
            node.step(trainer.global_step)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._alive(trainer)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._alive(trainer)

    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._alive(trainer)  # a test after the fit: the script's work after training, alive (its node's own limit)

    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._alive(trainer)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        self._alive(trainer, save=True)  # a full save's (ModelCheckpoint's too), state gathered: the write, a limit

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._alive(trainer)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._alive(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.watch is not None:  # the rest until fit() ends (an export, an upload) is alive as long as it runs
            self.watch.training_over = True
        self._node_over(trainer)

    def _node_over(self, trainer: pl.Trainer) -> None:
        """The node's alive file says training is over, at the trainer's step (:meth:`NodeAlive.over`)."""
        if (node := self._on_node(trainer)) is not None:
            node.over(trainer.global_step)


class SpotPreemption(SignsOfLife, Leaving):
    """Checkpoint at the next step on a spot notice (or SIGTERM), then exit with code 75.

    Args:
        dirpath: where checkpoints go: a local folder or an fsspec URL such as ``s3://bucket/run-1/`` (default: the
            launcher's ``LaunchEnv.checkpoint_uri``, else ``srifty/checkpoints``).
        endpoint: the instance metadata endpoint (default: the standard settings; off EC2 nothing is polled).
        interval_s: how often the metadata service is polled (default ``$SRIFTY_SPOT_POLL_S`` or 5 s).
        on_rebalance: ``"checkpoint"`` checkpoints (training on) on a rebalance recommendation; ``"ignore"`` logs it.
        handle_sigterm: treat SIGTERM as a notice (the spot two-minute warning reaches containers this way).
        exit_process: raise ``SystemExit(75)`` after the checkpoint (False: stop the Trainer and return normally,
            with ``callback.preempted`` set).
        every_s: also checkpoint every this many seconds (the plan's interval: :meth:`from_plan`),
            keeping the newest ``keep`` periodic checkpoints (default: on a fleet, the plan's, else none).
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

    def __init__(self, dirpath: str | None = None, **options: Any) -> None:
        check_options("SpotPreemption", options)
        Leaving.__init__(self, dirpath, **options)  # the options above, checked there (Leaving.SETTINGS)
        self._pace = StepPace()
        self._in_flight = 0  # micro-batches of the step in flight, while a leaving save between them is made

    # --- added by the package to every Trainer under a launch (launch_callbacks) -----------------------------------

    _auto = False  # made by launch_callbacks(), not by the script

    def _stand_down(self, trainer: pl.Trainer) -> bool:
        """An automatic SpotPreemption steps aside for one the script configured (its options win)."""
        callbacks = trainer.callbacks  # type: ignore[attr-defined]  # Lightning sets it in the connector
        if self._auto and any(isinstance(c, SpotPreemption) and not c._auto for c in callbacks):
            self._inactive = True
        return self._inactive

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not self._stand_down(trainer):  # a fit() without ckpt_path resumes from the launch's
            install_resume(trainer, "srifty", refuse_another_model=False)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stand_down(trainer):
            return
        from lightning_srifty.launch_checks import refuse_a_wasted_fleet

        refuse_a_wasted_fleet(trainer)  # before anything starts: its GPUs never idle, its ranks never apart
        self._start_watching(trainer.is_global_zero)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._inactive:
            return
        self._take_sigterm()  # replaces the handler Lightning registered just before (SIGTERMException, exit 0)
        if trainer.ckpt_path and trainer.is_global_zero and (lost := files_left_behind(trainer)):
            log.warning("SpotPreemption: %s", lost)
        if trainer.ckpt_path and trainer.is_global_zero and restarts_from_its_first_sample(trainer.train_dataloader):
            # Lightning's own "not resumable" warning needs an epoch's length, which an iterable has not: silent, a
            # trial's GAN trained its stream's first batches again on every resume
            log.warning("SpotPreemption: the run resumed at step %d, and %s", trainer.global_step, ITERABLE_RESTARTS)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._inactive:
            return
        self._restore()
        if not self.preempted:  # a fit that ended: the script's end, once reached, is marked on a fleet node
            exit_mark.arm(trainer.global_rank, trainer.global_step)
            self._node_over(trainer)  # on_train_end's too, where it did not run (resumed at its end: no fit loop)
            if trainer.is_global_zero:  # what a launcher that cannot see the process waits for
                protocol.write_record(self.dirpath, Finished(launch_id=self._launch_id, step=trainer.global_step))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        exit_mark.disarm()  # (an earlier fit's mark too: whichever callback it was, this process did not end well)
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

    # --- the step boundary -------------------------------------------------------------------------------------------

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._inactive:
            return
        step_end = time.time()
        boundary = self._pace.batch_ended(trainer)
        self._stepped(trainer, step_end, boundary)
        stop, rebalance, due = self._agree(trainer, boundary)
        if stop and not boundary and self._pace.finishes_first(trainer, self):
            return  # the step's last micro-batches first, while the window allows; one not leaving waits for its end
        k = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        self._in_flight = 0 if boundary else trainer.fit_loop.epoch_loop.batch_progress.current.ready % k
        try:
            self._at_step_end(trainer, stop, rebalance, due, step_end)
        finally:
            self._in_flight = 0

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Any) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        at_step_start(checkpoint, self._in_flight, trainer.callbacks)  # type: ignore[attr-defined]

    def _saved(self, run: Any) -> None:
        self._alive(run, save=True)  # a long save is not a hang to the launcher's stall watch

    def _stopped(self, run: Any) -> None:
        run.should_stop = True  # exit_process=False: the Trainer stops after this step

    @classmethod
    def from_plan(
        cls, plan: Any, choice: int | None = None, dirpath: str | None = None, **kwargs: Any
    ) -> SpotPreemption:
        """Checkpoint at the interval the plan recommends for ``plan.entries[choice]`` (default: its recommendation,
        ``plan.chosen``) (None where its run is shorter; a spot
        fleet whose save misses the notice under a deadline: short enough for the deadline's slack,
        :func:`predictor.runs.deadline.planned_interval_s`)."""
        from predictor.documents.plan import load_plan
        from predictor.runs.deadline import planned_interval_s

        plan = plan if hasattr(plan, "entries") else load_plan(plan)
        return cls(dirpath, every_s=planned_interval_s(plan, plan.chosen if choice is None else choice), **kwargs)


# what a resumed run whose training data is an iterable without a position of its own is told (the rehearsal quotes it)
ITERABLE_RESTARTS = (
    "its training dataset is iterable and keeps no position of its own: it streams from its first sample again, so "
    "the samples of the steps before are trained again and the rest of the stream never reached. Use a DataLoader "
    "that keeps its position (state_dict() and load_state_dict(), e.g. torchdata's StatefulDataLoader: Lightning "
    "saves and restores it with the checkpoint), or a map-style dataset, which srifty_auto resumes sample-exact."
)


def restarts_from_its_first_sample(loader: Any) -> bool:
    """``loader``'s dataset is iterable and the loader keeps no position Lightning would checkpoint (a
    ``state_dict``/``load_state_dict`` pair: Lightning's ``_Stateful``, its fit loop's "combined_loader" state), nor
    the dataset one its script may keep itself."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, torch.utils.data.IterableDataset):
        return False
    stateful = lambda o: callable(getattr(o, "state_dict", None)) and callable(getattr(o, "load_state_dict", None))  # noqa: E731
    return not (stateful(dataset) or stateful(loader))


def files_left_behind(trainer: pl.Trainer) -> str | None:
    """What to say of a resumed run whose ``ModelCheckpoint`` names files of an earlier leg this machine does not have.

    Its state (best model, top k, last) comes back with the checkpoint, and on a fleet its files were on a node that
    is gone: a trial's best was saved two legs before, where ``trainer.test(ckpt_path="best")`` after ``fit()``
    fails. None when every file named is here or remote (a dirpath every node reads)."""
    import os

    for callback in trainer.checkpoint_callbacks:
        named = [getattr(callback, "best_model_path", ""), getattr(callback, "last_model_path", "")]
        named += list(getattr(callback, "best_k_models", {}) or {})
        gone = sorted({str(p) for p in named if p and "://" not in str(p) and not os.path.exists(p)})
        if gone:
            where = protocol.VARIABLES["checkpoint_uri"]
            return (
                f"ModelCheckpoint(dirpath={getattr(callback, 'dirpath', None)!r}) names {len(gone)} file(s) saved "
                f"before the resume that this machine does not have (best: {named[0] or '-'}): an "
                "earlier leg saved them on its own disk, on a fleet a node that is gone (its copy in the bucket's "
                "outputs/ has them where its last copy ran: srifty outputs). Its best_model_path and top k still name "
                "them: trainer.test(ckpt_path='best') or a top-k eviction here would not find them. To keep them "
                f"where every node reads them: ModelCheckpoint(dirpath=os.path.join(os.environ['{where}'], 'best'))"
            )
    return None


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
