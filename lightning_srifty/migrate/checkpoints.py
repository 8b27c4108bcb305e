"""Checkpoints a run can trust: sha256 digests, the weights-only rule, and sharded (directory) checkpoints.

A checkpoint is a file (``torch.save``: DDP, one device) or, under ``FSDPStrategy(state_dict_type="sharded")`` and
``ModelParallelStrategy``, a directory written through ``torch.distributed.checkpoint`` (DCP) by every rank:
``.metadata`` (a pickle of where each tensor's chunks live), ``__<rank>_<n>.distcp`` (each rank's shards) and
Lightning's ``meta.pt`` (the rest: step, loops, callbacks' state). Beside each checkpoint ``SpotPreemption`` writes
``<checkpoint>.sha256`` in ``sha256sum`` format: one line for a file, one per file for a directory
(``sha256sum -c`` checks either from the checkpoint's folder).

Loading a DCP directory runs ``pickle.load`` on ``.metadata`` and ``torch.load(weights_only=False)`` on the byte
entries (optimizer ``param_groups``, Python values) inside the ``.distcp`` files; :func:`vet_directory` reads all
of them without executing anything and refuses any object outside an allowlist, as the weights-only rule does for
files. A directory saved on N ranks loads on M ranks (DCP reshards on load); :func:`consolidate` turns it into one
file for a strategy that cannot read a directory (one device, DDP).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from typing import Any

from lightning_srifty.store import DIGEST_SUFFIX, filesystem, is_remote, no_manifest, owned_files, put_text  # noqa: F401 - owned_files re-exported

log = logging.getLogger("lightning_srifty")

DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index (filesystem._metadata_fn)
LIGHTNING_META = "meta.pt"  # Lightning's non-tensor state in a sharded checkpoint (strategies.fsdp._METADATA_FILENAME)
_STEP = re.compile(r"step=(\d+)")

# What a DCP .metadata pickle may construct: the index's own dataclasses, torch.Size, dtypes and layouts, a path.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


# --- digests -------------------------------------------------------------------------------------------------------


def sha256_of(fs: Any, path: str, chunk: int = 8 << 20) -> str:
    """Hex sha256 of a file, streamed (constant memory)."""
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_digest(fs: Any, checkpoint: str, hexdigest: str) -> None:
    """Write ``<checkpoint>.sha256`` for a file checkpoint, atomically (:func:`~lightning_srifty.store.put_text`)."""
    write_manifest(fs, checkpoint, {"": hexdigest})


def write_manifest(fs: Any, checkpoint: str, digests: dict[str, str]) -> None:
    """Write ``<checkpoint>.sha256`` atomically: ``{relative path: hex}`` for a directory (``""`` for a file)."""
    name = PurePosixPath(checkpoint).name
    lines = [
        f"{hexdigest}  {name}/{rel}" if rel else f"{hexdigest}  {name}" for rel, hexdigest in sorted(digests.items())
    ]
    # a temporary name of one writer's own on a file system (ranks may write the same manifest), one PUT on S3
    put_text(fs, checkpoint + DIGEST_SUFFIX, "\n".join(lines) + "\n")


def list_folder(fs: Any, dirpath: str) -> list[dict[str, Any]]:
    """The entries of a checkpoint folder (``fs.ls(..., detail=True)``), ``[]`` when it is missing or empty.

    On S3 a fleet's instance role may list only below its prefix (``s3:ListBucket`` with an ``s3:prefix``
    condition, the module's policy): s3fs, finding an empty folder, lists its parent to look for a file of that name,
    which S3 refuses (403). A listing of the folder's own prefix then tells "empty" from "refused", and a refusal of
    that one is raised: never read as "no checkpoint", which would start the run over."""
    try:
        return list(fs.ls(dirpath, detail=True))
    except FileNotFoundError:
        return []
    except PermissionError:
        if not hasattr(fs, "call_s3"):
            raise
        bucket, key, _ = fs.split_path(dirpath)
        answer = fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=key.rstrip("/") + "/", MaxKeys=1)
        if answer.get("KeyCount", 0):
            raise
        return []


def _bare(path: str) -> str:
    """A path without its protocol and trailing slash: how a listing names it."""
    return path.split("://", 1)[-1].rstrip("/")


def read_manifest(fs: Any, checkpoint: str, listed: set[str] | None = None) -> dict[str, str] | None:
    """The recorded digests of ``checkpoint`` (``{relative path: hex}``, ``""`` for a file), or None.

    ``listed``: the names (without protocol) of the folder's entries, when the caller listed it: whether the digest
    exists is read from there, not asked of the store (on S3 a HEAD of a missing key is 403, not 404, for a role
    that may list only below its prefix; https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html)."""
    target = checkpoint + DIGEST_SUFFIX
    if listed is not None:
        if _bare(target) not in listed:
            return None
    elif not fs.exists(target):
        return None
    digests = {}
    with fs.open(target, "r") as f:
        for number, line in enumerate(f.read().splitlines(), 1):
            if line.strip():
                parts = line.split(maxsplit=1)
                if len(parts) != 2 or not re.fullmatch(r"[0-9a-fA-F]{64}", parts[0]):
                    raise ValueError(f"its digest file {target} is malformed at line {number} ({line[:80]!r})")
                hexdigest, path = parts
                path = path.strip().lstrip("*")  # sha256sum's binary-mode mark
                digests[path.split("/", 1)[1] if "/" in path else ""] = hexdigest.lower()
    if not digests:  # an emptied digest file is no record (issue #36 M1, L9): never "nothing to check"
        raise ValueError(f"its digest file {target} is empty: the checkpoint cannot be checked")
    return digests


def read_digest(fs: Any, checkpoint: str, listed: set[str] | None = None) -> str | None:
    """The recorded sha256 of a file ``checkpoint``, or None when none was recorded (``listed``: see
    :func:`read_manifest`)."""
    digests = read_manifest(fs, checkpoint, listed)
    return None if digests is None else next(iter(digests.values()), None)


def unsafe_globals(fs: Any, path: str) -> list[str]:
    """Objects the checkpoint's pickle would construct that torch's weights-only loader does not allow (read from
    the pickle's opcodes; nothing is executed). A Lightning checkpoint of tensors, numbers, strings and containers
    has none; ``os.system`` or any class a checkpoint smuggles in is named here."""
    with fs.open(path, "rb") as f:
        return _unsafe_in_torch_save(f)


def _unsafe_in_torch_save(f: Any) -> list[str]:
    from torch.serialization import get_unsafe_globals_in_checkpoint

    return list(get_unsafe_globals_in_checkpoint(f))


# --- directory checkpoints -----------------------------------------------------------------------------------------


def writes_directory(strategy: Any) -> bool:
    """True when ``strategy.save_checkpoint`` writes a DCP directory (FSDP sharded, ModelParallel distributed)."""
    return getattr(strategy, "_state_dict_type", None) == "sharded" or bool(
        getattr(strategy, "_save_distributed_checkpoint", False)
    )


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` constructing only :data:`_METADATA_GLOBALS` and torch dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if name in _METADATA_GLOBALS.get(module, ()) or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def read_dcp_metadata(fs: Any, directory: str) -> Any:
    """The DCP index of ``directory``, unpickled constructing nothing outside the allowlist.

    Raises:
        ValueError: it is missing, or its pickle would construct something else (named).
    """
    path = f"{directory}/{DCP_METADATA}"
    if not fs.exists(path):
        raise ValueError(f"it has no {DCP_METADATA} (not a torch.distributed.checkpoint directory, or incomplete)")
    with fs.open(path, "rb") as f:
        data = f.read()
    try:
        return _MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"its {DCP_METADATA} pickle would construct {exc}, which is not part of a checkpoint index (a checkpoint "
            "must be data, not code)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a truncated or garbled pickle
        raise ValueError(f"its {DCP_METADATA} does not read ({type(exc).__name__}: {exc})") from None


def vet_directory(fs: Any, directory: str, recorded: dict[str, str] | None) -> None:
    """Check a DCP checkpoint directory without loading it; return quietly when it is sound.

    Sound means: every file its manifest lists is there with the recorded sha256 (``recorded``; None for a
    directory written by something else); its ``.metadata`` constructs only index objects; every chunk it indexes
    lies inside an existing file; the byte entries it will ``torch.load(weights_only=False)`` and ``meta.pt``
    construct nothing outside torch's weights-only allowlist.

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    sizes = {
        PurePosixPath(str(e["name"])).name: int(e.get("size") or 0)
        for e in fs.ls(directory, detail=True)
        if e.get("type") != "directory"
    }
    if recorded is not None:
        for rel, hexdigest in sorted(recorded.items()):
            if rel not in sizes:
                raise ValueError(f"its file {rel} is missing (listed in {directory}{DIGEST_SUFFIX})")
            if sha256_of(fs, f"{directory}/{rel}") != hexdigest:
                raise ValueError(
                    f"its file {rel} ({sizes[rel]} bytes) differs from the sha256 recorded when it was saved "
                    f"({directory}{DIGEST_SUFFIX}): truncated or corrupted"
                )
    metadata = read_dcp_metadata(fs, directory)
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    byte_entries = {fqn for fqn, md in metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata)}
    for index, info in (metadata.storage_data or {}).items():
        rel = str(info.relative_path)
        if rel not in sizes:
            raise ValueError(f"its shard file {rel} is missing (indexed by {DCP_METADATA})")
        if info.offset + info.length > sizes[rel]:
            raise ValueError(
                f"its shard file {rel} is truncated ({sizes[rel]} bytes; {DCP_METADATA} indexes "
                f"{info.offset + info.length})"
            )
        if index.fqn in byte_entries:
            if info.transform_descriptors:
                raise ValueError(
                    f"its entry {index.fqn} is stored transformed ({info.transform_descriptors}); srifty cannot "
                    "check it is data before torch.load runs it"
                )
            with fs.open(f"{directory}/{rel}", "rb") as f:
                f.seek(info.offset)
                unsafe = _unsafe_in_torch_save(io.BytesIO(f.read(info.length)))
            if unsafe:
                raise ValueError(f"its entry {index.fqn} would construct {', '.join(unsafe[:5])} when loaded")
    if LIGHTNING_META in sizes:
        unsafe = unsafe_globals(fs, f"{directory}/{LIGHTNING_META}")
        if unsafe:
            raise ValueError(
                f"its {LIGHTNING_META} pickle would construct {', '.join(unsafe[:5])}, which a weights-only load "
                "refuses (a checkpoint must be data, not code); if you wrote it and trust it, pass it explicitly"
            )
    elif recorded is None:
        raise ValueError(f"it has no {LIGHTNING_META} (not a Lightning sharded checkpoint)")


