"""A fleet node's evidence that its job's script ran to its end: read when torchrun says a worker then died.

torch's process-group teardown can kill a process after its work is done: gloo's threads destroyed while joinable
("terminate called without an active exception", SIGABRT; pytorch/pytorch#190489, the atexit fix proposed and
withdrawn in #179291), NCCL's communicators torn down in a static destructor; or keep it from exiting. torchrun
reports any worker's death as its own exit 1, so a node whose training had finished recorded a failed job.

On a srifty fleet node (``SRIFTY_NODE_STATE``, the boot script's state folder) every rank arms an exit mark once a
``fit`` has ended (not on a notice: :class:`~lightning_srifty.migrate.preemption.SpotPreemption`). When the
interpreter exits, the rank writes :data:`~lightning_srifty.protocol.EXIT_MARK` ``.<local rank>`` there, ``"<global
rank> <global step> <pid>"``, and holds an exclusive ``flock`` on it until the process is gone: the boot script tells
a marked process that still runs (its teardown hangs) from one that has ended. What the boot script concludes from
the marks and from torchrun's failure table is in the module's user_data template.

The mark is written last of the exit handlers registered after this module's import (``atexit`` runs them last in,
first out: a logger's final upload, a user's ``atexit.register``), and not at all when:

- an exception reached the top (``sys.last_value``/``sys.last_exc``, which the interpreter sets before any
  ``sys.excepthook``, a replaced one included);
- ``sys.exit`` was called with a failing status after the fit (a wrapper on ``sys.exit``, looked up at call time:
  Hydra's ``sys.exit(1)`` after the exception it reported included; ``raise SystemExit(n)`` itself, and a ``from sys
  import exit`` made before the fit, are not seen: torchrun's table then shows ``n`` unless a signal ends the process
  first);
- a later fit raised (``on_exception``: :func:`disarm`).

Once the script has ended (its exit handlers run) an armed rank holds a SIGTERM: a peer that died in its own
teardown makes torchrun SIGTERM every other worker at once (on a worker's failure torch 2.13's agent waits a fixed
30 s before its SIGKILL; ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, the boot script's grace, applies when torchrun itself
is signalled), and a rank still in its exit handlers (a logger's final upload) would die unmarked, its node
recording a failed job whose training had finished (stop 79's CI lost that race). Handlers that take longer than
that wait are still cut. The handler, installed by the first exit handler to run (registered again at every
:func:`arm`, so after a logger's), is Python's own, not ``SIG_IGN``: a program an exit handler executes does not
inherit it, but torchrun signals the worker's process group, so an upload run in a child process is cut; only work
in the rank's own process is covered. The SIGTERM is held, not taken: once the mark is written (or a later exit
handler disarmed it) the default is back and a SIGTERM that came meanwhile is raised again, so the process ends of it
then (``-15``, marked) rather than finishing a teardown its supervisor asked it to cut (torch's exit handlers,
registered before this module's import, run after the mark).

Never fatal: a failed write is logged once.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from lightning_srifty import protocol

log = logging.getLogger("lightning_srifty")

# this process's mark: armed with "<global rank> <global step>" after a fit that ended, None otherwise (a process is
# one rank: module-level state, as atexit's is)
_armed: str | None = None
_folder: str | None = None
_unhandled_at_arm: tuple[Any, Any] = (None, None)  # sys.last_value / last_exc when armed: a newer one is a failure
_held: list[int] = []  # the mark's open descriptor, locked until the process is gone
_armed_pid = 0  # the process that armed it: a child forked after the fit that exits through atexit writes nothing
_sigterm_held = False  # a SIGTERM came while the exit handlers ran: raised again once the mark is written


def arm(global_rank: int, step: int, folder: str | None = None) -> None:
    """A fit ended on this rank (not on a notice): its mark is written when the process exits, unless the script
    then fails (``folder``: the node's state folder, default ``$SRIFTY_NODE_STATE``; none: off)."""
    global _armed, _folder, _unhandled_at_arm, _armed_pid
    folder = folder if folder is not None else os.environ.get(protocol.NODE_STATE)
    if not folder:
        return
    _armed, _folder = f"{int(global_rank)} {int(step)}", folder
    _unhandled_at_arm, _armed_pid = _unhandled(), os.getpid()
    if not getattr(sys.exit, "_srifty_exit_mark", False):
        sys.exit = _exit_wrapper(sys.exit)
    atexit.unregister(_hold_sigterm)  # at every arm: after the handlers registered before this fit ended (a later
    atexit.register(_hold_sigterm)  # fit's logger too), so run before them


def disarm() -> None:
    """Something after the fit failed (a later fit's exception, a failing ``sys.exit``): no mark at exit."""
    global _armed
    _armed = None


def _unhandled() -> tuple[Any, Any]:
    return getattr(sys, "last_value", None), getattr(sys, "last_exc", None)


def _exit_wrapper(original: Any) -> Any:
    def exit(status: object = None) -> None:  # sys.exit's own name, as tracebacks show it
        if status is not None and status is not False and status != 0:
            disarm()  # the script's own failing status: never a finished job
        original(status)

    exit._srifty_exit_mark = True  # type: ignore[attr-defined]
    return exit


def _will_mark() -> bool:
    """This process armed a mark that its exit is to write: armed here, and no exception reached the top since."""
    if _armed is None or _folder is None or os.getpid() != _armed_pid:
        return False
    since = zip(_unhandled(), _unhandled_at_arm, strict=True)
    return not any(now is not None and now is not then for now, then in since)


def _at_exit() -> None:
    if _will_mark() and _folder is not None:
        write(_folder, f"{_armed} {os.getpid()}")
    if signal.getsignal(signal.SIGTERM) is not _sigterm_at_exit:
        return
    try:  # marked, or disarmed by a later exit handler's failing sys.exit: SIGTERM's default is back
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # not the main thread's interpreter: nothing was installed
        return
    if _sigterm_held:  # the one that came meanwhile ends the process now, its mark written
        os.kill(os.getpid(), signal.SIGTERM)


def _hold_sigterm() -> None:
    """The first exit handler of an armed rank: the script has ended, so a SIGTERM now only cuts its exit handlers
    short (the mark's last): it is told on stderr and held until the mark is written."""
    if not _will_mark() or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return  # a failed script ends as SIGTERM ends it; a handler the script installed is the script's to keep
    with contextlib.suppress(ValueError, OSError):  # not the main thread's interpreter: nothing to do
        signal.signal(signal.SIGTERM, _sigterm_at_exit)


def _sigterm_at_exit(signum: int, frame: Any) -> None:
    global _sigterm_held
    if _sigterm_held:
        return  # told once
    _sigterm_held = True
    with contextlib.suppress(OSError, ValueError):  # a closed stderr must not raise into the exit handler it cut
        print(
            "srifty: SIGTERM after the script's end (a peer ended, or the node is stopping): held until its exit "
            "handlers finish and its end is marked (torchrun's SIGKILL follows, 30 s after a worker's failure)",
            file=sys.stderr,
            flush=True,
        )


atexit.register(_at_exit)  # at import: after every handler registered later (atexit is last in, first out)


def local_rank() -> int:
    """This process's local rank (torchrun's ``LOCAL_RANK``; 0 outside torchrun)."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def path_for(folder: str | os.PathLike[str], rank: int | None = None) -> Path:
    return Path(folder, f"{protocol.EXIT_MARK}.{local_rank() if rank is None else rank}")


def write(folder: str | os.PathLike[str], line: str) -> None:
    """The mark, written whole or not at all (a temporary name, then a rename), then held locked by this process."""
    path = path_for(folder)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # locked before it has its name: the lock follows the file (a review)
        _held.append(fd)  # released by the kernel when the process ends, however it ends
        os.write(fd, (line + "\n").encode())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("SpotPreemption: could not mark the script's end in %s: %s", path, exc)
