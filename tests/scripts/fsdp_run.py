"""A small job whose strategy comes from the plan (``plan_strategy()``), profiled by SriftyCallback; CPU, gloo.

    python tests/scripts/fsdp_run.py OUT [--max-steps N]        # under srifty launch or torchrun

Every rank writes ``OUT/strategy-rank<r>.json``: the strategy it got, its sharding, the wrapped and checkpointed
block classes; rank 0 writes the profile to ``OUT/profile.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback, plan_strategy
from lightning_srifty.profiling.sharded import checkpointed, fsdp_units

WIDTH = 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(3)])
        self.head = nn.Linear(WIDTH, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.head(self.blocks(x)), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--max-steps", type=int, default=8)
    args = parser.parse_args()
    out = Path(args.out)
    torch.manual_seed(0)
    model = Stack()
    strategy = plan_strategy("auto", model=model)
    data = TensorDataset(torch.randn(512, WIDTH), torch.randn(512, 1))
    trainer = pl.Trainer(
        accelerator="cpu",  # no devices=: plan_strategy() names one CPU device per local process, as a user's script
        strategy=strategy,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            SriftyCallback(
                warmup_steps=2,
                profile_steps=args.max_steps - 3,
                output=out / "profile.json",
                recommend=False,
                capture_ops=False,
                verbose=False,  # the checkpoint cost is measured: a sharded directory under FSDP
            )
        ],
    )
    trainer.fit(model, DataLoader(data, batch_size=8))
    wrapped = trainer.strategy.model
    got = {
        "strategy": type(trainer.strategy).__name__,
        "sharding": str(getattr(trainer.strategy, "sharding_strategy", "")),
        "world_size": trainer.world_size,
        "units": [type(u.module).__name__ for u in fsdp_units(wrapped)],
        "checkpointed": [type(b).__name__ for b in checkpointed(wrapped)],
        "batch_sizes": getattr(trainer.strategy, "batch_sizes", None),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"strategy-rank{trainer.global_rank}.json").write_text(json.dumps(got))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # let gloo's threads stop before the interpreter exits


if __name__ == "__main__":
    main()
