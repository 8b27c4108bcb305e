"""``plan_strategy()``: the Lightning strategy of the plan entry ``srifty launch`` started the job on.

    trainer = Trainer(strategy=plan_strategy(), callbacks=[SriftyCallback()])

The launcher passes the entry's layout as ``LaunchEnv.strategy`` (the Lightning strategy's
name and JSON arguments, :meth:`predictor.model.layout.Layout.lightning`); a move to another entry may change it, and
the job, restarted there, builds the new one. Block classes travel by name and are resolved on the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.strategies import Strategy

from lightning_srifty.protocol import VARIABLES, LaunchEnv
from lightning_srifty.strategies.ddp import SriftyDDPStrategy
from lightning_srifty.strategies.fsdp import SriftyFSDPStrategy, block_classes
from predictor.exceptions import ConfigError


def plan_strategy(default: str | Strategy = "auto", *, model: torch.nn.Module | None = None) -> str | Strategy:
    """The strategy the plan's layout names, under ``srifty launch``; ``default`` outside one.

    ``fsdp`` -> :class:`~lightning_srifty.strategies.fsdp.SriftyFSDPStrategy` with the layout's sharding, wrap and
    checkpointing policies; ``ddp`` -> :class:`~lightning_srifty.strategies.ddp.SriftyDDPStrategy` with the per-rank
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
    if name == "ddp" and not args and len(launch.batch_sizes) <= 1 and not launch.batch_groups:
        return default  # one rank of plain ddp: nothing to build
    return build_layout(launch, model=model)


def build_layout(
    launch: LaunchEnv,
    /,
    *,
    model: torch.nn.Module | None = None,
    ddp_class: type[SriftyDDPStrategy] = SriftyDDPStrategy,
    fsdp_class: type[SriftyFSDPStrategy] = SriftyFSDPStrategy,
    **extra: Any,
) -> Strategy:
    """The strategy object of ``launch``'s layout (:func:`plan_strategy` without the default), of ``ddp_class`` or
    ``fsdp_class`` (subclasses take ``extra`` too)."""
    name, args = launch.strategy_spec()
    sizes = list(launch.batch_sizes) or None
    # a mix whose rank order is known once its nodes joined: every rank's batch is gathered at set-up (RankBatches)
    groups = {"batch_groups": launch.batch_groups, "node_group": launch.node_group} if not sizes else {}
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not torch.cuda.is_available() and local > 1:
        # local processes on a CPU (the local provisioner): Lightning's devices="auto" would count one CPU device and
        # fail under torchrun's local ranks; the strategy names one per process, so the Trainer needs no devices=
        args = {**args, "parallel_devices": [torch.device("cpu")] * local}
    if name == "fsdp":
        strategy = fsdp_class(process_group_backend=backend, batch_sizes=sizes, **groups, **args, **extra)
        if model is not None:
            strategy.resolve_names(model)
        return strategy
    if name == "ddp":
        blocks = args.get("activation_checkpointing_policy")
        if model is not None and blocks:
            block_classes(blocks, model, "activation_checkpointing_policy")
        return ddp_class(
            batch_sizes=sizes if sizes and len(sizes) > 1 else None,
            process_group_backend=backend,
            **groups,
            **args,
            **extra,
        )
    raise ConfigError(
        f"${VARIABLES['strategy']} names the strategy {name!r}; this lightning-srifty builds ddp and fsdp. Launch an "
        "entry of the plan with one of those (its layout), or use the same lightning-srifty on both sides.",
        parameter=VARIABLES["strategy"],
        value=name,
    )


@dataclass(frozen=True)
class LaunchSettings:
    """What the plan asks of this rank under ``srifty launch`` (:func:`launch_settings`)."""

    batch_size: int | None  # this rank's samples per micro-step (None: not under a launch, or not given)
    accumulate_grad_batches: int
    strategy: str  # "ddp" or "fsdp"
    resume: str  # the checkpoint to resume from ("" on a first start)


def launch_settings(default_batch_size: int | None = None) -> LaunchSettings:
    """This rank's planned batch, accumulation, strategy and resume checkpoint; outside a launch, the defaults::

    s = launch_settings(default_batch_size=32)
    loader = DataLoader(data, batch_size=s.batch_size)
    trainer = Trainer(strategy="ddp", accumulate_grad_batches=s.accumulate_grad_batches)

    ``Trainer(strategy="srifty_auto")`` applies all of it without these lines
    (:mod:`lightning_srifty.strategies.planned`); this is for scripts that build their own.
    """
    launch = LaunchEnv.from_env()
    if launch is None:
        return LaunchSettings(default_batch_size, 1, "ddp", "")
    rank = int(os.environ.get("RANK", "0"))
    sizes, mine = launch.batch_sizes, launch.node_batches()
    # on a mix whose ranks are numbered as its nodes join, this rank's GPU type's planned batch (its group's batches
    # differ by one sample at most; the strategy's set-up knows which, and srifty_auto re-cuts the loader to it)
    batch = sizes[rank] if rank < len(sizes) else max(mine) if mine else default_batch_size
    return LaunchSettings(batch, launch.accumulate_grad_batches, launch.strategy_spec()[0], launch.resume)
