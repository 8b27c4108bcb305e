"""A fleet node's own evidence that its job is alive: the stall watch of the module's boot script reads it.

On a node of a fleet ``srifty terraform`` wrote, the boot script exports ``SRIFTY_NODE_STATE`` (its state folder).
Each node's local rank 0 rewrites :data:`~lightning_srifty.protocol.ALIVE_MARKER` there on every sign of life of the
training loop (a step's end, a validation batch, an epoch's start or end, a save), at most every
:data:`~lightning_srifty.protocol.ALIVE_EVERY_S` seconds, from the job's first step on: one line, ``"<global step>
<seconds a step, or -> <0|1>"``, its mtime the sign's time, ``1`` once training is over. A job that trained and then
stopped moving (a GPU that stopped answering with no fault its driver logs, a collective waiting on a hung rank, a read
that never returns) leaves the file unchanged, and the node stops it and leaves to be replaced (the module's
``watchdog.stall_s``). Local disk only: nothing here can slow a step by more than a rename, and a failed write is
logged once, never raised.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from lightning_srifty import protocol

log = logging.getLogger("lightning_srifty")


class NodeAlive:
    """The writer of one node's alive file (``folder``: the node's state folder; None: off, every call is a no-op)."""

    def __init__(self, folder: str | os.PathLike[str] | None, every_s: float = protocol.ALIVE_EVERY_S) -> None:
        self.path = None if not folder else Path(folder, protocol.ALIVE_MARKER)
        self.every_s = every_s
        self._first: tuple[int, float] | None = None  # (global step, monotonic) at the first step seen
        self._step = 0
        self._written: float | None = None  # monotonic time of the last write
        self._over = False  # training has ended: a sign of life now is the script's after it (a test, a validation)
        self._written_over = False  # what the last write said of it
        self._warned = False

    @classmethod
    def from_env(cls) -> NodeAlive:
        return cls(os.environ.get(protocol.NODE_STATE), protocol.ALIVE_EVERY_S)

    def step(self, step: int, now: float | None = None) -> None:
        """A training step ended at global step ``step``: the watch starts with the first."""
        now = time.monotonic() if now is None else now
        if self._first is None:
            self._first = (step, now)
        self._step, self._over = step, False  # a later fit's steps: training again, said at once
        self._write(now, over=False, force=self._written_over)

    def sign(self, now: float | None = None, *, force: bool = False) -> None:
        """A sign of life between steps (a validation batch; a save, ``force``: written whatever the last write's
        time, since a save is where a long silence begins): counted once the job has stepped. After its training
        (a test's or a validation's batches after the fit) it stays a sign of the script's work after training, which
        the node allows its own limit (the module's ``watchdog.after_fit_s``), not the step's."""
        if self._first is not None or self._written_over:
            self._write(time.monotonic() if now is None else now, over=self._over, force=force)

    def over(self, step: int | None = None) -> None:
        """Training has ended (at global step ``step``): what runs until the process exits (a test, an export, an
        upload) is not a hang until it has been silent for the node's limit after training. Written even by a job
        that took no step (``step`` given): a leg resumed from its run's last checkpoint (Lightning skips the fit
        loop) runs only its script's work after the fit, which the node then watches too (a review)."""
        self._over = True
        if self._first is None and step is not None:
            self._step = step
        if self._first is not None or step is not None:
            self._write(time.monotonic(), over=True, force=True)

    def step_time_s(self, now: float) -> float | None:
        """Seconds a step, measured since the first step seen (None before a second)."""
        if self._first is None or self._step <= self._first[0]:
            return None
        return (now - self._first[1]) / (self._step - self._first[0])

    def _write(self, now: float, *, over: bool, force: bool = False) -> None:
        if self.path is None or (not force and self._written is not None and now - self._written < self.every_s):
            return
        self._written, self._written_over = now, over
        step_time = self.step_time_s(now)
        line = f"{self._step} {'-' if step_time is None else f'{step_time:.3f}'} {int(over)}\n"
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.write_text(line)
            os.replace(tmp, self.path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("SpotPreemption: could not mark the node's job alive in %s: %s", self.path, exc)