def _is_directory(fs: Any, entry: dict[str, Any]) -> bool:
    return entry.get("type") == "directory"


def find_checkpoint(dirpath: str, *, written_after: str | None = None) -> str | None:
    """The newest sound checkpoint in ``dirpath`` (the one written last; the step in the name breaks a tie), or None.

    ``written_after``: the name of a file in ``dirpath`` (a leg's handover): only checkpoints written after it count,
    its time read from the same listing (the store's clock on both sides); None when it is not there.

    Written last, not the highest step: a folder can hold checkpoints of more than one run (a finished launch's step
    527, then an interrupted launch's step 160 in the same default folder), and a resume must never go back in time
    to another run's state (issue #37 H2). When a checkpoint of a higher step was written earlier, a warning names it:
    pass it explicitly to resume from it. When it was written is its digest's time (``<name>.sha256``, written just
    before the checkpoint is published; a sharded directory has no time of its own on an object store), else its own.

    Sound means: its recorded sha256 (written by ``SpotPreemption`` before it publishes a checkpoint; one per file
    for a directory) matches; its pickles construct nothing outside torch's weights-only allowlist (a checkpoint is
    data, never code: one that would call ``os.system`` is refused, not run; for a directory see
    :func:`vet_directory`); and, when no digest was recorded (a checkpoint written by something else), a file loads
    with ``torch.load(weights_only=True)`` and a directory indexes only chunks that exist. A newer checkpoint that
    fails is skipped with a warning naming why, and the previous one is tried. Resume with
    ``trainer.fit(..., ckpt_path=path, weights_only=True)`` so the load itself is weights-only too (a remote
    directory: through :func:`local_checkpoint` first, Lightning reads sharded checkpoints from local disk only).
    """
    fs = filesystem(dirpath)
    fs.invalidate_cache(dirpath)  # a long-lived process: what is there now, not what s3fs listed before
    listing = list_folder(fs, dirpath)  # no HEAD of the folder's own key: an instance role may not read it
    listed = {_bare(str(e["name"])) for e in listing}
    ordered = _newest_first(dirpath, listing, written_after)
    protocol = dirpath.split("://", 1)[0] + "://" if "://" in dirpath else ""
    for entry in ordered:
        name = str(entry["name"]).rstrip("/")
        path = name if "://" in name or not protocol else protocol + name
        try:
            vet_checkpoint(fs, path, listed, directory=_is_directory(fs, entry))
            return path
        except Exception as exc:  # noqa: BLE001 - any failure means: not this one
            log.warning("lightning-srifty: skipping checkpoint %s: %s; trying an older one", path, exc)
    return None


