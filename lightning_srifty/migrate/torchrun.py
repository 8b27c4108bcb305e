"""``python -m lightning_srifty.migrate.torchrun [torchrun arguments]``: torchrun, saying a planned leave in one line.

A job that checkpoints and leaves (a spot notice, SIGTERM, a granted move, a lost launcher heartbeat) exits 75
(``EX_TEMPFAIL``: resume elsewhere). torchrun reads any non-zero exit as a failure and prints ``train.py FAILED`` with
its own traceback; here, when every failed worker exited 75, that becomes one line and the exit status 75. Any other
failure is torchrun's, unchanged. torchrun stopped by a signal (the launcher releasing the fleet) ends with one line
and 128 + the signal's number, without a traceback.
"""

from __future__ import annotations

import logging
import sys

from lightning_srifty.protocol import PREEMPTED_EXIT_CODE


class _DropPlannedLeave(logging.Filter):
    """torchrun's ``failed (exitcode: 75)`` log line (the one-line summary below says it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"(exitcode: {PREEMPTED_EXIT_CODE})" not in record.getMessage()


def main() -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_DropPlannedLeave())
    try:
        torchrun()
    except ChildFailedError as exc:
        codes = {failure.exitcode for failure in exc.failures.values()}
        if codes != {PREEMPTED_EXIT_CODE}:
            raise
        print(
            f"srifty: the job left to be resumed elsewhere (exit {PREEMPTED_EXIT_CODE} on {len(exc.failures)} "
            "rank(s), after its checkpoint): a planned preemption, not a failure",
            file=sys.stderr,
            flush=True,
        )
        return PREEMPTED_EXIT_CODE
    except SignalException as exc:
        print(f"srifty: torchrun stopped by {exc.sigval.name}: the workers were asked to leave", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
