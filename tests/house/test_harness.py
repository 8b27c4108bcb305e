"""The test harness's own rules, where a wrong one would hide a failure (tests/_support.py)."""

from __future__ import annotations

import signal

import pytest

from _support import DONE, TEARDOWN_ABORT, ended_after_its_work

FIT = "`Trainer.fit` stopped: `max_steps=12` reached.\n"


@pytest.mark.parametrize(
    ("code", "log", "ok"),
    [
        (0, "", True),
        (-signal.SIGABRT, f"{FIT}{DONE} 1\n{DONE} 0\n{TEARDOWN_ABORT}\n", True),  # stop 77's leg: work written, abort
        (134, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n", True),  # the same through a shell
        (-signal.SIGABRT, f"{FIT}{TEARDOWN_ABORT}\n", False),  # aborted before the script said its work was written
        (-signal.SIGABRT, f"{TEARDOWN_ABORT}\n{DONE} 0\n", False),  # the message before rank 0's line: not after it
        (-signal.SIGABRT, f"{FIT}{DONE} 1\n{TEARDOWN_ABORT}\n", False),  # rank 1 done, rank 0 (the exit) not
        (-signal.SIGABRT, f"{FIT}{DONE} 10\n{TEARDOWN_ABORT}\n", False),  # rank 10 is not rank 0
        (-signal.SIGABRT, f"{FIT}{DONE} 0\n", False),  # SIGABRT without torch's message: something else
        (1, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n", False),  # an exit code of its own
        (-signal.SIGSEGV, f"{FIT}{DONE} 0\n{TEARDOWN_ABORT}\n", False),
    ],
)
def test_only_torchs_teardown_abort_after_the_work_passes_as_done(code, log, ok) -> None:
    assert ended_after_its_work(code, log) is ok
