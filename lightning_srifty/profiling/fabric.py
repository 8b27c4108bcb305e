"""FabricProfiler: profile a window of a Lightning Fabric loop and write ``srifty.profile/v1``, as
:class:`~.callback.SriftyCallback` does for a Trainer.

Fabric has no loop of its own to hook, so the script says where a batch starts and ends and where its backward is::

    fabric = L.Fabric(accelerator="auto", devices=8)
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    with FabricProfiler(fabric, model, optimizer, constraints=Constraints(steps=100_000, deadline_h=12)) as prof:
        for batch in loader:
            with prof.step(batch):  # one batch: its data wait, forward, backward and optimizer step
                loss = model(batch).loss
                prof.backward(loss)  # fabric.backward(loss), its start and end marked
                optimizer.step()
                optimizer.zero_grad()

The window (batches ``[warmup_steps, warmup_steps + profile_steps)``), the operator capture of the last warm-up
batch, the peak memory, the checkpoint's measured cost, the profile, the plan and the report are the callback's
(:class:`~.window.ProfileWindow`, :class:`~.results.WindowResults`); DDP's gradient all-reduces are timed by the same
communication hook ``srifty_ddp`` registers (:mod:`lightning_srifty.comm`), FSDP's all-gathers and reduce-scatters by
the same collective timer. After the window every method returns at its first line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from lightning_srifty.fabric_run import PROFILED_KEY, FabricRun, check_fabric, watch_for_other_work
from lightning_srifty.profiling.callback import _check_output_and_batch_size_fn
from lightning_srifty.profiling.recommendation import check_constraints, has_work, service_client
from lightning_srifty.profiling.results import DEFAULT_OUTPUT, WindowResults, launch_output
from lightning_srifty.profiling.window import ProfileWindow
from predictor.documents.checks import Setting, check_settings
from predictor.exceptions import ConfigError
from predictor.ranking.constraints import Constraints

log = logging.getLogger("lightning_srifty")

_NOTHING = contextlib.nullcontext()  # a step outside the window (reusable: it holds no state)


class _StrategyView:
    """The Fabric's strategy as the profiler reads a Trainer's: ``model`` (the wrapped module: DDP, FSDP or the
    plain one) and ``allreduce_timer`` added; everything else is the strategy's own."""

    def __init__(self, strategy: Any, model: torch.nn.Module, timer: Any) -> None:
        self.__wrapped__, self.model, self.allreduce_timer = strategy, model, timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


class FabricView(FabricRun):
    """A Fabric loop as the profiler reads a Trainer: its strategy (:class:`_StrategyView`), devices, precision,
    accumulation and loader; its length is the profiler's ``constraints``' (a Fabric loop has no ``max_steps``)."""

    max_steps = None
    max_epochs = None
    num_training_batches = math.inf
    num_val_batches: ClassVar[list[int]] = []
    val_check_batch = None
    check_val_every_n_epoch = None

    def __init__(self, fabric: Any, state: dict[str, Any], wrapped: torch.nn.Module, timer: Any, **loop: Any) -> None:
        super().__init__(fabric, state, step_key="")
        self._strategy = _StrategyView(fabric.strategy, wrapped, timer)
        self._optimizers: list[Any] = loop["optimizers"]
        self.accumulate_grad_batches, self.train_dataloader = loop["accumulate"], loop["loader"]

    @property
    def optimizers(self) -> list[Any]:
        return self._optimizers

    @property
    def strategy(self) -> Any:
        return self._strategy

    @property
    def num_devices(self) -> int:
        devices = getattr(self.fabric.strategy, "parallel_devices", None)
        return len(devices) if devices else 1

    @property
    def precision(self) -> str:
        return str(getattr(self.fabric.strategy.precision, "precision", "32-true"))


