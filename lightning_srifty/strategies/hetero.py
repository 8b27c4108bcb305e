"""Unequal per-rank batches (heterogeneous fleets) with an exact global-batch gradient, and a batch sampler that
resumes exactly on another world size.

DDP averages the ranks' gradients: with per-rank batches b_r (the plan's speed-proportional split) the average of
local means is not the global-batch mean. :func:`weighted_hook` scales rank r's gradient bucket by
``b_r * W / sum(b)`` before the all-reduce, so that the mean of the scaled buckets is ``sum_r b_r g_r / sum(b)``,
the gradient of the mean loss over the whole global batch.

:class:`GlobalBatchSampler` cuts every global batch (a seeded permutation per epoch, the same on every rank) into
the ranks' shares; its position is the number of samples consumed in the epoch, so a run checkpointed on one world
size resumes on another (same global batch, new split) without skipping or repeating a sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import Sampler

from lightning_srifty.protocol import VARIABLES
from predictor.exceptions import ConfigError


def rank_weights(batch_sizes: Sequence[int]) -> list[float]:
    total = float(sum(batch_sizes))
    return [b * len(batch_sizes) / total for b in batch_sizes]


def weighted_hook(weight: float, inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A DDP communication hook scaling this rank's bucket by ``weight`` before ``inner`` reduces it."""

    def hook(state, bucket):  # DDP accepts only unannotated or exact annotations
        if weight != 1.0:
            bucket.buffer().mul_(weight)
        return inner(state, bucket)

    return hook


def check_batch_sizes(batch_sizes: Sequence[int], world_size: int) -> list[int]:
    sizes = list(batch_sizes)
    if len(sizes) != world_size or any(not isinstance(b, int) or b < 1 for b in sizes):
        raise ConfigError(
            f"batch_sizes must give one whole number >= 1 per rank ({world_size} ranks). Got {sizes!r}. "
            "Take them from the plan's per-GPU batch split (srifty recommend --max-types 2).",
            parameter="batch_sizes",
            value=sizes,
        )
    return sizes


class GlobalBatchSampler(Sampler[list[int]]):
    """Per-batch index lists for one rank: ``sum(batch_sizes)`` samples per batch over the ranks, this rank's share
    ``batch_sizes[rank]``; ``accumulate_grad_batches`` batches make an optimizer step, so the global batch is
    ``sum(batch_sizes) x accumulate_grad_batches`` (pass the Trainer the same accumulation; ``srifty launch`` sets
    both from the plan: ``LaunchEnv.from_env().batch_sizes`` and ``.accumulate_grad_batches``).

    Incomplete global batches at the end of an epoch are dropped (every optimizer step has the full global batch).
    ``state_dict()`` / ``load_state_dict()`` carry (epoch, samples consumed in it); the state is the same on every
    rank and independent of the split, which is what makes a resume on another world size exact.
    """

    def __init__(
        self,
        dataset_len: int,
        batch_sizes: Sequence[int],
        rank: int = 0,
        *,
        shuffle: bool = True,
        seed: int = 0,
        accumulate_grad_batches: int = 1,
    ) -> None:
        if not 0 <= rank < len(batch_sizes):
            raise ConfigError(f"rank {rank} has no batch size in {list(batch_sizes)!r}.", parameter="rank", value=rank)
        self.dataset_len, self.batch_sizes, self.rank = dataset_len, list(batch_sizes), rank
        self.shuffle, self.seed = shuffle, seed
        if (
            isinstance(accumulate_grad_batches, bool)
            or not isinstance(accumulate_grad_batches, int)
            or (accumulate_grad_batches < 1)
        ):
            raise ConfigError(
                f"The 'accumulate_grad_batches' parameter of GlobalBatchSampler() must be an int >= 1. Got "
                f"{accumulate_grad_batches!r}.",
                parameter="accumulate_grad_batches",
                value=accumulate_grad_batches,
            )
        self.batch_samples = sum(self.batch_sizes)  # one batch (micro-step) over every rank
        self.global_batch = self.batch_samples * accumulate_grad_batches  # one optimizer step
        self.usable = dataset_len // self.global_batch * self.global_batch  # whole optimizer steps per epoch
        if self.usable == 0:  # every epoch would be empty: the run would "finish" having trained nothing
            raise ConfigError(
                f"The dataset has {dataset_len:,} samples, fewer than one global batch of {self.global_batch:,} "
                f"({sum(self.batch_sizes):,} per micro-step x {accumulate_grad_batches} accumulated): no optimizer "
                "step could be taken. The plan keeps the profiled global batch: use a plan made from a profile of this "
                "run (its dataset and batch), or a dataset of at least one global batch.",
                parameter="batch_sizes",
                value=self.batch_sizes,
            )
        self.offset = sum(self.batch_sizes[:rank])
        self.epoch = 0
        self.consumed = 0  # samples of the current epoch already handed out (all ranks together)

    @property
    def batch_size(self) -> int:
        """This rank's samples per batch (what a DataLoader's ``batch_size`` would say)."""
        return self.batch_sizes[self.rank]

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.dataset_len))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_len, generator=g).tolist()

    def __len__(self) -> int:
        return self.usable // self.batch_samples  # a whole epoch (a resumed one yields only what is left)

    def __iter__(self) -> Iterator[list[int]]:
        if self.consumed + self.batch_samples > self.usable:  # the last epoch was used up: the next one
            self.epoch, self.consumed = self.epoch + 1, 0
        order = self._order()
        while self.consumed + self.batch_samples <= self.usable:
            start = self.consumed + self.offset
            batch = order[start : start + self.batch_sizes[self.rank]]
            self.consumed += self.batch_samples
            yield batch

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def seek(self, steps: int) -> None:
        """Stand where a run that took ``steps`` optimizer steps from its start with this sampler stands: the epoch
        and the samples consumed in it follow from the global batch alone, so the position holds on any world size
        and split (a Fabric loop's resume: ``FabricPreemption(sampler=...)``, from the checkpoint's step count; the
        loader's prefetching, which runs the sampler ahead of training, does not move it)."""
        per_epoch = self.usable // self.global_batch
        self.epoch, self.consumed = steps // per_epoch, steps % per_epoch * self.global_batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed, "global_batch": self.global_batch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("global_batch", self.global_batch) != self.global_batch:
            raise ConfigError(
                f"The checkpoint was trained with a global batch of {state['global_batch']}, this run has "
                f"{self.global_batch}: keep the global batch (change the per-rank split or gradient accumulation) "
                "to resume exactly.",
                parameter="batch_sizes",
                value=self.batch_sizes,
            )
        self.epoch, self.consumed, self.seed = int(state["epoch"]), int(state["consumed"]), int(state["seed"])


