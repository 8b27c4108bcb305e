"""The plan's layout reaches the Trainer without glue (issue #22 item 2): ``Trainer(strategy="srifty_auto")`` is the
plan's strategy under srifty launch and srifty_ddp outside one; ``launch_settings()`` gives this rank's planned batch
and accumulation; what a script does otherwise is named at the start of training, with what the plan expected."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import types
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import GlobalBatchSampler, SriftyDDPStrategy, SriftyFSDPStrategy, launch_settings
from lightning_srifty.launch_checks import launch_mismatches
from lightning_srifty.protocol import LaunchEnv, strategy_text


def _launch(monkeypatch, **fields) -> LaunchEnv:
    launch = LaunchEnv(**{"launch_id": "L1", "checkpoint_uri": "/tmp/ck", **fields})
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


class _Toggled(pl.LightningModule):
    """A GAN's loop: two optimizers, each stepped with the other's parameters toggled off (no gradients for them)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.g, self.d = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        x = ids.float().unsqueeze(1)
        for opt, net in zip(self.optimizers(), (self.g, self.d)):
            self.toggle_optimizer(opt)
            opt.zero_grad()
            self.manual_backward(net(x).pow(2).mean())
            opt.step()
            self.untoggle_optimizer(opt)

    def configure_optimizers(self):
        return torch.optim.SGD(self.g.parameters(), lr=0.01), torch.optim.SGD(self.d.parameters(), lr=0.01)


@pytest.mark.parametrize("launched", [False, True])
def test_a_gans_toggled_optimizers_train_under_the_find_unused_parameters_name(monkeypatch, tmp_path, launched):
    """A trial's GAN failed under srifty_auto ("parameters that were not used"): Lightning's way out is
    strategy="ddp_find_unused_parameters_true", which drops srifty. srifty_auto and srifty_ddp have that name too."""
    _clear(monkeypatch)
    if launched:
        _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    with pytest.raises(RuntimeError, match="find_unused_parameters"):
        _fit_plain(tmp_path, max_steps=2, model=_Toggled())
    for name in ("srifty_auto_find_unused_parameters_true",) + (
        () if launched else ("srifty_ddp_find_unused_parameters_true",)
    ):
        trainer, _ = _fit_plain(tmp_path, max_steps=2, strategy=name, model=_Toggled())
        assert trainer.global_step == 2 and trainer.strategy._ddp_kwargs["find_unused_parameters"] is True


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
    with pytest.warns(UserWarning) as warned:  # through Lightning's rank-zero warnings
        trainer.fit(_Tiny(), DataLoader(TensorDataset(torch.zeros(32, 2)), batch_size=8))
    said = " ".join(str(w.message) for w in warned)
    assert "the plan gives rank 0 batches of 4 samples (global batch 4), its DataLoader gives 8" in said
    assert "the plan trains this fleet" not in said  # a ddp plan on one device: the strategy agrees


class _Seen(pl.LightningModule):
    """Records every micro-batch's sample ids; one parameter, SGD."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.batches: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        self.batches.append([int(i) for i in ids])
        return self.layer(ids.float().unsqueeze(1)).sum() * 0.0 + self.layer.weight.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _order(accumulate: int = 1) -> list[list[int]]:
    """The batches of 4 a rank of one takes from 96 samples: shuffled with Lightning's seed, as its DDP sampler is."""
    return [list(b) for b in GlobalBatchSampler(96, [4], 0, shuffle=True, seed=0, accumulate_grad_batches=accumulate)]


class _SaveAt(pl.Callback):
    """Checkpoints mid-epoch at a step, as SpotPreemption does on a notice."""

    def __init__(self, at: dict[int, str]) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step in self.at:
            trainer.save_checkpoint(self.at[trainer.global_step])


def _fit_plain(
    tmp_path,
    *,
    max_steps: int,
    loader=None,
    ckpt_path=None,
    save: dict[int, str] | None = None,
    strategy="srifty_auto",
    model: pl.LightningModule | None = None,
):
    """A plain script: its own DataLoader (batch 8, in order), Trainer(strategy="srifty_auto"), fit()."""
    model = model or _Seen()
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[_SaveAt(save)] if save else [],
    )
    loader = loader if loader is not None else DataLoader(TensorDataset(torch.arange(96)), batch_size=8)
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return trainer, model


