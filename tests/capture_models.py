"""Models and batch builders that ``srifty capture`` imports in the tests (tests/ is on sys.path)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn


class TinyLM(pl.LightningModule):
    """A one-block transformer language model trained with AdamW."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, batch_first=True, dropout=0.0)
        self.head = nn.Linear(dim, vocab)

    def training_step(self, batch, batch_idx):
        tokens = batch["tokens"]
        logits = self.head(self.block(self.emb(tokens[:, :-1])))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def make_batch(batch_size: int) -> dict[str, torch.Tensor]:
    return {"tokens": torch.randint(0, 64, (batch_size, 17))}


def empty_batch(batch_size: int) -> dict[str, torch.Tensor]:
    return {"tokens": torch.zeros(batch_size, 0, dtype=torch.long)}


def complex_batch(batch_size: int) -> torch.Tensor:
    return torch.zeros(batch_size, 4, dtype=torch.complex64)


def huge_batch(batch_size: int) -> torch.Tensor:
    return torch.zeros(batch_size, 2**40)


def broken_batch(batch_size: int) -> None:
    raise ValueError("no data here")


class NotAModule:
    pass
