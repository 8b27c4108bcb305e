"""The run a training command asks for against the run the plan priced: its steps and its accumulation.

A LightningCLI command's Trainer is set by its config files and its ``--trainer.*`` arguments
(:func:`~lightning_srifty.provision.terraform.glue.cli_trainer_values`). A plan of 2,000,000 steps written for a
config of ``max_steps: 600`` told its reviewers 3.91 h and $1.6 for a job that stops at step 600; a plan of 1,000 steps
for ``max_steps: 5000000`` gave the fleet a life cap of 1 h 10 min for a job of about 9.9 h, which the cap would have
stopped long before its end; a config's ``accumulate_grad_batches: 4`` trained another global batch than the one
profiled and planned, and nothing was said before the job's own log (a trial). A plain script's ``--max-steps N`` /
``--max_steps N`` is read as its Trainer's max_steps, and said as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lightning_srifty.console import fmt_hours, fmt_life
from lightning_srifty.provision.terraform.glue import cli_configs, cli_trainer_values
from lightning_srifty.provision.terraform.snapshot import Snapshot
from predictor.documents.plan import PlanEntry
from predictor.documents.profile import Profile

# a run this much longer or shorter than the plan's work is said (the job's own check at its first step uses the same)
TOLERANCE = 0.05
SCRIPT_FLAGS = ("--max-steps", "--max_steps")  # a plain script's flag read as its Trainer's max_steps


def _last_int(values: list[tuple[str, object]]) -> tuple[str, int] | None:
    """The last (where, whole number) of ``values``: the one LightningCLI applies."""
    for where, value in reversed(values):
        if isinstance(value, int) and not isinstance(value, bool):
            return where, value
    return None


def _script_flag(args: list[str]) -> tuple[str, int] | None:
    """A plain script's ``--max-steps N`` (or ``=N``, or ``--max_steps``), the last one given."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        raw = value if eq else args[i + 1] if i + 1 < len(args) else ""
        if name in SCRIPT_FLAGS and raw.isdigit():
            found = (name, int(raw))
    return found


def _asked_steps(snapshot: Snapshot, args: list[str], profile: Profile | None, batch: float) -> tuple[str, int] | None:
    """(where, steps of the global batch) the command's Trainer runs, where it says: the fewer of ``max_steps`` (a
    manual loop's over its optimizer steps a batch) and ``max_epochs`` x the profiled epoch's steps at the plan's
    global batch, as Lightning stops at whichever comes first."""
    k = float(profile.batch.optimizer_steps_per_batch or 1) if profile is not None else 1.0
    cli = bool(cli_configs(args)) or any(a.startswith("--trainer.") for a in args)
    given = _last_int(cli_trainer_values(snapshot, args, "max_steps")) if cli else _script_flag(args)
    found = []
    if given is not None and given[1] > 0:
        found.append((f"{given[0]} (max_steps {given[1]:,})", math.ceil(given[1] / k - 1e-9)))
    epochs = _last_int(cli_trainer_values(snapshot, args, "max_epochs")) if cli else None
    if epochs is not None and epochs[1] > 0 and profile is not None and profile.validation is not None:
        epoch_batches, per_batch = profile.validation.epoch_batches, profile.batch.all_devices
        if epoch_batches and per_batch:
            per_epoch = math.ceil(epoch_batches * per_batch / batch - 1e-9)
            found.append(
                (f"{epochs[0]} (max_epochs {epochs[1]:,}, {per_epoch:,} steps an epoch)", epochs[1] * per_epoch)
            )
    return min(found, key=lambda f: f[1]) if found else None


def run_length_notes(
    entry: PlanEntry,
    work_samples: float,
    snapshot: Snapshot,
    argv: list[str],
    profile: Profile | None,
    life_cap_h: Callable[[PlanEntry], float],
    applies_the_plan: bool,
) -> list[str]:
    """What the command's Trainer runs otherwise than the plan priced: its steps (more than :data:`TOLERANCE` off,
    with the life cap where it would stop the run) and its accumulation (against the profiled run's)."""
    args = argv[1:]
    batch = float(entry.global_batch or 0)
    notes = []
    asked = _asked_steps(snapshot, args, profile, batch) if batch > 0 and work_samples > 0 else None
    planned = math.ceil(work_samples / batch - 1e-9) if batch > 0 else 0
    if asked is not None and planned > 0 and abs(asked[1] / planned - 1) > TOLERANCE:
        where, steps = asked
        k = float(profile.batch.optimizer_steps_per_batch or 1) if profile is not None else 1.0
        startup_h = (entry.startup_s or 0.0) / 3600  # once, whatever the run's length
        run_h = startup_h + max(0.0, entry.time_h - startup_h) * steps / planned
        cap = life_cap_h(entry)
        stopped = (
            f"; about {fmt_hours(run_h)} at the plan's speed, past the fleet's life cap of {fmt_life(cap)}, which "
            "stops every node before the run's end (--max-life-h sets it)"
            if run_h > cap
            else ""
        )
        notes.append(
            f"{argv[0]} runs {steps:,} steps of {batch:,.0f} samples by {where}, the plan prices {planned:,}: the "
            f"time ({fmt_hours(entry.time_h)}), cost (${entry.cost_usd:,.2f}) and life cap this folder states are "
            f"the plan's run's{stopped}. Plan this run (srifty recommend --steps {steps}) and write the folder again, "
            f"or set max_steps to {math.ceil(planned * k - 1e-9):,}"
        )
    given = _last_int(cli_trainer_values(snapshot, args, "accumulate_grad_batches"))
    profiled = (profile.batch.accumulate_grad_batches or 1) if profile is not None else None
    if given is not None and profiled is not None and given[1] != profiled:
        where, accumulate = given
        then = (
            f"srifty_auto replaces it with the plan's, so the fleet trains the plan's global batch ({batch:,.0f}), "
            "not this one"
            if applies_the_plan
            else "the Trainer runs it, another global batch than the plan's, at other step times"
        )
        notes.append(
            f"{where} sets accumulate_grad_batches: {accumulate}, the profiled run accumulated {profiled} (the plan "
            f"trains a global batch of {batch:,.0f}, accumulation {entry.accumulate_grad_batches}): {then}. Profile "
            "the run with the config's accumulation to plan its training"
        )
    return notes
