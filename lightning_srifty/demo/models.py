"""Two small real models: a CNN classifier and a causal transformer language model."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn


class DigitsCNN(pl.LightningModule):
    """Two conv layers and an MLP head for 8x8 digit images."""

    def __init__(self, width: int = 32, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


class TinyLM(pl.LightningModule):
    """A small causal transformer LM (pre-norm encoder layers with a causal mask)."""

    mask: torch.Tensor  # the causal mask, a buffer (register_buffer in __init__)

    def __init__(
        self,
        vocab: int = 128,
        seq_len: int = 64,
        d_model: int = 128,
        n_layers: int = 2,
        n_heads: int = 4,
        lr: float = 3e-4,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:, :t]
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.lm_head(self.norm(h))

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])
