"""Rendezvous for the test scripts' spawned gloo workers without a port race or a lock file.

The parent process holds a TCPStore on a port the kernel picks (port 0), so no other process can take it between
choosing and binding; the workers join it as clients. (A ``file://`` store needs ``flock``, which some CI
filesystems do not honour, and a port picked then freed can be taken by anything else running on the machine.)
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch.distributed as dist

TIMEOUT = timedelta(seconds=90)


def master_store() -> dist.TCPStore:
    """The parent's store: keep it referenced until the workers are joined; its ``port`` goes to them."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def join(rank: int, port: int, world_size: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=TIMEOUT)


def leave() -> None:
    """Exit the worker without tearing DDP down: with a Python comm hook, torch's gloo process group can deadlock in
    its destructor (the main thread holds the GIL joining the gloo run-loop thread, which waits for the GIL to free
    the hook's future callback; seen in CI with torch 2.13). Call it once the result is written."""
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)
