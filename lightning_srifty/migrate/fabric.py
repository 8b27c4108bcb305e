"""A Lightning Fabric loop on a srifty fleet: resume, periodic checkpoints, a notice's checkpoint, the node's watches.

A Trainer gets all of it from :class:`~.preemption.SpotPreemption` (every Trainer on a fleet has one). Fabric has no
training loop of its own to hook, so the script says where its steps end::

    fabric = L.Fabric(accelerator="auto")
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    with FabricPreemption(fabric, state) as spot:  # state is now the fleet's newest checkpoint's, if any
        for batch in batches(skip=state["step"]):  # the data position is the script's: resume it from the step
            ...  # forward, fabric.backward, optimizer.step
            state["step"] += 1
            spot.step()  # the step's end: the node's alive file, the launcher's records, and the checkpoints

At each :meth:`FabricPreemption.step` the ranks agree whether any has a notice (an all-reduce, as a Trainer's); a
periodic checkpoint is saved when the plan's interval (``LaunchEnv.checkpoint_every_s`` on a fleet) has passed; on a
spot notice, SIGTERM or the launcher's move every rank takes part in ``fabric.save`` of ``state`` (the writer's save,
seal and publish: :class:`~.writer.CheckpointWriter`), rank 0 writes ``PREEMPTED.json`` and the process exits with
75, which the fleet's nodes read as "left with its checkpoint": the replacements resume from it. Leaving the ``with``
block normally records the end of training (``FINISHED.json``, the node's exit mark and alive file); an exception
records ``FAILED.json``. :meth:`FabricPreemption.alive` is a sign of life between steps (a validation batch).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from lightning_srifty import protocol, store
from lightning_srifty.fabric_run import PROFILED_KEY, FabricRun, check_fabric
from lightning_srifty.migrate import exit_mark
from lightning_srifty.migrate.alive import NodeAlive
from lightning_srifty.migrate.checkpoints import forget_on_this_node, launch_resume_path, on_this_node
from lightning_srifty.migrate.leaving import Leaving, check_options
from lightning_srifty.protocol import Failed, Finished
from predictor.exceptions import ConfigError

log = logging.getLogger("lightning_srifty")


class FabricPreemption(Leaving):
    """Resume, checkpoint and leave a Lightning Fabric loop on a srifty fleet (see the module's example).

    Args:
        fabric: the script's launched :class:`lightning.fabric.Fabric`.
        state: what a checkpoint holds and a resume restores in place (``fabric.save`` / ``fabric.load``): the set-up
            modules and optimizers, and ``state[step_key]``, the optimizer steps taken (an int the loop advances).
        dirpath: where checkpoints go (default: the fleet's or the launcher's checkpoint folder, else
            ``srifty/checkpoints``).
        step_key: the key of ``state`` that counts the steps (default ``"step"``).
        resume: at the start, load the checkpoint the fleet resumes from (its newest sound one) into ``state``.
        sampler: the :class:`~lightning_srifty.GlobalBatchSampler` the loop's loader takes its batches from
            (``DataLoader(dataset, batch_sampler=sampler)``, set up with ``use_distributed_sampler=False``): after a
            resume it stands at the restored step's sample (:meth:`~lightning_srifty.GlobalBatchSampler.seek`), so
            the resumed loop trains on the samples an uninterrupted one would, on any world size. Without it the data
            position is the loop's.
        **options: :class:`~.preemption.SpotPreemption`'s (``every_s``, ``keep``, ``leave_deadline_s``,
            ``exit_process``...); ``exit_process=False`` returns from :meth:`step` with :attr:`preempted` set
            instead of exiting with 75.
    """

    def __init__(
        self,
        fabric: Any,
        state: dict[str, Any],
        dirpath: str | None = None,
        *,
        step_key: str = "step",
        resume: bool = True,
        sampler: Any = None,
        **options: Any,
    ) -> None:
        _check_state(state, step_key)
        if sampler is not None and not callable(getattr(sampler, "seek", None)):
            raise ConfigError(
                f"FabricPreemption(sampler=...) takes a lightning_srifty.GlobalBatchSampler (it seeks to a step), not "
                f"a {type(sampler).__name__}: DataLoader(dataset, batch_sampler=GlobalBatchSampler(len(dataset), "
                "[batch] * world_size, rank=fabric.global_rank, seed=0)).",
                parameter="sampler",
                value=type(sampler).__name__,
            )
        needed = ("strategy", "save", "load", "broadcast", "global_rank", "local_rank", "world_size")
        check_fabric("FabricPreemption", fabric, needed)
        check_options("FabricPreemption", options)
        super().__init__(dirpath, **options)
        self.fabric, self.state, self.step_key, self.resume_at_start = fabric, state, step_key, resume
        self.sampler = sampler
        self.run = FabricRun(fabric, state, step_key)
        self.resumed_from: str | None = None
        self._node = NodeAlive.from_env() if self.run.local_rank == 0 else None
        self._started = self._ended = False
        self._trained: dict[str, Any] | None = None

    # --- the start and the end ---------------------------------------------------------------------------------------

    def __enter__(self) -> FabricPreemption:
        self.start()
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        if error is None or (isinstance(error, SystemExit) and error.code in (None, 0)):
            self.finished()
        elif not (isinstance(error, SystemExit) and self.preempted):
            self.failed(error)

    def start(self) -> None:
        """Before the first step (the ``with`` block does it): the process group's end at exit (gloo's too), the
        launch checks, the store, the watches, SIGTERM as a notice, and the resume (``resume``). A failure here is
        the loop's: recorded (``FAILED.json``), the watches stopped and SIGTERM handed back, then raised (a ``with``
        block's exit does not run when its entry raises)."""
        if self._started or self._ended:
            raise ConfigError(
                "This FabricPreemption has already started a loop: make one FabricPreemption per training loop.",
                parameter="FabricPreemption.start",
                value="again",
            )
        self._started = True
        from lightning_srifty.launch_checks import refuse_a_wasted_fleet
        from lightning_srifty.teardown import destroy_at_exit

        destroy_at_exit()  # gloo's group ended before the interpreter's teardown, as srifty_ddp and srifty_fsdp do
        try:
            refuse_a_wasted_fleet(self.run)  # its GPUs never idle, its ranks never apart
            self._start_watching(self.run.is_global_zero)
            self._take_sigterm()
            if self.resume_at_start:
                self.resume()
        except BaseException as error:
            self.failed(error)
            raise

    def resume(self) -> str | None:
        """Load the checkpoint the fleet resumes from into ``state`` (in place, weights only), and return its path;
        None on a first start or outside a srifty fleet or launch. Every rank loads what rank 0 found."""
        fabric = self.fabric
        path = launch_resume_path(agree=lambda find: fabric.broadcast(find() if fabric.is_global_zero else None, src=0))
        if path is None:
            return None
        # on this node's disk: Fabric's FSDP load takes a local path only, and a remote file is fetched once per node
        # (local rank 0; an 8-GPU node held 8 copies of a 7B model's 81 GB before), checked against its sha256
        local = on_this_node(path, fetch_file=True, local_rank=fabric.local_rank)
        rest = fabric.load(local, self.state, weights_only=True)  # data, never code (find_checkpoint vetted it)
        if store.is_remote(path):  # the copy the node fetched, once every rank loaded it (never a local checkpoint)
            fabric.barrier()
            if fabric.local_rank == 0:
                forget_on_this_node(local)
        if isinstance(rest, dict) and PROFILED_KEY in rest:  # FabricProfiler's mark: the run is not profiled again
            self.state[PROFILED_KEY] = rest[PROFILED_KEY]
        if self.sampler is not None:  # the data where an uninterrupted run's would be at this step
            self.sampler.seek(self.run.global_step)
        self.resumed_from = path
        log.warning("FabricPreemption: resumed from %s at step %d", path, self.run.global_step)
        return path

    def finished(self) -> None:
        """Training is over: the script's end is marked on a fleet node, and rank 0 records ``FINISHED.json`` (what a
        launcher that cannot see the process waits for). What runs after it (a test, an export) is the script's work
        after training, which the node allows its own limit."""
        self._restore()
        self._ended = True
        if self.preempted:
            return
        run = self.run
        exit_mark.arm(run.global_rank, run.global_step)
        if self._node is not None:
            self._node.over(run.global_step)
        if run.is_global_zero:
            protocol.write_record(self.dirpath, Finished(launch_id=self._launch_id, step=run.global_step))

    def failed(self, error: BaseException) -> None:
        """The loop raised: rank 0 records ``FAILED.json`` (a launcher watching a remote fleet must not wait)."""
        exit_mark.disarm()
        self._restore()
        self._ended = True
        if self.run.is_global_zero and not self.preempted:
            try:
                said = f"{type(error).__name__}: {error}"[:2000]
                record = Failed(launch_id=self._launch_id, step=self.run.global_step, error=said)
                protocol.write_record(self.dirpath, record)
            except Exception as exc:  # noqa: BLE001 - the original exception is what matters
                log.warning("FabricPreemption: could not write %s: %s", protocol.FAILED, exc)

    # --- the loop's signs --------------------------------------------------------------------------------------------

    def step(self) -> None:
        """An optimizer step ended (``state[step_key]`` already counts it): every rank calls it at the same step.
        After the job left (``exit_process=False``: :attr:`preempted`), it does nothing: end the loop."""
        if not self._started or self._ended:
            raise ConfigError(
                "spot.step() runs inside the loop's `with FabricPreemption(fabric, state) as spot:` block (or after "
                "spot.start()): the resume must come before the first step, and the end of training must be recorded.",
                parameter="FabricPreemption.step",
                value="outside its block",
            )
        if self.preempted:
            return
        run, step_end = self.run, time.time()
        if self.watch is not None and run.is_global_zero:
            if self._trained is None:
                self._trained = run.trained(self.launch)
            self.watch.step_ended(run.global_step, step_end, trained=self._trained)
        if self._node is not None:
            self._node.step(run.global_step)
        stop, rebalance, due = self._agree(run)
        self._at_step_end(run, stop, rebalance, due, step_end)

    def alive(self, *, save: bool = False) -> None:
        """A sign of life between steps (a validation batch): neither stall watch takes a long evaluation for a
        hung job."""
        if self.watch is not None and self.run.is_global_zero:
            self.watch.note_active(time.time())
        if self._node is not None:
            self._node.sign(force=save)

    def _saved(self, run: Any) -> None:
        self.alive(save=True)

    def _stopped(self, run: Any) -> None:
        run.should_stop = True


