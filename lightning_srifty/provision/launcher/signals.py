"""Signals that end a command which started something (a fleet, a local AWS, nodes): they become an exception, so
that the command's ``finally`` releases what it started before it ends. Python's default SIGTERM and SIGHUP end the
process at once and run no ``finally``: a rehearsal stopped by SIGTERM left its moto server, its nodes' boot scripts
and their training running."""

from __future__ import annotations

import signal
import threading
from typing import Any

from predictor.exceptions import LaunchInterrupted


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP raise :class:`LaunchInterrupted` once (main thread only); a second signal while
    the command releases what it started is answered with ``busy`` (a line), not a second interruption."""

    SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

    def __init__(self, echo: Any, who: str, busy: str) -> None:
        self.echo, self.who, self.busy, self.fired, self.previous = echo, who, busy, None, {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.fired is not None:
            self.echo(f"{self.who}: {signal.Signals(signum).name}: {self.busy}")
            return
        self.fired = signum
        raise LaunchInterrupted(signum, self.who)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
