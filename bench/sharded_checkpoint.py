"""Save and load time and size of a sharded (torch.distributed.checkpoint) checkpoint against a full one, 2 FSDP ranks.

    python bench/sharded_checkpoint.py [--blocks 8] [--width 1024] [--repeats 3] [--out bench/results/...json]

2 CPU processes (gloo), FSDP full shard with one unit per block, Adam after one step (so the checkpoint holds the
weights and both moments: 3 x the parameters), saved the way Lightning's FSDPStrategy does it:
- sharded (``state_dict_type="sharded"``): every rank writes its shards through ``torch.distributed.checkpoint``,
  rank 0 also Lightning's ``meta.pt``; load: every rank reads its part (resharded if the world size changed);
- full (``state_dict_type="full"``): the weights and the optimizer state are gathered to rank 0, which writes one
  ``torch.save`` file; load: every rank reads the whole file and keeps its shard.
Times are wall seconds on rank 0 from the first rank's start to the last rank's end (a barrier each side); the
medians of ``--repeats`` runs are written, with every run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, folder: str, results: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(args.width, 4 * args.width), nn.Linear(4 * args.width, args.width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    model = FullyShardedDataParallel(
        nn.Sequential(*(Block() for _ in range(args.blocks))),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        device_id=torch.device("cpu"),
        use_orig_params=True,
    )
    params = sum(p.numel() for p in model.parameters()) * world  # each rank holds 1/world
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, args.width)).sum().backward()
    optimizer.step()
    base = Path(folder)
    figures: dict[str, list[float]] = {
        k: [] for k in ("sharded_save_s", "sharded_load_s", "full_save_s", "full_load_s")
    }
    sizes: dict[str, int] = {}

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    def save_sharded(sharded: Path) -> None:
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            state = {
                "model": model.state_dict(),
                "optimizer_0": FullyShardedDataParallel.optim_state_dict(model, optimizer),
            }
            dcp.save(state, checkpoint_id=sharded)
        if rank == 0:
            torch.save({"global_step": 1, "epoch": 0}, sharded / "meta.pt")

    def load_sharded(sharded: Path) -> None:
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            state = {"model": model.state_dict()}
            dcp.load(state, checkpoint_id=sharded)
            model.load_state_dict(state["model"])
            osd = load_sharded_optimizer_state_dict(
                model_state_dict=state["model"],
                optimizer_key="optimizer_0",
                storage_reader=dcp.FileSystemReader(sharded),
            )
            optimizer.load_state_dict(
                FullyShardedDataParallel.optim_state_dict_to_load(model, optimizer, osd["optimizer_0"])
            )
        torch.load(sharded / "meta.pt", weights_only=True)

    def save_full(full: Path) -> None:
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)  # on CPU already (True segfaults there)
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            state = {
                "state_dict": model.state_dict(),
                "optimizer_states": [FullyShardedDataParallel.optim_state_dict(model, optimizer)],
            }
        if rank == 0:
            torch.save(state | {"global_step": 1, "epoch": 0}, full)

    def load_full(full: Path) -> None:
        state = torch.load(full, map_location="cpu", weights_only=True, mmap=True)
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            model.load_state_dict(state["state_dict"])
            optimizer.load_state_dict(
                FullyShardedDataParallel.optim_state_dict_to_load(model, optimizer, state["optimizer_states"][0])
            )

    for repeat in range(args.repeats):
        sharded, full = base / f"sharded-{repeat}", base / f"full-{repeat}.ckpt"
        figures["sharded_save_s"].append(timed(partial(save_sharded, sharded)))
        figures["full_save_s"].append(timed(partial(save_full, full)))
        figures["sharded_load_s"].append(timed(partial(load_sharded, sharded)))
        figures["full_load_s"].append(timed(partial(load_full, full)))
        if rank == 0:
            sizes = {"sharded_bytes": _size(sharded), "full_bytes": _size(full)}
            shutil.rmtree(sharded)
            full.unlink()
        dist.barrier()
    if rank == 0:
        medians = {k: round(statistics.median(v), 3) for k, v in figures.items()}
        Path(results).write_text(json.dumps({"parameters": params, **sizes, **medians, "runs": figures}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "sharded_checkpoint.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import socket

    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="srifty-ckpt-bench-")
    results = os.path.join(folder, "results.json")
    try:
        mp.spawn(_worker, args=(2, port, args, folder, results), nprocs=2, join=True)
        figures = json.loads(Path(results).read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures |= {
        "ranks": 2,
        "blocks": args.blocks,
        "width": args.width,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "disk": "local disk of the bench machine (page cache warm)",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
