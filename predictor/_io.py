"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)  # read once at import (setting it back at once); calling os.umask later would race threads
os.umask(_UMASK)


def _final_mode(target: Path) -> int:
    """Keep an existing file's mode; new files get the usual 0o666 less the umask (mkstemp would make them 0600)."""
    try:
        return target.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o666 & ~_UMASK


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync'd, then renamed.

    Creates missing parent folders. Raises OSError (the caller decides how loud to be) when the folder
    cannot be created or written.
    """
    target = Path(path)
    refuse_non_regular(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _final_mode(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Serialise ``data`` as indented JSON and write it atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def refuse_non_regular(target: Path) -> None:
    """Raise OSError when ``target`` exists and is not a regular file: the rename of an atomic write would replace
    a device (``/dev/full``, ``/dev/null``), a FIFO, a socket, a folder or a symbolic link (and not what it points
    to) with the output."""
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        return
    kind = (
        "a folder" if stat.S_ISDIR(mode)
        else "a symbolic link" if stat.S_ISLNK(mode)
        else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a FIFO" if stat.S_ISFIFO(mode)
        else "a socket" if stat.S_ISSOCK(mode)
        else "not a regular file"
    )  # fmt: skip
    error = IsADirectoryError if stat.S_ISDIR(mode) else OSError
    raise error(
        errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
        f"{target} is {kind}, not a regular file: refusing to replace it; give the path of a file to write",
    )


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise OSError if a file could not be created at ``path`` (creating the folder if needed), or if something
    other than a regular file is there."""
    target = Path(path)
    refuse_non_regular(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=target.parent)
    os.close(fd)
    os.unlink(tmp)


def read_json_document(source: str | os.PathLike[str], what: str, missing_hint: str) -> Any:
    """Parsed JSON of a document file; ProfileError naming the file and what is wrong (missing, not JSON)."""
    from predictor.exceptions import ProfileError

    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{what} file {str(path)!r} does not exist. {missing_hint}") from None
    except OSError as exc:
        raise ProfileError(f"Cannot read {what.lower()} {str(path)!r}: {exc.strerror}.") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"{what} {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}."
        ) from None