class FabricProfiler(WindowResults):
    """Profile batches ``[warmup_steps, warmup_steps + profile_steps)`` of a Fabric loop (see the module's example).

    Args:
        fabric: the script's launched :class:`lightning.fabric.Fabric`.
        model: the module ``fabric.setup`` returned (the one the loop calls).
        optimizers: its optimizer, or a list of them (as ``fabric.setup`` returned them).
        warmup_steps, profile_steps, output, batch_size_fn, count_flops, capture_ops, model_name, verbose, max_series,
            measure_checkpoint, recommend, constraints, report, service: as :class:`~.callback.SriftyCallback`'s.
            With ``recommend`` the ``constraints`` must give the run's length (``Constraints(steps=...)``, optimizer
            steps; or ``samples``, or ``epochs`` with ``steps_per_epoch``): a Fabric loop has no ``max_steps`` to
            read it from.
        accumulate_grad_batches: batches per optimizer step (the loop's gradient accumulation); a ``step`` is one
            batch.
        dataloader: the training loader (its ``num_workers`` goes in the profile).
        state: the loop's checkpointed state (``FabricPreemption``'s): the checkpoint cost is measured by
            ``fabric.save`` of it (else of the model and optimizers), and ``state["srifty_profiled"]`` records that
            the run was profiled, so that a run resumed from its checkpoint is not profiled again (``reprofile``).
        reprofile: profile a resumed run again.
    """

    owner = "FabricProfiler"
    kept_in = "prof.profile"
    SETTINGS: ClassVar[dict[str, Setting]] = {
        "warmup_steps": Setting("int", minimum=1, fix="The first batch carries one-off costs and is never profiled."),
        "profile_steps": Setting("int", minimum=1),
        "max_series": Setting("int", minimum=0),
        "accumulate_grad_batches": Setting("int", minimum=1),
    }

    def __init__(
        self,
        fabric: Any,
        model: torch.nn.Module,
        optimizers: Any,
        *,
        warmup_steps: int = 20,
        profile_steps: int = 200,
        output: str | os.PathLike[str] | None = DEFAULT_OUTPUT,
        batch_size_fn: Callable[[Any], int] | None = None,
        count_flops: bool = True,
        capture_ops: bool = True,
        model_name: str | None = None,
        verbose: bool = True,
        max_series: int = 1000,
        measure_checkpoint: bool = True,
        recommend: bool = True,
        constraints: Constraints | Mapping[str, Any] | None = None,
        report: bool = True,
        service: Any = None,
        accumulate_grad_batches: int = 1,
        dataloader: Any = None,
        state: dict[str, Any] | None = None,
        reprofile: bool = False,
    ) -> None:
        check_settings(self.owner, self.SETTINGS, locals())
        _check_fabric(fabric, model)
        optimizers = _optimizers(optimizers)
        self._results_init()
        self.warmup_steps, self.profile_steps, self.max_series = int(warmup_steps), int(profile_steps), int(max_series)
        self.measure_checkpoint, self.recommend, self.report = bool(measure_checkpoint), bool(recommend), bool(report)
        self.constraints = check_constraints(self.owner, constraints)
        if self.recommend and not has_work(self.constraints):
            raise ConfigError(
                "FabricProfiler(recommend=True) ranks fleets for the whole run, and a Fabric loop's length is its "
                "own: pass constraints=Constraints(steps=...) (optimizer steps; or samples=, or epochs= with "
                "steps_per_epoch=), or recommend=False to write the profile only (then `srifty recommend "
                "srifty/profile.json --steps N`).",
                parameter="constraints",
                value=constraints,
            )
        self.service, self._post_observation = service_client(self.owner, "service", service), True
        _check_output_and_batch_size_fn(self.owner, output, batch_size_fn)
        if output == DEFAULT_OUTPUT:
            output = launch_output() or output
        self.output = Path(output) if output is not None else None
        self.model_name, self.verbose = model_name or type(_original(model)).__name__, bool(verbose)
        self.fabric, self.model = fabric, model
        self.state = state if state is not None else _state_of(model, optimizers)
        self._window: ProfileWindow | None = None
        self._loader: Any = None
        self._epochs: int | None = None
        self._backward_marked = self._warned = False
        if state is not None and state.get(PROFILED_KEY) and not reprofile:
            log.info("FabricProfiler: this run was already profiled (its state says so); pass reprofile=True.")
            return
        self._start(optimizers, int(accumulate_grad_batches), dataloader, batch_size_fn, count_flops, capture_ops)

    def _start(
        self, optimizers: list[Any], accumulate: int, loader: Any, batch_size_fn: Any, flops: bool, ops: bool
    ) -> None:
        """The window, on every rank or on none: a rank that cannot start it (never a reason to stop training) would
        leave the others waiting in the window's end, so the ranks agree first (one all-reduce, here only)."""
        from lightning_srifty.imds import MetadataLookup

        window = None
        try:
            wrapped = getattr(self.model, "_forward_module", self.model)  # DDP / FSDP / the module itself
            timer, why = _allreduce_timer(wrapped)
            self.run = FabricView(
                self.fabric, self.state, wrapped, timer, optimizers=optimizers, accumulate=accumulate, loader=loader
            )
            window = ProfileWindow(
                self.run,  # type: ignore[arg-type]  # duck-typed: a Fabric read as a Trainer
                warmup_steps=self.warmup_steps,
                profile_steps=self.profile_steps,
                capture_ops=ops,
                count_flops=flops,
                batch_size_fn=batch_size_fn,
            )
            window.no_timer_reason, window.owner = why, self.owner
        except Exception as exc:  # noqa: BLE001 - the profiler must never stop training
            log.error("FabricProfiler could not start profiling (%s: %s); training goes on.", type(exc).__name__, exc)
        if not _every_rank(self.fabric, window is not None):
            if window is not None:
                log.error("FabricProfiler: another rank could not start profiling; this one does not profile either.")
            return
        assert window is not None
        self._output_ok = self._check_output() if self.run.is_global_zero else True
        self._imds = MetadataLookup()
        self._window = window
        self._loader, self._epochs = loader, _epochs_begun(loader)
        watch_for_other_work(self)  # FabricPreemption's checkpoints leave their step out

    # --- the loop's marks --------------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """The window is measured (or was never to be): the loop may stop, or train on unprofiled."""
        return self._window is None or self._window.done

    def step(self, batch: Any) -> contextlib.AbstractContextManager[None]:
        """One training batch, from its start (the data wait before it is the step's ``data`` phase) to its
        optimizer step; a batch that raises is left out and the window goes on (every rank must reach its end).
        Outside the window: a context that does nothing (one shared object)."""
        window = self._measuring()
        return _NOTHING if window is None else self._measured(window, batch)

    @contextlib.contextmanager
    def _measured(self, window: ProfileWindow, batch: Any) -> Iterator[None]:
        self._backward_marked = False
        if (begun := _epochs_begun(self._loader)) != self._epochs:  # the loader started an epoch (its workers...)
            self._epochs = begun
            window.interrupt("epoch_boundary")
        window.begin_batch(self.run, batch)  # type: ignore[arg-type]
        try:
            yield
        except BaseException:
            # this rank's batch only: the step is left out and counted, and the window goes on, so that every rank
            # reaches the window's end (its collectives) at the same batch; a loop that dies leaves it unfinished
            if window.flops is not None and window.flops.active:
                window.flops.abort("the captured batch raised an exception")
            window.interrupt("exception")
            self._end(window)
            raise
        self._check_backward_marked(window)
        self._end(window)

    def _end(self, window: ProfileWindow) -> None:
        if window.end_batch():
            self._finish(window, truncated=False)

    def _finish(self, window: ProfileWindow, *, truncated: bool) -> None:
        self._finish_window(self.run, _original(self.model), window, truncated=truncated)
        self.state[PROFILED_KEY] = True  # FabricPreemption's checkpoints carry it to a resumed run

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``fabric.backward(loss, ...)``, its start and end marked (the step's backward phase, and where the
        operator capture's optimizer phase begins)."""
        window = self._measuring()
        if window is not None:
            self._backward_marked = True
            window.before_backward()
        self.fabric.backward(loss, *args, **kwargs)
        if window is not None:
            window.after_backward()

    def interrupt(self, why: str) -> None:
        """Work that is not training ran since the last step or runs in this one (validation, a log's sync): that
        step is left out of the statistics and counted by ``why``. ``FabricPreemption``'s checkpoints say so
        themselves."""
        if (window := self._measuring()) is not None:
            window.interrupt(str(why))

    def finish(self) -> None:
        """The loop ended (leaving the ``with`` block does it): a window cut short is profiled as far as it ran."""
        window = self._measuring()
        longer = f"{self.warmup_steps + self.profile_steps} batches, or give fewer warmup_steps / profile_steps"
        if window is not None and self._cut_short(self.run, window, unit="batch(es)", longer=longer):
            self._finish(window, truncated=True)

    def __enter__(self) -> FabricProfiler:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        if error is None:
            self.finish()
        elif (window := self._measuring()) is not None:
            window.abort("the loop raised an exception")

    # --- inside ------------------------------------------------------------------------------------------------------

    def _measuring(self) -> ProfileWindow | None:
        window = self._window
        return window if window is not None and not window.done else None

    def _check_backward_marked(self, window: ProfileWindow) -> None:
        """A batch whose backward the profiler did not see: no phases, and no operator table (its backward's
        operators would be counted as the forward's); said once, with the fix."""
        if self._backward_marked:
            return
        if window.ops is not None and window.ops.active:
            window.ops.abort(
                "the captured batch's backward was not marked: call prof.backward(loss) instead of "
                "fabric.backward(loss)"
            )
        if not self._warned and self.run.is_global_zero:
            self._warned = True
            log.warning(
                "FabricProfiler: a batch ran without prof.backward(loss): call it instead of fabric.backward(loss) "
                "for the step's forward / backward / optimizer phases and the operator table."
            )


def _check_fabric(fabric: Any, model: Any) -> None:
    check_fabric("FabricProfiler", fabric, ("strategy", "backward", "save", "global_rank", "world_size", "all_reduce"))
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"FabricProfiler(model=...) takes the module fabric.setup returned, not a {type(model).__name__}.",
            parameter="model",
            value=type(model).__name__,
        )


