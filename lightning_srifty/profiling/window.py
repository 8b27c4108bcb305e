"""One profiling window of a run: what :class:`~lightning_srifty.profiling.callback.SriftyCallback`'s hooks feed.

A :class:`ProfileWindow` holds the step recorder, the collective timers (``srifty_ddp``'s all-reduce timer, FSDP's
all-gathers and reduce-scatters), the operator capture or FLOP counter of the last warm-up batch, the validation
batches' times and the notes; it goes ``waiting`` (warm-up) -> ``profiling`` -> ``done``, and at the end gives this
rank's :class:`~lightning_srifty.profiling.assemble.RankPayload`. It knows nothing of where the profile goes.
"""

from __future__ import annotations

import datetime as _dt
import math
import socket
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_srifty.profiling import hardware as hw
from lightning_srifty.profiling.assemble import RankPayload, assemble_profile
from lightning_srifty.profiling.flops import StepFlopCounter
from lightning_srifty.profiling.model_info import batch_size, normalize_precision
from lightning_srifty.profiling.ops_capture import StepOpCapture
from lightning_srifty.profiling.recorder import StepRecorder
from lightning_srifty.profiling.run_record import hardware_record, model_record
from lightning_srifty.profiling.sharded import ShardedCollectiveTimer, fsdp_units, layout_name
from lightning_srifty.profiling.steps import manual_optimization, optimization_record
from lightning_srifty.timing import clock_for
from predictor.documents.profile import Profile
from predictor.model.stats import summarize

WAITING, PROFILING, DONE = "waiting", "profiling", "done"


