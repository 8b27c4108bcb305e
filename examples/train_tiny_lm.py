"""Profile a small causal transformer LM on synthetic Markov-chain tokens (no download) with SriftyCallback.

python examples/train_tiny_lm.py [--precision bf16-mixed] [--accelerator cuda]
"""

import argparse

import lightning.pytorch as pl

from lightning_srifty import SriftyCallback
from lightning_srifty.demo.data import TokensDataModule
from lightning_srifty.demo.models import TinyLM

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--accelerator", default="auto")
    args = parser.parse_args()

    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_steps=260,
        accelerator=args.accelerator,
        precision=args.precision,
        callbacks=[SriftyCallback(output="srifty/tiny-lm-profile.json")],
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(TinyLM(d_model=128, n_layers=2), datamodule=TokensDataModule(batch_size=32))