def _step_of(entry: dict[str, Any]) -> int:
    match = _STEP.search(PurePosixPath(str(entry["name"])).name)
    return int(match.group(1)) if match else -1


def _newest_first(dirpath: str, listing: list[dict[str, Any]], written_after: str | None) -> list[dict[str, Any]]:
    """The checkpoints of a folder's ``listing``, the one written last first (its digest's time, else its own; the
    step breaks a tie, then a notice's checkpoint comes before another of its step), only those written after the
    file ``written_after`` when given ([] when it is not there); a warning names a checkpoint of a higher step
    written earlier (:func:`find_checkpoint`)."""

    def when(entry: dict[str, Any]) -> float:
        mtime = entry.get("mtime") or entry.get("LastModified") or 0
        return mtime.timestamp() if hasattr(mtime, "timestamp") else float(mtime)

    written = {_bare(str(e["name"])): when(e) for e in listing}

    def key(entry: dict[str, Any]) -> tuple[float, int, int]:
        name = _bare(str(entry["name"]))
        # a notice during a periodic save leaves two checkpoints of one step, often in one second of an object store's
        # clock (S3 lists whole seconds): the same state, and the notice's is the one PREEMPTED.json names (a CI run's
        # rehearsal resumed the periodic one, and its check of the notice's failed)
        leaving = int(PurePosixPath(name).name.startswith("preempt-"))
        return max(written.get(name, 0.0), written.get(name + DIGEST_SUFFIX, 0.0)), _step_of(entry), leaving

    entries = [e for e in listing if str(e["name"]).rstrip("/").endswith(".ckpt")]
    if written_after is not None:
        opened = [t for name, t in written.items() if PurePosixPath(name).name == written_after]
        entries = [e for e in entries if opened and key(e)[0] > opened[0]]
    ordered = sorted(entries, key=key, reverse=True)
    if ordered and max(_step_of(e) for e in ordered) > _step_of(ordered[0]):
        higher = max(ordered, key=_step_of)
        log.warning(
            "srifty: %s holds %s (step %d), written before the newest checkpoint %s (step %d): another run's? The "
            "newest is resumed; pass the other one explicitly to resume from it",
            dirpath,
            PurePosixPath(str(higher["name"]).rstrip("/")).name,
            _step_of(higher),
            PurePosixPath(str(ordered[0]["name"]).rstrip("/")).name,
            _step_of(ordered[0]),
        )
    return ordered


