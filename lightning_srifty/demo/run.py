"""``srifty demo``: train a demo model with SriftyCallback and print the profile."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_srifty.demo.data import DigitsDataModule, TokensDataModule
from lightning_srifty.demo.models import DigitsCNN, TinyLM
from lightning_srifty.profiling.callback import SriftyCallback
from lightning_srifty.strategies import planned  # noqa: F401 - registers srifty_ddp, srifty_fsdp and srifty_auto
from predictor.ranking import Constraints

MODELS = ("cnn", "lm")


@dataclass
class DemoConfig:
    model: str = "cnn"
    max_steps: int | None = None
    warmup_steps: int = 20
    profile_steps: int = 200
    devices: int = 1
    num_nodes: int = 1
    accelerator: str = "auto"
    strategy: str = "auto"
    precision: str = "32-true"
    batch_size: int | None = None
    num_workers: int = 0
    output: str | None = "srifty/profile.json"
    seed: int = 0
    progress: bool = True
    val_check_interval: int | None = None
    size: str = "small"
    total_steps: int | None = 100_000  # the run the recommendation is made for (the demo itself is only a profile)


def epochs_for(max_steps: int, train_samples: int, batch_size: int, world: int) -> int:
    """Epochs ``max_steps`` optimizer steps take when each of ``world`` ranks draws full batches of ``batch_size``
    from its share of ``train_samples`` (Lightning's DistributedSampler pads the shares to ``ceil(samples /
    world)``; the last partial batch is dropped): the demo stops at ``max_steps`` inside the last one."""
    per_epoch = max(1, -(-train_samples // world) // batch_size)
    return max(1, -(-max_steps // per_epoch))


def build(config: DemoConfig) -> tuple[pl.LightningModule, DigitsDataModule | TokensDataModule]:
    """The model and data of a demo configuration."""
    if config.model == "cnn":
        width = {"small": 32, "medium": 64, "large": 128}[config.size]
        return DigitsCNN(width=width), DigitsDataModule(
            batch_size=config.batch_size or 64, num_workers=config.num_workers, seed=config.seed
        )
    d_model, n_layers = {"small": (128, 2), "medium": (256, 4), "large": (384, 6)}[config.size]
    return (
        TinyLM(d_model=d_model, n_layers=n_layers),
        TokensDataModule(batch_size=config.batch_size or 32, num_workers=config.num_workers, seed=config.seed),
    )


def run_demo(config: DemoConfig, extra_callbacks: list[Any] | None = None) -> tuple[SriftyCallback, pl.Trainer]:
    """Train the demo model with SriftyCallback; the callback's ``profile`` holds the result (on rank 0)."""
    pl.seed_everything(config.seed, workers=True, verbose=False)
    model, data = build(config)
    callback = SriftyCallback(
        warmup_steps=config.warmup_steps,
        profile_steps=config.profile_steps,
        output=config.output,
        constraints=Constraints(steps=config.total_steps) if config.total_steps else None,
    )
    max_steps = config.max_steps or config.warmup_steps + config.profile_steps + 50
    data.setup("fit")  # the epochs the steps take, so the progress bar counts to them (not Lightning's -1)
    world = max(1, config.devices if isinstance(config.devices, int) else 1) * max(1, config.num_nodes)
    trainer = pl.Trainer(
        max_steps=max_steps,
        max_epochs=epochs_for(max_steps, len(data.train), data.batch_size, world),
        accelerator=config.accelerator,
        devices=config.devices,
        num_nodes=config.num_nodes,
        strategy=config.strategy,
        precision=config.precision,  # type: ignore[arg-type]  # a name Lightning checks itself
        callbacks=[callback, *(extra_callbacks or [])],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=config.progress,
        enable_model_summary=False,
        val_check_interval=config.val_check_interval,
        check_val_every_n_epoch=None if config.val_check_interval else 1,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=data)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # let gloo's threads stop before the interpreter exits
    return callback, trainer