def test_srifty_auto_applies_the_plans_batch_and_accumulation_to_a_plain_script(monkeypatch, caplog, tmp_path) -> None:
    from lightning_srifty.migrate.preemption import SpotPreemption
    from lightning_srifty.strategies.planned import PlannedDDPStrategy

    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=3, checkpoint_uri=str(tmp_path / "ck"))
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        trainer, model = _fit_plain(tmp_path, max_steps=2)
    assert isinstance(trainer.strategy, PlannedDDPStrategy)
    assert trainer.accumulate_grad_batches == 3 and trainer.global_step == 2
    # 2 steps x 3 micro-batches of 4, drawn as Lightning's DDP draws a training set (shuffled, seed 0)
    assert model.batches == _order(accumulate=3)[:6]
    assert "the plan accumulates 3 micro-steps per optimizer step" in caplog.text
    assert (
        "rank 0 takes 4 samples per batch (the script's DataLoader gave 8): its share of the plan's global batch, "
        "12 on 1 rank(s) x 3 accumulated." in caplog.text
    )
    assert any(isinstance(c, SpotPreemption) for c in trainer.callbacks)  # the move on a spot notice, too


def test_srifty_auto_refuses_a_plans_accumulation_for_a_module_that_steps_its_own_optimizers(monkeypatch, tmp_path):
    """A trial's GAN (automatic_optimization=False) on a fleet planned at 64 x 2 accumulated: Lightning refuses
    accumulate_grad_batches for a manual loop, but srifty_auto set it after that check, so every micro-batch was an
    optimizer step and the global batch half the plan's, silently. Such a plan is refused, with the way out; a plan
    without accumulation trains the loop."""
    from helpers import TwoOptimizerModel, loader
    from predictor.exceptions import ConfigError

    def fit(accumulate: int) -> pl.Trainer:
        _clear(monkeypatch)
        _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=accumulate, checkpoint_uri=str(tmp_path / "ck"))
        trainer = pl.Trainer(strategy="srifty_auto", accelerator="cpu", devices=1, max_steps=6, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=tmp_path)  # fmt: skip
        trainer.fit(TwoOptimizerModel(), loader(n=64, batch_size=8))
        return trainer

    with pytest.raises(ConfigError, match=r"2 micro-batches accumulated .*\(automatic_optimization=False\)") as said:
        fit(2)
    assert "Plan again from a profile of this script" in str(said.value)
    assert fit(1).global_step == 6  # 3 batches of the plan's 4, both optimizers stepped on each


def test_a_rank_batch_split_again_over_another_world_size_is_not_called_the_plans(monkeypatch, caplog, tmp_path):
    """A plan of 2 ranks of 8 rehearsed on one (``srifty rehearse --nodes 1``: the global batch of 16 split again
    over the ranks present) said "rank 0 takes the plan's 16 samples per batch", though the plan gives each rank 8:
    16 is the rank's share of the plan's global batch, which is what the plan fixes and what is named as the plan's."""
    from lightning_srifty.provision.rehearsal.walk import _batch_for_nodes

    train = {"env": {"SRIFTY_BATCH_SIZES": "8,8"}}
    _batch_for_nodes(train, 1)
    sizes = tuple(int(b) for b in train["env"]["SRIFTY_BATCH_SIZES"].split(","))
    assert sizes == (16,)
    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=sizes, accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        _, model = _fit_plain(tmp_path, max_steps=1)  # the script's own loader: the plan's 8 a rank
    assert len(model.batches[0]) == 16
    assert "the plan's 16" not in caplog.text
    assert (
        "rank 0 takes 16 samples per batch (the script's DataLoader gave 8): its share of the plan's global batch, "
        "16 on 1 rank(s) x 1 accumulated." in caplog.text
    )


