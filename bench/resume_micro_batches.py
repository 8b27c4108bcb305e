"""A run moved mid-epoch to a fleet of another micro-batch (the same global batch): what Lightning's epoch does with
and without ExactResume restating its batch count in the new fleet's micro-batches (the sixty-sixth session's trial:
2 GPUs of 32 -> 1 GPU of 32 x 2 accumulated lost its epoch's validation, and the move back a step).

One process stands for each fleet: what differs between them is the micro-batch over every rank (8 = 2 x 4 or 1 x 8,
against 4 x 2 accumulated, 2 x 4), which is all the count depends on. 96 samples, a global batch of 8 (12 steps an
epoch), 3 epochs, validated at each epoch's end; the move at a step's end, as a spot notice's checkpoint.

    python bench/resume_micro_batches.py            # a table, before (the count as restored) and after
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from unittest import mock

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty.strategies import hetero
from lightning_srifty.strategies.hetero import ExactResume, GlobalBatchSampler

CASES = [(([8], 1), ([4], 2), 5), (([4], 2), ([8], 1), 5), (([4], 2), ([8], 1), 17), (([8], 1), ([2], 4), 30)]


class Left(Exception):
    pass


def leg(folder: Path, seen: dict, sizes: list[int], accumulate: int, stop_at: int | None = None, resume=None):
    """One leg (also tests/job/test_hetero.py's): ``sizes`` per rank (one process: one rank), ``accumulate``
    micro-batches a step; ``stop_at``: a checkpoint at that step's end (``folder/notice.ckpt``), as a spot notice's,
    then the leg ends; ``resume``: from it. ``seen`` gets each step's sample ids (``ids``), the steps validation ran
    at (``validated``) and each epoch's last step (``epoch_steps``)."""
    x = torch.randn(96, 3, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(torch.arange(96), x, x.sum(1, keepdim=True))

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            ids, xb, yb = batch
            seen["ids"].setdefault(self.global_step, []).extend(int(i) for i in ids)
            return nn.functional.mse_loss(self.net(xb), yb)

        def validation_step(self, batch, batch_idx):
            return None

        def on_validation_end(self) -> None:
            seen["validated"].append(self.global_step)

        def on_train_epoch_end(self) -> None:
            seen.setdefault("epoch_steps", {})[self.current_epoch] = self.global_step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class StopAt(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if stop_at is not None and trainer.global_step == stop_at and not trainer.fit_loop._should_accumulate():
                trainer.save_checkpoint(folder / "notice.ckpt")
                raise Left

    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=3, accumulate_grad_batches=accumulate, use_distributed_sampler=False,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[ExactResume(), StopAt()],
    )  # fmt: skip
    sampler = GlobalBatchSampler(96, sizes, 0, seed=5, accumulate_grad_batches=accumulate)
    loader, val = DataLoader(data, batch_sampler=sampler), DataLoader(data, batch_size=96)
    with contextlib.suppress(Left):  # the first leg ends at its notice's checkpoint
        trainer.fit(Module(), loader, val, ckpt_path=resume, weights_only=False)


def moved(before, after, stop_at: int, restate: bool) -> dict:
    seen: dict = {"ids": {}, "validated": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        leg(folder, seen, *before, stop_at=stop_at)
        keep = contextlib.nullcontext() if restate else mock.patch.object(hetero, "_count_in_this_fleets_batches",
                                                                           lambda *a: None)  # fmt: skip
        with keep:
            leg(folder, seen, *after, resume=folder / "notice.ckpt")
    return seen


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    pl.seed_everything(0, verbose=False)
    print("| move (micro-batch x accumulation, at step) | count | steps | half-batch steps | steps' samples "
          "as uninterrupted | validations (of 3) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|")
    for before, after, stop_at in CASES:
        ref: dict = {"ids": {}, "validated": []}
        with tempfile.TemporaryDirectory() as tmp:
            leg(Path(tmp), ref, *after)
        for restate in (False, True):
            got = moved(before, after, stop_at, restate)
            same = sum(sorted(got["ids"].get(k, [])) == sorted(v) for k, v in ref["ids"].items())
            short = sum(len(v) < 8 for v in got["ids"].values())
            name = f"{before[0][0]}x{before[1]} -> {after[0][0]}x{after[1]} at {stop_at}"
            count = "restated (ExactResume)" if restate else "as restored (before)"
            print(f"| {name} | {count} | {len(got['ids'])} | {short} | {same} of {len(ref['ids'])} | "
                  f"{len(got['validated'])} |")  # fmt: skip


if __name__ == "__main__":
    main()
