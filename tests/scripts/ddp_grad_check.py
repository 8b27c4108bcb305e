"""Gradients through the srifty timing hook equal plain DDP's, on 2 real gloo processes.

python tests/scripts/ddp_grad_check.py   (prints 'max_abs_diff=<x> buckets=<n> records=<m>')
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rendezvous
import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from lightning_srifty.comm import AllReduceTimer


def grads(rank: int, timed: bool) -> tuple[list[torch.Tensor], AllReduceTimer | None]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 8))
    ddp = DDP(model, bucket_cap_mb=0.1)
    timer = None
    if timed:
        timer = AllReduceTimer()
        state, hook = timer.wrap(default_hooks.allreduce_hook, None)
        ddp.register_comm_hook(state, hook)
        timer.start(timer.clock)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for step in range(3):
        if timer is not None:
            timer.step = step
        ddp.zero_grad()
        x = torch.randn(64, 32, generator=g)
        ddp(x).pow(2).mean().backward()
    return [p.grad.clone() for p in ddp.parameters()], timer


def worker(rank: int, port: int, result_file: str) -> None:
    rendezvous.join(rank, port, world_size=2)
    plain, _ = grads(rank, timed=False)
    timed, timer = grads(rank, timed=True)
    diff = max((a - b).abs().max().item() for a, b in zip(plain, timed))
    series = timer.resolve([0, 1, 2])
    if rank == 0:
        Path(result_file).write_text(
            f"max_abs_diff={diff} buckets={len(series.buckets)} steps={len(series.busy_s)} "
            f"bytes={series.bytes_per_step}\n"
        )
    rendezvous.leave()


if __name__ == "__main__":
    store = rendezvous.master_store()
    out = sys.argv[1]
    mp.spawn(worker, args=(store.port, out), nprocs=2, join=True)
    print(Path(out).read_text().strip())