class ProfileWindow:
    """Training batches ``[warmup_steps, warmup_steps + profile_steps)`` measured on one rank.

    Args:
        trainer: the Trainer whose strategy and device are measured.
        warmup_steps: batches before the window; the last one's operators (or FLOPs) are captured.
        profile_steps: batches in the window.
        capture_ops: capture the ATen operator table (which gives the FLOPs too).
        count_flops: count FLOPs with torch's ``FlopCounterMode`` when the table is not captured.
        batch_size_fn: ``batch -> samples``, else read off the batch's first tensor.
    """

    def __init__(
        self,
        trainer: pl.Trainer,
        *,
        warmup_steps: int,
        profile_steps: int,
        capture_ops: bool,
        count_flops: bool,
        batch_size_fn: Callable[[Any], int] | None,
    ) -> None:
        self.warmup_steps, self.profile_steps, self.batch_size_fn = warmup_steps, profile_steps, batch_size_fn
        self.count_flops = count_flops
        self.device = trainer.strategy.root_device
        self.recorder = StepRecorder(clock_for(self.device))
        # srifty_ddp's all-reduce timer (lightning_srifty.comm), read off the strategy: the profiler sits below them
        self.timer = getattr(trainer.strategy, "allreduce_timer", None)
        # FSDP's all-gathers and reduce-scatters, on every rank (Lightning's FSDPStrategy and its subclasses)
        self.sharded = (
            ShardedCollectiveTimer() if fsdp_units(trainer.strategy.model or trainer.lightning_module) else None
        )
        # one mode for both when the table is captured (same flop formulas); the plain flop counter otherwise
        self.ops = StepOpCapture() if capture_ops else None
        self.flops = self.ops if self.ops is not None else StepFlopCounter() if count_flops else None
        self.seen = 0
        self.val_batch_s: list[float] = []  # validation batches' seconds until the profile is written
        self._val_started: float | None = None
        self.first_step: int | None = None
        self.notes: list[str] = []
        self.batch_source = "batch_size_fn" if batch_size_fn else "detected"
        self.no_timer_reason: str | None = None  # why a DDP run's all-reduces are not timed, when it is not srifty_ddp
        self.owner = "SriftyCallback"  # the profiler the notes' advice names (FabricProfiler in a Fabric loop)
        self.phase = WAITING

    @property
    def done(self) -> bool:
        return self.phase is DONE

    # --- the training batch ------------------------------------------------------------------------------------------

    def begin_batch(self, trainer: pl.Trainer, batch: Any) -> None:
        n = self.seen
        if n == self.warmup_steps:
            self._start()
        if n > 0:  # step 0 only anchors the recorder at its end
            if self.timer is not None:
                self.timer.step = n
            if self.sharded is not None:
                self.sharded.step = n
            self.recorder.begin(n, self._samples(batch))
        if self.flops is not None and n == self.warmup_steps - 1:
            self.recorder.interrupt("flop_counter")
            if self.ops is not None:
                on_cpu = self.device.type != "cuda"
                mixed = str(trainer.precision).endswith("-mixed") or str(trainer.precision) in ("16", "bf16")
                self.ops.start_forward(
                    emulate_cuda_autocast=on_cpu and mixed,
                    optimizers=trainer.optimizers,
                    first_step=n == 0,
                    manual=manual_optimization(trainer.lightning_module),
                )
            else:
                self.flops.start_forward()

    def before_zero_grad(self) -> None:
        if self.ops is not None and self.ops.active:
            self.ops.start_optimizer()

    def before_backward(self) -> None:
        if self.flops is not None and self.flops.active:
            self.flops.start_backward()
        self.recorder.before_backward()

    def after_backward(self) -> None:
        if self.ops is not None and self.ops.active:
            self.ops.start_optimizer()
        self.recorder.after_backward()

    def end_batch(self) -> bool:
        """The batch's end; True when the window is complete."""
        if self.flops is not None and self.flops.active:
            self.flops.finish()
        self.recorder.end()
        self.seen += 1
        return self.phase is PROFILING and self.recorder.steps >= self.profile_steps

    def interrupt(self, why: str) -> None:
        """Work inside the window that is not a training step (validation, a checkpoint, an epoch's boundary)."""
        self.recorder.interrupt(why)

    def _start(self) -> None:
        self.phase = PROFILING
        self.first_step = self.seen
        self.recorder.reset()
        hw.reset_peak_memory(self.device)
        if self.timer is not None:
            self.timer.start(self.recorder.clock)
        if self.sharded is not None:
            self.sharded.start(self.recorder.clock)

    def _samples(self, batch: Any) -> int | None:
        if self.batch_size_fn is not None:
            try:
                return int(self.batch_size_fn(batch))
            except Exception as exc:  # noqa: BLE001 - a bad batch_size_fn must not stop training
                self.notes.append(f"batch_size_fn raised {type(exc).__name__}: {exc}")
                return None
        return batch_size(batch)

    # --- validation --------------------------------------------------------------------------------------------------

    def validation_batch_started(self) -> None:
        self._val_started = time.perf_counter()

    def validation_batch_ended(self) -> None:
        started, self._val_started = self._val_started, None
        if started is not None and self.phase is not DONE and len(self.val_batch_s) < 1000:
            self.val_batch_s.append(time.perf_counter() - started)

    def validation(self, trainer: pl.Trainer) -> dict[str, Any] | None:
        """How often the run validates (Lightning's own cadence) and its batches' time here, or None without a
        validation loop; the profile keeps it and the plan says what it adds (issue #37 L)."""
        try:
            batches = [int(b) for b in trainer.num_val_batches if math.isfinite(b)]
        except (AttributeError, TypeError):
            batches = []
        if not self.val_batch_s and not sum(batches):
            return None
        every = getattr(trainer, "val_check_batch", None)
        epochs = getattr(trainer, "check_val_every_n_epoch", None)
        seconds = getattr(trainer, "_val_check_time_interval", None)  # a time-based val_check_interval, in seconds
        share = getattr(trainer, "val_check_interval", None)  # a float is a share of this run's epoch
        epoch = getattr(trainer, "num_training_batches", None)
        timed_ok = isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0
        every_s = float(seconds) if timed_ok and seconds is not None else None
        timed = every_s is not None
        return {
            "every_batches": int(every) if isinstance(every, (int, float)) and math.isfinite(every) else None,
            "every_epochs": int(epochs) if isinstance(epochs, int) and epochs > 0 else None,
            "every_epoch_fraction": float(share) if isinstance(share, float) and 0 < share <= 1 and not timed else None,
            "every_s": every_s,
            "epoch_batches": int(epoch) if isinstance(epoch, (int, float)) and math.isfinite(epoch) and epoch else None,
            "batches": sum(batches) if batches else None,
            "batch_s": summarize(self.val_batch_s) if self.val_batch_s else None,
        }

    # --- the end -----------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """The window is over: no more hooks, the collective timers stop."""
        self.phase = DONE
        if self.timer is not None:
            self.timer.stop()
        if self.sharded is not None:
            self.sharded.stop()

    def abort(self, why: str) -> None:
        """Training raised: the capture in progress is dropped."""
        if self.flops is not None:
            self.flops.abort(why)
        self.stop()

    def payload(self, trainer: pl.Trainer) -> RankPayload:
        """This rank's measurements (an error in words instead, for rank 0 to report)."""
        rank = trainer.global_rank
        try:
            series = self.recorder.resolve()
            comm = self.timer.resolve(series.indices) if self.timer is not None else None
            sharded = self.sharded.resolve(series.indices) if self.sharded is not None else None
            name = hw.device_info(self.device).get("device_name")
            return RankPayload(
                rank=rank,
                ops=self._op_table(trainer, series),
                series=series,
                comm=comm,
                sharded=sharded,
                device_name=name,
                hostname=socket.gethostname(),
                peak_memory=hw.peak_memory(self.device),
            )
        except Exception as exc:  # noqa: BLE001 - reported to rank 0 instead of raising
            return RankPayload(rank=rank, error=f"{type(exc).__name__}: {exc}")

    def _op_table(self, trainer: pl.Trainer, series: Any) -> Any:
        """This rank's operator table (only rank 0's is sent), with the reason in the notes when there is none."""
        if self.ops is None or not trainer.is_global_zero:
            return None
        samples = next((s for s in series.samples if s), None)
        device = self.device.type if self.device.type in ("cpu", "cuda") else None
        table = self.ops.table(
            samples=samples, device=device or "cpu", precision=normalize_precision(trainer.precision)
        )
        if table is None or device is None:
            why = self.ops.reason or ("the batch size is unknown" if not samples else f"device {self.device.type}")
            if self.seen < self.warmup_steps:  # the capture is of the last warm-up step, which never came (#37 L)
                why = (
                    f"the run ended during warm-up ({self.seen} steps), before step {self.warmup_steps}, whose batch "
                    f"the table is captured on: train longer, or give {self.owner}(warmup_steps=...) fewer steps"
                )
            self.notes.append(f"no operator table: {why}")
            return None
        return table

    def profile(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        payloads: list[RankPayload],
        truncated: bool,
        checkpoint: dict[str, Any] | None,
        meta: Any,
        model_name: str | None,
        max_series: int,
    ) -> Profile:
        """The run's profile (rank 0), from every rank's payload, the checkpoint's measured cost and the instance
        metadata ``meta`` (None off EC2)."""
        notes = list(self.notes)
        lead = payloads[0].series
        first = self.first_step
        if first is None:
            first = lead.indices[0] if lead and lead.indices else 1
        if truncated and self.first_step is not None:
            notes.append(
                f"The run ended inside the profile window: {self.recorder.steps} of {self.profile_steps} "
                f"requested steps ran ({len(lead.step_s) if lead else 0} kept)."
            )
        if lead is not None and lead.step_s and not lead.phase_steps and manual_optimization(pl_module):
            notes.append(
                "the module steps its own optimizers (automatic_optimization=False) with more than one backward pass "
                "a batch: the step's time is measured, not split into data, forward, backward and optimizer phases"
            )
        hardware = hardware_record(trainer, self.device, meta, notes)
        samples = next((s for s in (lead.samples if lead else []) if s), None)
        counted = self.count_flops and self.flops is not None
        flops = self.flops.per_sample(samples) if counted and self.flops else {"reason": "count_flops=False"}
        return assemble_profile(
            checkpoint=checkpoint,
            ranks=payloads,
            model=model_record(trainer, pl_module, flops, model_name, notes),
            hardware=hardware,
            batch_source=self.batch_source,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            loader_workers=loader_workers(trainer),
            optimization=optimization_record(trainer, pl_module),
            window={
                "first_step": first,
                "requested_steps": self.profile_steps,
                "truncated": truncated,
                "clock": self.recorder.clock.name,
            },
            software=hw.software_versions(),
            notes=notes,
            max_series=max_series,
            comm_reason=self.comm_reason(trainer),
            backend=self.timer.backend if self.timer is not None else _backend(self.sharded),
            layout=layout_name(trainer.strategy, trainer.strategy.model or pl_module),
            validation=self.validation(trainer),
            created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )

    def comm_reason(self, trainer: pl.Trainer) -> str | None:
        """Why the profile has no all-reduce timing, or None when it has one."""
        if trainer.world_size == 1:
            return "a single process: no gradient all-reduce"
        if self.sharded is not None:
            return None
        if self.timer is None:
            return self.no_timer_reason or "all-reduce is timed only with strategy='srifty_ddp'"
        return None


def _backend(timer: ShardedCollectiveTimer | None) -> str | None:
    dist = torch.distributed
    return str(dist.get_backend()) if timer is not None and dist.is_available() and dist.is_initialized() else None


def loader_workers(trainer: Any) -> int | None:
    """The training DataLoader's ``num_workers`` (Lightning's CombinedLoader: its first loader), None when not a
    DataLoader or not set up."""
    loader = getattr(trainer, "train_dataloader", None)
    flat = getattr(loader, "flattened", None)  # CombinedLoader
    if isinstance(flat, list) and flat:
        loader = flat[0]
    workers = getattr(loader, "num_workers", None)
    return workers if isinstance(workers, int) and workers >= 0 else None
