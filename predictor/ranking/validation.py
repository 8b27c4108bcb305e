"""What the run's validation adds to a plan, which the predicted times do not hold (issue #37 L): how often it
runs, how many times in the planned work, counted as Lightning counts them, and what one costs where profiled."""

from __future__ import annotations

from predictor.documents.profile import Profile, ValidationTiming
from predictor.documents.work import Work
from predictor.ranking.constraints import Constraints
from predictor.ranking.words import Words, three

VALIDATION_NOTE = "the profiled run validates"  # how the note begins (srifty recommend prints it)


def validation_notes(profile: Profile, work: Work, constraints: Constraints, words: Words) -> list[str]:
    """The note on the profiled run's validation: its cadence, its count in the planned work
    (:func:`validation_count`), and one's time on the profiling hardware; none without a validation loop."""
    v = profile.validation
    if v is None or not (v.every_batches or v.every_epochs or v.every_s):
        return []
    cadence, runs = validation_count(v, work, constraints, words)
    text = f"{VALIDATION_NOTE} {cadence}"
    if runs is not None:
        text += f": {runs:,} validation(s) in the planned work"
    if v.batches and v.batch_s is not None:
        one = v.batches * v.batch_s.p50
        text += f", {v.batches:,} batches each, {three(one)} s each on the profiling hardware"
        if runs:
            text += f" ({three(runs * one / 3600)} h in all there)"
    return [text + "; the times above are training only: validation is not in them"]


def validation_count(v: ValidationTiming, work: Work, constraints: Constraints, words: Words) -> tuple[str, int | None]:
    """(the cadence in words, the validations in the planned work or None where it cannot be counted).

    A share of an epoch (a float ``val_check_interval``, once an epoch by default) is resolved against the planned
    epoch (``steps_per_epoch`` with the profile's accumulation), else the profiled run's: Lightning validates at each
    ``max(1, int(epoch x share))``-th batch of an epoch (``_FitLoop.setup_data``), so a share resolved against a
    profiling run's short epoch counted thousands of validations in a long one. A time-based interval's count
    follows each fleet's speed and is not given."""
    if v.every_s:
        return f"every {three(v.every_s)} s of training (how many times follows each fleet's speed)", None
    epoch = v.epoch_batches
    if constraints.steps_per_epoch:
        epoch = constraints.steps_per_epoch * work.accumulate_grad_batches
    if v.every_epoch_fraction is not None:
        once = v.every_epoch_fraction == 1  # Lightning's default
        share = "once an epoch" if once else f"every {v.every_epoch_fraction:g} of an epoch"
        if epoch is None:
            return share, None
        every = max(1, int(epoch * v.every_epoch_fraction))
        each = "at the end" if once else f"each {every:,}"
        if constraints.steps_per_epoch:
            cadence = f"{share} ({each} of the planned epoch's {epoch:,} training batches)"
        else:
            cadence = (
                f"{share} ({each} of the {epoch:,} training batches of an epoch as long as the profiled "
                f"run's; for another length give the work as {words.name('epochs')} with "
                f"{words.name('steps_per_epoch')})"
            )
    elif v.every_batches:
        every, cadence = v.every_batches, f"every {v.every_batches:,} training batches"
        if v.every_epochs is None or epoch is None:  # counted over the run, not within each epoch
            return cadence, int(work.batches // every)
        # counted from each epoch's start (a trial read "every 50 training batches" of a run whose 64-batch epochs
        # validated once each, at the 50th)
        epochs = "each epoch" if v.every_epochs == 1 else f"one epoch in {v.every_epochs}"
        cadence = f"every {v.every_batches:,} training batches of {epochs}, counted from its start"
        if every > epoch:  # Lightning's _FitLoop.setup_data raises ValueError
            return cadence + (
                f", more than the planned epoch's {epoch:,}: Lightning refuses it (check_val_every_n_epoch=None counts "
                "them over the run)"
            ), None
    else:  # at each epoch's end (a loader without a length)
        cadence = f"every {v.every_epochs} epoch(s)"
        if epoch is None:
            return cadence, None
        every = epoch
    return cadence, epoch_validations(work.batches, epoch, every, v.every_epochs or 1)


def epoch_validations(batches: float, epoch: int, every: int, every_n: int) -> int:
    """Validations in ``batches`` training batches of epochs of ``epoch`` batches: at each ``every``-th batch of an
    epoch whose number is a multiple of ``every_n`` (Lightning's ``_should_check_val_fx``: the batch index within
    the epoch, ``(current_epoch + 1) % check_val_every_n_epoch``)."""
    full, rest = divmod(int(batches), epoch)
    runs = (full // every_n) * (epoch // every)
    if rest and (full + 1) % every_n == 0:
        runs += rest // every
    return runs
