"""What a job srifty started checks of its own Trainer: GPUs paid for and left idle, and what the script does
otherwise than the plan it was launched from (torch-light; read by the profiler and the preemption callback, which
sit below the strategies)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy

from lightning_srifty.protocol import ALLOW_CPU, RESUME_LATEST, VARIABLES, LaunchEnv
from predictor.exceptions import ConfigError


def refuse_a_wasted_fleet(trainer: Any) -> None:
    """What a job on a srifty fleet checks before its first step: GPUs paid for and left idle
    (:func:`refuse_idle_gpus`), ranks that would each train a copy (:func:`refuse_lone_ranks`)."""
    refuse_idle_gpus(trainer)
    refuse_lone_ranks(trainer)


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
    who = getattr(trainer, "who", "Trainer")  # a Fabric loop's run says "Fabric"
    message = (
        f"the {who} runs on the CPU while CUDA sees {torch.cuda.device_count()} GPU(s) on this machine: the script "
        'pins accelerator="cpu" (or "mps"), so the GPUs would sit idle. Use accelerator="auto" (Lightning\'s '
        f'default) or "gpu"; set {ALLOW_CPU}=1 if the CPU is meant'
    )
    if os.environ.get(VARIABLES["checkpoint_uri"]) or LaunchEnv.from_env() is not None:
        raise ConfigError(f"Stopped before training: {message}.", parameter="accelerator", value="cpu")
    from lightning.pytorch.utilities import rank_zero_warn

    rank_zero_warn(f"srifty: {message}.")


def refuse_lone_ranks(trainer: Any) -> None:
    """Stop a job on a srifty fleet whose Trainer trains on fewer processes than torchrun started (``WORLD_SIZE``):
    every process would train its own copy of the model and write the same checkpoints, where the plan priced one
    data-parallel job. The module sets the fleet's node count as the Trainer's default (``PL_TRAINER_NUM_NODES``), so
    this is a script that passes ``num_nodes`` or ``devices`` of its own that disagree (Lightning refuses a multi-GPU
    node's such mismatch itself; one GPU a node it trains alone). Outside a srifty fleet it is a warning.

    Raises:
        ConfigError: on a srifty fleet, the ranks would train apart.
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        return
    trains = int(getattr(trainer, "world_size", world) or 1)
    if world <= trains:
        return
    nodes = getattr(trainer, "num_nodes", 1)
    devices = getattr(getattr(trainer, "strategy", None), "parallel_devices", None)
    message = (
        f"torchrun started {world} processes for this job, and this {getattr(trainer, 'who', 'Trainer')} trains on "
        f"{trains} of them "
        f"(num_nodes={nodes}, {len(devices) if devices else 1} device(s), {type(trainer.strategy).__name__}): each "
        f"process would train its own copy and write the same checkpoints. Leave num_nodes and devices out on a "
        f'srifty fleet (the fleet sets num_nodes: PL_TRAINER_NUM_NODES), or pass Trainer(strategy="srifty_auto")'
    )
    if os.environ.get(VARIABLES["checkpoint_uri"]) or LaunchEnv.from_env() is not None:
        raise ConfigError(f"Stopped before training: {message}.", parameter="num_nodes", value=nodes)
    from lightning.pytorch.utilities import rank_zero_warn

    rank_zero_warn(f"srifty: {message}.")


def launch_mismatches(trainer: Any, launch: LaunchEnv | None = None) -> list[str]:
    """What the running Trainer does differently from what ``srifty launch`` planned for this fleet: the strategy
    (sharded or not), the accumulation, this rank's batch per micro-step, the move when late the plan counted on,
    the checkpoint to resume from. Empty outside a launch or when they agree."""
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
            # srifty_auto re-cuts a loader it can: one it left is an iterable's or has its own batch sampler (a
            # trial's stream was told to pass the strategy it had)
            fix = (
                "srifty_auto cannot re-cut it (an iterable dataset, or a batch sampler of its own): build it with"
                if getattr(trainer.strategy, "applies_the_plan", False)
                else 'pass Trainer(strategy="srifty_auto"), which re-cuts it, or build it with'
            )
            out.append(
                f"the plan gives rank {rank} batches of {sizes[rank]} samples (global batch "
                f"{sum(sizes) * launch.accumulate_grad_batches}), its DataLoader gives {batch}: {fix} "
                "batch_size=launch_settings().batch_size (the same training as the profiled one)"
            )
    unwatched = _late_move_unwatched(trainer, launch)
    if unwatched:
        out.append(unwatched)
    if launch.resume and launch.resume != RESUME_LATEST and not getattr(trainer, "ckpt_path", None):
        out.append(
            f"the launcher resumes this job from {launch.resume}, but fit() got no ckpt_path: the run starts over. "
            'Pass Trainer(strategy="srifty_auto"), which resumes a fit() without ckpt_path, or '
            "trainer.fit(model, ckpt_path=resume_checkpoint())"
        )
    return out


def plan_data(launch: LaunchEnv) -> Any:
    """The launch's plan as its JSON (a dict), or None when it cannot be read here."""
    from lightning_srifty import store

    try:
        if "://" in launch.plan:
            folder, _, name = launch.plan.rpartition("/")
            return store.read(folder, name)
        return json.loads(Path(launch.plan).read_text()) if launch.plan else None
    except Exception:  # noqa: BLE001 - a comparison, never a failure
        return None


def _planned_model(launch: LaunchEnv) -> str | None:
    """The model the launch's plan was made for (its ``model``), or None when the plan cannot be read here."""
    data = plan_data(launch)
    model = data.get("model") if isinstance(data, dict) else getattr(data, "model", None)
    return str(model) if model else None


def _late_move_unwatched(trainer: Any, launch: LaunchEnv) -> str | None:
    """The plan counted on a move when this fleet is late (``move_if_late``) and the Trainer carries no
    MigrationTriggers to make it: what to do, or None."""
    data = plan_data(launch)
    entries = data.get("entries") if isinstance(data, dict) else None
    choice = launch.choice if launch.choice is not None else (data or {}).get("chosen")
    if not isinstance(entries, list) or not isinstance(choice, int) or not 0 <= choice < len(entries):
        return None
    entry = entries[choice] if isinstance(entries[choice], dict) else {}
    target, chance = entry.get("late_move_to"), entry.get("late_move_chance")
    names = {type(cb).__name__ for cb in getattr(trainer, "callbacks", None) or ()}
    if not target or "MigrationTriggers" in names:
        return None
    own = f" ({1 - float(chance):.0%})" if isinstance(chance, (int, float)) else ""
    return (
        f"the plan meets its deadline on this fleet by moving to {target} if it is measured late (move_if_late), and "
        f"the Trainer carries no MigrationTriggers to make that move: add MigrationTriggers() beside SpotPreemption() "
        f"to its callbacks, or the deadline rests on this fleet's own chance{own}"
    )


def _simple(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def _batch_size(loader: Any) -> int | None:
    for candidate in (loader, getattr(loader, "batch_sampler", None)):
        size = getattr(candidate, "batch_size", None)
        if isinstance(size, int):
            return size
    return None
