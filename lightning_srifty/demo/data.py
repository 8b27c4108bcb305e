"""Data that needs no download: scikit-learn's digits images and synthetic Markov-chain token sequences."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


class _LoadersMixin:
    """Shuffled training batches (last partial one dropped) and ordered validation batches."""

    train: TensorDataset
    val: TensorDataset
    batch_size: int
    num_workers: int

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
            drop_last=True,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size, num_workers=self.num_workers)


class DigitsDataModule(_LoadersMixin, pl.LightningDataModule):
    """The 1,797 8x8 handwritten digits bundled with scikit-learn, as 1x8x8 float images in [0, 1]."""

    def __init__(self, batch_size: int = 64, num_workers: int = 0, val_fraction: float = 0.15, seed: int = 0) -> None:
        super().__init__()
        self.batch_size, self.num_workers, self.val_fraction, self.seed = batch_size, num_workers, val_fraction, seed

    def setup(self, stage: str | None = None) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.seed))
        n_val = int(len(x) * self.val_fraction)
        self.val = TensorDataset(x[order[:n_val]], y[order[:n_val]])
        self.train = TensorDataset(x[order[n_val:]], y[order[n_val:]])


def markov_tokens(n_sequences: int, seq_len: int, vocab: int, branching: int = 4, seed: int = 0) -> torch.Tensor:
    """Sequences from a fixed random Markov chain in which each token has ``branching`` likely successors.

    A model that learns the chain reaches a loss near log(branching), so training visibly makes progress.
    """
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab, size=(vocab, branching))
    out = np.empty((n_sequences, seq_len + 1), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab, size=n_sequences)
    picks = rng.integers(0, branching, size=(n_sequences, seq_len))
    for t in range(seq_len):
        out[:, t + 1] = successors[out[:, t], picks[:, t]]
    return torch.from_numpy(out)


class TokensDataModule(_LoadersMixin, pl.LightningDataModule):
    """Synthetic next-token-prediction data: (input, target) pairs shifted by one token."""

    def __init__(
        self,
        batch_size: int = 32,
        seq_len: int = 64,
        vocab: int = 128,
        n_sequences: int = 4096,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.batch_size, self.seq_len, self.vocab = batch_size, seq_len, vocab
        self.n_sequences, self.num_workers, self.seed = n_sequences, num_workers, seed

    def setup(self, stage: str | None = None) -> None:
        tokens = markov_tokens(self.n_sequences, self.seq_len, self.vocab, seed=self.seed)
        n_val = self.n_sequences // 10
        self.val = TensorDataset(tokens[:n_val, :-1], tokens[:n_val, 1:])
        self.train = TensorDataset(tokens[n_val:, :-1], tokens[n_val:, 1:])
