"""SriftyCallback: profile a window of the real training run and write ``srifty.profile/v1``.

The callback only maps Lightning hooks onto a :class:`~lightning_srifty.profiling.recorder.StepRecorder` (and the
``srifty_ddp`` all-reduce timer); after the window it detaches: every hook returns at its first line. Nothing
it does may stop training: failures are logged with the fix and training goes on.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_srifty.imds import MetadataLookup
from lightning_srifty.profiling.recommendation import (  # noqa: F401 - lightning_default_length: its former home
    check_constraints,
    fold_deprecated,
    lightning_default_length,
    service_client,
)
from lightning_srifty.profiling.results import (  # noqa: F401 - not_the_launchs_plan, summary_lines: former home
    DEFAULT_OUTPUT,
    WindowResults,
    launch_output,
    not_the_launchs_plan,
    summary_lines,
)
from lightning_srifty.profiling.run_record import hardware_record, matmul_precision, model_record  # noqa: F401
from lightning_srifty.profiling.window import ProfileWindow
from predictor.documents.checks import Setting, check_settings
from predictor.exceptions import ConfigError
from predictor.ranking.constraints import Constraints

if TYPE_CHECKING:
    from predictor.service.client import ServiceClient

log = logging.getLogger("lightning_srifty")


class SriftyCallback(Callback, WindowResults):
    """Profile training steps ``[warmup_steps, warmup_steps + profile_steps)`` of ``trainer.fit``.

    Args:
        warmup_steps: batches to let run before measuring (allocator, autotuning, DDP bucket rebuild). >= 1;
            FLOPs are counted on the last warm-up batch.
        profile_steps: batches to measure. If the run is shorter, what ran is profiled and the profile says so.
        output: where rank 0 writes the profile JSON (atomically); ``None`` keeps it in memory only
            (``callback.profile``). Under ``srifty launch`` the default goes to ``srifty/launch-<launch id>/`` (the
            fleet's own measurement, beside the plan it makes), never over the profile the launch's plan came from.
        stop_after_profile: ask the Trainer to stop once the window is measured.
        batch_size_fn: ``batch -> samples`` when the batch size cannot be read off the batch's first tensor.
        count_flops: report FLOPs per sample (``model.flops``), counted on the last warm-up batch: by the operator
            capture when ``capture_ops``, else by torch's ``FlopCounterMode``.
        capture_ops: record the ATen operator table of the last warm-up batch (the profile's ``ops``, which the
            predictor's per-operator model reads); one dispatch mode gives the FLOPs too (FlopCounterMode's formulas).
            On CPU the captured step runs CUDA's autocast policy under mixed precision and foreach optimizers, so
            the table is the CUDA step's. A failure is noted in the profile; training goes on.
        model_name: name recorded in the profile (default: the LightningModule's class name).
        reprofile: profile again after a resume even though the checkpoint says the run was profiled.
        verbose: print the summary table on rank 0.
        max_series: at most this many raw per-step times are kept in the profile.
        measure_checkpoint: at the end of the window, save one full checkpoint to a temporary local folder and read
            it back, to record what a checkpoint costs (the ranker's checkpoint interval and restart cost use it);
            estimated first from the state's size, and only what fits half the free disk and memory is measured.
        recommend: after profiling, rank EC2 fleets for the whole run with :func:`predictor.recommend.recommend`
            (what ``srifty recommend`` runs), print the table and write ``plan.json`` (and ``report.html`` when
            ``report``) beside the profile. A failure of the predictor is logged, never raised.
        constraints: what the ranking is asked, a :class:`predictor.ranking.Constraints` (or a dict of its fields):
            ``Constraints(deadline_h=12, budget_usd=500, market="spot:0.75")``. Checked here, so a typo fails before
            training starts. Without a work (``steps``, ``samples`` or ``epochs``) the run's own length is used: the
            Trainer's ``max_steps``, or ``max_epochs`` x batches per epoch / accumulation (optimizer steps).
        report: write the HTML report (and its plot) beside the plan.
        service: rank through a ``srifty serve`` service instead of in-process (its observations calibrate the
            ranking): a :class:`predictor.service.client.ServiceClient` (``ServiceClient(url, token=...)``) or its URL.
            On EC2 the run also posts its measured throughput there as an observation of the fleet it runs on (posting
            needs the service's token: ``token=`` or ``$SRIFTY_SERVICE_TOKEN``).

    The 0.1 arguments ``total_steps``, ``deadline_h``, ``budget_usd``, ``objective``, ``market``, ``regions``,
    ``max_instances``, ``max_types``, ``scaling``, ``allow_arm64``, ``predictor_url``, ``predictor_token`` and
    ``post_observation`` still work with a DeprecationWarning; they go in 0.3.
    """

    PROVIDES_PROFILE = True  # MigrationTriggers (and any other callback) find the run's profile by this, not by type
    SETTINGS: ClassVar[dict[str, Setting]] = {  # the window's numbers, declared once (checks.Setting)
        "warmup_steps": Setting("int", minimum=1, fix="The first batch carries one-off costs and is never profiled."),
        "profile_steps": Setting("int", minimum=1),
        "max_series": Setting("int", minimum=0),
    }

    def __init__(
        self,
        warmup_steps: int = 20,
        profile_steps: int = 200,
        output: str | os.PathLike[str] | None = DEFAULT_OUTPUT,
        stop_after_profile: bool = False,
        *,
        batch_size_fn: Callable[[Any], int] | None = None,
        count_flops: bool = True,
        capture_ops: bool = True,
        model_name: str | None = None,
        reprofile: bool = False,
        verbose: bool = True,
        max_series: int = 1000,
        measure_checkpoint: bool = True,
        recommend: bool = True,
        constraints: Constraints | Mapping[str, Any] | None = None,
        report: bool = True,
        service: ServiceClient | str | None = None,
        **deprecated: Any,
    ) -> None:
        owner = "SriftyCallback()"
        check_settings(owner, self.SETTINGS, locals())
        self.warmup_steps, self.profile_steps, self.max_series = int(warmup_steps), int(profile_steps), int(max_series)
        _check_output_and_batch_size_fn(owner, output, batch_size_fn)
        self.measure_checkpoint = bool(measure_checkpoint)
        self.recommend, self.report = bool(recommend), bool(report)
        own = [name for name in inspect.signature(type(self).__init__).parameters if name not in ("self", "deprecated")]
        constraints, service, self._post_observation = fold_deprecated(owner, deprecated, constraints, service, own)
        self.constraints = check_constraints(owner, constraints)
        self.service = service_client(owner, "service", service)
        self._results_init()
        self._given_output = str(output)  # the state key's: a launch's own default folder changes with each launch
        if output == DEFAULT_OUTPUT:
            output = launch_output() or output
        self.output = Path(output) if output is not None else None
        self.stop_after_profile = bool(stop_after_profile)
        self.batch_size_fn = batch_size_fn
        self.count_flops = bool(count_flops)
        self.capture_ops = bool(capture_ops)
        self.model_name = model_name
        self.reprofile = bool(reprofile)
        self.verbose = bool(verbose)
        self._window: ProfileWindow | None = None  # while a window is measured (None: every hook returns at once)
        self._state_key: str | None = None

    # ----------------------------------------------------------------- state (survives restarts)
    @property
    def state_key(self) -> str:
        # Lightning reads this on every hook call (profiler label): build it once
        if self._state_key is None:
            # the output the script gave, not where a launch put it (srifty/launch-<id>/): a resumed launch (a new id)
            # found no state under its own key and profiled the run again (issue #37 M4)
            self._state_key = self._generate_state_key(output=self._given_output)
        return self._state_key

    def state_dict(self) -> dict[str, Any]:
        return {"profiled": self.profiled, "output": str(self.output) if self.output else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.profiled = bool(state_dict.get("profiled", False))

    # ----------------------------------------------------------------- set-up
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from lightning_srifty.launch_checks import refuse_a_wasted_fleet

        # on a srifty fleet a Trainer pinned to the CPU stops here (the GPUs paid for), and one whose ranks would
        # each train a copy
        refuse_a_wasted_fleet(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window = None
        _warn_launch_mismatches(trainer)
        if self.profiled and not self.reprofile:
            rank_zero_info(  # Lightning's console logger on rank 0 (the package's own logger shows no info)
                "SriftyCallback: this run was already profiled (state restored from the checkpoint); "
                "pass reprofile=True to profile it again."
            )
            return
        try:
            self._setup(trainer)
        except Exception as exc:  # noqa: BLE001 - the profiler must never stop training
            log.error(
                "SriftyCallback could not start profiling (%s: %s); training continues without it.",
                type(exc).__name__,
                exc,
            )

    def _setup(self, trainer: pl.Trainer) -> None:
        window = ProfileWindow(
            trainer,
            warmup_steps=self.warmup_steps,
            profile_steps=self.profile_steps,
            capture_ops=self.capture_ops,
            count_flops=self.count_flops,
            batch_size_fn=self.batch_size_fn,
        )
        self._output_ok = self._check_output() if trainer.is_global_zero else True
        self._imds = MetadataLookup()
        self._window = window

    def _measuring(self) -> ProfileWindow | None:
        """The window while it measures; None once it is done (every hook then returns at its first line)."""
        window = self._window
        return window if window is not None and not window.done else None

    # ----------------------------------------------------------------- per-step hooks
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if (window := self._measuring()) is not None:
            window.begin_batch(trainer, batch)

    def on_before_zero_grad(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if (window := self._measuring()) is not None:
            window.before_zero_grad()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if (window := self._measuring()) is not None:
            window.before_backward()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (window := self._measuring()) is not None:
            window.after_backward()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (window := self._measuring()) is not None and window.end_batch():
            self._finish(trainer, pl_module, window, truncated=False)

    # ----------------------------------------------------------------- non-training work inside the window
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (window := self._measuring()) is not None:
            window.interrupt("validation")

    def on_validation_batch_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if (window := self._measuring()) is not None:
            window.validation_batch_started()

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if (window := self._measuring()) is not None:
            window.validation_batch_ended()

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if (window := self._measuring()) is not None:
            window.interrupt("checkpoint")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (window := self._measuring()) is not None:
            window.interrupt("epoch_boundary")

    # ----------------------------------------------------------------- end of the window / of the run
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (window := self._measuring()) is None:
            return
        longer = f"max_steps >= {self.warmup_steps + self.profile_steps}"
        if self._cut_short(trainer, window, unit="training step(s)", longer=longer):
            self._finish(trainer, pl_module, window, truncated=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if (window := self._measuring()) is not None:
            window.abort("training raised an exception")

    def _finish(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, window: ProfileWindow, *, truncated: bool
    ) -> None:
        self._finish_window(trainer, pl_module, window, truncated=truncated)
        if self.stop_after_profile:
            trainer.should_stop = True


def _check_output_and_batch_size_fn(owner: str, output: Any, batch_size_fn: Any) -> None:
    if output is not None and not isinstance(output, (str, os.PathLike)):
        raise ConfigError(
            f"The 'output' parameter of {owner} must be a path or None. Got {output!r}.",
            parameter="output",
            value=output,
        )
    if batch_size_fn is not None and not callable(batch_size_fn):
        raise ConfigError(
            f"The 'batch_size_fn' parameter of {owner} must be callable (batch -> int). Got {batch_size_fn!r}.",
            parameter="batch_size_fn",
            value=batch_size_fn,
        )


def _warn_launch_mismatches(trainer: pl.Trainer) -> None:
    """Under srifty launch: what the script does otherwise than the plan (never raises)."""
    try:
        from lightning_srifty.launch_checks import launch_mismatches

        for line in launch_mismatches(trainer):
            rank_zero_warn(f"SriftyCallback: {line}.")
    except Exception as exc:  # noqa: BLE001 - a check must never stop training
        rank_zero_warn(f"SriftyCallback: could not compare the Trainer with the plan ({exc})")


_not_the_launchs_plan = not_the_launchs_plan  # its former name (tests, scripts)
