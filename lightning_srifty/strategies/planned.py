"""``Trainer(strategy="srifty_auto")``: the plan applied in the Trainer under ``srifty launch``, with no glue.

Under a launch (``LaunchEnv`` in the environment) the strategy is the plan entry's layout (:func:`plan_strategy`),
and it also applies what the plan decided for this fleet:

- **the per-rank batch**: the training DataLoader is rebuilt around a :class:`GlobalBatchSampler` giving this rank
  its planned share of every global batch (unequal on mixed fleets; the gradient weighting that keeps the
  global-batch mean is the strategy's), with the script's dataset, collate function and workers;
- **the accumulation**: ``trainer.accumulate_grad_batches`` is the plan's, so the global batch per optimizer step is
  the profiled one (a recommendation never changes it);
- **the resume checkpoint**: a ``fit()`` without ``ckpt_path`` resumes from the checkpoint the launcher names
  (fetched and verified by :func:`resume_checkpoint`); a ``ckpt_path`` the script passes wins;
- **the sample position**: :class:`ExactResume` keeps where the epoch was, so a resume on another world size neither
  skips nor repeats a sample;
- **the move**: :class:`SpotPreemption` (unless the script has one) checkpoints to the launch's checkpoint URI at the
  next step on a spot notice or SIGTERM and leaves with exit 75, for the launcher to restart the job elsewhere.

What the script set otherwise (another batch, another accumulation) is replaced, and said at the start with both
values. A DataLoader that cannot be rebuilt (an iterable dataset, a DataLoader subclass, a batch sampler of the
script's own) is left alone and named, with the one line that fixes it. Outside a launch ``srifty_auto`` is
``srifty_ddp``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from lightning.pytorch.strategies import Strategy, StrategyRegistry
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.data import _is_dataloader_shuffled
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset

from lightning_srifty.migrate.checkpoints import install_resume
from lightning_srifty.protocol import LaunchEnv
from lightning_srifty.strategies.ddp import SriftyDDPStrategy
from lightning_srifty.strategies.fsdp import SriftyFSDPStrategy
from lightning_srifty.strategies.hetero import ExactResume, GlobalBatchSampler
from lightning_srifty.strategies.plan_strategy import build_layout
from predictor.exceptions import ConfigError

log = logging.getLogger(__name__)

# the DataLoader arguments a rebuilt loader keeps (everything but how batches are cut)
_KEPT = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


class _PlanPosition(ExactResume):
    """:class:`ExactResume` for the loader ``srifty_auto`` rebuilt; idle when the loader was left as it was."""

    @staticmethod
    def _ours(trainer: Any) -> bool:
        return isinstance(getattr(trainer.train_dataloader, "batch_sampler", None), GlobalBatchSampler)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._ours(trainer):
            if self._restored is not None:  # Lightning warns that the loader "is not resumable": here it is
                from lightning.pytorch.utilities.rank_zero import rank_zero_info

                rank_zero_info(
                    "srifty_auto: the resume is sample-exact: the position in the epoch (epoch "
                    f"{self._restored.get('epoch')}, {self._restored.get('consumed')} samples) came back with the "
                    "checkpoint and the loader srifty_auto re-cut continues from it; Lightning's warning that the "
                    "dataloader is not resumable does not apply to it."
                )
            super().on_train_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._ours(trainer):
            super().on_train_epoch_start(trainer, pl_module)

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if self._ours(trainer):
            super().on_train_batch_start(trainer, *args)


def rebuild_loader(loader: Any, sizes: list[int], rank: int, accumulate: int, seed: int = 0) -> tuple[Any, str]:
    """``loader`` re-cut so that this rank takes ``sizes[rank]`` samples of every ``sum(sizes)``-sample batch (a
    :class:`GlobalBatchSampler`), everything else kept; and why not, when it cannot be (then ``loader`` itself)."""
    if type(loader) is not DataLoader:
        return loader, f"the training loader is a {type(loader).__name__}, not a torch DataLoader"
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        return loader, "its dataset is iterable (the loader cannot choose the samples of a batch)"
    try:
        length = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return loader, "its dataset has no length"
    inner = loader.batch_sampler
    if inner is not None and type(inner) not in (BatchSampler, GlobalBatchSampler):
        return loader, f"it cuts batches with its own {type(inner).__name__}"
    if isinstance(inner, GlobalBatchSampler) and inner.batch_sizes == sizes:
        return loader, ""  # already the plan's
    kept = {name: getattr(loader, name) for name in _KEPT if hasattr(loader, name)}
    if not kept.get("num_workers"):
        kept.pop("prefetch_factor", None)
        kept.pop("persistent_workers", None)
    shuffle = _is_dataloader_shuffled(loader)
    drawn = getattr(inner, "sampler", None) if inner is not None else loader.sampler
    if isinstance(drawn, DistributedSampler):  # Lightning's, put in for the ranks: it kept the script's shuffle
        shuffle, seed = bool(drawn.shuffle), int(drawn.seed)
    if isinstance(inner, GlobalBatchSampler):  # the script's own split: its order kept
        shuffle, seed = inner.shuffle, inner.seed
    sampler = GlobalBatchSampler(length, sizes, rank, shuffle=shuffle, seed=seed, accumulate_grad_batches=accumulate)
    return DataLoader(dataset, batch_sampler=sampler, **kept), ""


def runs(sizes: list[int]) -> str:
    """Per-rank batches in rank order, equal neighbours counted: [24, 24, 9] -> "24 (2 ranks), 9" (a trial read "2 x2"
    as a product)."""
    out: list[list[int]] = []
    for b in sizes:
        if out and out[-1][0] == b:
            out[-1][1] += 1
        else:
            out.append([b, 1])
    return ", ".join(f"{b} ({n} ranks)" if n > 1 else str(b) for b, n in out)


class _AppliesThePlan:
    """What ``srifty_auto`` adds to the layout's strategy under a launch (see the module docstring); mixed in before
    a Lightning strategy class, whose hooks it extends."""

    applies_the_plan = True  # what launch_checks reads (a DataLoader left as it was is one this could not re-cut)

    launch: LaunchEnv

    def __init__(self, *args: Any, launch: LaunchEnv, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.launch = launch

    def setup_environment(self) -> None:
        super().setup_environment()  # type: ignore[misc]
        self._apply_to_trainer(self.lightning_module.trainer)  # type: ignore[attr-defined]

    def process_dataloader(self, dataloader: object) -> object:
        loader = super().process_dataloader(dataloader)  # type: ignore[misc]
        return self._apply_to_loader(loader, self.lightning_module.trainer)  # type: ignore[attr-defined]

    def _apply_to_trainer(self, trainer: Any) -> None:
        planned = self.launch.accumulate_grad_batches
        if planned > 1 and getattr(trainer.lightning_module, "automatic_optimization", True) is False:
            # set after Lightning's own check, which refuses accumulation for a manual loop: the plan's would be
            # ignored, every micro-batch an optimizer step, the global batch a fraction of the plan's (a trial's GAN)
            raise ConfigError(
                f"srifty_auto: the plan trains this fleet{' (' + self.launch.fleet + ')' if self.launch.fleet else ''}"
                f" with {planned} micro-batches accumulated per optimizer step, and this LightningModule steps its own "
                "optimizers (automatic_optimization=False), for which Lightning accumulates nothing: the training "
                "would change. Plan again from a profile of this script (SriftyCallback records the manual loop, and "
                "the ranking then plans no accumulation), or choose a fleet whose GPUs hold their share of the "
                "global batch.",
                parameter="accumulate_grad_batches",
                value=planned,
            )
        if trainer.accumulate_grad_batches != planned:
            log.warning(
                "srifty_auto: the plan accumulates %d micro-steps per optimizer step on this fleet (the global batch "
                "the run was profiled with); the Trainer's accumulate_grad_batches=%d is replaced.",
                planned,
                trainer.accumulate_grad_batches,
            )
            trainer.accumulate_grad_batches = planned
        self._say_the_batch()
        if not any(isinstance(c, ExactResume) for c in trainer.callbacks):
            trainer.callbacks.append(_PlanPosition())
        # imported here: this module registers the strategies as lightning.pytorch loads, which importing
        # migrate.preemption first (from lightning_srifty import SpotPreemption) does, half-way through its own import
        from lightning_srifty.migrate.preemption import SpotPreemption

        if not any(isinstance(c, SpotPreemption) for c in trainer.callbacks):
            # the launcher moves the job on a spot notice, a drift or a price: it checkpoints and leaves (exit 75)
            trainer.callbacks.append(SpotPreemption())
        install_resume(trainer, "srifty_auto")  # a fit() without ckpt_path resumes from the launcher's checkpoint

    def _say_the_batch(self) -> None:
        """Once (rank 0): the per-rank batches, accumulation and global batch this fleet trains with; on a mix whose
        ranks' GPU types were gathered at set-up and did not match the plan's counts, that it was split again."""
        sizes = list(self.launch.batch_sizes or getattr(self, "batch_sizes", None) or ())
        if not sizes:
            return
        from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

        a = self.launch.accumulate_grad_batches
        where = f" on {self.launch.fleet}" if self.launch.fleet else ""
        gathered = " (the ranks' GPU types gathered at set-up)" if not self.launch.batch_sizes else ""
        if getattr(self, "batch_resplit", False):
            rank_zero_warn(
                f"srifty_auto: the fleet's mix of GPU types is not the plan's{where}: the plan's {sum(sizes)} samples "
                "per micro-step were split again over the ranks present, in proportion to each type's planned batch "
                "(the global batch is unchanged; the step time is not the predicted one)."
            )
        rank_zero_info(
            f"srifty_auto: the plan's batch{where}: per rank {runs(sizes)} samples per micro-step{gathered} x {a} "
            f"accumulated = global batch {sum(sizes) * a} on {len(sizes)} rank(s)."
        )

    def _apply_to_loader(self, dataloader: Any, trainer: Any) -> Any:
        sizes = list(self.launch.batch_sizes or getattr(self, "batch_sizes", None) or ())  # gathered on a mix
        world = int(getattr(self, "world_size", 1))
        if trainer.state.stage != RunningStage.TRAINING or len(sizes) != world:
            return dataloader
        rank = int(getattr(self, "global_rank", 0))
        seed = int(os.environ.get("PL_GLOBAL_SEED", "0"))
        before = getattr(dataloader, "batch_size", None)
        rebuilt, why = rebuild_loader(dataloader, sizes, rank, self.launch.accumulate_grad_batches, seed)
        if why and before != sizes[rank]:  # a loader that already gives the rank's share needs no re-cut (a trial)
            log.warning(
                "srifty_auto: rank %d's share of the plan's global batch is %d samples per batch, but this DataLoader "
                "cannot be re-cut (%s), so it trains %s samples per batch, not the plan's: build it with "
                "batch_size=launch_settings().batch_size.",
                rank,
                sizes[rank],
                why,
                "its own" if before is None else before,
            )
        elif rebuilt is not dataloader and before is not None and before != sizes[rank]:
            # the rank's batch is its share of the plan's global batch, split again where the fleet is not the
            # plan's (a mix filled otherwise, srifty rehearse --nodes, a move): the global batch is what is the plan's
            log.warning(
                "srifty_auto: rank %d takes %d samples per batch (the script's DataLoader gave %d): its share of the "
                "plan's global batch, %d on %d rank(s) x %d accumulated.",
                rank,
                sizes[rank],
                before,
                sum(sizes) * self.launch.accumulate_grad_batches,
                world,
                self.launch.accumulate_grad_batches,
            )
        return rebuilt


class PlannedDDPStrategy(_AppliesThePlan, SriftyDDPStrategy):
    """``srifty_ddp`` with the plan's batch, accumulation and resume applied (built by ``srifty_auto``)."""


