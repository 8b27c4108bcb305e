"""The training command a fleet runs, as torchrun's argv: the script (or ``-m module``) and its arguments.

Every node runs ``torchrun <rendezvous options> <argv>``; torchrun starts Python itself, so a command written the
way one runs it by hand, ``python train.py --epochs 90``, would make torchrun open a file named ``python``. This
module turns what users write into what torchrun takes:

    train.py --epochs 90                    -> ["train.py", "--epochs", "90"]
    python train.py --epochs 90             -> ["train.py", "--epochs", "90"]
    python3 -u train.py                     -> ["train.py"]            (user_data sets PYTHONUNBUFFERED=1)
    python -m pkg.train --lr 0.1            -> ["-m", "pkg.train", "--lr", "0.1"]   (torchrun's own -m)
    python -m torch.distributed.run ...     -> refused: srifty starts torchrun itself

The words are split like a POSIX shell (``shlex``); the Terraform module quotes each of them again in user_data.
"""

from __future__ import annotations

import re
import shlex

from predictor.exceptions import ConfigError

_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _refuse(command: str, why: str) -> ConfigError:
    return ConfigError(
        f"The train_command {command!r} {why} Give the script and its arguments, e.g. --train-command "
        "'train.py --epochs 90' or 'python -m pkg.train --lr 0.1'.",
        parameter="train_command",
        value=command,
    )


def train_argv(command: str) -> list[str]:
    """What torchrun starts for ``command`` (see the module docstring).

    Raises:
        ConfigError: the command is empty, cannot be split, is a launcher itself, or uses a Python option torchrun
            cannot pass on (``-c``, ``-O``, ``-X`` ...).
    """
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise _refuse(command, f"cannot be split into words ({exc}).") from None
    if not words:
        raise _refuse(command, "is empty: torchrun needs a script to start on every node.")
    if words[0].rsplit("/", 1)[-1] in _LAUNCHERS:
        raise _refuse(command, "starts a launcher: srifty runs torchrun with the fleet's rendezvous itself.")
    if not _PYTHON.match(words[0]):
        return words
    rest = words[1:]
    while rest and rest[0] == "-u":  # unbuffered output: user_data exports PYTHONUNBUFFERED=1
        rest = rest[1:]
    if not rest:
        raise _refuse(command, "names the interpreter but no script.")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise _refuse(command, "has -m without a module.")
        if rest[1] in _LAUNCHERS:
            raise _refuse(command, "starts a launcher: srifty runs torchrun with the fleet's rendezvous itself.")
        return rest
    if rest[0].startswith("-"):
        raise _refuse(command, f"passes the Python option {rest[0]!r}, which torchrun cannot pass on.")
    return rest
