"""SriftyCallback: profile a window of the real training run and write ``srifty.profile/v1``.

The callback only maps Lightning hooks onto a :class:`~lightning_srifty.profiling.recorder.StepRecorder` (and the
``srifty_ddp`` all-reduce timer); after the window it detaches: every hook returns at its first line. Nothing
it does may stop training: failures are logged with the fix and training goes on.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_srifty.ddp.strategy import SriftyDDPStrategy
from lightning_srifty.imds import MetadataLookup
from lightning_srifty.profiling import hardware as hw
from lightning_srifty.profiling.assemble import RankPayload, assemble_profile
from lightning_srifty.profiling.checkpoint_cost import measure_checkpoint
from lightning_srifty.profiling.flops import StepFlopCounter
from lightning_srifty.profiling.model_info import (
    batch_size,
    gradient_bytes,
    normalize_precision,
    optimizer_names,
    optimizer_state_bytes,
    parameter_counts,
)
from lightning_srifty.profiling.ops_capture import StepOpCapture
from lightning_srifty.profiling.recommendation import (
    check_constraints,
    fold_deprecated,
    post_observation,
    service_client,
    with_work,
)
from lightning_srifty.profiling.recorder import StepRecorder
from lightning_srifty.profiling.sharded import ShardedCollectiveTimer, fsdp_units, full_sizes, layout_name, structure
from lightning_srifty.timing import clock_for
from predictor.documents.atomic import check_writable
from predictor.documents.checks import check_int
from predictor.documents.profile import Profile
from predictor.exceptions import ConfigError, SriftyError
from predictor.model.stats import summarize
from predictor.ranking.constraints import Constraints

if TYPE_CHECKING:
    from predictor.service.client import ServiceClient

log = logging.getLogger("lightning_srifty")


def lightning_default_length(trainer: pl.Trainer) -> bool:
    """The Trainer runs Lightning's default length: 1000 epochs when neither max_epochs nor max_steps is given."""
    return trainer.max_epochs == 1000 and (trainer.max_steps is None or trainer.max_steps < 0)


_WAITING, _PROFILING, _DONE = "waiting", "profiling", "done"


DEFAULT_OUTPUT = "srifty/profile.json"


def _launch_output() -> str | None:
    """Under ``srifty launch``: the launch's own profile path, so that a job on the user's machine (the local
    provisioner runs in the project folder) never writes over the profile the launch's plan was made from."""
    from lightning_srifty.protocol import LaunchEnv

    try:
        launch = LaunchEnv.from_env()
    except Exception:  # noqa: BLE001 - another protocol version: SpotPreemption says so; keep the default here
        return None
    return f"srifty/launch-{launch.launch_id}/profile.json" if launch is not None and launch.launch_id else None


