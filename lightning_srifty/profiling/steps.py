"""A run's steps in the one vocabulary (:mod:`predictor.documents.work`): a step is one batch of the global batch
(accumulation included) whatever its optimizers. Lightning's ``global_step`` and ``max_steps`` count every
optimizer's step: the same with automatic optimization (one optimizer), k a batch for a manual loop that steps k
optimizers (a GAN's generator and discriminator: 2; a trial's GAN was planned twice its work)."""

from __future__ import annotations

from typing import Any


def optimizer_steps_per_batch(trainer: Any) -> float:
    """Lightning's global_step counts a batch makes: 1 with automatic optimization (one optimizer, accumulation or
    not), else the optimizer steps per batch processed so far, on average (1 before the first): a GAN's 2, a WGAN's
    critic stepped every batch and its generator every fifth 1.2 (a trial's read 1, rounded, and its work 20 % more)."""
    if not manual_optimization(getattr(trainer, "lightning_module", None)):
        return 1.0
    progress = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "batch_progress", None)
    processed = getattr(getattr(progress, "total", None), "processed", 0)
    # the processed count is the hooks' own (a batch's on_train_batch_end sees it counted; Lightning's count of the
    # batches that stepped comes a moment later), and it is checkpointed with the loop, so a resumed run reads it too
    if not (isinstance(processed, int) and processed > 0):
        return 1.0
    return max(1.0, round(int(trainer.global_step) / processed, 6))


def batches_stepped(trainer: Any) -> int:
    """The steps the run has made, in the vocabulary's steps: ``global_step`` over the optimizer steps a batch makes."""
    return int(int(trainer.global_step) / optimizer_steps_per_batch(trainer) + 1e-6)


def manual_optimization(pl_module: Any) -> bool:
    """The module steps its own optimizers (``automatic_optimization=False``)."""
    return getattr(pl_module, "automatic_optimization", True) is False


def optimization_record(trainer: Any, pl_module: Any) -> dict[str, Any]:
    """The profile's batch fields of a manual loop (nothing for automatic optimization: the profile stays as before)."""
    if not manual_optimization(pl_module):
        return {}
    k = optimizer_steps_per_batch(trainer)
    return {"manual_optimization": True, **({"optimizer_steps_per_batch": k} if k > 1 + 1e-9 else {})}
