"""How much training, in one vocabulary: samples, batches, optimizer steps and gradient accumulation.

A *step* is an optimizer step of the global batch everywhere (Lightning's ``max_steps`` and ``trainer.global_step``,
the callback's ``total_steps``, ``srifty recommend --steps``, the ranker's ``steps``). A module that steps k optimizers
a batch by itself (a GAN's generator and discriminator) makes Lightning count k a step: its profile says so
(``batch.optimizer_steps_per_batch``), and a step here is still one batch of the global batch
(:mod:`lightning_srifty.profiling.steps`). A *batch* is what one rank's DataLoader yields
(a micro-batch when gradients are accumulated). The *global batch* is the samples of one optimizer step over every
rank, accumulation included: ``per-rank batches summed x accumulate_grad_batches``. :func:`global_batch` is the one
place it is read from a profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.documents.checks import check_int, check_number
from predictor.documents.profile import Profile
from predictor.exceptions import ConfigError


def profile_world(profile: Profile) -> int:
    """Ranks the profile ran on: ``hardware.world_size``, else devices x nodes."""
    hw = profile.hardware
    return int(hw.world_size or hw.devices * hw.nodes)


def global_batch(profile: Profile) -> int:
    """Samples per optimizer step of the profiled run, over every rank and accumulation included.

    ``batch.all_devices`` (samples per batch over all ranks) when the profile has it, else ``batch.per_device`` x
    the ranks (``hardware.world_size``, else ``devices x nodes``), times ``batch.accumulate_grad_batches``.
    """
    b = profile.batch
    per_batch = b.all_devices or b.per_device * profile_world(profile)
    return int(per_batch * (b.accumulate_grad_batches or 1))


@dataclass(frozen=True)
class Work:
    """An amount of training: ``samples``, at ``global_batch`` samples per optimizer step made of
    ``accumulate_grad_batches`` batches."""

    samples: float
    global_batch: int
    accumulate_grad_batches: int = 1

    def __post_init__(self) -> None:
        check_int("Work()", "global_batch", self.global_batch, minimum=1)
        check_int("Work()", "accumulate_grad_batches", self.accumulate_grad_batches, minimum=1)
        check_number("Work()", "samples", self.samples, minimum=0, exclusive=True)

    @property
    def optimizer_steps(self) -> float:
        return self.samples / self.global_batch

    @property
    def batches(self) -> float:
        """Batches each rank runs (optimizer steps x accumulation)."""
        return self.optimizer_steps * self.accumulate_grad_batches

    @property
    def batch_samples(self) -> float:
        """Samples of one batch over every rank."""
        return self.global_batch / self.accumulate_grad_batches

    @classmethod
    def of_steps(cls, steps: float, global_batch: int, accumulate_grad_batches: int = 1) -> Work:
        """``steps`` optimizer steps of ``global_batch`` samples."""
        return cls(float(steps) * global_batch, global_batch, accumulate_grad_batches)

    @classmethod
    def of_batches(cls, batches: float, global_batch: int, accumulate_grad_batches: int = 1) -> Work:
        """``batches`` batches per rank (``accumulate_grad_batches`` of them make one optimizer step)."""
        return cls(float(batches) * global_batch / accumulate_grad_batches, global_batch, accumulate_grad_batches)

    @classmethod
    def of_profile(cls, profile: Profile, *, steps: float | None = None, samples: float | None = None) -> Work:
        """Work in the profiled run's global batch: ``steps`` optimizer steps, or ``samples``."""
        accumulation = int(profile.batch.accumulate_grad_batches or 1)
        gb = global_batch(profile)
        if samples is not None:
            return cls(float(samples), gb, accumulation)
        if steps is None:
            raise ConfigError("Give the work as 'steps' or 'samples'.", parameter="steps", value=None)
        return cls.of_steps(steps, gb, accumulation)
