"""``plan_strategy()``: the Lightning strategy of the plan entry ``srifty launch`` started the job on.

    trainer = Trainer(strategy=plan_strategy(), callbacks=[SriftyCallback()])

The launcher passes the entry's layout as ``LaunchEnv.strategy`` (the Lightning strategy's
name and JSON arguments, :meth:`predictor.model.layout.Layout.lightning`); a move to another entry may change it, and
the job, restarted there, builds the new one. Block classes travel by name and are resolved on the model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy, Strategy

from lightning_srifty.ddp.fsdp import SriftyFSDPStrategy, block_classes
from lightning_srifty.ddp.strategy import SriftyDDPStrategy
from lightning_srifty.protocol import ALLOW_CPU, RESUME_LATEST, VARIABLES, LaunchEnv
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
    (:mod:`lightning_srifty.migrate.plan`); this is for scripts that build their own.
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


def refuse_idle_gpus(trainer: Any) -> None:
    """Stop a job that srifty started on a GPU fleet (``srifty launch``, or a node of ``srifty terraform``'s module:
    its checkpoint folder variable is set) when its Trainer runs on the CPU although CUDA sees GPUs: a script
    profiled on a laptop often says ``accelerator="cpu"``, and the fleet would then be paid to train far slower than
    predicted until its life cap. Outside a srifty fleet it is a warning. ``SRIFTY_ALLOW_CPU=1`` allows it (tests, a
    local trial, a CPU job on purpose).

    Raises:
        ConfigError: on a srifty fleet, the GPUs are idle.
    """
    if os.environ.get(ALLOW_CPU) == "1" or not torch.cuda.is_available():
        return
    device = getattr(getattr(trainer, "strategy", None), "root_device", None)
    if device is None or device.type != "cpu":
        return
    message = (
        f"the Trainer runs on the CPU while CUDA sees {torch.cuda.device_count()} GPU(s) on this machine: the script "
        'pins accelerator="cpu" (or "mps"), so the GPUs would sit idle. Use accelerator="auto" (Lightning\'s '
        f'default) or "gpu"; set {ALLOW_CPU}=1 if the CPU is meant'
    )
    if os.environ.get(VARIABLES["checkpoint_uri"]) or LaunchEnv.from_env() is not None:
        raise ConfigError(f"Stopped before training: {message}.", parameter="accelerator", value="cpu")
    from lightning.pytorch.utilities import rank_zero_warn

    rank_zero_warn(f"srifty: {message}.")


def launch_mismatches(trainer: Any, launch: LaunchEnv | None = None) -> list[str]:
    """What the running Trainer does differently from what ``srifty launch`` planned for this fleet: the strategy
    (sharded or not), the accumulation, this rank's batch per micro-step, the checkpoint to resume from. Empty
    outside a launch or when they agree."""
    launch = launch or LaunchEnv.from_env()
    if launch is None:
        return []
    out = []
    planned = _planned_model(launch)
    module = type(getattr(trainer, "lightning_module", None)).__name__
    if planned and module not in ("NoneType", planned) and _simple(planned) != _simple(module):
        out.append(
            f"the plan was made for the model {planned!r} (its profile), this Trainer trains {module}: if the plan is "
            "another model's, its fleets, times and global batch are too (the job takes the plan's batch). Make the "
            "plan from this script's profile (srifty recommend --profile srifty/profile.json)"
        )
    name, _ = launch.strategy_spec()
    sharded = isinstance(trainer.strategy, FSDPStrategy)
    if (name == "fsdp") != sharded:
        out.append(
            f"the plan trains this fleet with {name}, the Trainer's strategy is {type(trainer.strategy).__name__}: "
            'pass Trainer(strategy="srifty_auto") (or plan_strategy())'
        )
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    if accumulate != launch.accumulate_grad_batches:
        out.append(
            f"the plan accumulates {launch.accumulate_grad_batches} micro-steps per optimizer step, the Trainer "
            f'{accumulate}: pass Trainer(strategy="srifty_auto"), which applies it, or '
            "accumulate_grad_batches=launch_settings().accumulate_grad_batches"
        )
    rank = getattr(trainer, "global_rank", 0)
    sizes = list(launch.batch_sizes or getattr(trainer.strategy, "batch_sizes", None) or ())  # gathered on a mix
    if sizes and rank < len(sizes):
        batch = _batch_size(getattr(trainer, "train_dataloader", None))
        if batch is not None and batch != sizes[rank]:
            out.append(
                f"the plan gives rank {rank} batches of {sizes[rank]} samples (global batch "
                f"{sum(sizes) * launch.accumulate_grad_batches}), its DataLoader gives {batch}: pass "
                'Trainer(strategy="srifty_auto"), which re-cuts it, or build it with '
                "batch_size=launch_settings().batch_size (the same training as the profiled one)"
            )
    if launch.resume and launch.resume != RESUME_LATEST and not getattr(trainer, "ckpt_path", None):
        out.append(
            f"the launcher resumes this job from {launch.resume}, but fit() got no ckpt_path: the run starts over. "
            'Pass Trainer(strategy="srifty_auto"), which resumes a fit() without ckpt_path, or '
            "trainer.fit(model, ckpt_path=resume_checkpoint())"
        )
    return out


def _planned_model(launch: LaunchEnv) -> str | None:
    """The model the launch's plan was made for (its ``model``), or None when the plan cannot be read here."""
    from lightning_srifty import store

    try:
        if "://" in launch.plan:
            folder, _, name = launch.plan.rpartition("/")
            data = store.read(folder, name)
        else:
            data = json.loads(Path(launch.plan).read_text()) if launch.plan else None
    except Exception:  # noqa: BLE001 - a comparison, never a failure
        return None
    model = data.get("model") if isinstance(data, dict) else getattr(data, "model", None)
    return str(model) if model else None


def _simple(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def _batch_size(loader: Any) -> int | None:
    for candidate in (loader, getattr(loader, "batch_sampler", None)):
        size = getattr(candidate, "batch_size", None)
        if isinstance(size, int):
            return size
    return None