def vet_checkpoint(fs: Any, path: str, listed: set[str] | None = None, *, directory: bool | None = None) -> None:
    """Raise ValueError saying why ``path`` is not a sound checkpoint (what :func:`find_checkpoint` skips): a
    directory that does not match its manifest; a file whose recorded sha256 differs; a pickle that would construct
    something outside torch's weights-only allowlist; and, for a file with no recorded digest (not one of ours), one
    that does not load as a Lightning checkpoint or holds weights that are not finite (a flipped byte of a float)."""
    import torch

    if directory if directory is not None else fs.isdir(path):
        vet_directory(fs, path, read_manifest(fs, path, listed))
        return
    recorded = read_digest(fs, path, listed)
    if recorded is not None and sha256_of(fs, path) != recorded:
        raise ValueError(f"its sha256 differs from the one recorded when it was saved ({path}{DIGEST_SUFFIX})")
    unsafe = unsafe_globals(fs, path)
    if unsafe:
        raise ValueError(
            f"its pickle would construct {', '.join(unsafe[:5])}, which a weights-only load refuses (a "
            "checkpoint must be data, not code); if you wrote it and trust it, pass it explicitly"
        )
    if recorded is None:  # not one of ours: make sure it loads at all, and that its weights are numbers
        with fs.open(path, "rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or "state_dict" not in state or "global_step" not in state:
            raise ValueError("not a Lightning checkpoint (no state_dict / global_step)")
        bad = [
            name
            for name, value in state["state_dict"].items()
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all())
        ]
        if bad:
            raise ValueError(f"its weights are not all finite (NaN or inf in {', '.join(bad[:3])})")


def local_checkpoint(path: str, cache_dir: str, *, require_manifest: bool = False, fetch_file: bool = False) -> str:
    """A checkpoint Lightning can load: ``path`` itself, except a directory on a remote store (``s3://``...), which
    is downloaded into ``cache_dir`` (to a temporary name, checked against its manifest, then renamed) first.

    ``require_manifest`` (what :func:`resume_checkpoint` asks under ``srifty launch``, issue #23 item 3): a directory
    must have its manifest, and a local one is checked against it too; deleting the manifest no longer turns a
    damaged shard into a silent resume.

    ``fetch_file``: a remote file is downloaded too (checked against its recorded sha256), for a strategy that loads
    a local path only: Lightning's one-device and DDP strategies read a remote file through fsspec, but its FSDP
    (a full state dict: one file) and model-parallel strategies take the path as a local ``Path`` ("s3:/..." is
    "not a valid checkpoint").

    Raises:
        MigrationError: the download does not match the manifest recorded beside the remote directory (or file), or
            (with ``require_manifest``) a directory has no manifest or does not match it.
    """

    if not is_remote(path):
        local = path.removeprefix("file://")
        if require_manifest and os.path.isdir(local):
            _vet_local_directory(local)
        return local
    fs = filesystem(path)
    if not fs.isdir(path):  # Lightning reads a remote file through fsspec itself, except where fetch_file says
        return _fetch_file(fs, path, cache_dir) if fetch_file else path
    return _fetch_directory(fs, path, cache_dir, require_manifest)


def _fetch_directory(fs: Any, path: str, cache_dir: str, require_manifest: bool) -> str:
    """The remote sharded checkpoint ``path`` as a local directory in ``cache_dir`` (:func:`local_checkpoint`)."""
    from predictor.exceptions import MigrationError

    name = PurePosixPath(path.rstrip("/")).name
    final = os.path.join(cache_dir, name)
    try:
        recorded = read_manifest(fs, path)
    except ValueError as exc:
        raise MigrationError(f"The checkpoint {path} cannot be resumed: {exc}. Resume from another one.") from None
    if recorded is None and require_manifest:
        raise no_manifest(path)
    if recorded is not None and _cached_copy_is_sound(final, recorded):  # another rank here fetched it already
        return final
    os.makedirs(cache_dir, exist_ok=True)
    # A name of this process's own: every rank of a node may fetch at once, and none may see another's half-copy.
    partial = tempfile.mkdtemp(prefix=f"{name}.partial-", dir=cache_dir)
    try:
        listed = {PurePosixPath(str(p)).name for p in fs.ls(path, detail=False)}
        for rel in sorted(recorded) if recorded else sorted(listed):
            # only a plain name the folder's listing holds: a manifest (writable by every instance of the run) that
            # names ../x or /x must never make this process write outside its cache
            plain = rel not in ("", ".", "..") and not any(c in rel for c in "/\\\0")
            if not plain or rel not in listed:
                raise MigrationError(
                    f"The checkpoint {path}'s manifest lists {rel!r}, which is not a file of that folder: refusing "
                    "to download it (a tampered or foreign manifest); resume from another checkpoint."
                )
            fs.get_file(f"{path}/{rel}", os.path.join(partial, rel))
        try:
            vet_directory(filesystem(partial), partial, recorded)
        except ValueError as exc:
            raise MigrationError(f"The checkpoint {path} did not download intact to {partial}: {exc}.") from None
        if recorded is not None:
            write_manifest(filesystem(partial), partial, recorded)
        _publish(partial, final, recorded)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial + DIGEST_SUFFIX)
    return final


def _fetch_file(fs: Any, path: str, cache_dir: str) -> str:
    """The remote file checkpoint ``path`` as a local file in ``cache_dir``: downloaded to a name of this process's
    own, checked against the sha256 recorded when it was saved, and renamed into place (a sound copy already there,
    another rank's of this node, is taken as it is)."""
    from predictor.exceptions import MigrationError

    final = os.path.join(cache_dir, PurePosixPath(path).name)
    recorded = read_digest(fs, path)
    local = filesystem(final)
    if os.path.isfile(final) and (recorded is None or sha256_of(local, final) == recorded):
        return final
    os.makedirs(cache_dir, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f"{PurePosixPath(path).name}.partial-", dir=cache_dir)
    os.close(fd)
    try:
        fs.get_file(path, partial)
        if recorded is not None and sha256_of(local, partial) != recorded:
            raise MigrationError(
                f"The checkpoint {path} did not download intact to {partial}: its sha256 differs from the one "
                f"recorded when it was saved ({path}{DIGEST_SUFFIX}). Resume from another checkpoint."
            )
        os.replace(partial, final)  # atomic: a reader sees the whole file or none
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
    return final