class ExactResume(Callback):
    """Keeps a :class:`GlobalBatchSampler`'s position in the checkpoint.

    It counts the global batches trained in the epoch (at batch start, so a checkpoint taken at that batch's end
    includes it), stores (epoch, samples consumed, seed) in the checkpoint, and hands that position to the sampler of
    the resumed run, whatever its world size and split. Pass ``use_distributed_sampler=False`` to the Trainer.
    """

    def __init__(self) -> None:
        self.epoch, self.consumed, self.global_batch, self.seed = 0, 0, 0, 0
        self.batch_samples = 0
        self._restored: dict[str, int] | None = None

    @property
    def state_key(self) -> str:
        return "ExactResume"

    @staticmethod
    def _sampler(trainer: pl.Trainer) -> GlobalBatchSampler:
        sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
        if not isinstance(sampler, GlobalBatchSampler):
            raise ConfigError(
                "ExactResume needs the training DataLoader built with batch_sampler=GlobalBatchSampler(...) and "
                "Trainer(use_distributed_sampler=False).",
                parameter="batch_sampler",
                value=type(sampler).__name__,
            )
        return sampler

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        sampler = self._sampler(trainer)
        self.global_batch, self.batch_samples, self.seed = sampler.global_batch, sampler.batch_samples, sampler.seed
        if self._restored is not None:
            sampler.load_state_dict(self._restored)
            self.epoch, self.consumed = self._restored["epoch"], self._restored["consumed"]
            if trainer.current_epoch == self.epoch:  # resumed inside the epoch
                _count_in_this_fleets_batches(trainer, self.consumed, self.batch_samples)
            _draw_again(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        resumed = self._restored is not None and trainer.current_epoch == self._restored["epoch"]
        self._restored = None
        if not resumed:  # a resumed epoch continues where it stopped
            self.epoch, self.consumed = trainer.current_epoch, 0
            # Lightning sets the epoch of a batch sampler's inner sampler only: follow its epoch here
            self._sampler(trainer).set_epoch(trainer.current_epoch)

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.consumed += self.batch_samples

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "consumed": self.consumed, "global_batch": self.global_batch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restored = dict(state)


def _draw_again(trainer: pl.Trainer) -> None:
    """The training loader's iterator made again, from the position just restored. Lightning makes it before
    ``on_train_start`` (``FitLoop.setup_data``), and a loader with workers draws its first batches then
    (``prefetch_factor`` x ``num_workers``): from the epoch's start, in the order of the sampler's epoch before the
    restore (a trial's resume, "sample-exact" in its log, trained the epoch's first two batches again). A new iterator
    drops those (persistent workers drain them) and draws from the restored position; one without workers had drawn
    nothing yet, and draws the same."""
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    if fetcher is not None and getattr(fetcher, "combined_loader", None) is not None:
        iter(fetcher)


def _count_in_this_fleets_batches(trainer: pl.Trainer, consumed: int, batch_samples: int) -> None:
    """Lightning's count of the epoch's batches, restored from the checkpoint, in this fleet's micro-batches.

    The checkpoint counts the micro-batches of the fleet that saved it; where this fleet's micro-batch over every rank
    (``batch_samples``) is another (2 GPUs of 32 -> 1 GPU of 32 x 2 accumulated: the same global batch), that count
    is wrong here: Lightning decides from it when the accumulation ends (an optimizer step on half the global batch),
    when the epoch ends and whether it validates there (a trial's run lost its epoch's validation, and the move back a
    step). The epoch's count becomes the samples consumed in this fleet's micro-batches, and the run's count what an
    uninterrupted run on this fleet would have; every counter of each moves by the same amount, so Lightning still
    reads where in a batch the checkpoint was taken. Runs before ``fit_loop.run`` resets the epoch loop (it reads the
    counts then), in ``on_train_start``.
    """
    progress = trainer.fit_loop.epoch_loop.batch_progress
    here = consumed // batch_samples
    per_epoch = trainer.num_training_batches
    run = trainer.current_epoch * int(per_epoch) + here if math.isfinite(per_epoch) else progress.total.ready
    for counter, target in ((progress.current, here), (progress.total, run)):
        shift = target - counter.ready
        for name in ("ready", "started", "processed", "completed"):  # a _BatchProgress's tracker has all four
            setattr(counter, name, getattr(counter, name) + shift)


class RankBatches:
    """Mixed in before a Lightning DDP/FSDP strategy class: the per-rank batches the strategy weights gradients by.

    ``batch_sizes`` gives one per global rank. On a fleet whose rank order is known only once its nodes have joined
    (a mix of GPU types started by ``srifty terraform``: torchrun numbers ranks in join order) ``batch_groups`` (the
    plan's groups: key and its GPUs' batches) and ``node_group`` (this node's key) stand instead: once the process
    group exists every rank's group is gathered, and ``batch_sizes`` becomes the plan's batch of each rank
    (:func:`predictor.model.batch.assign_rank_batches`; the plan's split exactly when the fleet is the plan's mix,
    the plan's samples per micro-step split again over the ranks present when it is not).
    """

    batch_sizes: list[int] | None
    batch_resplit: bool  # the fleet's mix was not the plan's: its samples per micro-step were split again

    def __init__(
        self,
        *args: Any,
        batch_sizes: Sequence[int] | None = None,
        batch_groups: Sequence[tuple[str, Sequence[int]]] = (),
        node_group: str = "",
        **kwargs: Any,
    ) -> None:
        self.batch_sizes = list(batch_sizes) if batch_sizes is not None else None
        self.batch_groups = tuple((str(k), tuple(v)) for k, v in batch_groups)
        self.node_group = node_group
        self.batch_resplit = False
        if self.batch_groups and node_group not in {k for k, _ in self.batch_groups}:
            raise ConfigError(
                f"this node's plan group (${VARIABLES['node_group']}) is {node_group!r}, the plan's groups are "
                f"{[k for k, _ in self.batch_groups]}: the node's boot script exports its group (srifty terraform's "
                "module does); re-generate the module from the plan the fleet was made from.",
                parameter="node_group",
                value=node_group,
            )
        super().__init__(*args, **kwargs)

    def setup_environment(self) -> None:
        super().setup_environment()  # type: ignore[misc]
        if self.batch_sizes is None and self.batch_groups:
            self.batch_sizes, self.batch_resplit = self._gather_batches()

    def _gather_batches(self) -> tuple[list[int], bool]:
        from predictor.model.batch import assign_rank_batches

        keys = [k for k, _ in self.batch_groups]
        world = int(self.world_size)  # type: ignore[attr-defined]
        mine = keys.index(self.node_group)
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            device = self.root_device  # type: ignore[attr-defined]  # NCCL gathers CUDA tensors, gloo CPU ones
            own = torch.tensor([mine], dtype=torch.int64, device=device)
            everyone = [torch.zeros_like(own) for _ in range(world)]
            torch.distributed.all_gather(everyone, own)
            indices = [int(t.item()) for t in everyone]
        else:
            indices = [mine] * world
        return assign_rank_batches(self.batch_groups, [keys[i] for i in indices])