def test_srifty_auto_resumes_a_fit_without_ckpt_path_from_the_launchers_checkpoint(monkeypatch, caplog, tmp_path):
    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    first, seen = _fit_plain(
        tmp_path, max_steps=6, save={2: str(tmp_path / "step2.ckpt"), 5: str(tmp_path / "step5.ckpt")}
    )
    order = _order()
    assert first.global_step == 6 and seen.batches == order[:6]
    _launch(
        monkeypatch,
        batch_sizes=(4,),
        accumulate_grad_batches=1,
        checkpoint_uri=str(tmp_path / "ck"),
        resume=str(tmp_path / "step5.ckpt"),
    )
    with caplog.at_level(logging.INFO):
        resumed, model = _fit_plain(tmp_path, max_steps=8)
    assert f"resuming from the launcher's checkpoint {tmp_path / 'step5.ckpt'}" in caplog.text
    # Lightning says the loader "is not resumable"; srifty_auto says why that does not apply (issue #37 M4)
    assert "srifty_auto: the resume is sample-exact: the position in the epoch (epoch 0, 20 samples)" in caplog.text
    assert resumed.global_step == 8 and model.batches == order[5:8]  # the next sample on
    # a ckpt_path the script passes wins over the launcher's
    again, model = _fit_plain(tmp_path, max_steps=3, ckpt_path=str(tmp_path / "step2.ckpt"))
    assert again.global_step == 3 and model.batches == [order[2]]


def test_a_plain_trainer_under_a_launch_resumes_too(monkeypatch, caplog, tmp_path) -> None:
    """A new user's trial: a script with a plain Trainer (SriftyCallback alone, the README's quick start) started over
    from step 0 on every move while the launcher said it resumed. The SpotPreemption every Trainer gets under a launch
    (Lightning's callbacks_factory) makes a fit() without ckpt_path resume from the launcher's checkpoint."""
    from lightning_srifty.migrate.preemption import SpotPreemption

    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(8,), accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    _fit_plain(tmp_path, max_steps=6, save={2: str(tmp_path / "step2.ckpt"), 4: str(tmp_path / "step4.ckpt")})
    ck, resume = str(tmp_path / "ck"), str(tmp_path / "step4.ckpt")
    _launch(monkeypatch, batch_sizes=(8,), accumulate_grad_batches=1, checkpoint_uri=ck, resume=resume)
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        trainer, model = _fit_plain(tmp_path, max_steps=7, strategy="auto")
    assert any(isinstance(c, SpotPreemption) for c in trainer.callbacks)  # added by the package, not the script
    assert f"srifty: resuming from the launcher's checkpoint {resume}" in caplog.text
    assert trainer.global_step == 7 and len(model.batches) == 3  # on from the checkpoint's 4 steps, not from 0
    # a ckpt_path the script passes still wins
    again, model = _fit_plain(tmp_path, max_steps=4, ckpt_path=str(tmp_path / "step2.ckpt"), strategy="auto")
    assert again.global_step == 4 and len(model.batches) == 2
    # the launcher's checkpoint is one fit()'s: a later fit() of the process starts as the script says (a review)
    later, model = _fit_plain(tmp_path, max_steps=2, strategy="auto")
    assert later.global_step == 2 and len(model.batches) == 2


def test_the_resume_every_trainer_gets_does_not_stop_a_trainer_of_another_model(monkeypatch, caplog, tmp_path):
    """A review: with the resume on every Trainer under a launch, a script whose Trainer trains another module than
    the checkpoint's stopped with srifty_auto's refusal. The automatic resume says so and starts that fit() fresh;
    srifty_auto, which the script asked for, still refuses (test_a_checkpoint_of_another_model_is_refused_...)."""

    class Wider(_Seen):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 3)
            self.head = torch.nn.Linear(3, 1)

    _clear(monkeypatch)
    ck = str(tmp_path / "ck")
    _launch(monkeypatch, batch_sizes=(8,), accumulate_grad_batches=1, checkpoint_uri=ck)
    _fit_plain(tmp_path, max_steps=3, save={2: str(tmp_path / "step2.ckpt")})
    _launch(
        monkeypatch, batch_sizes=(8,), accumulate_grad_batches=1, checkpoint_uri=ck, resume=str(tmp_path / "step2.ckpt")
    )
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        trainer.fit(Wider(), DataLoader(TensorDataset(torch.arange(96)), batch_size=8))
    assert trainer.global_step == 2  # trained from the start, not stopped
    assert "was not written by this model (Wider: missing from the checkpoint: head.weight, head.bias" in caplog.text
    # the checkpoint was not taken: the script's next fit() of the model that wrote it resumes from it
    resumed, model = _fit_plain(tmp_path, max_steps=4, strategy="auto")
    assert resumed.global_step == 4 and len(model.batches) == 2


