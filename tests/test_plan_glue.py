"""The plan's layout reaches the Trainer without glue (issue #22 item 2): ``Trainer(strategy="srifty_auto")`` is the
plan's strategy under srifty launch and srifty_ddp outside one; ``launch_settings()`` gives this rank's planned batch
and accumulation; what a script does otherwise is named at the start of training, with what the plan expected."""

from __future__ import annotations

import logging
import types

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyDDPStrategy, SriftyFSDPStrategy, launch_settings
from lightning_srifty.ddp.plan_strategy import launch_mismatches
from lightning_srifty.protocol import LaunchEnv, strategy_text


def _launch(monkeypatch, **fields) -> LaunchEnv:
    launch = LaunchEnv(launch_id="L1", checkpoint_uri="/tmp/ck", **fields)
    for name, value in launch.to_env().items():
        monkeypatch.setenv(name, value)
    return launch


def _clear(monkeypatch) -> None:
    import os

    for name in [v for v in os.environ if v.startswith("SRIFTY_")]:
        monkeypatch.delenv(name)


def test_srifty_auto_is_the_plans_strategy_under_a_launch(monkeypatch) -> None:
    _clear(monkeypatch)
    assert isinstance(pl.Trainer(strategy="srifty_auto", accelerator="cpu", devices=1).strategy, SriftyDDPStrategy)
    assert launch_settings(default_batch_size=32) == launch_settings(32)  # outside a launch: the defaults
    assert launch_settings(32).batch_size == 32 and launch_settings(32).accumulate_grad_batches == 1
    _launch(monkeypatch, batch_sizes=(6,), accumulate_grad_batches=3, strategy=strategy_text("fsdp", {}))
    monkeypatch.setenv("RANK", "0")
    trainer = pl.Trainer(strategy="srifty_auto", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, SriftyFSDPStrategy)
    settings = launch_settings(32)
    assert (settings.batch_size, settings.accumulate_grad_batches, settings.strategy) == (6, 3, "fsdp")


def test_a_script_that_trains_otherwise_than_the_plan_is_told_what_the_plan_expected(monkeypatch) -> None:
    _clear(monkeypatch)
    launch = _launch(
        monkeypatch,
        batch_sizes=(4, 4),
        accumulate_grad_batches=2,
        strategy=strategy_text("fsdp", {}),
        resume="s3://b/run/preempt-step=5.ckpt",
    )
    loader = DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=8)
    trainer = types.SimpleNamespace(
        strategy=DDPStrategy(), accumulate_grad_batches=1, global_rank=1, train_dataloader=loader, ckpt_path=None
    )
    got = launch_mismatches(trainer, launch)
    assert len(got) == 4, got
    assert got[0].startswith("the plan trains this fleet with fsdp, the Trainer's strategy is DDPStrategy")
    assert "accumulates 2 micro-steps per optimizer step, the Trainer 1" in got[1]
    assert "rank 1 batches of 4 samples (global batch 16), its DataLoader gives 8" in got[2]
    assert "resumes this job from s3://b/run/preempt-step=5.ckpt, but fit() got no ckpt_path" in got[3]
    agreeing = types.SimpleNamespace(
        strategy=SriftyFSDPStrategy(),
        accumulate_grad_batches=2,
        global_rank=1,
        train_dataloader=DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=4),
        ckpt_path="/local/preempt-step=5.ckpt",
    )
    assert launch_mismatches(agreeing, launch) == []
    _clear(monkeypatch)
    assert launch_mismatches(trainer) == []  # not under a launch: nothing to compare


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_callback_warns_at_the_start_of_training(monkeypatch, caplog, tmp_path) -> None:
    from lightning_srifty import SriftyCallback

    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SriftyCallback(output=tmp_path / "profile.json")],
    )
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        trainer.fit(_Tiny(), DataLoader(TensorDataset(torch.zeros(32, 2)), batch_size=8))
    assert "the plan gives rank 0 batches of 4 samples (global batch 4), its DataLoader gives 8" in caplog.text
    assert "the plan trains this fleet" not in caplog.text  # a ddp plan on one device: the strategy agrees
