"""``srifty launch --plan plan.json [--choice N] -- train.py [args]``: run the training job on the plan's fleet and
keep it running through migrations, through a provisioner (``local``: processes on this machine; ``terraform``: the
generated Terraform of the plan, see :mod:`lightning_srifty.provision`).

The job gets its settings in the environment, and talks back through small JSON markers beside the checkpoints
(:mod:`lightning_srifty.protocol`), the one place reachable from both sides whatever the provisioner:

    SRIFTY_BATCH_SIZES      per-rank batch sizes per micro-step, exactly the plan's (its speed-proportional split)
    SRIFTY_ACCUMULATE_GRAD_BATCHES  micro-steps per optimizer step, exactly the plan's
                            (for Trainer(accumulate_grad_batches=...))
    SRIFTY_CHECKPOINT_DIR   where SpotPreemption checkpoints and the markers go
    SRIFTY_RESUME           the checkpoint to resume from ("" on the first start)
    SRIFTY_FLEET            the fleet, e.g. "g4dn.xlarge:2"
    SRIFTY_PLAN, SRIFTY_CHOICE  the plan this fleet comes from and its index (for MigrationTriggers)

Two kinds of move:

- *involuntary* (a spot notice or SIGTERM): the job checkpoints and leaves (``PREEMPTED.json``); the launcher brings
  the next fleet of the current plan up, starts the job there from the checkpoint, and releases the old fleet;
- *voluntary* (:class:`~lightning_srifty.migrate.MigrationTriggers`: drift from the prediction, cheaper prices): the
  job asks (``MOVE_REQUEST.json`` with a re-ranked plan) and keeps training; the launcher brings the new fleet up
  first, then answers ``LEAVE.json``; the job checkpoints and leaves; the new fleet starts from that checkpoint; the
  old fleet is released last. The training stops only for a save, a restart and a load.

The global batch of the first fleet (samples per optimizer step: the per-rank batches summed, times the accumulation)
is kept on every later fleet (the optimisation stays the same): a plan made with strong scaling gives every fleet
that global batch, and its per-rank batches and accumulation are used as they are; an older or weak-scaling plan's
fleet gets the first fleet's global batch split in proportion to its per-GPU shares. Every move is appended to
``migrations.jsonl`` (when, why, from, to, step, seconds lost).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_srifty import protocol as markers
from lightning_srifty.provision.base import LaunchedFleet, Provisioner
from predictor.exceptions import MigrationError
from predictor.plan import Plan, PlanEntry, load_plan


def rank_batch_sizes(entry: PlanEntry, global_batch: int | None = None) -> list[int]:
    """Whole per-rank batches per micro-step in group order, in proportion to the plan's per-GPU split, adding up to
    ``global_batch`` samples per micro-step (default: the plan's own); largest remainders get the leftover
    samples."""
    shares = [g.per_device_batch for g in entry.groups for _ in range(g.count * g.gpus_per_instance)]
    a = entry.accumulate_grad_batches
    total = global_batch if global_batch is not None else round(sum(shares) / a)
    if total < len(shares):
        raise MigrationError(
            f"A batch of {total} samples per micro-step cannot be split over the {len(shares)} GPUs of "
            f"{entry.fleet}: every rank needs at least one sample."
        )
    scaled = [s * total / sum(shares) for s in shares]
    sizes = [max(1, int(s)) for s in scaled]
    for i in sorted(range(len(scaled)), key=lambda i: scaled[i] - int(scaled[i]), reverse=True)[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def fleet_batches(entry: PlanEntry, global_batch: int | None = None) -> tuple[list[int], int]:
    """(per-rank batches per micro-step, accumulate_grad_batches) for ``entry``: exactly the plan's when it records
    them and they make ``global_batch`` samples per optimizer step (default: whatever they make); else the plan's
    per-GPU shares scaled to ``global_batch`` with the plan's accumulation.

    Raises:
        MigrationError: ``global_batch`` cannot be split into the entry's accumulation and GPUs.
    """
    a = entry.accumulate_grad_batches
    exact = entry.rank_batches()
    if exact is not None and (global_batch is None or sum(exact) * a == global_batch):
        return exact, a
    if global_batch is None:
        return rank_batch_sizes(entry), a
    if global_batch % a:
        raise MigrationError(
            f"The global batch of {global_batch} samples per optimizer step does not split into the "
            f"{a} micro-steps of {entry.fleet}: re-plan with srifty recommend (strong scaling keeps it)."
        )
    return rank_batch_sizes(entry, global_batch // a), a


@dataclass
class Migration:
    when: str
    why: str
    trigger: str  # spot (a notice or SIGTERM), drift, price
    voluntary: bool
    from_fleet: str
    to_fleet: str
    step: int | None
    notice_to_durable_s: float | None  # from the job's SpotPreemption
    downtime_s: float  # from the old job's exit to the job started on the new fleet (provisioning, spot moves)
    provisioned_while_training_s: float  # voluntary moves: bringing the new fleet up, while the old one trained
    durable_unix: float | None = None  # when the checkpoint was durable (the job's clock)


def _timed_up(provisioner: Any, plan: Any, choice: int, name: str) -> LaunchedFleet:
    """``provisioner.up``; a cloud provisioner's time to bring the fleet up is recorded for the ranking's start-up
    figures (``predictor.startup``: the median per instance type replaces the default)."""
    t0 = time.monotonic()
    fleet = provisioner.up(plan, choice, name)
    if provisioner.kind != "local":  # local processes say nothing about EC2
        from predictor import startup

        startup.record([g.instance_type for g in plan.entries[choice].groups], time.monotonic() - t0)
    return fleet


def _env(
    plan_uri: str,
    fleet: LaunchedFleet,
    batches: tuple[list[int], int],
    checkpoint_dir: str,
    resume: str,
    started: float,
) -> dict[str, str]:
    sizes, accumulation = batches
    return {
        "SRIFTY_BATCH_SIZES": ",".join(map(str, sizes)),
        "SRIFTY_ACCUMULATE_GRAD_BATCHES": str(accumulation),
        "SRIFTY_CHECKPOINT_DIR": checkpoint_dir,
        "SRIFTY_RESUME": resume,
        "SRIFTY_FLEET": fleet.entry.fleet,
        "SRIFTY_PLAN": plan_uri,
        "SRIFTY_CHOICE": str(fleet.index),
        # when the run began working to this plan (its deadline counts from then; a re-ranked plan's from the move)
        "SRIFTY_PLAN_STARTED_UNIX": f"{started:.3f}",
    }


def launch(
    plan: Plan,
    script: list[str] | None = None,
    *,
    choice: int = 0,
    workdir: str | os.PathLike[str] = "srifty/launch",
    provisioner: Provisioner | None = None,
    checkpoint_dir: str | None = None,
    max_migrations: int = 3,
    simulate_notice_after: float | None = None,
    max_local_processes: int = 8,
    poll_s: float = 0.5,
    name: str = "srifty",
    echo: Any = print,
) -> list[Migration]:
    """Run the job on ``plan.entries[choice]`` and keep it running through migrations (see the module doc).

    ``provisioner`` defaults to the local one running ``script``; ``checkpoint_dir`` to ``<workdir>/checkpoints``
    (the terraform provisioner's S3 prefix for that one).
    """
    if provisioner is None:
        from lightning_srifty.provision.local import LocalProvisioner

        if not script:
            raise MigrationError("The local provisioner needs the training script to run.")
        provisioner = LocalProvisioner(
            script, max_processes=max_local_processes, simulate_notice_after=simulate_notice_after, echo=echo
        )
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint_dir or getattr(provisioner, "checkpoint_uri", None) or str((root / "checkpoints").resolve())
    markers.clear(ckpt, markers.PREEMPTED, markers.FINISHED, markers.FAILED, markers.MOVE_REQUEST, markers.LEAVE)
    log_path = root / "migrations.jsonl"
    migrations: list[Migration] = []
    plan_started: dict[str, float] = {}

    def keep_plan(p: Plan) -> str:  # where the job reads the plan its fleet comes from
        uri = markers.write(ckpt, f"plans/plan-{len(plan_started) + 1}.json", p.to_dict())
        plan_started[uri] = time.time()
        return uri

    def record(move: Migration) -> None:
        migrations.append(move)
        with log_path.open("a") as f:
            f.write(json.dumps(move.__dict__) + "\n")
        echo(
            f"srifty launch: {move.trigger} at step {move.step}: {move.from_fleet} -> {move.to_fleet} "
            f"({move.downtime_s:.1f} s without training)"
        )

    plan_uri = keep_plan(plan)
    batches = fleet_batches(plan.entries[choice])
    global_batch = sum(batches[0]) * batches[1]  # samples per optimizer step, kept on every later fleet
    numbers = itertools.count(1)  # fleet names stay unique for the whole launch (resources, handover objects)
    fleet = _timed_up(provisioner, plan, choice, f"{name}-{next(numbers)}")
    up = [fleet]
    try:
        provisioner.start(fleet, _env(plan_uri, fleet, batches, ckpt, "", plan_started[plan_uri]))
        pending: tuple[LaunchedFleet, str, dict[str, Any], float] | None = None  # a voluntary move's new fleet, up
        while True:
            time.sleep(poll_s)
            code = provisioner.poll(fleet)
            there = markers.present(ckpt)  # one listing per poll; only what is there is read

            def read(marker: str, there: set[str] = there) -> dict[str, Any] | None:
                return markers.read(ckpt, marker) if marker in there else None

            finished, left, failed = read(markers.FINISHED), read(markers.PREEMPTED), read(markers.FAILED)
            if failed is not None:
                raise MigrationError(
                    f"The job failed on {fleet.entry.fleet} at step {failed.get('step')}: {failed.get('error')}"
                )
            request = None if (pending or finished or left) else read(markers.MOVE_REQUEST)
            if request is not None:
                markers.clear(ckpt, markers.MOVE_REQUEST)
                if len(migrations) >= max_migrations:
                    echo(f"srifty launch: move to {request.get('to_fleet')} declined: --max-migrations reached")
                else:
                    new_plan = load_plan(request["plan"])
                    echo(f"srifty launch: move requested ({request['why']}): {request.get('reason', '')}")
                    t0 = time.monotonic()
                    new = _timed_up(provisioner, new_plan, new_plan.chosen, f"{name}-{next(numbers)}")
                    up.append(new)
                    pending = (new, keep_plan(new_plan), request, time.monotonic() - t0)
                    markers.write(ckpt, markers.LEAVE, {"to_fleet": new.entry.fleet})
                continue
            if finished is not None or (code == 0 and left is None):
                _wait_exit(provisioner, fleet)
                echo(f"srifty launch: finished on {fleet.entry.fleet} after {len(migrations)} migration(s)")
                return migrations
            if left is None:
                if code is not None:
                    raise MigrationError(
                        f"The job failed on {fleet.entry.fleet} with exit status {code} (not a preemption)."
                    )
                continue
            # the job left: a spot notice, SIGTERM, or the voluntary move granted above
            _wait_exit(provisioner, fleet)
            gone = time.monotonic()
            markers.clear(ckpt, markers.PREEMPTED, markers.LEAVE)
            resume = left.get("checkpoint") or ""
            if pending is not None and left.get("move"):
                new, new_uri, request, up_s = pending
                pending, trigger, voluntary = None, request["why"], True
            else:
                if len(migrations) >= max_migrations:
                    raise MigrationError(f"Preempted again after {max_migrations} migrations: giving up.")
                nxt = fleet.index + 1
                if nxt >= len(fleet.plan.entries):
                    raise MigrationError(
                        f"No fleet left in the plan after {len(migrations)} migration(s): re-plan with "
                        "srifty recommend."
                    )
                if pending is not None:  # a notice came before the granted move: that fleet is up, use it
                    new, new_uri, _, _ = pending
                    pending = None
                else:
                    new = _timed_up(provisioner, fleet.plan, nxt, f"{name}-{next(numbers)}")
                    up.append(new)
                    new_uri = plan_uri
                trigger, voluntary, up_s = "spot", False, 0.0
            batches = fleet_batches(new.entry, global_batch)
            provisioner.start(new, _env(new_uri, new, batches, ckpt, resume, plan_started[new_uri]))
            record(
                Migration(
                    dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    str(left.get("why") or trigger),
                    trigger,
                    voluntary,
                    fleet.entry.fleet,
                    new.entry.fleet,
                    left.get("step"),
                    left.get("notice_to_durable_s"),
                    time.monotonic() - gone,
                    up_s,
                    left.get("durable_unix"),
                )
            )
            provisioner.down(fleet)  # the old fleet goes last: the new one has its job
            up.remove(fleet)
            fleet, plan_uri = new, new_uri
    finally:
        for remaining in up:
            try:
                provisioner.stop(remaining)
                provisioner.down(remaining)
            except Exception as exc:  # noqa: BLE001 - report every fleet left behind, keep the first error
                echo(f"srifty launch: releasing {remaining.entry.fleet} ({remaining.name}) failed: {exc}")


def _wait_exit(provisioner: Provisioner, fleet: LaunchedFleet, timeout: float = 120.0) -> None:
    """Local processes: wait for them to exit (the marker comes just before) so the next fleet has the machine."""
    wait = getattr(provisioner, "wait", None)
    if wait is not None and wait(fleet, timeout) is None:
        provisioner.stop(fleet)
