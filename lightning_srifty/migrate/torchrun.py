"""``python -m lightning_srifty.migrate.torchrun [torchrun arguments]``: torchrun, saying a planned leave in one line.

A job that checkpoints and leaves (a spot notice, SIGTERM, a granted move, a lost launcher heartbeat) exits 75
(``EX_TEMPFAIL``: resume elsewhere). torchrun reads any non-zero exit as a failure and prints ``train.py FAILED`` with
its own traceback; here, when every failed worker exited 75, that becomes one line and the exit status 75. A worker
that had not left yet when the first one did is stopped by torchrun (``Sending process ... closing signal SIGTERM``),
and torchrun counts it among the failures: one it stopped that ended by that signal (or left with 75 itself) is part
of the planned leave, and torchrun's lines about stopping it are kept back. Any other failure is torchrun's,
unchanged, with those lines. torchrun stopped by a signal (the launcher releasing the fleet) ends with one line and
128 + the signal's number, without a traceback.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
from typing import Any

from lightning_srifty.protocol import PREEMPTED_EXIT_CODE

CLOSED_BY = {-int(signal.SIGTERM), -int(signal.SIGKILL)}  # how a worker torchrun stopped ends (its SIGTERM, then KILL)


class _PlannedLeaveLines(logging.Filter):
    """torchrun's log lines of a planned leave: its ``failed (exitcode: 75)`` is dropped (the one-line summary says
    it); its ``Sending process <pid> closing signal`` lines are held until it is known whether the leave was planned
    (:meth:`release` shows them; a planned leave drops them), and the pids they name are kept."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger
        self.held: list[logging.LogRecord] = []
        self.closed: set[int] = set()  # the workers torchrun stopped (pids)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if closing := re.match(r"Sending process (\d+) closing signal", message):
            self.closed.add(int(closing.group(1)))
            self.held.append(record)
            return False
        if f"(exitcode: {PREEMPTED_EXIT_CODE})" in message:
            return False
        self.release()  # anything else: what was held comes first
        return True

    def release(self) -> None:
        held, self.held = self.held, []
        for record in held:
            self.logger.callHandlers(record)

    def planned(self, failures: dict[int, Any]) -> bool:
        """Every failed worker left with 75, or was stopped by torchrun (a pid it named) and ended by its signal."""
        others = [f for f in failures.values() if f.exitcode != PREEMPTED_EXIT_CODE]
        stopped = all(f.exitcode in CLOSED_BY and f.pid in self.closed for f in others)
        return len(others) < len(failures) and stopped


def main() -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    lines = _PlannedLeaveLines(logger)
    logger.addFilter(lines)
    try:
        torchrun()
    except ChildFailedError as exc:
        if not lines.planned(exc.failures):
            lines.release()
            raise
        left = sum(f.exitcode == PREEMPTED_EXIT_CODE for f in exc.failures.values())
        stopped = len(exc.failures) - left
        print(
            f"srifty: the job left to be resumed elsewhere (exit {PREEMPTED_EXIT_CODE} on {left} rank(s), after its "
            f"checkpoint{f'; torchrun stopped the other {stopped}' if stopped else ''}): a planned preemption, not a "
            "failure",
            file=sys.stderr,
            flush=True,
        )
        return PREEMPTED_EXIT_CODE
    except SignalException as exc:
        lines.release()
        print(f"srifty: torchrun stopped by {exc.sigval.name}: the workers were asked to leave", file=sys.stderr)
        return 128 + int(exc.sigval)
    lines.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
