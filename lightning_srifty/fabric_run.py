"""A Lightning Fabric loop read as a Trainer: what the checkpoint writer, the launch checks (``migrate``'s
:class:`~lightning_srifty.migrate.fabric.FabricPreemption`) and the profiler
(:class:`~lightning_srifty.profiling.fabric.FabricProfiler`) ask of a run, from the script's Fabric and its state."""

from __future__ import annotations

import weakref
from typing import Any, Protocol

PROFILED_KEY = "srifty_profiled"  # FabricProfiler's, in the loop's checkpointed state: a resumed run is not profiled


def check_fabric(owner: str, fabric: Any, needed: tuple[str, ...]) -> None:
    """``fabric`` has what ``owner`` uses of a :class:`lightning.fabric.Fabric`, else a ConfigError naming it."""
    from predictor.exceptions import ConfigError

    for name in needed:
        if not hasattr(fabric, name):
            raise ConfigError(
                f"{owner}(fabric=...) takes the script's Fabric, not a {type(fabric).__name__} (no .{name}): pass "
                "the lightning.fabric.Fabric the loop trains with.",
                parameter="fabric",
                value=type(fabric).__name__,
            )


class _Profiler(Protocol):
    fabric: Any

    def interrupt(self, why: str) -> None: ...


_PROFILERS: weakref.WeakSet[Any] = weakref.WeakSet()  # FabricProfilers measuring a window (none, mostly)


def watch_for_other_work(profiler: _Profiler) -> None:
    """``profiler`` hears of the work its Fabric's loop does between steps that is not training (a checkpoint
    ``FabricPreemption`` saves), as a Trainer's callback hears ``on_save_checkpoint``: that step is left out."""
    _PROFILERS.add(profiler)


def other_work(fabric: Any, why: str) -> None:
    """Work that is not training runs in ``fabric``'s loop now: its profilers leave the step out."""
    for profiler in list(_PROFILERS):
        if profiler.fabric is fabric:
            profiler.interrupt(why)


class FabricRun:
    """A Fabric loop as the checkpoint writer and the launch checks read a Trainer: its step (``state[step_key]``),
    its strategy and ranks, and ``save_checkpoint`` as ``fabric.save`` of ``state``."""

    who = "Fabric"  # what the launch checks' refusals call it

    def __init__(self, fabric: Any, state: dict[str, Any], step_key: str) -> None:
        self.fabric, self.state, self.step_key = fabric, state, step_key
        self.should_stop = False

    @property
    def global_step(self) -> int:
        return int(self.state[self.step_key])

    @property
    def strategy(self) -> Any:
        return self.fabric.strategy

    @property
    def is_global_zero(self) -> bool:
        return bool(self.fabric.is_global_zero)

    @property
    def global_rank(self) -> int:
        return int(self.fabric.global_rank)

    @property
    def local_rank(self) -> int:
        return int(self.fabric.local_rank)

    @property
    def world_size(self) -> int:
        return int(self.fabric.world_size)

    @property
    def num_nodes(self) -> int:
        return int(getattr(self.fabric.strategy, "num_nodes", 1) or 1)

    @property
    def lightning_module(self) -> Any:
        """The state's modules as one (what a checkpoint's size is estimated from)."""
        import torch

        return torch.nn.ModuleDict({k: v for k, v in self.state.items() if isinstance(v, torch.nn.Module)})

    @property
    def optimizers(self) -> list[Any]:
        import torch

        return [v for v in self.state.values() if isinstance(v, torch.optim.Optimizer)]

    def save_checkpoint(self, path: str, weights_only: bool = False) -> None:
        other_work(self.fabric, "checkpoint")  # a profile window's step with a save in it is not a training step
        self.fabric.save(path, self.state)  # every rank calls it: a sharded strategy writes each rank's part

    def trained(self, launch: Any) -> dict[str, Any]:
        """How the loop trains, for ``STARTED.json``: its ranks, its strategy, and a sharded or unsharded strategy
        where the plan says otherwise (its batch and accumulation are the script's loop's: not seen here)."""
        from lightning.fabric.strategies import DDPStrategy, FSDPStrategy

        strategy = self.fabric.strategy
        sharded = isinstance(strategy, FSDPStrategy)
        name = "fsdp" if sharded else "ddp" if isinstance(strategy, DDPStrategy) else type(strategy).__name__
        mismatches = []
        try:
            planned = launch.strategy_spec()[0] if launch is not None else None
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop training (one rank calls it)
            planned = None
            mismatches.append(f"not checked: {type(exc).__name__}: {exc}")
        if planned is not None and (planned == "fsdp") != sharded:
            mismatches.append(
                f"the plan trains this fleet with {planned}, the Fabric's strategy is {type(strategy).__name__}: "
                f'pass Fabric(strategy="{planned}")'
            )
        return {"world_size": self.world_size, "strategy": name, "mismatches": tuple(mismatches)}