class SriftyCallback(Callback):
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
        self.warmup_steps = check_int(
            owner,
            "warmup_steps",
            warmup_steps,
            minimum=1,
            fix="The first batch carries one-off costs and is never profiled.",
        )
        self.profile_steps = check_int(owner, "profile_steps", profile_steps, minimum=1)
        self.max_series = check_int(owner, "max_series", max_series, minimum=0)
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
        self.measure_checkpoint = bool(measure_checkpoint)
        self.recommend, self.report = bool(recommend), bool(report)
        self._val_batch_s: list[float] = []
        self._val_started: float | None = None
        own = [name for name in inspect.signature(type(self).__init__).parameters if name not in ("self", "deprecated")]
        constraints, service, self._post_observation = fold_deprecated(owner, deprecated, constraints, service, own)
        self.constraints = check_constraints(owner, constraints)
        self.service = service_client(owner, "service", service)
        self.plan: Any = None
        self.written: dict[str, Path] = {}  # what rank 0 wrote: "profile", "plan", "report" -> path
        self._given_output = str(output)  # the state key's: a launch's own default folder changes with each launch
        if output == DEFAULT_OUTPUT:
            output = _launch_output() or output
        self.output = Path(output) if output is not None else None
        self.stop_after_profile = bool(stop_after_profile)
        self.batch_size_fn = batch_size_fn
        self.count_flops = bool(count_flops)
        self.capture_ops = bool(capture_ops)
        self.model_name = model_name
        self.reprofile = bool(reprofile)
        self.verbose = bool(verbose)
        self.profiled = False
        self.profile: Profile | None = None
        self._phase = _DONE
        self._recorder: StepRecorder | None = None
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
        from lightning_srifty.ddp.plan_strategy import refuse_idle_gpus

        refuse_idle_gpus(trainer)  # on a srifty fleet a Trainer pinned to the CPU stops here, the GPUs paid for

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._phase = _DONE
        try:
            from lightning_srifty.ddp.plan_strategy import launch_mismatches

            for line in launch_mismatches(trainer):  # under srifty launch: what the script does otherwise
                rank_zero_warn(f"SriftyCallback: {line}.")
        except Exception as exc:  # noqa: BLE001 - a check must never stop training
            rank_zero_warn(f"SriftyCallback: could not compare the Trainer with the plan ({exc})")
        if self.profiled and not self.reprofile:
            self._info(
                trainer,
                "SriftyCallback: this run was already profiled (state restored from the checkpoint); "
                "pass reprofile=True to profile it again.",
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
        self._device = trainer.strategy.root_device
        self._recorder = StepRecorder(clock_for(self._device))
        self._timer = trainer.strategy.allreduce_timer if isinstance(trainer.strategy, SriftyDDPStrategy) else None
        # FSDP's all-gathers and reduce-scatters, on every rank (Lightning's FSDPStrategy and its subclasses)
        self._sharded = (
            ShardedCollectiveTimer() if fsdp_units(trainer.strategy.model or trainer.lightning_module) else None
        )
        # one mode for both when the table is captured (same flop formulas); the plain flop counter otherwise
        self._ops = StepOpCapture() if self.capture_ops else None
        self._flops = self._ops if self._ops is not None else StepFlopCounter() if self.count_flops else None
        self._seen = 0
        self._val_batch_s: list[float] = []  # validation batches' seconds until the profile is written
        self._val_started: float | None = None
        self._first_step: int | None = None
        self._notes: list[str] = []
        self._batch_source = "batch_size_fn" if self.batch_size_fn else "detected"
        self._output_ok = True
        if self.output is not None and trainer.is_global_zero:
            try:
                check_writable(self.output)
            except OSError as exc:
                self._output_ok = False
                log.error(
                    "SriftyCallback cannot write the profile to %s (%s). Training continues and the profile "
                    "is kept in memory (callback.profile); pass output= a writable path to get the file.",
                    self.output,
                    exc.strerror or exc,
                )
        self._imds = MetadataLookup()
        self._phase = _WAITING

    # ----------------------------------------------------------------- per-step hooks
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._phase is _DONE:
            return
        n = self._seen
        if n == self.warmup_steps:
            self._start_window()
        if n > 0:  # step 0 only anchors the recorder at its end
            if self._timer is not None:
                self._timer.step = n
            if self._sharded is not None:
                self._sharded.step = n
            self._recorder.begin(n, self._samples(batch))
        if self._flops is not None and n == self.warmup_steps - 1:
            self._recorder.interrupt("flop_counter")
            if self._ops is not None:
                on_cpu = self._device.type != "cuda"
                mixed = str(trainer.precision).endswith("-mixed") or str(trainer.precision) in ("16", "bf16")
                self._ops.start_forward(
                    emulate_cuda_autocast=on_cpu and mixed, optimizers=trainer.optimizers, first_step=n == 0
                )
            else:
                self._flops.start_forward()

    def on_before_zero_grad(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self._phase is not _DONE and self._ops is not None and self._ops.active:
            self._ops.start_optimizer()

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self._phase is _DONE:
            return
        if self._flops is not None and self._flops.active:
            self._flops.start_backward()
        self._recorder.before_backward()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._phase is _DONE:
            return
        if self._ops is not None and self._ops.active:
            self._ops.start_optimizer()
        self._recorder.after_backward()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._phase is _DONE:
            return
        if self._flops is not None and self._flops.active:
            self._flops.finish()
        self._recorder.end()
        self._seen += 1
        if self._phase is _PROFILING and self._recorder.steps >= self.profile_steps:
            self._finish(trainer, pl_module, truncated=False)

    # ----------------------------------------------------------------- non-training work inside the window
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._phase is not _DONE:
            self._recorder.interrupt("validation")

    def on_validation_batch_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        self._val_started = time.perf_counter()

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        started, self._val_started = self._val_started, None
        if started is not None and self._phase is not _DONE and len(self._val_batch_s) < 1000:
            self._val_batch_s.append(time.perf_counter() - started)

    def _validation(self, trainer: pl.Trainer) -> dict[str, Any] | None:
        """How often the run validates (Lightning's own cadence) and its batches' time here, or None without a
        validation loop; the profile keeps it and the plan says what it adds (issue #37 L)."""
        try:
            batches = [int(b) for b in trainer.num_val_batches if math.isfinite(b)]
        except (AttributeError, TypeError):
            batches = []
        if not self._val_batch_s and not sum(batches):
            return None
        every = getattr(trainer, "val_check_batch", None)
        epochs = getattr(trainer, "check_val_every_n_epoch", None)
        return {
            "every_batches": int(every) if isinstance(every, (int, float)) and math.isfinite(every) else None,
            "every_epochs": int(epochs) if isinstance(epochs, int) and epochs > 0 else None,
            "batches": sum(batches) if batches else None,
            "batch_s": summarize(self._val_batch_s) if self._val_batch_s else None,
        }

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._phase is not _DONE:
            self._recorder.interrupt("checkpoint")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._phase is not _DONE:
            self._recorder.interrupt("epoch_boundary")

    # ----------------------------------------------------------------- end of the window / of the run
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._phase is _DONE:
            return
        if self._recorder.steps == 0:
            self._phase = _DONE
            ran = self._seen
            self._error(
                trainer,
                f"SriftyCallback: no profile written: {ran} training step(s) ran and at least 2 are "
                "needed (the first only anchors the timing). Train longer, e.g. max_steps >= "
                f"{self.warmup_steps + self.profile_steps}.",
            )
            return
        if self._phase is _WAITING:
            self._notes.append(
                f"The run ended during warm-up ({self._seen} steps, warmup_steps={self.warmup_steps}): steps "
                f"1-{self._seen - 1} were profiled instead; expect start-up noise in these figures."
            )
        self._finish(trainer, pl_module, truncated=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._phase is not _DONE:
            self._phase = _DONE
            if self._flops is not None:
                self._flops.abort("training raised an exception")
            if self._timer is not None:
                self._timer.stop()
            if self._sharded is not None:
                self._sharded.stop()

    def _start_window(self) -> None:
        self._phase = _PROFILING
        self._first_step = self._seen
        self._recorder.reset()
        hw.reset_peak_memory(self._device)
        if self._timer is not None:
            self._timer.start(self._recorder.clock)
        if self._sharded is not None:
            self._sharded.start(self._recorder.clock)

    def _samples(self, batch: Any) -> int | None:
        if self.batch_size_fn is not None:
            try:
                return int(self.batch_size_fn(batch))
            except Exception as exc:  # noqa: BLE001 - a bad batch_size_fn must not stop training
                self._notes.append(f"batch_size_fn raised {type(exc).__name__}: {exc}")
                return None
        return batch_size(batch)

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, truncated: bool) -> None:
        self._phase = _DONE
        self.profiled = True
        if self._timer is not None:
            self._timer.stop()
        if self._sharded is not None:
            self._sharded.stop()
        payload = self._local_payload(trainer)
        payloads = _gather(payload, trainer)
        checkpoint = measure_checkpoint(trainer, self._notes) if self.measure_checkpoint else None
        if trainer.is_global_zero:
            try:
                self._write(trainer, pl_module, payloads, truncated, checkpoint)
            except Exception as exc:  # noqa: BLE001 - never crash training because of the profiler
                log.error("SriftyCallback could not build the profile: %s", exc)
        if self._timer is not None:
            self._timer.reset()
        if self.stop_after_profile:
            trainer.should_stop = True

    def _local_payload(self, trainer: pl.Trainer) -> RankPayload:
        rank = trainer.global_rank
        try:
            series = self._recorder.resolve()
            comm = self._timer.resolve(series.indices) if self._timer is not None else None
            sharded = self._sharded.resolve(series.indices) if self._sharded is not None else None
            name = hw.device_info(self._device).get("device_name")
            return RankPayload(
                rank=rank,
                ops=self._op_table(trainer, series),
                series=series,
                comm=comm,
                sharded=sharded,
                device_name=name,
                hostname=socket.gethostname(),
                peak_memory=hw.peak_memory(self._device),
            )
        except Exception as exc:  # noqa: BLE001 - reported to rank 0 instead of raising
            return RankPayload(rank=rank, error=f"{type(exc).__name__}: {exc}")

    def _op_table(self, trainer: pl.Trainer, series: Any) -> Any:
        """This rank's operator table (only rank 0's is sent), with the reason in the notes when there is none."""
        if self._ops is None or not trainer.is_global_zero:
            return None
        samples = next((s for s in series.samples if s), None)
        device = self._device.type if self._device.type in ("cpu", "cuda") else None
        table = self._ops.table(
            samples=samples, device=device or "cpu", precision=normalize_precision(trainer.precision)
        )
        if table is None or device is None:
            why = self._ops.reason or ("the batch size is unknown" if not samples else f"device {self._device.type}")
            if self._seen < self.warmup_steps:  # the capture is of the last warm-up step, which never came (#37 L)
                why = (
                    f"the run ended during warm-up ({self._seen} steps), before step {self.warmup_steps}, whose batch "
                    f"the table is captured on: train longer, or give SriftyCallback(warmup_steps=...) fewer steps"
                )
            self._notes.append(f"no operator table: {why}")
            return None
        return table

    def _write(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        payloads: list[RankPayload],
        truncated: bool,
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        notes = list(self._notes)
        lead = payloads[0].series
        first = self._first_step if self._first_step is not None else (lead.indices[0] if lead and lead.indices else 1)
        if truncated and self._first_step is not None:
            measured = len(lead.step_s) if lead else 0
            notes.append(
                f"The run ended inside the profile window: {self._recorder.steps} of {self.profile_steps} "
                f"requested steps ran ({measured} kept)."
            )
        device = hw.device_info(self._device)
        notes.extend(device.pop("notes"))
        meta = self._imds.result(wait=0.5)  # off EC2 the lookup is already over; on EC2 IMDS answers in ms
        hardware = {
            **device,
            "devices": trainer.num_devices,
            "nodes": trainer.num_nodes,
            "world_size": trainer.world_size,
            "cpu_count": hw.cpu_count(),
            "cpu_model": hw.cpu_model(),
            "cpu_arch": hw.cpu_arch(),
            "instance_type": meta.instance_type if meta else None,
            "availability_zone": meta.availability_zone if meta else None,
            "lifecycle": meta.lifecycle if meta else None,
        }
        samples = next((s for s in (lead.samples if lead else []) if s), None)
        self.profile = assemble_profile(
            checkpoint=checkpoint,
            ranks=payloads,
            model=self._model_info(trainer, pl_module, samples, notes),
            hardware=hardware,
            batch_source=self._batch_source,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            window={
                "first_step": first,
                "requested_steps": self.profile_steps,
                "truncated": truncated,
                "clock": self._recorder.clock.name,
            },
            software=hw.software_versions(),
            notes=notes,
            max_series=self.max_series,
            comm_reason=self._comm_reason(trainer),
            backend=self._timer.backend if self._timer is not None else _backend(self._sharded),
            layout=layout_name(trainer.strategy, trainer.strategy.model or pl_module),
            validation=self._validation(trainer),
            created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )
        written = None
        if self.output is not None and self._output_ok:
            try:
                written = self.written["profile"] = self.profile.save(self.output)
            except OSError as exc:
                log.error(
                    "SriftyCallback could not write the profile to %s (%s); it is kept in callback.profile.",
                    self.output,
                    exc.strerror or exc,
                )
        if self.verbose:
            from lightning_srifty.console import print_profile

            print_profile(self.profile, written)
        if self.recommend:
            self._recommend(trainer)

    def _recommend(self, trainer: pl.Trainer) -> None:
        """Rank fleets for the whole run with :func:`predictor.recommend.recommend` (what ``srifty recommend``
        runs); never raises."""
        try:
            constraints = with_work(self.constraints, trainer)
            if constraints is None:
                rank_zero_info(
                    "SriftyCallback: the run's length is unknown (no max_steps or max_epochs): pass "
                    "constraints=Constraints(steps=...) to get a recommendation."
                )
                return
            if constraints is not self.constraints and lightning_default_length(trainer):
                rank_zero_warn(
                    "SriftyCallback: the recommendation prices 1000 epochs, Lightning's default when the Trainer has "
                    "neither max_epochs nor max_steps; pass Trainer(max_epochs=...) or "
                    "SriftyCallback(constraints=Constraints(steps=...)) for the run you mean."
                )
            from predictor.recommend import recommend

            if self.service is not None and self._post_observation:
                post_observation(self.service, self.profile)
            beside = self.output is not None and self._output_ok
            result = recommend(
                self.profile,
                constraints,
                service=self.service,
                plan_path=self.output.with_name("plan.json") if beside else None,
                report_path=self.output.with_name("report.html") if beside and self.report else None,
            )
            self.plan = result.plan
            self.written.update({k: v for k, v in result.written.items() if k != "plot"})
            if self.verbose:
                from lightning_srifty.console import console, plan_table

                console().print(plan_table(self.plan))
                for line in self.summary():
                    print(line)  # plain: a path must not be wrapped
        except SriftyError as exc:
            rank_zero_warn(f"SriftyCallback: no fleet recommendation: {exc}")
        except Exception as exc:  # noqa: BLE001 - the predictor must never stop training
            log.error(
                "SriftyCallback: the fleet recommendation failed (%s: %s); training continues.", type(exc).__name__, exc
            )

    def _model_info(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, samples: int | None, notes: list[str]
    ) -> dict[str, Any]:
        total, trainable = parameter_counts(pl_module)
        grads = gradient_bytes(pl_module)
        optimizer_state = optimizer_state_bytes(trainer.optimizers)
        wrapped = trainer.strategy.model or pl_module
        full = full_sizes(wrapped)
        if full is not None:  # sharded: the module holds this rank's shard; the profile records the whole model
            total, trainable, grads = full["parameters"], full["trainable"], full["gradient_bytes"]
            optimizer_state *= full["shard_group"]  # each rank holds 1/shard_group of it (padding aside)
        precision = normalize_precision(trainer.precision)
        if precision is None:
            notes.append(f"precision {trainer.precision!r} is not a known Lightning setting; recorded as 32-true")
        counted = self.count_flops and self._flops is not None
        flops = self._flops.per_sample(samples) if counted else {"reason": "count_flops=False"}
        return {
            "name": self.model_name or type(pl_module).__name__,
            "parameters": total,
            "trainable_parameters": trainable,
            "precision": precision or "32-true",
            "float32_matmul_precision": matmul_precision(),
            "gradient_bytes": sum(grads.values()),
            "gradient_bytes_by_dtype": grads,
            "optimizer": optimizer_names(trainer.optimizers),
            "optimizer_state_bytes": optimizer_state,
            "flops": flops,
            "structure": structure(wrapped),
        }

    def _comm_reason(self, trainer: pl.Trainer) -> str | None:
        if trainer.world_size == 1:
            return "a single process: no gradient all-reduce"
        if self._sharded is not None:
            return None
        if self._timer is None:
            return "all-reduce is timed only with strategy='srifty_ddp'"
        return None

    def summary(self) -> list[str]:
        """Where the profile, plan and report went, and how far to trust GPU figures that come from a CPU profile
        (what ``srifty demo`` and a user's own run both say at the end of profiling)."""
        lines = [f"{what} written to {path}" for what, path in self.written.items()]
        if "report" in self.written:
            lines[-1] += " (open it in a browser)"
        hw = self.profile.hardware if self.profile is not None else None
        if self.plan is not None and hw is not None and not hw.gpu and (hw.accelerator or "cpu") == "cpu":
            lines.append(
                "note: this profile ran on the CPU: every GPU figure above (times, costs, the ranking) is "
                "extrapolated from CPU timings through the performance model, and can be off by a wide margin. "
                "Profile on one GPU (srifty demo --accelerator gpu, or SriftyCallback in your own run) for a "
                "prediction to act on."
            )
        return lines

    # ----------------------------------------------------------------- messages
    @staticmethod
    def _info(trainer: pl.Trainer, message: str) -> None:
        rank_zero_info(message)  # Lightning's console logger on rank 0 (the package's own logger shows no info)

    @staticmethod
    def _error(trainer: pl.Trainer, message: str) -> None:
        if trainer.is_global_zero:
            log.error(message)


def _backend(timer: ShardedCollectiveTimer | None) -> str | None:
    dist = torch.distributed
    return str(dist.get_backend()) if timer is not None and dist.is_available() and dist.is_initialized() else None


def _gather(payload: RankPayload, trainer: pl.Trainer) -> list[RankPayload]:
    """Every rank's payload on every rank (rank order), or just this one outside a process group."""
    dist = torch.distributed
    if trainer.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return [payload]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, payload)
    return sorted(gathered, key=lambda p: p.rank)


def matmul_precision() -> str:
    """What fp32 matmuls run at: ``torch.get_float32_matmul_precision()``, except that TF32 enabled another way
    (``torch.backends.cuda.matmul.allow_tf32``, or ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`` as NVIDIA's NGC containers
    set it, which the precision getter does not show) counts as ``"high"``."""
    precision = torch.get_float32_matmul_precision()
    if precision == "highest" and torch.backends.cuda.matmul.allow_tf32:
        return "high"
    return precision
