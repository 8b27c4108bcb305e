"""What one checkpoint costs, measured inside the profile window without endangering the run: the state's size is
estimated first, and only what fits half the free disk (the save) and half the available host memory (the read-back)
is measured; what was skipped is said in the profile's notes."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, cast

import lightning.pytorch as pl
import torch

CHECKPOINT_SHARE = 0.5  # the measurement may use at most half of the free disk, and read back into half the memory


def measure_checkpoint(trainer: pl.Trainer, notes: list[str], owner: str = "SriftyCallback") -> dict[str, Any] | None:
    """Save one full checkpoint to local disk (every rank takes part) and read it back on rank 0, as far as the
    host allows; what was skipped goes in ``notes``. Never raises.

    On a fleet of several nodes each has its own disk: a sharded checkpoint's shards are then on the disks of the
    nodes whose ranks wrote them. Its size is every rank's files, summed; rank 0 reads it back only where it sees every
    shard (one node, or a shared disk); each node removes its own copy."""
    # what the checkpoint will hold, before writing a byte of it: a 7B model with Adam is ~84 GB, which must
    # neither fill the disk nor be read back into a host of 16 GiB (an OOM kill nobody can catch)
    need = state_bytes(trainer)
    disk_free = shutil.disk_usage(tempfile.gettempdir()).free
    plan = cast(  # rank 0's budget, on every rank
        dict[str, Any],
        trainer.strategy.broadcast(
            checkpoint_budget(need, disk_free, available_memory_bytes(), owner) if trainer.is_global_zero else None
        ),
    )
    if plan["skip"]:
        notes.append(plan["skip"])
        return None
    folder = tempfile.mkdtemp(prefix="srifty-ckpt-") if trainer.is_global_zero else ""
    try:
        folder = trainer.strategy.broadcast(folder)  # one path on every node (Lightning saves under rank 0's)
        path = os.path.join(folder, "measure.ckpt")
        start = time.perf_counter()
        trainer.save_checkpoint(path, weights_only=False)  # the full checkpoint a resume needs (said: no log line)
        trainer.strategy.barrier("srifty-measure-checkpoint")
        save_s = time.perf_counter() - start
        files = _files_by_rank(trainer, path)  # rank 0's: what every rank wrote, and how large
        result = None
        if trainer.is_global_zero:
            try:
                result = _read_back(path, plan, files, notes)
            except Exception as exc:  # noqa: BLE001 - the other ranks wait at the barrier below
                notes.append(f"checkpoint cost not measured: {type(exc).__name__}: {exc}")
        trainer.strategy.barrier("srifty-measure-read")  # a shared disk: nobody removes what rank 0 still reads
        if result is None:
            return None
        return {"save_s": save_s, **result}
    except Exception as exc:  # noqa: BLE001 - a measurement, never a reason to stop training
        notes.append(f"checkpoint cost not measured: {type(exc).__name__}: {exc}")
        return None
    finally:
        if trainer.local_rank == 0 and folder:  # every node's copy (its own disk)
            shutil.rmtree(folder, ignore_errors=True)


def _files_by_rank(trainer: pl.Trainer, path: str) -> dict[int, dict[str, int]]:
    """Each rank's files of the saved checkpoint (a directory: the shards it wrote; a file: rank 0's) and their
    sizes, gathered on every rank."""
    from lightning_srifty.store import owned_files

    if os.path.isdir(path):
        mine = {rel: os.path.getsize(os.path.join(path, rel)) for rel in owned_files(path, trainer.global_rank)}
    else:
        mine = {os.path.basename(path): os.path.getsize(path)} if trainer.is_global_zero else {}
    gathered: list[Any] = [mine]
    if torch.distributed.is_available() and torch.distributed.is_initialized() and trainer.world_size > 1:
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, mine)
    return {rank: part or {} for rank, part in enumerate(gathered)}


def _read_back(path: str, plan: dict[str, Any], files: dict[int, dict[str, int]], notes: list[str]) -> dict[str, Any]:
    """Rank 0: the checkpoint's size and, where the host allows and rank 0 sees every file, its read-back time."""
    sharded = os.path.isdir(path)  # FSDP's sharded state: a torch.distributed.checkpoint directory
    size = sum(n for part in files.values() for n in part.values())
    where = "local disk, sharded directory read back by one process" if sharded else "local disk"
    named = [os.path.join(path, rel) if sharded else path for part in files.values() for rel in part]
    missing = [name for name in named if not os.path.exists(name)]
    load_s = None
    if not plan["load"]:
        notes.append(plan["why_no_load"])
    elif missing:
        where = "local disks of the nodes, sharded directory (not read back)"
        notes.append(
            f"checkpoint read-back not measured: {len(missing)} of its {sum(map(len, files.values()))} files are on "
            "other nodes' disks (a resume reads them from the checkpoint store)"
        )
    else:
        start = time.perf_counter()
        if sharded:  # every shard read back into one process, as a resume on another world size reads them
            from pathlib import Path

            from lightning.fabric.utilities.load import _load_distributed_checkpoint

            _load_distributed_checkpoint(Path(path))
        else:
            torch.load(path, map_location="cpu", weights_only=True)
        load_s = time.perf_counter() - start
    return {"load_s": load_s, "bytes": size, "where": where}


def state_bytes(trainer: pl.Trainer) -> int:
    """Bytes of the tensors a full checkpoint holds: the module's state dict and the optimizers' state."""

    total = sum(
        t.numel() * t.element_size() for t in trainer.lightning_module.state_dict().values() if torch.is_tensor(t)
    )
    for optimizer in trainer.optimizers:
        for state in optimizer.state.values():
            total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
    return int(total)


def available_memory_bytes() -> int | None:
    """The host's available memory (Linux MemAvailable), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def checkpoint_budget(
    need: int, disk_free: int, memory_free: int | None, owner: str = "SriftyCallback"
) -> dict[str, Any]:
    """Whether the checkpoint measurement may save (``skip`` is the reason when not) and read back (``load``)."""
    gib = 2**30
    if need > CHECKPOINT_SHARE * disk_free:
        return {
            "skip": f"checkpoint cost not measured: the state is ~{need / gib:.1f} GiB and the temporary folder has "
            f"{disk_free / gib:.1f} GiB free (the measurement uses at most half); set TMPDIR to a larger disk or "
            f"{owner}(measure_checkpoint=False)",
            "load": False,
        }
    if memory_free is not None and need > CHECKPOINT_SHARE * memory_free:
        return {
            "skip": None,
            "load": False,
            "why_no_load": f"checkpoint read-back not measured: ~{need / gib:.1f} GiB would not fit half of the "
            f"{memory_free / gib:.1f} GiB of available host memory (the save was measured)",
        }
    return {"skip": None, "load": True}
