"""Saving a checkpoint so that no half-written one is ever picked up: save -> seal (its sha256) -> publish.

:class:`CheckpointWriter` is what :class:`~.preemption.SpotPreemption` saves with: every rank takes part in
``trainer.save_checkpoint`` to a temporary name; rank 0 writes the digest (``<name>.sha256``) and then renames the
checkpoint into place (a local folder), or saves it on local disk first and uploads the digest and then the
checkpoint (an object store, one upload of the final key: atomic there), within a deadline; an upload the store does
not take in time leaves the checkpoint on local disk, and :attr:`CheckpointWriter.stored` says so. A sharded strategy
writes a directory: each rank hashes and uploads its own files and rank 0 publishes the manifest last.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl

from lightning_srifty import protocol, store
from lightning_srifty.migrate.checkpoints import (
    DIGEST_SUFFIX,
    owned_files,
    rm_checkpoint,
    sha256_of,
    upload_files,
    write_digest,
    write_manifest,
    writes_directory,
)
from lightning_srifty.store import filesystem
from predictor.exceptions import ConfigError

log = logging.getLogger("lightning_srifty")


class CheckpointWriter:
    """Saves, seals and publishes the checkpoints of one folder, and prunes the periodic ones.

    Args:
        dirpath: the checkpoint folder: local, or an fsspec URL (``s3://bucket/run-1``).
        local_fallback: the local folder a remote folder's checkpoints are saved in first, and stay in when the store
            does not take them in time.
        keep: how many periodic checkpoints are kept (in the store, and apart on local disk).
    """

    def __init__(self, dirpath: str, local_fallback: str, keep: int = 2) -> None:
        self.dirpath, self.local_fallback, self.keep = dirpath, local_fallback, max(1, keep)
        self.stored = "durable"  # or "local <host>:<path>": where the newest checkpoint went
        self.checkpoints: list[str] = []
        self.last_save = time.monotonic()
        self.last_save_s: float | None = None  # how long the last save took (seconds), once one was made
        self._interrupt: threading.Event | None = None

    def due(self, every_s: float | None) -> bool:
        """Whether a periodic checkpoint every ``every_s`` seconds (None: none) is due."""
        return every_s is not None and time.monotonic() - self.last_save >= every_s

    def save(
        self,
        trainer: pl.Trainer,
        reason: str = "manual",
        deadline_s: float | None = None,
        *,
        interrupt: threading.Event | None = None,
    ) -> str:
        """Save on every rank to a temporary name; rank 0 records its sha256 and renames it into place when complete
        (the digest is written before the rename, so a published checkpoint always has it).

        A remote folder (``s3://``...) gets the checkpoint saved and hashed on local disk first, then its digest and
        then the checkpoint uploaded (one upload of the final key on an object store, atomic there: no temporary
        object, no server-side copy, and a published checkpoint always has its digest), within ``deadline_s`` when
        given; if the store does not take it (an outage, or in time), it stays on local disk, the returned path is
        the local one and ``self.stored`` says so.

        ``interrupt`` (a periodic save: the notice event) ends the wait for the upload as soon as it is set on this
        rank; the checkpoint then stays on local disk as when the time runs out.

        A sharded strategy (FSDP ``state_dict_type="sharded"``) writes a directory: see :meth:`_directory`."""
        final = f"{self.dirpath}/{reason}-step={trainer.global_step}.ckpt"
        started = time.monotonic()
        self.stored = "durable"
        self._interrupt = interrupt
        if writes_directory(trainer.strategy):
            final = self._directory(trainer, final, deadline_s)
        elif not store.is_remote(self.dirpath):
            filesystem(final).makedirs(self.dirpath, exist_ok=True)  # a bare torch.save (FSDP's full) makes none
            partial = final + ".partial"
            trainer.save_checkpoint(partial, weights_only=False)
            trainer.strategy.barrier("srifty-preempt-save")
            if trainer.is_global_zero:
                fs = filesystem(final)
                write_digest(fs, final, sha256_of(fs, partial))
                fs.mv(partial, final)
            trainer.strategy.barrier("srifty-preempt-renamed")
        else:
            final = self._remote(trainer, final, deadline_s)
        self.checkpoints.append(final)
        self.last_save = time.monotonic()
        self.last_save_s = self.last_save - started
        return final

    def _directory(self, trainer: pl.Trainer, final: str, deadline_s: float | None) -> str:
        """Every rank writes its shards into ``<name>.partial/``; after a barrier each rank hashes the files it wrote,
        rank 0 gathers the digests, writes the manifest ``<name>.sha256`` and renames the directory into place.

        A remote folder gets the same, on local disk first (Lightning writes sharded checkpoints to local paths
        only); then every rank uploads its own files (within the deadline when there is one) and rank 0, once every
        rank's upload succeeded, uploads the manifest last: an object store has no directory rename, so there the
        manifest is what publishes it (:func:`find_checkpoint` refuses files that do not match it, and a directory
        without one is checked against its own index). If a rank's upload fails or runs out of time, the checkpoint
        stays on local disk, as for a file."""
        started = time.monotonic()
        remote = store.is_remote(self.dirpath)
        name = final.rsplit("/", 1)[-1]
        local = os.path.join(self.local_fallback, name) if remote else final.removeprefix("file://")
        digests = self._publish_local(trainer, local)
        if not remote:
            return final
        rank = trainer.global_rank
        mine = owned_files(local, rank)
        budget = None if deadline_s is None else deadline_s - (time.monotonic() - started)
        error = within(budget, lambda: upload_files(local, final, mine), self._interrupt)
        uploaded = trainer.strategy.reduce_boolean_decision(error is None, all=True)
        where = final
        if trainer.is_global_zero:
            if uploaded:
                budget = None if deadline_s is None else deadline_s - (time.monotonic() - started)
                error = within(budget, lambda: write_manifest(filesystem(final), final, digests), self._interrupt)
                uploaded = error is None
            if not uploaded:
                where = local
                self.stored = f"local {socket.gethostname()}:{local}"
                log.error(
                    "SpotPreemption: the sharded checkpoint did not reach %s (%s); it is kept on local disk at %s "
                    "(each node holds the shards its ranks wrote), and the next fleet resumes from the newest "
                    "checkpoint that did.",
                    final,
                    error or "another rank's upload failed",
                    local,
                )
        where = trainer.strategy.broadcast(where)
        self.stored = trainer.strategy.broadcast(self.stored)
        if where == final:  # durable in the store: the local copy is not needed any more
            trainer.strategy.barrier("srifty-sharded-uploaded")
            if trainer.local_rank == 0:  # every node's copy (its own disk)
                shutil.rmtree(local, ignore_errors=True)
                with contextlib.suppress(OSError):
                    os.remove(local + DIGEST_SUFFIX)
        return where

    def _publish_local(self, trainer: pl.Trainer, final: str) -> dict[str, str]:
        """Save into ``final + ".partial"``, hash (each rank its own files), write the manifest, rename; return the
        digests (complete on rank 0)."""
        import torch.distributed as dist

        partial = final + ".partial"
        if trainer.local_rank == 0:  # a save cut short earlier (maybe on another world size) leaves stale shards
            shutil.rmtree(partial, ignore_errors=True)  # on every node: each has its own disk (or shares this one)
        trainer.strategy.barrier("srifty-sharded-clean")
        trainer.save_checkpoint(partial, weights_only=False)
        trainer.strategy.barrier("srifty-preempt-save")
        fs = filesystem(partial)
        mine = {rel: sha256_of(fs, os.path.join(partial, rel)) for rel in owned_files(partial, trainer.global_rank)}
        gathered: list[Any] = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        digests = {rel: h for part in gathered for rel, h in (part or {}).items()}
        if trainer.is_global_zero:
            write_manifest(fs, final, digests)  # before the rename: a published directory always has it
            _into_place(partial, final)
        trainer.strategy.barrier("srifty-preempt-renamed")
        if trainer.local_rank == 0 and not trainer.is_global_zero and os.path.isdir(partial):
            _into_place(partial, final)  # another node's own disk: its ranks' shards (on a shared disk, none left)
        trainer.strategy.barrier("srifty-node-renamed")
        return digests

    def _remote(self, trainer: pl.Trainer, final: str, deadline_s: float | None) -> str:
        started = time.monotonic()
        local = os.path.join(self.local_fallback, final.rsplit("/", 1)[-1])
        os.makedirs(self.local_fallback, exist_ok=True)
        if not trainer.strategy.broadcast(room_for(trainer, self.local_fallback) if trainer.is_global_zero else True):
            return self._streamed(trainer, final)
        trainer.save_checkpoint(local + ".partial", weights_only=False)
        trainer.strategy.barrier("srifty-preempt-save")
        where = final
        if trainer.is_global_zero:
            local_fs = filesystem(local)
            digest = sha256_of(local_fs, local + ".partial")
            write_digest(local_fs, local, digest)
            os.replace(local + ".partial", local)

            def upload() -> None:
                fs = filesystem(final)
                write_digest(fs, final, digest)  # first: the checkpoint is never visible without it
                try:
                    store.put_file(fs, local, final)
                except BaseException:
                    # best effort: a digest left without its checkpoint would fail an older one of the same name
                    with contextlib.suppress(Exception):
                        fs.rm(final + DIGEST_SUFFIX)
                    raise

            budget = None if deadline_s is None else deadline_s - (time.monotonic() - started)
            error = within(budget, upload, self._interrupt)
            if error is None:
                with contextlib.suppress(OSError):
                    os.remove(local)
                    os.remove(local + DIGEST_SUFFIX)
            else:
                where = local
                self.stored = f"local {socket.gethostname()}:{local}"
                log.error(
                    "SpotPreemption: the checkpoint did not reach %s (%s); it is kept on this machine's disk at %s, "
                    "and the next fleet resumes from the newest checkpoint that did.",
                    final,
                    error,
                    local,
                )
        where = trainer.strategy.broadcast(where)
        self.stored = trainer.strategy.broadcast(self.stored)
        return where

    def _streamed(self, trainer: pl.Trainer, final: str) -> str:
        """Local disk has no room for the checkpoint: Lightning writes it into the store directly (one object, whole or
        absent on S3), and rank 0 reads it back for its digest. Not bounded by a deadline, and no local copy if the
        store fails: the second failure of two."""
        log.warning(
            "SpotPreemption: %s has no room for the checkpoint (about %.1f GB): writing it to %s directly",
            self.local_fallback,
            checkpoint_bytes(trainer) / 1e9,
            final,
        )
        trainer.save_checkpoint(final, weights_only=False)
        if trainer.is_global_zero:
            fs = filesystem(final)
            write_digest(fs, final, sha256_of(fs, final))
        trainer.strategy.barrier("srifty-preempt-streamed")
        return final

    def write_record(self, record: Any, deadline_s: float) -> None:
        """The status record, in the checkpoint folder within the deadline; else on local disk, and said loudly."""
        error = within(deadline_s, lambda: protocol.write_record(self.dirpath, record))
        if error is None:
            return
        local = protocol.write_record(self.local_fallback, record)
        log.error(
            "SpotPreemption: %s could not be written to %s within %.0f s (%s); written to %s instead.",
            type(record).__name__,
            self.dirpath,
            deadline_s,
            error,
            local,
        )

    def prune(self, trainer: pl.Trainer) -> None:
        """Keep the newest ``keep`` periodic checkpoints in the store and, apart, the newest ``keep`` of those an
        upload left on local disk: a checkpoint kept locally in an outage never costs the store one of its durable
        ones (the local ones die with the instance). A removal that fails is said and tried again at the next prune;
        it never stops the training.

        Global rank 0 removes from the store; the local rank 0 of every node removes the node's own local copies (a
        sharded one is on every node's disk)."""
        if trainer.local_rank != 0:
            return
        periodic = [p for p in self.checkpoints if "/periodic-step=" in p]
        stored = [p for p in periodic if p.startswith(self.dirpath + "/")] if trainer.is_global_zero else []
        local = [p for p in periodic if not p.startswith(self.dirpath + "/")]
        for old in stored[: -self.keep] + local[: -self.keep]:
            try:
                rm_checkpoint(filesystem(old), old)  # a file or a sharded directory, with its digest
            except Exception as exc:  # noqa: BLE001 - the store may be out: keep it listed, prune it later
                log.warning("SpotPreemption: could not remove the old checkpoint %s (%s); tried again later", old, exc)
                continue
            self.checkpoints.remove(old)


def _into_place(partial: str, final: str) -> None:
    """Rename a saved directory into place, over an older one of the same name."""
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.replace(partial, final)


def default_local_fallback(dirpath: str) -> str:
    """``$TMPDIR/srifty-checkpoints/<12 hex digits of the folder's sha256>``: one per checkpoint folder, so that two
    jobs on one machine (a sweep) never hash or remove each other's files."""
    return os.path.join(tempfile.gettempdir(), "srifty-checkpoints", hashlib.sha256(dirpath.encode()).hexdigest()[:12])


def checkpoint_bytes(trainer: pl.Trainer) -> int:
    """About what a full checkpoint of this run takes: its weights and buffers and the optimizers' state tensors.
    Read from this rank's tensors, never ``state_dict()``, which under FSDP is a collective (rank 0 alone asked it
    and waited for good: a review); a strategy that shards them holds a world size'th here."""
    import torch

    module = trainer.lightning_module
    tensors = [*module.parameters(), *module.buffers()]
    for optimizer in trainer.optimizers:
        tensors += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    size = sum(t.numel() * t.element_size() for t in tensors)
    shards = any(c.__name__ == "FSDPStrategy" for c in type(trainer.strategy).__mro__)  # Lightning's and Fabric's
    return size * int(getattr(trainer, "world_size", 1) or 1) if shards else size


def room_for(trainer: pl.Trainer, folder: str) -> bool:
    """Whether ``folder``'s disk can take the checkpoint with a margin (1.2x its estimate, and 1 GB kept free)."""
    return shutil.disk_usage(folder).free > 1.2 * checkpoint_bytes(trainer) + 2**30


def check_store(dirpath: str, seconds: float) -> None:
    """Refuse a checkpoint folder in an object store whose bucket does not exist, before the first step (issue #36
    L8: outside ``srifty launch``, which checks it itself, it was found at the first save, after that much training).

    One listing of the folder itself (what an instance role's policy grants: ListBucket under the run's prefix, which
    a HeadBucket would not be), bounded by ``seconds``. Only the store's own answer that the bucket does not exist is
    an error; a store that does not answer in time, or refuses a listing, is a warning (the saves will say more)."""
    if not store.is_remote(dirpath):
        return
    missing: list[str] = []

    def look() -> None:
        fs = filesystem(dirpath)
        try:
            fs.ls(dirpath, detail=False, refresh=True)
        except FileNotFoundError as exc:  # an empty folder (a first start) too: only the bucket's absence counts
            cause: BaseException | None = exc
            while cause is not None:
                text = f"{getattr(cause, 'response', {}).get('Error', {}).get('Code', '')} {cause}"
                if "NoSuchBucket" in text or "bucket does not exist" in text:
                    missing.append(str(cause))
                    return
                cause = cause.__cause__ or cause.__context__
        except PermissionError:
            pass  # the policy lets the run write its prefix, not list what is above it (s3fs looks there too)
        finally:
            fs.invalidate_cache(dirpath)  # no listing of now may be served to a later look for checkpoints

    failed = within(max(1.0, min(seconds, 60.0)), look)
    if missing:
        bucket = dirpath.split("://", 1)[1].split("/", 1)[0]
        raise ConfigError(
            f"SpotPreemption: the checkpoint folder {dirpath!r} is in a bucket that does not exist ({bucket!r}): no "
            "checkpoint could be saved. Create the bucket (or give dirpath= a folder in one that exists; under "
            "`srifty launch` or a srifty fleet the module's bucket is passed for you).",
            parameter="dirpath",
            value=dirpath,
        )
    if failed:
        log.warning("SpotPreemption: the checkpoint folder %s could not be checked (%s)", dirpath, failed)


def within(seconds: float | None, work: Callable[[], object], interrupt: threading.Event | None = None) -> str | None:
    """Run ``work`` in a daemon thread for at most ``seconds`` (None: as long as it takes), and no longer than until
    ``interrupt`` is set (a notice or SIGTERM on this rank: the leave comes first): None when it finished, else what
    went wrong, with how long it was given (its error, the time running out, or the interruption: the thread is
    left behind; a finished upload is still a sound checkpoint, its digest went first)."""
    if seconds is not None and seconds <= 0:  # no time left: not started (a thread would go on writing meanwhile)
        return "no time left before the deadline"
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            failure.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, name="srifty-deadline", daemon=True)
    thread.start()
    while thread.is_alive():
        left = None if seconds is None else seconds - (time.monotonic() - started)
        if left is not None and left <= 0:
            return f"no answer within {_secs(seconds or 0.0)} s"
        if interrupt is not None and interrupt.is_set():
            return f"a notice came first, {_secs(time.monotonic() - started)} s into it"
        thread.join(0.25 if left is None else min(0.25, left))
    if failure:
        return f"gave up after {_secs(time.monotonic() - started)} s: {type(failure[0]).__name__}: {failure[0]}"
    return None


def _secs(seconds: float) -> str:
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}"