def _vet_local_directory(local: str) -> None:
    """A local sharded checkpoint must have its manifest and match it (``require_manifest``)."""
    from predictor.exceptions import MigrationError

    fs = filesystem(local)
    try:
        recorded = read_manifest(fs, local)
        if recorded is None:
            raise no_manifest(local)
        vet_directory(fs, local, recorded)
    except ValueError as exc:
        raise MigrationError(f"The checkpoint {local} is not the one that was saved: {exc}.") from None


def _cached_copy_is_sound(final: str, recorded: dict[str, str] | None) -> bool:
    """Whether ``final`` is a sound copy: every file ``recorded`` lists with its sha256, and an index that reads."""
    if not os.path.isdir(final):
        return False
    try:
        vet_directory(filesystem(final), final, recorded)
    except (ValueError, OSError):
        return False
    return True


def _publish(partial: str, final: str, recorded: dict[str, str] | None) -> None:
    """Rename the vetted ``partial`` to ``final``; when a sound copy won the race meanwhile, keep that one.

    A stale ``final`` (another checkpoint's, or damaged) is first renamed aside, never deleted in place, so a
    reader never sees a directory half-removed.
    """
    for _ in range(3):
        try:
            os.rename(partial, final)
        except OSError:  # final exists (a directory rename never replaces a non-empty one)
            if _cached_copy_is_sound(final, recorded):
                return
            aside = tempfile.mkdtemp(prefix=f"{os.path.basename(final)}.stale-", dir=os.path.dirname(final))
            try:
                os.rename(final, os.path.join(aside, "old"))
            except FileNotFoundError:
                pass  # somebody else moved it
            finally:
                shutil.rmtree(aside, ignore_errors=True)
            continue
        if recorded is not None:
            os.replace(partial + DIGEST_SUFFIX, final + DIGEST_SUFFIX)
        return
    raise OSError(f"could not publish {partial} as {final}: it keeps changing under this process")


def consolidate(directory: str, out: str) -> str:
    """Write a sharded checkpoint directory as one Lightning checkpoint file ``out`` (atomically) and return it.

    Lightning's one-device and DDP strategies read only files (``torch.load`` of the path); this is the bridge for
    a run saved under FSDP that resumes without it. Model weights become one ``state_dict``; optimizer states keep
    FSDP's layout (keyed by parameter name, ``param_groups`` listing names), which ``torch.optim.Optimizer.
    load_state_dict`` maps onto the new optimizer's parameters by position, so the moments carry over when the
    optimizer is built over the parameters in the same order. The directory is vetted first (:func:`vet_directory`).

    Raises:
        MigrationError: the directory is not a sound sharded checkpoint (says why).
    """
    import torch
    from lightning.fabric.utilities.load import _load_distributed_checkpoint
    from lightning.pytorch.utilities.consolidate_checkpoint import _format_checkpoint

    from predictor.documents.atomic import atomic_write_bytes
    from predictor.exceptions import MigrationError

    local = directory.removeprefix("file://")
    fs = filesystem(local)
    try:
        vet_directory(fs, local, read_manifest(fs, local))
    except ValueError as exc:
        raise MigrationError(
            f"The checkpoint {directory} cannot be consolidated: {exc}. Pick another with find_checkpoint()."
        ) from None
    from pathlib import Path

    checkpoint = _format_checkpoint(_load_distributed_checkpoint(Path(local)))
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    atomic_write_bytes(out, buffer.getvalue())
    return out


def rm_checkpoint(fs: Any, path: str) -> None:
    """Remove a published checkpoint (file or directory) and its digest."""
    if fs.exists(path):
        fs.rm(path, recursive=True)
    if fs.exists(path + DIGEST_SUFFIX):
        fs.rm(path + DIGEST_SUFFIX)


def upload_files(local_dir: str, remote_dir: str, files: Iterable[str]) -> None:
    """Copy ``files`` (relative paths) of a local directory into a remote one (fsspec)."""
    fs = filesystem(remote_dir)
    for rel in files:
        fs.put_file(os.path.join(local_dir, rel), f"{remote_dir}/{rel}")


def architecture_differences(path: str, module: Any, limit: int = 3) -> list[str]:
    """How a file checkpoint's weights differ from ``module``'s (names missing or unexpected, shapes that differ; at
    most ``limit`` of each kind, with the counts): [] when they match, for a sharded checkpoint (a directory, which
    FSDP checks as it loads) or one without a ``state_dict``, and for a module a sharded strategy holds: its
    ``state_dict()`` is then that strategy's collective, and asked of the LightningModule inside FSDP's root it
    marked an inner unit the root, which broke the next step (a full state dict's file, resumed); FSDP's load checks
    the names and shapes itself. Reads the file memory-mapped (no copy)."""
    import torch

    if os.path.isdir(path) or _held_sharded(module):
        return []
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception:  # noqa: BLE001 - Lightning's own load says what is wrong with the file
        return []
    saved = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(saved, dict):
        return []
    own = module.state_dict()
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    shapes = [
        f"{k} {tuple(saved[k].shape)} in the checkpoint, {tuple(own[k].shape)} in the model"
        for k in own
        if k in saved and hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(own[k].shape)
    ]
    out = []
    for what, names in (("missing from the checkpoint", missing), ("not in the model", unexpected), ("", shapes)):
        if names:
            shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
            out.append(f"{what}: {shown}" if what else f"shapes differ: {shown}")
    return out