class PlannedFSDPStrategy(_AppliesThePlan, SriftyFSDPStrategy):
    """``srifty_fsdp`` with the plan's batch, accumulation and resume applied (built by ``srifty_auto``)."""


def srifty_auto(find_unused_parameters: bool = False) -> Strategy:
    """``Trainer(strategy="srifty_auto")``: under ``srifty launch`` the plan's layout with its batch, accumulation and
    resume applied (module docstring); else ``srifty_ddp`` (Lightning's DDP with all-reduce timing).
    ``find_unused_parameters`` (``"srifty_auto_find_unused_parameters_true"``): DDP's, as Lightning's
    ``ddp_find_unused_parameters_true`` (a GAN whose toggled optimizers leave parameters without gradients)."""
    launch = LaunchEnv.from_env()
    unused: dict[str, Any] = {"find_unused_parameters": True} if find_unused_parameters else {}
    if launch is None:
        return SriftyDDPStrategy(process_group_backend="nccl" if torch.cuda.is_available() else "gloo", **unused)
    extra = unused if launch.strategy_spec()[0] == "ddp" else {}  # FSDP has no such option (nor needs it)
    return build_layout(launch, ddp_class=PlannedDDPStrategy, fsdp_class=PlannedFSDPStrategy, launch=launch, **extra)


for _name, _unused in (("srifty_auto", False), ("srifty_auto_find_unused_parameters_true", True)):
    StrategyRegistry.register(
        _name,
        srifty_auto,
        description="the plan's strategy under srifty launch, with its per-rank batch, accumulation and resume "
        "checkpoint applied; else srifty_ddp" + (" (DDP's find_unused_parameters=True)" if _unused else ""),
        override=True,
        **({"find_unused_parameters": True} if _unused else {}),
    )
