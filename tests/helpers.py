"""Small real models and data for fast Lightning runs in tests."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class TinyModel(pl.LightningModule):
    """A two-layer MLP regression; optional per-rank sleep in training_step to make a straggler."""

    def __init__(self, hidden: int = 32, sleep_on_rank: int | None = None, sleep_s: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.sleep_on_rank, self.sleep_s = sleep_on_rank, sleep_s

    def training_step(self, batch, batch_idx):
        if self.sleep_on_rank is not None and self.global_rank == self.sleep_on_rank:
            time.sleep(self.sleep_s)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def regression_data(n: int = 512, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class TwoOptimizerModel(pl.LightningModule):
    """A manual loop stepping two optimizers a batch, as a GAN's generator and discriminator: Lightning's global_step
    and max_steps count 2 a batch."""

    def __init__(self, second_every: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.first, self.second = nn.Linear(16, 8), nn.Linear(8, 1)
        self.second_every = second_every  # a WGAN's generator: stepped every n-th batch

    def training_step(self, batch, batch_idx):
        x, y = batch
        one, two = self.optimizers()
        for opt in (one, two) if batch_idx % self.second_every == 0 else (one,):
            opt.zero_grad()
            self.manual_backward(nn.functional.mse_loss(self.second(self.first(x)), y))
            opt.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.first.parameters(), lr=0.01), torch.optim.SGD(self.second.parameters(), lr=0.01)


def loader(n: int = 512, batch_size: int = 8) -> DataLoader:
    return DataLoader(regression_data(n), batch_size=batch_size, shuffle=False)


class DictDataset(Dataset):
    """Batches as dicts whose first entry is not a tensor: the batch size must come from batch_size_fn."""

    def __init__(self, n: int = 256) -> None:
        self.data = regression_data(n)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        x, y = self.data[i]
        return {"meta": "sample", "x": x, "y": y}


class DictModel(TinyModel):
    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch["x"]), batch["y"])


def trainer(callbacks: list, max_steps: int, **kwargs) -> pl.Trainer:
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    defaults.update(kwargs)
    return pl.Trainer(max_steps=max_steps, callbacks=callbacks, **defaults)