def _held_sharded(module: Any) -> bool:
    """Whether ``module`` is (or holds) an FSDP unit, or its parameters are DTensors (FSDP2, tensor parallel)."""
    from torch.distributed import fsdp

    units = tuple(k for k in (getattr(fsdp, "FullyShardedDataParallel", None), getattr(fsdp, "FSDPModule", None)) if k)
    return any(isinstance(m, units) for m in module.modules()) or any(
        type(p).__name__ == "DTensor" for p in module.parameters()
    )


# the launches whose resume a fit() of this process took: (launch id, checkpoint), one fit() each
_RESUMED: set[tuple[str, str]] = set()


def _resume_words(launch: Any) -> str:
    """What a resume is called in the job's log: "latest" is the fleet's newest sound checkpoint (a trial read
    "resuming from the launcher's checkpoint latest"), and one the fleet wrote since its handover may be taken."""
    from lightning_srifty.protocol import RESUME_LATEST

    resume = launch.resume
    if resume == RESUME_LATEST:
        return "the fleet's newest sound checkpoint"
    words = f"the launcher's checkpoint {resume}" if resume else "the newest checkpoint this fleet wrote"
    return words + (", or one this fleet wrote since" if resume and launch.resume_after else "")


def install_resume(trainer: Any, who: str, *, refuse_another_model: bool = True) -> None:
    """A ``fit()`` the script started without ``ckpt_path`` resumes from the checkpoint the launcher names
    (:func:`resume_checkpoint`); a ``ckpt_path`` the script passes wins. Lightning picks the checkpoint before any
    strategy or callback hook runs, so the one place left is the connector's ``resume_start`` (Lightning 2.x, called
    after the setup hooks), wrapped for this Trainer only, once (``srifty_auto`` and every Trainer's
    :class:`SpotPreemption` under a launch call it; ``who`` names the caller in the log). Outside a launch, or on a
    first start, nothing changes. Before, a plain Trainer under ``srifty launch`` started over from step 0 on every
    move while the launcher said it resumed (a new user's trial).

    The launcher's checkpoint is one fit()'s: the first ``fit()`` of the process without ``ckpt_path`` that loads it
    takes it, a later one (a second stage) starts as the script says. A checkpoint another model wrote is refused
    by name (``refuse_another_model``: ``srifty_auto``, issue #36 L9), or, for the resume every Trainer gets under a
    launch, said and not loaded (a script whose first Trainer trains another module is not stopped: a review).

    A copy the node fetched (:func:`on_this_node`) is removed by local rank 0 in the connector's ``resume_end``,
    after its barrier (every rank has loaded it): a 7B model's 81 GB copy stayed beside the run's next save on the
    node's disk before. Another model's copy, not loaded, stays for a later fit() that takes it. So does the copy a
    script's own ``fit(ckpt_path=resume_checkpoint())`` loads: the script holds the path and may pass it again (a
    ``validate`` or a second stage; a review), so it is the script's to remove (:func:`forget_on_this_node`)."""
    from lightning.pytorch.trainer.states import TrainerFn

    from lightning_srifty.protocol import LaunchEnv

    launch = LaunchEnv.from_env()
    connector = trainer._checkpoint_connector
    if launch is None or not (launch.resume or launch.resume_after) or getattr(connector, "_srifty_resume", False):
        return
    original_start = type(connector).resume_start.__get__(connector)
    original_end = type(connector).resume_end.__get__(connector)
    copies: list[str] = []  # the node's copy of what this fit() loads, removed once every rank has loaded it

    def resume_start(checkpoint_path: Any = None, *args: Any, **kwargs: Any) -> Any:
        key = (launch.launch_id, launch.resume)
        if not checkpoint_path and trainer.state.fn == TrainerFn.FITTING and key not in _RESUMED:
            found = launch_resume_path(agree=lambda find: _from_rank_zero(trainer, find))
            checkpoint_path = None if found is None else _node_local(trainer, found, who, refuse_another_model, copies)
            if found is None or checkpoint_path is not None:  # nothing to take, or taken: a later fit() of the
                _RESUMED.add(key)  # process starts as the script says (another model's is left for one of its own)
            if checkpoint_path is not None:
                log.warning("%s: resuming from %s (%s).", who, _resume_words(launch), checkpoint_path)
        return original_start(checkpoint_path, *args, **kwargs)

    def resume_end() -> None:
        original_end()  # ends in a barrier: every rank of every node has loaded the checkpoint
        while copies:
            copy = copies.pop()
            if trainer.local_rank == 0:  # a large model's file would otherwise sit beside the next save on the disk
                forget_on_this_node(copy)
                log.info("srifty: removed the node's copy %s of the checkpoint it resumed from", copy)

    connector.resume_start = resume_start
    connector.resume_end = resume_end
    connector._srifty_resume = True


