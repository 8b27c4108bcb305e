"""Unequal per-rank batches give the global-batch gradient, on 2 real gloo processes: DDP through the weighted
hook, FSDP (``--fsdp``, full shard) through the weighted loss of ``SriftyFSDPStrategy``.

python tests/scripts/hetero_grad_check.py RESULT [--fsdp]   (writes 'max_abs_diff=<x> max_abs_grad=<y>')
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rendezvous
import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from lightning_srifty.strategies.fsdp import loss_weight, scale_loss
from lightning_srifty.strategies.hetero import rank_weights, weighted_hook

SIZES = [24, 8]  # a fast GPU's share and a slow one's


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3)).double()


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(sum(SIZES), 16, generator=g).double(), torch.randn(sum(SIZES), 3, generator=g).double()


def worker(rank: int, port: int, result: str, fsdp: bool) -> None:
    rendezvous.join(rank, port, world_size=2)
    x, y = data()
    lo = sum(SIZES[:rank])
    if fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = FullyShardedDataParallel(model(), device_id=torch.device("cpu"), use_orig_params=True)
        loss = torch.nn.functional.mse_loss(wrapped(x[lo : lo + SIZES[rank]]), y[lo : lo + SIZES[rank]])
        scale_loss(loss, loss_weight(SIZES, rank)).backward()
        with FullyShardedDataParallel.summon_full_params(wrapped, with_grads=True):
            grads = [p.grad.clone() for p in wrapped.parameters()]
    else:
        ddp = DDP(model(), bucket_cap_mb=0.01)
        ddp.register_comm_hook(None, weighted_hook(rank_weights(SIZES)[rank], default_hooks.allreduce_hook))
        torch.nn.functional.mse_loss(ddp(x[lo : lo + SIZES[rank]]), y[lo : lo + SIZES[rank]]).backward()
        grads = [p.grad for p in ddp.parameters()]
    if rank == 0:
        full = model()
        torch.nn.functional.mse_loss(full(x), y).backward()
        diff = max((a - b.grad).abs().max().item() for a, b in zip(grads, full.parameters()))
        scale = max(b.grad.abs().max().item() for b in full.parameters())
        Path(result).write_text(f"max_abs_diff={diff} max_abs_grad={scale}\n")
    rendezvous.leave()


if __name__ == "__main__":
    store = rendezvous.master_store()
    mp.spawn(worker, args=(store.port, sys.argv[1], "--fsdp" in sys.argv[2:]), nprocs=2)
    print(Path(sys.argv[1]).read_text().strip())
