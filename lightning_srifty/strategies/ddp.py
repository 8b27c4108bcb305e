"""``srifty_ddp``: Lightning's DDP plus a communication hook that times every gradient all-reduce.

    Trainer(strategy="srifty_ddp", devices=8, callbacks=[SriftyCallback()])

Lightning registers ``ddp_comm_hook`` on CUDA only; this strategy registers its timing hook on every device
(gloo on CPU too), wrapping the user's ``ddp_comm_hook`` / ``ddp_comm_wrapper`` when given, so gradients are
unchanged. SriftyCallback reads the timings into the profile's ``communication`` section.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch.nn.parallel import DistributedDataParallel

from lightning_srifty.comm import AllReduceTimer, mean_allreduce_hook
from lightning_srifty.strategies.fsdp import block_classes
from lightning_srifty.strategies.hetero import RankBatches, check_batch_sizes, rank_weights, weighted_hook
from lightning_srifty.strategies.nodes import TorchrunNodes
from lightning_srifty.teardown import destroy_at_exit


class SriftyDDPStrategy(RankBatches, TorchrunNodes, DDPStrategy):
    """DDP whose gradient all-reduces are timed per bucket (bytes, seconds, overlap with backward).

    Takes every argument of :class:`lightning.pytorch.strategies.DDPStrategy`, and ``batch_sizes``: one per global
    rank when ranks take unequal batches (a heterogeneous fleet's speed-proportional split; or ``batch_groups`` and
    ``node_group`` where the rank order is known only after the rendezvous, :class:`RankBatches`); each rank's
    gradient is then weighted so that the all-reduced gradient is the global-batch mean
    (:mod:`lightning_srifty.strategies.hetero`); and ``activation_checkpointing_policy``: block classes, or their names
    (``["LlamaDecoderLayer"]``, resolved on the model at set-up), wrapped with torch's checkpoint wrapper before DDP
    (each keeps its input and recomputes the rest in backward).
    """

    strategy_name = "srifty_ddp"

    def __init__(
        self,
        *args: Any,
        activation_checkpointing_policy: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.allreduce_timer = AllReduceTimer()
        self.activation_checkpointing_policy = activation_checkpointing_policy

    def setup_environment(self) -> None:
        super().setup_environment()
        destroy_at_exit()

    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        if self.activation_checkpointing_policy:
            apply_checkpointing(model, self.activation_checkpointing_policy)
        return super()._setup_model(model)

    def _register_ddp_hooks(self) -> None:
        # Replaces DDPStrategy's (which skips non-CUDA devices): one hook, ours, wrapping the real reduction.
        assert isinstance(self.model, DistributedDataParallel)
        inner_hook: Any = self._ddp_comm_hook or mean_allreduce_hook  # plain DDP's mean, bit for bit
        if self._ddp_comm_wrapper is not None:
            inner_hook = self._ddp_comm_wrapper(inner_hook)
        if self.batch_sizes is not None:
            sizes = check_batch_sizes(self.batch_sizes, self.world_size)
            inner_hook = weighted_hook(rank_weights(sizes)[self.global_rank], inner_hook)
        state, hook = self.allreduce_timer.wrap(inner_hook, self._ddp_comm_state)
        self.model.register_comm_hook(state=state, hook=hook)
        if torch.distributed.is_initialized():
            self.allreduce_timer.backend = str(torch.distributed.get_backend())

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        for name, start_method, unused in (
            ("srifty_ddp", "popen", False),
            ("srifty_ddp_spawn", "spawn", False),
            # Lightning's ddp_find_unused_parameters_true, timed: a GAN's toggled optimizers leave parameters unused
            ("srifty_ddp_find_unused_parameters_true", "popen", True),
        ):
            if name in strategy_registry:
                continue
            strategy_registry.register(
                name,
                cls,
                description=f"DDP timing every all-reduce (lightning-srifty), start_method {start_method!r}"
                + (", find_unused_parameters=True" if unused else ""),
                start_method=start_method,
                **({"find_unused_parameters": True} if unused else {}),
            )


def apply_checkpointing(model: torch.nn.Module, blocks: Any) -> None:
    """Wrap every submodule of the classes ``blocks`` (classes or their names) with torch's non-reentrant
    checkpoint wrapper, in place (nothing when the model already has checkpointed blocks)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    if any(isinstance(m, CheckpointWrapper) for m in model.modules()):
        return
    classes = tuple(block_classes(blocks, model, "activation_checkpointing_policy"))
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda m: isinstance(m, classes)
    )


SriftyDDPStrategy.register_strategies(StrategyRegistry)