def _loadable(value: Any, where: str) -> str | None:
    """Where in ``value`` something sits that a weights-only load refuses (a numpy array, an object), else None."""
    import torch

    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor, torch.device, torch.dtype)):
        return None
    if isinstance(value, (list, tuple)):
        return next((w for i, v in enumerate(value) if (w := _loadable(v, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        return next((w for k, v in value.items() if (w := _loadable(v, f"{where}[{k!r}]"))), None)
    return f"{where} ({type(value).__module__}.{type(value).__qualname__})"


def _check_state(state: Any, step_key: str) -> None:
    if not isinstance(state, dict):
        raise ConfigError(
            f"FabricPreemption(state=...) takes the dict fabric.save() saves, not a {type(state).__name__}: "
            f'{{"model": model, "optimizer": optimizer, "{step_key}": 0}}.',
            parameter="state",
            value=type(state).__name__,
        )
    step = state.get(step_key)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(
            f"FabricPreemption(state=...) needs state[{step_key!r}], the optimizer steps taken (an int >= 0 the "
            f"loop advances before each spot.step()), and it is {step!r}: add {step_key!r}: 0 to the state "
            "(or name your counter with step_key=).",
            parameter=f"state[{step_key!r}]",
            value=step,
        )
    import torch

    for key, value in state.items():  # modules and optimizers save their state dicts; a stateful object too
        if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
            continue
        saved = value.state_dict() if callable(getattr(value, "state_dict", None)) else value
        if (bad := _loadable(saved, f"state[{key!r}]")) is not None:
            raise ConfigError(
                f"FabricPreemption(state=...) holds {bad}, which a weights-only load refuses: every checkpoint "
                "would save, and no replacement could resume from one. Keep tensors, numbers, strings and lists or "
                "dicts of them in the state (a numpy array as torch.from_numpy(a), a random state as a tensor).",
                parameter="state",
                value=bad,
            )
