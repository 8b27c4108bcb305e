"""A fleet node's evidence that its job's script ran to its end: read when torchrun says a worker then died.

torch's process-group teardown can kill a process after its work is done: gloo's threads destroyed while joinable
("terminate called without an active exception", SIGABRT; pytorch/pytorch#190489, the atexit fix proposed and
withdrawn in #179291), NCCL's communicators torn down in a static destructor. torchrun reports any worker's death as
its own exit 1, so a node whose training had finished recorded a failed job (the fleet still ended, as a failure).

On a srifty fleet node (``SRIFTY_NODE_STATE``, the boot script's state folder) every rank arms an exit mark once a
``fit`` has ended (not on a notice, not interrupted). When the interpreter begins to exit (``atexit``: the script's
end, reached with no exception left unhandled since), the rank writes :data:`~lightning_srifty.protocol.EXIT_MARK`
``.<local rank>`` there: ``"<global rank> <global step>"``. What the boot script concludes from the marks, and from
torchrun's failure table (every failure a signal, none an exit status), is in the module's user_data template.

What the marks cannot tell: a script that calls ``sys.exit(n)`` after its fit still reaches ``atexit`` (torchrun's table
then says ``exitcode: n``, which the boot script never excuses), unless the process is also killed by a signal in its
teardown. A ``fit`` in a later call that raises disarms the mark (``on_exception``), and so does an exception that
reaches the top. Never fatal: a failed write is logged once.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from pathlib import Path
from types import TracebackType

from lightning_srifty import protocol

log = logging.getLogger("lightning_srifty")

# this process's mark: armed with "<global rank> <global step>" after a fit that ended, None otherwise (the process is
# one rank: a module-level state, as atexit's is)
_armed: str | None = None
_hooked = False
_folder: str | None = None


def arm(global_rank: int, step: int, folder: str | None = None) -> None:
    """A fit ended on this rank (not on a notice, not interrupted): its mark is written when the process exits, unless
    something raises before that (``folder``: the node's state folder, default ``$SRIFTY_NODE_STATE``; none: off)."""
    global _armed, _hooked, _folder
    folder = folder if folder is not None else os.environ.get(protocol.NODE_STATE)
    if not folder:
        return
    _armed, _folder = f"{int(global_rank)} {int(step)}", folder
    if not _hooked:
        _hooked = True
        _previous = sys.excepthook

        def _unhandled(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            disarm()  # an exception reached the top: the script did not end well, whatever its fit did
            _previous(kind, value, tb)

        sys.excepthook = _unhandled
        atexit.register(_at_exit)


def disarm() -> None:
    """Something after the fit failed (a later fit's exception, one that reached the top): no mark at exit."""
    global _armed
    _armed = None


def _at_exit() -> None:
    if _armed is not None and _folder is not None:
        write(_folder, _armed)


def local_rank() -> int:
    """This process's local rank (torchrun's ``LOCAL_RANK``; 0 outside torchrun)."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def path_for(folder: str | os.PathLike[str], rank: int | None = None) -> Path:
    return Path(folder, f"{protocol.EXIT_MARK}.{local_rank() if rank is None else rank}")


def write(folder: str | os.PathLike[str], line: str) -> None:
    """The mark, written whole or not at all (a temporary name, then a rename)."""
    path = path_for(folder)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(line + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("SpotPreemption: could not mark the script's end in %s: %s", path, exc)
