"""Unequal per-rank batches through the weighted hook give the global-batch gradient, on 2 real gloo processes.

python tests/scripts/hetero_grad_check.py RESULT   (writes 'max_abs_diff=<x> max_abs_grad=<y>')
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rendezvous
import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from lightning_srifty.ddp.hetero import rank_weights, weighted_hook

SIZES = [24, 8]  # a fast GPU's share and a slow one's


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3)).double()


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(sum(SIZES), 16, generator=g).double(), torch.randn(sum(SIZES), 3, generator=g).double()


def worker(rank: int, port: int, result: str) -> None:
    rendezvous.join(rank, port, world_size=2)
    ddp = DDP(model(), bucket_cap_mb=0.01)
    ddp.register_comm_hook(None, weighted_hook(rank_weights(SIZES)[rank], default_hooks.allreduce_hook))
    x, y = data()
    lo = sum(SIZES[:rank])
    torch.nn.functional.mse_loss(ddp(x[lo : lo + SIZES[rank]]), y[lo : lo + SIZES[rank]]).backward()
    if rank == 0:
        full = model()
        torch.nn.functional.mse_loss(full(x), y).backward()
        diff = max((a.grad - b.grad).abs().max().item() for a, b in zip(ddp.parameters(), full.parameters()))
        scale = max(b.grad.abs().max().item() for b in full.parameters())
        Path(result).write_text(f"max_abs_diff={diff} max_abs_grad={scale}\n")
    rendezvous.leave()


if __name__ == "__main__":
    store = rendezvous.master_store()
    mp.spawn(worker, args=(store.port, sys.argv[1]), nprocs=2)
    print(Path(sys.argv[1]).read_text().strip())
