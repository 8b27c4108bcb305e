"""One leg of a moved sharded run: FSDP (sharded checkpoints) + GlobalBatchSampler + ExactResume + SpotPreemption.

python tests/scripts/fsdp_migrate_run.py OUT --batch-sizes 6,6 --max-steps 12 [--strategy fsdp|single|ddp]
    [--sigterm-at K] [--resume-from CKPT_DIR] [--ckpt-uri URI] [--profile] [--node-disk]

Under torchrun (``--nnodes 2 --nproc_per_node 1``: two nodes) each agent's processes are the devices and the sampler
takes the global rank.

A small model of repeated blocks (each its own FSDP unit), Adam. Every rank appends the sample ids of each step to
OUT/seen-rank<r>.txt ("epoch step id id ..."); rank 0 appends the full (gathered) parameters after each step to
OUT/params.txt; a resumed run saves what it restored (model and Adam state, with its own strategy: a directory
under FSDP) to OUT/at-start.ckpt before its first step. Checkpoints go to --ckpt-uri (default OUT/ckpt).
"""

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_srifty.migrate.checkpoints import consolidate, local_checkpoint
from lightning_srifty.migrate.preemption import SpotPreemption, find_checkpoint
from lightning_srifty.strategies.hetero import ExactResume, GlobalBatchSampler

N, D = 96, 8


class Indexed(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, D, generator=g)
        self.y = torch.sin(self.x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(N, 1, generator=g)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


class Block(nn.Module):
    """The repeated unit: FSDP wraps (and shards) each one on its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class Model(pl.LightningModule):
    def __init__(self, out: Path, blocks: int = 3, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.inp = nn.Linear(D, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        ids, x, y = batch
        with open(self.out / f"seen-rank{self.global_rank}.txt", "a") as f:
            f.write(f"{self.current_epoch} {self.global_step} " + " ".join(str(int(i)) for i in ids) + "\n")
        return nn.functional.mse_loss(self(x), y)

    def on_train_batch_end(self, *args) -> None:
        flat = full_parameters(self.trainer)
        if self.global_rank == 0:
            with open(self.out / "params.txt", "a") as f:
                f.write(f"{self.global_step} " + " ".join(f"{v:.9g}" for v in flat) + "\n")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def _fsdp_root(trainer: pl.Trainer):
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = trainer.strategy.model
    return model if isinstance(model, FullyShardedDataParallel) else None


def full_parameters(trainer: pl.Trainer) -> list[float]:
    """Every parameter, whole, in the module's order (a collective under FSDP: every rank calls it)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    module = trainer.lightning_module
    root = _fsdp_root(trainer)
    if root is None:
        return torch.cat([p.detach().flatten() for p in module.parameters()]).tolist()
    with FullyShardedDataParallel.summon_full_params(root, writeback=False):
        return torch.cat([p.detach().flatten() for p in module.parameters()]).tolist()


class Record(pl.Callback):
    """A resumed run saves what it restored (OUT/at-start.ckpt) before its first step; SIGTERM at a step."""

    def __init__(self, out: Path, sigterm_at: int | None) -> None:
        self.out, self.sigterm_at = out, sigterm_at

    def on_train_start(self, trainer, *args) -> None:
        if trainer.ckpt_path:  # what the resumed run holds, as its own strategy saves it (the optimizer included)
            trainer.save_checkpoint(str(self.out / "at-start.ckpt"))

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.sigterm_at is not None and trainer.global_step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)  # SpotPreemption (after this callback) saves at this step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--batch-sizes", default="6,6")
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--strategy", choices=("fsdp", "single", "ddp"), default="fsdp")
    p.add_argument("--sigterm-at", type=int)
    p.add_argument("--resume-from", help="a checkpoint folder: resume from the newest sound checkpoint in it")
    p.add_argument("--ckpt-uri", help="where this leg's checkpoints go (default OUT/ckpt)")
    p.add_argument("--every-s", type=float, help="periodic checkpoints this often (keep 2)")
    p.add_argument("--profile", action="store_true", help="SriftyCallback's window (1 + 3 steps) to OUT/profile.json")
    p.add_argument("--state-dict-type", choices=("sharded", "full"), default="sharded", help="FSDP's checkpoints")
    p.add_argument(
        "--node-disk",
        action="store_true",
        help="TMPDIR is the node's own disk: a resume downloads there; what is left is listed in OUT/disk-rank<r>.txt",
    )
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    # under torchrun (the two-node leg) each agent starts its own processes: the sampler takes the global rank
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    rank = int(os.environ["RANK"] if torchrun else os.environ.get("LOCAL_RANK", "0"))
    sampler = GlobalBatchSampler(N, sizes, rank, shuffle=True, seed=7)
    loader = DataLoader(Indexed(), batch_sampler=sampler)
    preemption = SpotPreemption(args.ckpt_uri or str(out / "ckpt"), exit_process=False, every_s=args.every_s, keep=2)
    callbacks = [ExactResume(), Record(out, args.sigterm_at), preemption]
    if args.profile:  # the profiler's defaults (the checkpoint measured) but a short window
        from lightning_srifty import SriftyCallback

        profiler = SriftyCallback(warmup_steps=1, profile_steps=3, output=str(out / "profile.json"), recommend=False)
        callbacks.append(profiler)
    if args.strategy == "fsdp":
        from lightning_srifty.strategies.fsdp import SriftyFSDPStrategy  # FSDP on CPU/gloo too, blocks by name

        strategy = SriftyFSDPStrategy(
            auto_wrap_policy=["Block"],
            state_dict_type=args.state_dict_type,
            process_group_backend="gloo",
            batch_sizes=sizes,
        )
    elif args.strategy == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend="gloo")
    else:
        strategy = "auto"
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]) if torchrun else len(sizes),
        strategy=strategy,
        max_steps=args.max_steps,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    ckpt = None
    if args.resume_from:
        found = find_checkpoint(args.resume_from)
        assert found is not None, f"no sound checkpoint in {args.resume_from}"
        cache = os.path.join(tempfile.gettempdir(), "download") if args.node_disk else str(out / "download")
        ckpt = local_checkpoint(found, cache)  # a remote directory: fetched and checked first
        if args.strategy != "fsdp" and os.path.isdir(ckpt):  # one device / DDP read files only
            ckpt = consolidate(ckpt, str(out / f"consolidated-rank{rank}.ckpt"))
    trainer.fit(Model(out), train_dataloaders=loader, ckpt_path=ckpt, weights_only=True)
    if preemption.preempted and trainer.is_global_zero:
        (out / "preempted.json").write_text(json.dumps({"step": trainer.global_step, "checkpoint": ckpt}))
    if args.node_disk and not args.resume_from:  # the node's disk is gone with its mount namespace: what it kept
        tmp = Path(tempfile.gettempdir())  # a checkpoint's copies, and the profiler's measured checkpoint
        left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if "step=" in p.name or "srifty-ckpt" in p.name)
        (out / f"disk-rank{trainer.global_rank}.txt").write_text("\n".join(left))
    print(f"srifty-leg: done rank {rank}", flush=True)  # tests/_support.py's DONE: everything above is written
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