def _node_local(trainer: Any, path: str, who: str, refuse_another_model: bool, copies: list[str]) -> str | None:
    """The launcher's checkpoint ``path`` on this node (fetched once per node where the strategy loads local paths
    only, the copy appended to ``copies`` when this fit() takes it), or None: another model's, said and not loaded
    (:func:`install_resume`), whose copy a later fit() of the process reuses."""
    local = on_this_node(path, fetch_file=loads_local_paths(trainer.strategy), local_rank=trainer.local_rank)
    taken = _this_models(local, trainer.lightning_module, who, refuse_another_model)
    if taken is not None and is_remote(path) and local != path:  # another model's stays for the Trainer that takes it
        copies.append(local)
    return taken


def _this_models(checkpoint_path: str, module: Any, who: str, refuse_another_model: bool) -> str | None:
    """``checkpoint_path`` when ``module`` wrote it (or loads loosely); else refused by name, or (not
    ``refuse_another_model``) said and None: this fit() starts as the script says (:func:`install_resume`)."""
    from lightning_srifty.protocol import VARIABLES, LaunchEnv
    from predictor.exceptions import ConfigError

    strict = getattr(module, "strict_loading", True) is not False  # a module that loads loosely: its call
    differences = architecture_differences(checkpoint_path, module) if strict else []
    if not differences:
        return checkpoint_path
    if not refuse_another_model:
        log.warning(
            "%s: the launcher's checkpoint %s was not written by this model (%s: %s); this fit() starts as the script "
            "says.",
            who,
            checkpoint_path,
            type(module).__name__,
            "; ".join(differences),
        )
        return None
    launch = LaunchEnv.from_env()
    named = launch.resume if launch is not None and launch.resume else "of this fleet"
    # another model's checkpoint in this folder: Lightning would stop with a traceback
    raise ConfigError(
        f"The launcher's checkpoint {named} ({checkpoint_path}) was not written by this model "
        f"({type(module).__name__}): {'; '.join(differences)}. Give this run a checkpoint folder of its own (srifty "
        f"terraform --name, or ${VARIABLES['checkpoint_uri']}), or pass fit(ckpt_path=...) of this model.",
        parameter="resume",
        value=checkpoint_path,
    )


def loads_local_paths(strategy: Any) -> bool:
    """Whether ``strategy`` loads a checkpoint from a local path only: Lightning's FSDP and model-parallel strategies
    take ``Path(checkpoint_path)`` (their ``load_checkpoint``); the others read it through their checkpoint IO, which
    opens remote URLs with fsspec."""
    from lightning.pytorch import strategies

    local = tuple(
        getattr(strategies, name) for name in ("FSDPStrategy", "ModelParallelStrategy") if hasattr(strategies, name)
    )
    return isinstance(strategy, local)  # ModelParallelStrategy: Lightning 2.4 on


def _from_rank_zero(trainer: Any, find: Callable[[], str | None]) -> str | None:
    """``find()`` on global rank 0, and what it found on every rank (the Trainer's processes are connected)."""
    found = find() if trainer.is_global_zero else None
    return trainer.strategy.broadcast(found, src=0)


def _resume_path(launch: Any, agree: Callable[[Callable[[], str | None]], str | None] | None) -> str | None:
    """Where ``launch`` resumes from, before any download (:func:`resume_checkpoint`): the newest checkpoint written
    since the leg's handover (``resume_after``), else ``resume`` ("latest": the folder's newest sound one), or None."""
    from lightning_srifty.protocol import RESUME_LATEST

    def search(**kw: Any) -> str | None:
        def find() -> str | None:
            return find_checkpoint(launch.checkpoint_uri, **kw)

        return find() if agree is None else agree(find)

    path = launch.resume
    if launch.resume_after:  # a node that replaces one of the leg's: where the fleet was, if it got further
        newer = search(written_after=launch.resume_after)
        if newer is not None:
            log.warning(
                "srifty: resuming from %s, written by this fleet since its start (%s): not from %s",
                newer,
                launch.resume_after,
                launch.resume or "the start",
            )
            return str(newer)
    if path == RESUME_LATEST:  # a srifty terraform fleet's node: the fleet's newest sound checkpoint, if any
        newest = search()
        if newest is None:
            log.warning("srifty: no checkpoint in %s yet: a first start", launch.checkpoint_uri)
            return None
        log.warning("srifty: resuming from the fleet's newest sound checkpoint %s", newest)
        return str(newest)
    return path or None


def resume_checkpoint(
    cache_dir: str | None = None,
    *,
    timeout_s: float = 1800.0,
    poll_s: float = 0.5,
    agree: Callable[[Callable[[], str | None]], str | None] | None = None,
    fetch_file: bool = False,
) -> str | None:
    """The checkpoint ``srifty launch`` says to resume from (``LaunchEnv.resume``), as a path Lightning can load, or
    None on a first start or outside a launch: ``trainer.fit(model, ckpt_path=resume_checkpoint(), ...)``.

    On a srifty terraform fleet's node the launch says "latest": the fleet's newest sound checkpoint. Under srifty
    launch a remote fleet's nodes are also told the leg's handover (``LaunchEnv.resume_after``): a checkpoint written
    since then is the leg's own, and the newest of them wins (a node that replaces a lost one). With ``agree``
    (given the search, it runs it on global rank 0 alone and broadcasts what it found: what every Trainer under a
    launch does once its processes are connected), every rank resumes the one rank 0 found; without it,
    each rank looks on its own (before the Trainer there is no process group), and one that cannot read the newest
    (a transient store error) would resume an older one than its peers.

    A sharded checkpoint (a directory) on a remote store is downloaded once per node, by local rank 0, into
    ``cache_dir`` (default ``$TMPDIR/srifty-resume/<launch id>``) and checked against its manifest; the node's other
    ranks wait for it to appear (it is renamed into place complete) for up to ``timeout_s``. With ``fetch_file`` a
    remote file is fetched the same way (:func:`local_checkpoint`: for a strategy that loads local paths only).

    Raises:
        MigrationError: the download does not match its manifest, or another rank waited ``timeout_s`` for it.
    """
    found = launch_resume_path(agree)
    if found is None:
        return None
    return on_this_node(found, cache_dir, timeout_s=timeout_s, poll_s=poll_s, fetch_file=fetch_file)