def _optimizers(given: Any) -> list[Any]:
    items = list(given) if isinstance(given, (list, tuple)) else [given]
    for item in items:
        if not isinstance(getattr(item, "optimizer", item), torch.optim.Optimizer):
            raise ConfigError(
                "FabricProfiler(optimizers=...) takes the optimizer fabric.setup returned (or a list of them), not a "
                f"{type(item).__name__}.",
                parameter="optimizers",
                value=type(item).__name__,
            )
    return items


def _original(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module under Fabric's wrapper (``_FabricModule.module``)."""
    inner = getattr(model, "module", None)
    return inner if type(model).__name__ == "_FabricModule" and isinstance(inner, torch.nn.Module) else model


def _state_of(model: torch.nn.Module, optimizers: list[Any]) -> dict[str, Any]:
    """What a checkpoint of the loop holds when the script gives no state: the model and its optimizers."""
    state: dict[str, Any] = {"model": model}
    for i, optimizer in enumerate(optimizers):
        state["optimizer" if i == 0 else f"optimizer_{i}"] = optimizer
    return state


def _allreduce_timer(wrapped: torch.nn.Module) -> tuple[Any, str | None]:
    """For a DDP module: the all-reduce timer, registered as its communication hook around DDP's own mean (Fabric
    registers none; gradients bit for bit those of plain DDP), or the one a profiler before registered there;
    (None, why) where there is nothing to time or another hook is already there (torch takes one)."""
    from torch.nn.parallel import DistributedDataParallel

    from lightning_srifty.comm import AllReduceTimer, mean_allreduce_hook, timed_comm_hook

    ddp = getattr(wrapped, "_orig_mod", wrapped)  # fabric.setup(torch.compile(model)): compiled around DDP
    if not isinstance(ddp, DistributedDataParallel):  # a single process and FSDP never read it (the window
        # times FSDP's collectives itself); DeepSpeed's or a model-parallel strategy's gradients pass no DDP module
        return None, f"all-reduce not timed: the module is a {type(ddp).__name__}, not DDP's, to hook"
    hooks = list(getattr(ddp, "_comm_hooks", None) or [])
    for hook, state in hooks:
        if hook is timed_comm_hook and getattr(state, "timer", None) is not None:
            return state.timer, None  # this model's earlier profiler's hook (reprofile=True)
    if hooks:
        return None, "all-reduce not timed: the DDP module already has a communication hook (torch takes one)"
    timer = AllReduceTimer()
    state, hook = timer.wrap(mean_allreduce_hook, None)
    try:
        ddp.register_comm_hook(state=state, hook=hook)
    except RuntimeError as exc:  # a built-in hook (register_builtin_comm_hook) is not in _comm_hooks
        return None, f"all-reduce not timed: the DDP module did not take the profiler's hook ({exc})"
    if torch.distributed.is_initialized():
        timer.backend = str(torch.distributed.get_backend())
    return timer, None


def _every_rank(fabric: Any, ok: bool) -> bool:
    """Whether ``ok`` holds on every rank (one all-reduce; ``ok`` itself in a single process)."""
    if int(getattr(fabric, "world_size", 1) or 1) <= 1:
        return ok
    flag = torch.tensor([0 if ok else 1], device=fabric.device)
    return int(fabric.all_reduce(flag, reduce_op="sum").item()) == 0


def _epochs_begun(loader: Any) -> int | None:
    """How many times Fabric's loader (``fabric.setup_dataloaders``) has begun an epoch: each begin is a step of other
    work (a sampler's shuffle, a worker pool's start) that the window leaves out, as a Trainer's callback does."""
    count = getattr(loader, "_num_iter_calls", None)
    return count if isinstance(count, int) else None
