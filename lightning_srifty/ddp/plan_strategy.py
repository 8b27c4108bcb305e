"""``plan_strategy()``: the Lightning strategy of the plan entry ``srifty launch`` started the job on.

    trainer = Trainer(strategy=plan_strategy(), callbacks=[SriftyCallback()])

The launcher passes the entry's layout as ``LaunchEnv.strategy`` (the Lightning strategy's
name and JSON arguments, :meth:`predictor.layout.Layout.lightning`); a move to another entry may change it, and the
job, restarted there, builds the new one. Block classes travel by name and are resolved on the model.
"""

from __future__ import annotations

import os

import torch
from lightning.pytorch.strategies import Strategy

from lightning_srifty.ddp.fsdp import SriftyFSDPStrategy, block_classes
from lightning_srifty.ddp.strategy import SriftyDDPStrategy
from lightning_srifty.protocol import VARIABLES, LaunchEnv
from predictor.exceptions import ConfigError


def plan_strategy(default: str | Strategy = "auto", *, model: torch.nn.Module | None = None) -> str | Strategy:
    """The strategy the plan's layout names, under ``srifty launch``; ``default`` outside one.

    ``fsdp`` -> :class:`~lightning_srifty.ddp.fsdp.SriftyFSDPStrategy` with the layout's sharding, wrap and
    checkpointing policies; ``ddp`` -> :class:`~lightning_srifty.ddp.strategy.SriftyDDPStrategy` with the per-rank
    batch sizes (unequal on heterogeneous fleets) and its activation-checkpointing blocks (a single rank of plain
    ddp gets ``default``). The process group is gloo on CPU, NCCL with CUDA.

    Args:
        default: what to return when the job does not run under ``srifty launch``.
        model: the LightningModule, to check the named block classes now rather than at the Trainer's set-up.

    Raises:
        ConfigError: the launcher's strategy is unreadable or names a strategy this release cannot build; FSDP with
            unequal per-rank batches; a block class the model does not have (with ``model``).
    """
    launch = LaunchEnv.from_env()
    if launch is None:
        return default
    name, args = launch.strategy_spec()
    sizes = list(launch.batch_sizes) or None
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not torch.cuda.is_available() and local > 1:
        # local processes on a CPU (the local provisioner): Lightning's devices="auto" would count one CPU device and
        # fail under torchrun's local ranks; the strategy names one per process, so the Trainer needs no devices=
        args = {**args, "parallel_devices": [torch.device("cpu")] * local}
    if name == "fsdp":
        strategy = SriftyFSDPStrategy(process_group_backend=backend, batch_sizes=sizes, **args)
        if model is not None:
            strategy.resolve_names(model)
        return strategy
    if name == "ddp":
        blocks = args.get("activation_checkpointing_policy")
        if model is not None and blocks:
            block_classes(blocks, model, "activation_checkpointing_policy")
        if not args and (sizes is None or len(sizes) == 1):
            return default
        return SriftyDDPStrategy(
            batch_sizes=sizes if sizes and len(sizes) > 1 else None, process_group_backend=backend, **args
        )
    raise ConfigError(
        f"${VARIABLES['strategy']} names the strategy {name!r}; this lightning-srifty builds ddp and fsdp. Launch an "
        "entry of the plan with one of those (its layout), or use the same lightning-srifty on both sides.",
        parameter=VARIABLES["strategy"],
        value=name,
    )
