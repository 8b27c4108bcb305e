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
    """Write ``text`` (UTF-8) to ``path`` atomically: see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsync'd, then renamed.

    Creates missing parent folders. Raises OSError naming ``path`` (the caller decides how loud to be) when the
    folder cannot be created or written.
    """
    target = Path(path)
    refuse_non_regular(target)
    fd, tmp = _temporary(target, ".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _final_mode(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def _temporary(target: Path, suffix: str) -> tuple[int, str]:
    """A temporary file beside ``target`` (its folder created if missing); an OSError names ``target``, not the
    temporary name, and says what to do."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    except OSError as exc:
        raise _cannot_write(target, exc) from None


def _cannot_write(target: Path, exc: OSError) -> OSError:
    return type(exc)(
        exc.errno,
        f"cannot write {target}: {exc.strerror or exc} (in {target.parent}); give a path in a folder you can write",
        str(target),
    )


def write_png(figure: Any, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """A matplotlib figure as PNG at exactly ``path``, atomically (:func:`atomic_write_bytes`): never through a
    symbolic link or over a device, FIFO or folder, and never to ``path`` + ``.png`` (matplotlib appends it to a name
    without a suffix: ``--plot /dev/null`` wrote ``/dev/null.png``; issue #36 M4)."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return atomic_write_bytes(path, buffer.getvalue())


def atomic_write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Serialise ``data`` as indented JSON and write it atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def check_distinct_outputs(
    outputs: dict[str, str | os.PathLike[str] | None], inputs: dict[str, str | os.PathLike[str] | None] | None = None
) -> None:
    """Refuse two outputs (or an output and an input) that are one file: the later write replaced the earlier one,
    after the first had been reported written (``--out r.png --report r.html``: the plot replaced the plan).
    ``inputs`` (by the flag that names them) may repeat one another; an output may be none of them.

    Every command that writes more than one file, or writes beside what it reads, calls it before it reads or
    writes anything (``srifty recommend``, ``replay``, ``eval``); each write itself goes through
    :func:`atomic_write_bytes` (never through a symbolic link, never over a device, FIFO or folder).

    Raises:
        ConfigError: naming both and the fix.
    """
    from predictor.exceptions import ConfigError

    def real(path: str | os.PathLike[str]) -> str:  # os.path.realpath: a symlink loop is a path, not a RuntimeError
        return os.path.realpath(os.path.expanduser(path))

    read = {real(p): name for name, p in (inputs or {}).items() if p is not None}
    seen: dict[str, str] = {}
    for name, path in outputs.items():
        if path is None:
            continue
        resolved = real(path)
        why = (
            f"{name} is the file {read[resolved]} reads ({path}): writing it would replace the command's own input. "
            "Give the output another path."
            if resolved in read
            else f"{seen[resolved]} and {name} are the same file ({path}): the second would replace the first. Give "
            "each its own path."
            if resolved in seen
            else None
        )
        if why is not None:
            raise ConfigError(why, parameter=name.split(" ", 1)[0].removesuffix("'s"), value=str(path))
        seen[resolved] = name


def refuse_non_regular(target: Path) -> None:
    """Raise OSError when ``target`` exists and is not a regular file: the rename of an atomic write would replace
    a device (``/dev/full``, ``/dev/null``), a FIFO, a socket, a folder or a symbolic link (and not what it points
    to) with the output."""
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # e.g. a parent that is a file (ENOTDIR)
        raise _cannot_write(target, exc) from None
    if stat.S_ISREG(mode):
        return
    kind = "a symbolic link" if stat.S_ISLNK(mode) else file_kind(mode)
    error = IsADirectoryError if stat.S_ISDIR(mode) else OSError
    raise error(
        errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
        f"{target} is {kind}, not a regular file: refusing to replace it; give the path of a file to write",
    )


def file_kind(mode: int) -> str:
    """What a ``st_mode`` that is not a regular file is, in words ("a FIFO")."""
    return (
        "a folder" if stat.S_ISDIR(mode)
        else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a FIFO" if stat.S_ISFIFO(mode)
        else "a socket" if stat.S_ISSOCK(mode)
        else "not a regular file"
    )  # fmt: skip


class TooLarge(OSError):
    """A file over the reader's limit (its size is ``filename``'s first ``limit`` + 1 bytes at least)."""


DOCUMENT_LIMIT = 256 << 20  # a profile with the operator table of a 70B model is a few MB


def read_bounded(path: str | os.PathLike[str], limit: int = DOCUMENT_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, and nothing else: a FIFO, a device (``/dev/zero``), a
    socket or a folder is refused before any byte is read (opened without blocking, so a FIFO with no writer cannot
    hang the caller), and at most ``limit`` + 1 bytes are read before a larger file is refused.

    Raises:
        FileNotFoundError: nothing there.
        OSError: not a regular file (``errno.EINVAL``, the kind named), or :class:`TooLarge`.
    """
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"is {file_kind(mode)}, not a regular file: give the path of a file", str(path))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise TooLarge(errno.EFBIG, f"is over {limit:,} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise OSError if a file could not be created at ``path`` (creating the folder if needed), or if something
    other than a regular file is there."""
    target = Path(path)
    refuse_non_regular(target)
    fd, tmp = _temporary(target, ".probe")
    os.close(fd)
    os.unlink(tmp)


def read_json_document(source: str | os.PathLike[str], what: str, missing_hint: str) -> Any:
    """Parsed JSON of a document file; ProfileError naming the file and what is wrong (missing, not JSON)."""
    from predictor.exceptions import ProfileError

    path = Path(source)
    try:
        text = read_bounded(path).decode("utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{what} file {str(path)!r} does not exist. {missing_hint}") from None
    except OSError as exc:  # read_bounded says "is a FIFO ..."; the system "Too many levels of symbolic links"
        reason = str(exc.strerror or exc)
        reason = f"it {reason}" if reason.startswith("is ") else reason[:1].lower() + reason[1:]
        raise ProfileError(f"Cannot read {what.lower()} {str(path)!r}: {reason}.") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"{what} {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8 JSON."
        ) from None
    return parse_json(text, f"{what} {str(path)!r}")


MAX_DEPTH = 16  # srifty documents nest about 6 levels


def parse_json(text: str | bytes, what: str) -> Any:
    """``json.loads`` with errors a person can act on: ProfileError naming ``what``, the line and column; a document
    nested deeper than the parser recurses is refused, saying how deep."""
    from predictor.exceptions import ProfileError

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
    except RecursionError:
        raise ProfileError(
            f"{what} nests objects or lists {nesting_depth(text):,} deep; srifty documents nest fewer than "
            f"{MAX_DEPTH} levels: this is not a profile or a plan."
        ) from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}.") from None
    except ValueError as exc:  # e.g. an integer literal over sys.get_int_max_str_digits()
        raise ProfileError(f"{what} cannot be read as JSON: {exc}.") from None


def nesting_depth(text: str | bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text (brackets inside strings are skipped), in one pass."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