def test_a_checkpoint_of_another_model_is_refused_by_name_not_loaded(monkeypatch, tmp_path) -> None:
    """Issue #36 L9: the newest checkpoint in the folder was another architecture's (two runs sharing a folder); the
    resume handed it to Lightning, which stopped with a state_dict traceback. It is refused, naming the differences
    and the fix."""
    from predictor.exceptions import ConfigError

    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    _fit_plain(tmp_path, max_steps=3, save={2: str(tmp_path / "step2.ckpt")})

    class Wider(_Seen):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 3)
            self.head = torch.nn.Linear(3, 1)

    _launch(
        monkeypatch,
        batch_sizes=(4,),
        accumulate_grad_batches=1,
        checkpoint_uri=str(tmp_path / "ck"),
        resume=str(tmp_path / "step2.ckpt"),
    )
    trainer = pl.Trainer(strategy="srifty_auto", accelerator="cpu", devices=1, max_steps=4, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    loader = DataLoader(TensorDataset(torch.arange(96)), batch_size=8)
    with pytest.raises(ConfigError) as error:
        trainer.fit(Wider(), loader)
    message = str(error.value)
    assert "was not written by this model (Wider): missing from the checkpoint: head.weight, head.bias" in message
    assert "shapes differ: layer.weight (1, 1) in the checkpoint, (3, 1) in the model" in message
    assert "a checkpoint folder of its own" in message


def test_srifty_auto_names_a_loader_it_cannot_re_cut(monkeypatch, caplog, tmp_path) -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter((torch.tensor(i),) for i in range(1000))

    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        _, model = _fit_plain(tmp_path, max_steps=1, loader=DataLoader(Stream(), batch_size=8))
    assert len(model.batches[0]) == 8  # left as it was
    assert (
        "rank 0's share of the plan's global batch is 4 samples per batch, but this DataLoader cannot be re-cut (its "
        "dataset is " in caplog.text
    )
    assert "so it trains 8 samples per batch, not the plan's: build it with" in caplog.text
    assert "batch_size=launch_settings().batch_size" in caplog.text
    # what the job reports (STARTED.json, the rehearsal's check) tells the way out it has: not the strategy it passed
    trainer = types.SimpleNamespace(
        strategy=types.SimpleNamespace(applies_the_plan=True), global_rank=0, train_dataloader=DataLoader(Stream(), 8)
    )
    said = " ".join(launch_mismatches(trainer, LaunchEnv(launch_id="L1", checkpoint_uri="/tmp/ck", batch_sizes=(4,))))
    assert "srifty_auto cannot re-cut it (an iterable dataset" in said and 'pass Trainer(strategy="srifty' not in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        _fit_plain(tmp_path, max_steps=1, loader=DataLoader(Stream(), batch_size=4))  # the plan's batch already
    assert "cannot be re-cut" not in caplog.text  # a trial's stream at the plan's batch was warned of nothing it did


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("at", [3, 27])
def test_a_resume_of_a_loader_with_workers_trains_the_samples_an_uninterrupted_run_does(
    tmp_path, monkeypatch, at, workers
):
    """A trial's resume logged "sample-exact" and trained the epoch's first two batches again: Lightning makes the
    loader's iterator before on_train_start, where the position comes back, and a loader with workers draws
    prefetch_factor x num_workers batches at once, from the epoch's start (in a later epoch, in the order of the
    sampler's epoch 0). The iterator is made again from the restored position. 96 samples, batches of 4: step 27 is
    in the second epoch."""
    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    made = lambda: DataLoader(TensorDataset(torch.arange(96)), batch_size=8, num_workers=workers,  # noqa: E731
                              persistent_workers=bool(workers))  # fmt: skip
    ckpt = str(tmp_path / "at.ckpt")
    _, whole = _fit_plain(tmp_path, max_steps=at + 6, loader=made(), save={at: ckpt})
    _, resumed = _fit_plain(tmp_path, max_steps=at + 6, loader=made(), ckpt_path=ckpt)
    assert resumed.batches == whole.batches[at:], (resumed.batches[:3], whole.batches[at : at + 3])


def test_a_resumed_stream_that_keeps_no_position_is_said(monkeypatch, caplog, tmp_path) -> None:
    """A trial's GAN read an IterableDataset: every resume trained the stream's first batches again, and nothing said
    so (Lightning's "not resumable" warning needs an epoch's length). A resumed run is told, with the way out; a
    loader that keeps its position (Lightning checkpoints it) is not."""
    from lightning_srifty.migrate.preemption import ITERABLE_RESTARTS

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter((torch.tensor(i),) for i in range(1000))

    class Kept(DataLoader):  # a loader with a position of its own, as torchdata's StatefulDataLoader
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    _clear(monkeypatch)
    _launch(monkeypatch, batch_sizes=(4,), accumulate_grad_batches=1, checkpoint_uri=str(tmp_path / "ck"))
    ckpt = str(tmp_path / "at2.ckpt")
    _fit_plain(tmp_path, max_steps=2, loader=DataLoader(Stream(), batch_size=4), save={2: ckpt})
    for loader, said in ((DataLoader(Stream(), batch_size=4), True), (Kept(Stream(), batch_size=4), False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
            _fit_plain(tmp_path, max_steps=3, loader=loader, ckpt_path=ckpt)
        assert (f"the run resumed at step 2, and {ITERABLE_RESTARTS}" in caplog.text) is said, caplog.text


@pytest.mark.parametrize("callback", ["SpotPreemption", "SriftyCallback"])
def test_a_job_srifty_started_on_gpus_with_a_trainer_pinned_to_the_cpu_stops_before_training(
    tmp_path, monkeypatch, callback
) -> None:
    """A script profiled on a laptop says accelerator="cpu"; on a GPU fleet the nodes would train on their CPUs until
    the life cap (a new user's walk). On a srifty fleet (SRIFTY_CHECKPOINT_URI, as the module's nodes export) the job
    stops before its first step, naming the fix; elsewhere it is a warning; SRIFTY_ALLOW_CPU=1 allows it. CUDA is
    simulated (this machine has none): torch.cuda says 4 GPUs once the Trainer is built."""
    from helpers import TinyModel, loader, trainer
    from lightning_srifty import SriftyCallback
    from lightning_srifty.migrate.preemption import SpotPreemption
    from predictor.exceptions import ConfigError

    def make() -> pl.Callback:
        if callback == "SpotPreemption":
            return SpotPreemption(str(tmp_path / "ckpt"), exit_process=False, handle_sigterm=False)
        return SriftyCallback(output=None, recommend=False)

    def gpus(t: pl.Trainer) -> pl.Trainer:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
        return t

    monkeypatch.delenv("SRIFTY_ALLOW_CPU")
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(tmp_path / "ckpt"))
    t = gpus(trainer([make()], max_steps=3))
    with pytest.raises(ConfigError, match=r'CUDA sees 4 GPU\(s\).*accelerator="auto"') as refused:
        t.fit(TinyModel(), train_dataloaders=loader())
    assert refused.value.parameter == "accelerator" and t.global_step == 0
    monkeypatch.undo()

    monkeypatch.delenv("SRIFTY_ALLOW_CPU")  # not on a srifty fleet: trained, with a warning
    monkeypatch.delenv("SRIFTY_CHECKPOINT_URI", raising=False)
    t = gpus(trainer([make()], max_steps=3))
    with pytest.warns(UserWarning, match="the GPUs would sit idle"):
        t.fit(TinyModel(), train_dataloaders=loader())
    assert t.global_step == 3
    monkeypatch.undo()

    monkeypatch.setenv("SRIFTY_ALLOW_CPU", "1")  # meant: trained on a fleet, no word
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(tmp_path / "ckpt"))
    t = gpus(trainer([make()], max_steps=3))
    t.fit(TinyModel(), train_dataloaders=loader())
    assert t.global_step == 3


def test_a_local_trial_may_train_on_the_cpu(monkeypatch) -> None:
    """`srifty launch`'s local provisioner runs one process per planned GPU on this machine, on its CPU where it has
    fewer GPUs: its jobs get SRIFTY_ALLOW_CPU=1, so a GPU workstation's trial is not stopped for idle GPUs (a review
    found the suite's global SRIFTY_ALLOW_CPU hid this)."""
    import subprocess
    import types as _types

    from lightning_srifty.protocol import ALLOW_CPU, VARIABLES
    from lightning_srifty.provision.launcher import local

    seen: dict = {}
    monkeypatch.delenv(ALLOW_CPU)
    monkeypatch.setattr(subprocess, "Popen", lambda command, env, **kw: seen.update(env) or _types.SimpleNamespace())
    entry = _types.SimpleNamespace(fleet="g4dn.xlarge:1", market="spot", groups=())
    fleet = _types.SimpleNamespace(entry=entry, plan=_types.SimpleNamespace(checkpoint_s=None), data={"ranks": 1})
    local.LocalProvisioner(["train.py"], echo=lambda line: None).start(fleet, {VARIABLES["batch_sizes"]: "8"})
    assert seen[ALLOW_CPU] == "1" and seen[VARIABLES["batch_sizes"]] == "8"


def test_under_a_launch_the_jobs_profile_never_overwrites_the_users(tmp_path, monkeypatch) -> None:
    """The local provisioner runs the job in the project folder: its SriftyCallback() wrote srifty/profile.json over
    the profile the launch's plan came from (a new user's walk). Under a launch the default goes to the launch's own
    folder; an output the script names is kept."""
    from lightning_srifty import SriftyCallback

    for key, value in LaunchEnv(launch_id="L9", checkpoint_uri=str(tmp_path / "ckpt")).to_env().items():
        monkeypatch.setenv(key, value)
    assert str(SriftyCallback().output) == "srifty/launch-L9/profile.json"
    assert str(SriftyCallback(output="mine.json").output) == "mine.json" and SriftyCallback(output=None).output is None
    for key in LaunchEnv(launch_id="L9", checkpoint_uri="x").to_env():
        monkeypatch.delenv(key)
    assert str(SriftyCallback().output) == "srifty/profile.json"


def test_a_plan_made_for_another_model_is_named_under_a_launch(tmp_path) -> None:
    """A plan made from another profile (a ResNet-50 plan for an MLP script) ran without a word, the job taking its
    8x larger batch (a new user's walk): the mismatch names both models and the fix; the same model passes."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "srifty.plan/v1", "model": "resnet50"}))
    launch = LaunchEnv(launch_id="L1", checkpoint_uri=str(tmp_path), plan=str(plan))

    class MLP(pl.LightningModule):
        pass

    trainer = types.SimpleNamespace(
        lightning_module=MLP(), strategy=DDPStrategy(), accumulate_grad_batches=1, global_rank=0
    )
    (said,) = [m for m in launch_mismatches(trainer, launch) if "the plan was made for" in m]
    assert "'resnet50' (its profile), this Trainer trains MLP" in said and "srifty recommend --profile" in said
    plan.write_text(json.dumps({"schema": "srifty.plan/v1", "model": "MLP"}))
    assert not [m for m in launch_mismatches(trainer, launch) if "the plan was made for" in m]


def test_a_plan_that_counts_a_move_when_late_names_the_missing_migration_triggers(tmp_path) -> None:
    """A plan made with move_if_late meets its deadline on this fleet by moving if it is measured late: a Trainer
    without MigrationTriggers would never move, so the launch says so (with the fleet's own chance); with it, or on
    an entry that counts no move, nothing is said."""
    from lightning_srifty.migrate.preemption import SpotPreemption
    from lightning_srifty.migrate.triggers import MigrationTriggers

    plan = tmp_path / "plan.json"
    moving = {"late_move_to": "g4dn.xlarge:2", "late_move_chance": 0.5}
    plan.write_text(json.dumps({"schema": "srifty.plan/v1", "chosen": 0, "entries": [moving, {}]}))
    launch = LaunchEnv(launch_id="L1", checkpoint_uri=str(tmp_path), plan=str(plan), choice=0)
    bare = types.SimpleNamespace(strategy=DDPStrategy(), accumulate_grad_batches=1, callbacks=[SpotPreemption()])
    (said,) = [m for m in launch_mismatches(bare, launch) if "move_if_late" in m]
    assert "moving to g4dn.xlarge:2 if it is measured late" in said and "own chance (50%)" in said
    assert "add MigrationTriggers()" in said
    watched = types.SimpleNamespace(
        **{**vars(bare), "callbacks": [SpotPreemption(), MigrationTriggers.__new__(MigrationTriggers)]}
    )
    assert not [m for m in launch_mismatches(watched, launch) if "move_if_late" in m]
    second = dataclasses.replace(launch, choice=1)  # an entry that counts no move
    assert not [m for m in launch_mismatches(bare, second) if "move_if_late" in m]


@pytest.mark.parametrize("callback", ["SpotPreemption", "SriftyCallback"])
def test_ranks_that_would_each_train_a_copy_stop_on_a_fleet(tmp_path, monkeypatch, callback) -> None:
    """A trial: on a fleet of one-GPU nodes the example (Trainer(devices=1), no num_nodes) trained a copy on each node,
    each writing the same checkpoints, where the plan priced one data-parallel job. The module now sets the fleet's
    node count as the Trainer's default (Lightning reads PL_TRAINER_NUM_NODES for an argument the script leaves
    out); a Trainer that still trains on fewer processes than torchrun started (WORLD_SIZE) stops on a srifty fleet,
    naming the fix, and is a warning elsewhere."""
    from helpers import TinyModel, loader, trainer
    from lightning_srifty import SriftyCallback
    from lightning_srifty.migrate.preemption import SpotPreemption
    from predictor.exceptions import ConfigError

    def make() -> pl.Callback:
        if callback == "SpotPreemption":
            return SpotPreemption(str(tmp_path / "ckpt"), exit_process=False, handle_sigterm=False)
        return SriftyCallback(output=None, recommend=False)

    monkeypatch.setenv("PL_TRAINER_NUM_NODES", "2")  # what user_data exports on a 2-node fleet
    assert pl.Trainer(accelerator="cpu", devices=1, logger=False).num_nodes == 2  # Lightning's env default
    monkeypatch.delenv("PL_TRAINER_NUM_NODES")
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's two ranks, this one's Trainer alone
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(tmp_path / "ckpt"))
    t = trainer([make()], max_steps=3)
    with pytest.raises(ConfigError, match=r"torchrun started 2 processes .* trains on 1 of them") as refused:
        t.fit(TinyModel(), train_dataloaders=loader())
    assert refused.value.parameter == "num_nodes" and t.global_step == 0
    monkeypatch.delenv("SRIFTY_CHECKPOINT_URI")  # not on a srifty fleet: trained, with a warning
    t = trainer([make()], max_steps=3)
    with pytest.warns(UserWarning, match="each process would train its own copy"):
        t.fit(TinyModel(), train_dataloaders=loader())
    assert t.global_step == 3


@pytest.mark.parametrize("lightning_import", ["import lightning.pytorch as pl", "import lightning as pl"])
def test_srifty_auto_works_when_the_package_is_imported_before_lightning(lightning_import, tmp_path) -> None:
    """A trial: Lightning checks a strategy's name in Trainer(), before any entry point loads, so the strategies exist
    only once this package registered them; imported before lightning, it did not (every node stopped on "invalid
    strategy name 'srifty_auto'"). Imported first, it registers them as lightning.pytorch loads, still torch-free."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "import lightning_srifty\n"
        "assert 'torch' not in sys.modules, 'the package imported torch'\n"
        f"{lightning_import}\n"
        "t = pl.Trainer(strategy='srifty_auto', accelerator='cpu', devices=1, logger=False)\n"
        "print('strategy', type(t.strategy).__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SRIFTY_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "strategy SriftyDDPStrategy" in done.stdout  # srifty_auto outside a launch


def test_migration_triggers_take_a_mixed_fleets_batch_from_its_groups() -> None:
    """A review: a fleet's handover to a mix carries the plan's groups, not the per-rank list; MigrationTriggers then
    took the global batch from the plan, which a launch with another global batch does not train."""
    from lightning_srifty.migrate.triggers import launch_sizes

    mix = LaunchEnv(launch_id="L1", checkpoint_uri="/c", batch_groups=(("g5.xlarge", (5,)), ("g4dn.xlarge", (3, 3))))
    assert launch_sizes(mix) == (5, 3, 3) and launch_sizes(None) == ()
    assert launch_sizes(LaunchEnv(launch_id="L1", checkpoint_uri="/c", batch_sizes=(4, 4))) == (4, 4)


def test_a_trainer_that_runs_another_work_than_the_plans_is_said_with_both_ways_to_agree(tmp_path, caplog) -> None:
    """A plan of 20,000 steps on a script of max_steps=100,000: every figure of the plan, the deadline's chance and the
    spot guard's on-demand finish were for a fifth of the run, in silence. The first step's report says so in the
    node's log (a warning, not a mismatch: a rehearsal runs a few hundred steps of the plan's run on purpose); within
    5 % nothing is said; a manual loop's max_steps counts its optimizers."""
    from lightning_srifty.migrate.launch_watch import trained_as, work_mismatch

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "srifty.plan/v1", "chosen": 0, "constraints": {"work_samples": 20_000 * 64},
                                "entries": [{"global_batch": 64}]}))  # fmt: skip
    launch = LaunchEnv(launch_id="L1", checkpoint_uri=str(tmp_path), plan=str(plan), choice=0)

    class Auto(pl.LightningModule):
        pass

    def trainer(max_steps: int, module: Any = None, processed: int = 0, global_step: int = 0) -> Any:
        progress = types.SimpleNamespace(total=types.SimpleNamespace(processed=processed))
        loop = types.SimpleNamespace(epoch_loop=types.SimpleNamespace(batch_progress=progress))
        return types.SimpleNamespace(
            lightning_module=module or Auto(), strategy=DDPStrategy(), accumulate_grad_batches=1, global_rank=0,
            world_size=1, max_steps=max_steps, max_epochs=None, num_training_batches=float("inf"),
            global_step=global_step, fit_loop=loop, callbacks=[],
        )  # fmt: skip

    said = work_mismatch(trainer(100_000), launch)
    assert said is not None and "runs 100,000 steps of 64 samples, the plan prices 20,000 (1,280,000 samples)" in said
    assert "for 0.2x this run" in said and "srifty recommend --steps 100000" in said and "max_steps=20,000" in said
    assert work_mismatch(trainer(20_500), launch) is None  # within 5 %
    assert work_mismatch(trainer(800), launch) is not None  # a rehearsal's short run: said, and no mismatch
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        record = trained_as(trainer(800), launch)
    assert not [m for m in record["mismatches"] if "steps" in m]
    assert "runs 800 steps" in caplog.text

    class Gan(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

    gan = trainer(40_000, Gan(), processed=3, global_step=6)  # two optimizers a batch: 20,000 batches
    assert work_mismatch(gan, launch) is None
    said = work_mismatch(trainer(100_000, Gan(), processed=3, global_step=6), launch)
    assert said is not None and "runs 50,000 steps" in said and "max_steps=40,000 (its 2 optimizer steps" in said
    assert work_mismatch(trainer(100_000), dataclasses.replace(launch, plan=str(tmp_path / "none.json"))) is None
    # a move's plan prices the rest of the run: 20,000 steps left of 80,000 agree with it, as the whole run would
    moved = trainer(80_000, processed=60_000, global_step=60_000)
    assert work_mismatch(moved, launch) is None
    assert work_mismatch(trainer(80_000, processed=30_000, global_step=30_000), launch) is not None
