"""The checkpoint folder as a store (torch-free): local or any fsspec URL (``s3://bucket/run``), written atomically.

Everything the job and the launcher keep beside the checkpoints goes through here: the protocol's records
(:mod:`lightning_srifty.protocol`), the data files (plans, ``calibration.json``, ``profile.json``) and the checkpoints'
digests and manifests. On a file system a write is a temporary name and a rename; on an object store
(:data:`OBJECT_STORES`) one PUT of the final key, which is atomic there.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from typing import Any

from predictor.exceptions import MigrationError

_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")  # torch.distributed.checkpoint's file of a rank
DIGEST_SUFFIX = ".sha256"  # beside every checkpoint SpotPreemption publishes, in sha256sum's format (its manifest)


def filesystem(dirpath: str) -> Any:
    """The fsspec filesystem of ``dirpath`` (a folder or a URL such as ``s3://b/run``). For S3 the endpoint
    (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, read now) is passed explicitly: fsspec caches filesystems by
    their options, and one made for an earlier endpoint must never be handed out again."""
    from fsspec.core import url_to_fs

    options: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if str(dirpath).startswith(("s3://", "s3a://")) and endpoint:
        # explicit, so that fsspec's cache of filesystems (keyed by these options) never hands out one made for
        # another endpoint
        options["endpoint_url"] = endpoint
    return url_to_fs(str(dirpath), **options)[0]


def is_remote(path: str) -> bool:
    """Whether ``path`` is in an object store (``s3://``...), not on this machine (a folder, or a ``file://`` URL)."""
    return "://" in str(path) and not str(path).startswith("file://")


def path(dirpath: str, name: str) -> str:
    return f"{str(dirpath).rstrip('/')}/{name}"


# stores where one PUT is atomic: a reader gets the old object or the whole new one, never a part (S3: "Amazon S3 never
# adds partial objects", with read-after-write consistency; likewise GCS and Azure blobs)
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def put_text(fs: Any, final: str, text: str) -> None:
    """Write ``text`` as ``final`` on ``fs`` atomically: on a file system a temporary name, then a rename; on an object
    store (:data:`OBJECT_STORES`) one PUT of the final key, which is atomic there. A temporary object and s3fs's
    "rename" (a copy, then a delete) would add nothing but two requests and a race: the copy looks the temporary key up
    in s3fs's listing cache, which another thread's listing of the folder, started before the PUT, can refill without
    it (`FileNotFoundError` on a key just written; CI, a launcher thread polling the folder the test wrote to)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if protocols & OBJECT_STORES:
        fs.pipe_file(final, text.encode())
        return
    fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
    partial = f"{final}.{os.getpid()}.{secrets.token_hex(3)}.partial"  # two writers never share a temporary name
    with fs.open(partial, "w") as f:
        f.write(text)
    fs.mv(partial, final)


def put_file(fs: Any, local: str, final: str) -> None:
    """Upload the local file ``local`` as ``final`` on ``fs`` atomically, as :func:`put_text` writes text: on an object
    store one upload of the final key (s3fs sends a large file as a multipart upload, and the object exists only once
    it completes: a reader never sees a part), elsewhere a temporary name and a rename. A checkpoint of gigabytes
    would otherwise be uploaded, then copied server-side by the rename, then deleted."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if protocols & OBJECT_STORES:
        fs.put_file(local, final)
        return
    partial = f"{final}.{os.getpid()}.{secrets.token_hex(3)}.partial"
    fs.put_file(local, partial)
    fs.mv(partial, final)


def write(dirpath: str, name: str, data: dict[str, Any]) -> str:
    """Write ``data`` as ``dirpath/name`` atomically (:func:`put_text`); returns where."""
    fs, final = filesystem(dirpath), path(dirpath, name)
    put_text(fs, final, json.dumps(data, indent=1, default=str))
    return final


def read(dirpath: str, name: str) -> Any:
    fs, where = filesystem(dirpath), path(dirpath, name)
    try:
        with fs.open(where, "r") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def present(dirpath: str) -> set[str]:
    """The names in ``dirpath`` now (one listing; what a poll reads before opening only what is there)."""
    fs = filesystem(dirpath)
    fs.invalidate_cache()
    try:
        return {str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(str(dirpath).rstrip("/"), detail=False)}
    except FileNotFoundError:
        return set()


def no_manifest(checkpoint: str) -> MigrationError:
    """What a launch says of a checkpoint directory without its manifest (issue #23 item 3)."""
    name = checkpoint.rstrip("/").rsplit("/", 1)[-1]
    return MigrationError(
        f"The sharded checkpoint {checkpoint} has no manifest ({name}{DIGEST_SUFFIX}): under srifty launch a "
        "checkpoint directory resumes only with the sha256 of every file recorded when it was saved (SpotPreemption "
        "writes it), since without it a damaged shard would load silently. It was deleted or never written: resume "
        "from another checkpoint, or pass one you trust as ckpt_path outside srifty launch."
    )


def require_manifest(checkpoint: str) -> None:
    """Refuse a checkpoint directory that has no manifest beside it (a file checkpoint passes: its digest is optional
    and :func:`~lightning_srifty.migrate.checkpoints.find_checkpoint` loads it weights-only).

    Raises:
        MigrationError: :func:`no_manifest`.
    """
    fs = filesystem(checkpoint)
    fs.invalidate_cache()
    if fs.isdir(checkpoint) and not fs.exists(checkpoint.rstrip("/") + DIGEST_SUFFIX):
        raise no_manifest(checkpoint)


def exists(dirpath: str, name: str) -> bool:
    fs = filesystem(dirpath)
    fs.invalidate_cache()  # s3fs caches listings: a marker written by another process must be seen
    return bool(fs.exists(path(dirpath, name)))


def clear(dirpath: str, *names: str) -> None:
    fs = filesystem(dirpath)
    for name in names:
        if fs.exists(path(dirpath, name)):
            fs.rm(path(dirpath, name))


def owned_files(directory: str, rank: int) -> list[str]:
    """The files of a local checkpoint directory that ``rank`` wrote (its ``__<rank>_<n>.distcp``); rank 0 also owns
    the rest (``.metadata``, ``meta.pt``). Each rank hashes and uploads its own: no file twice, and on a multi-node
    fleet with node-local disks each file is handled on the node that has it."""
    mine = []
    for root, _, files in os.walk(directory):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            shard = _SHARD.search(name)
            if (int(shard.group(1)) if shard else 0) == rank:
                mine.append(rel)
    return sorted(mine)