def launch_resume_path(agree: Callable[[Callable[[], str | None]], str | None] | None = None) -> str | None:
    """The checkpoint ``srifty launch`` says to resume from, as it is in the store (before any download), or None on a
    first start or outside a launch (:func:`resume_checkpoint`, which also brings it onto this node)."""
    from lightning_srifty.protocol import LaunchEnv

    launch = LaunchEnv.from_env()
    return None if launch is None else _resume_path(launch, agree)


def on_this_node(
    path: str,
    cache_dir: str | None = None,
    *,
    timeout_s: float = 1800.0,
    poll_s: float = 0.5,
    fetch_file: bool = False,
    local_rank: int | None = None,
) -> str:
    """The checkpoint ``path`` as this node loads it (:func:`resume_checkpoint`): a remote directory (or, with
    ``fetch_file``, a remote file) downloaded once per node by local rank 0 into ``cache_dir`` (default
    ``$TMPDIR/srifty-resume/<launch id>``) and checked; anything else as it is. ``local_rank``: this process's rank
    on the node, as the Trainer or Fabric knows it (default: ``$LOCAL_RANK``, which torchrun sets and SLURM does not,
    where every rank would fetch its own). The node's other ranks wait up to
    ``timeout_s`` for local rank 0's word beside it (:data:`NODE_MARK_SUFFIX`): that the copy of what the store
    records now is in place (a copy of another run's checkpoint of the same name is not), or that it failed and why.

    Raises:
        MigrationError: the download does not match its manifest or digest (on every rank of the node), or another
            rank waited ``timeout_s``.
    """
    from lightning_srifty.protocol import LaunchEnv

    launch = LaunchEnv.from_env()
    run = launch.launch_id if launch is not None and launch.launch_id else "run"
    cache = cache_dir or os.path.join(tempfile.gettempdir(), "srifty-resume", run)
    if not is_remote(path) or not (fetch_file or filesystem(path).isdir(path)):
        return local_checkpoint(path, cache, require_manifest=True)  # nothing to download
    final = os.path.join(cache, PurePosixPath(path.rstrip("/")).name)
    record = _recorded(path)
    if (int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank) != 0:
        return _wait_for_node_copy(path, final, record, timeout_s, poll_s)
    os.makedirs(cache, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(final + NODE_MARK_SUFFIX)  # a word of before: this copy is not said ready until it is
    try:
        local = local_checkpoint(path, cache, require_manifest=True, fetch_file=fetch_file)
    except BaseException as exc:
        _say_on_this_node(final, record, f"failed: {exc}")
        raise
    _say_on_this_node(final, record, "ready")
    log.warning("srifty: the checkpoint %s is on this node at %s, for its ranks", path, local)
    return local


# beside a checkpoint local rank 0 brought onto the node: what the store recorded of it, then "ready" or "failed: why"
NODE_MARK_SUFFIX = ".on-this-node"


def _recorded(path: str) -> str:
    """What the store records of checkpoint ``path`` (its digests), as one short token: the same checkpoint's on every
    rank, another run's of the same name different."""
    digests = read_manifest(filesystem(path), path)
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:16]


def _say_on_this_node(final: str, record: str, word: str) -> None:
    temporary = f"{final}{NODE_MARK_SUFFIX}.{os.getpid()}"
    with open(temporary, "w") as out:
        out.write(f"{record} {word}")
    os.replace(temporary, final + NODE_MARK_SUFFIX)


def _wait_for_node_copy(path: str, final: str, record: str, timeout_s: float, poll_s: float) -> str:
    """A rank other than the node's first: ``final`` once local rank 0 says this record of it is in place."""
    import time

    from predictor.exceptions import MigrationError

    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(FileNotFoundError):
            with open(final + NODE_MARK_SUFFIX) as said:
                mark, _, word = said.read().partition(" ")
            if mark == record and word == "ready":
                return final
            if mark == record and word.startswith("failed: "):
                why = word.removeprefix("failed: ")
                raise MigrationError(f"Local rank 0 could not bring the checkpoint {path} onto this node: {why}")
        if time.monotonic() > deadline:
            raise MigrationError(
                f"Waited {timeout_s:.0f} s for local rank 0 to download the checkpoint {path} to {final}; "
                "it did not say it was in place: see local rank 0's log."
            )
        time.sleep(poll_s)


def forget_on_this_node(local: str) -> None:
    """Remove a checkpoint :func:`on_this_node` brought onto the node (its copy and its words), once every rank of the
    node loaded it: a large model's file would otherwise stay beside the next save on the node's disk."""
    if os.path.isdir(local):
        shutil.rmtree(local, ignore_errors=True)
    for leftover in (local, local + DIGEST_SUFFIX, local + NODE_MARK_SUFFIX):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.remove(leftover)
