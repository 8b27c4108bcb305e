"""The process group's end: destroyed when the interpreter exits, whatever the backend (srifty_ddp, srifty_fsdp, and
a Lightning Fabric loop under FabricPreemption). torch is imported when it is called, not with the module."""

from __future__ import annotations

import atexit

_DESTROY_REGISTERED = False


def destroy_at_exit() -> None:
    """Destroy the process group when the interpreter exits, whatever its backend (once per process).

    Lightning does it for NCCL only. Left to the interpreter's exit, gloo's threads outlive the Python comm hooks and
    FSDP's state, and a finished run sometimes aborted ("terminate called without an active exception",
    SIGABRT) or hung after training had ended well (seen in this project's 2-process CPU tests under load; a Fabric
    FSDP leg, which registered none, in stop 96's clean clone)."""
    global _DESTROY_REGISTERED
    import torch

    dist = torch.distributed
    if _DESTROY_REGISTERED or not (dist.is_available() and dist.is_initialized()) or dist.get_backend() == "nccl":
        return
    atexit.register(_destroy_process_group)
    _DESTROY_REGISTERED = True


def _destroy_process_group() -> None:
    import torch

    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
