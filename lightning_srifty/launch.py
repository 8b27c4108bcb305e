"""``srifty launch --plan plan.json [--choice N] -- train.py [args]``: run the training job on the plan's fleet and
keep it running through spot interruptions, moving to the next fleet of the plan each time.

Provisioner ``local`` (this machine): a fleet of N instances x G GPUs becomes N x G processes under
``torch.distributed.run --standalone``. The global batch of the first fleet is kept on every later fleet (the
optimisation stays the same); only its split over the ranks follows the new fleet's speed-proportional shares. The
job gets its setting in the environment:

    SRIFTY_BATCH_SIZES      per-rank batch sizes (the plan's speed-proportional split, same global batch)
    SRIFTY_CHECKPOINT_DIR   where SpotPreemption checkpoints
    SRIFTY_RESUME           the checkpoint to resume from ("" on the first start)
    SRIFTY_FLEET            the fleet, e.g. "g4dn.xlarge:2"

A run that leaves on a notice writes ``PREEMPTED.json`` beside its checkpoints (torchrun does not pass a worker's
exit status on); the launcher then records the migration in ``migrations.jsonl`` (why, from, to, step, seconds
lost) and restarts from the newest sound checkpoint on the next fleet. ``--simulate-notice-after S`` serves a local
metadata service to the job and posts a spot notice after S seconds (the first fleet only).

Not built yet: the ``terraform`` provisioner and the drift / price triggers (issue #7).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.exceptions import MigrationError
from predictor.plan import Plan, PlanEntry


def rank_batch_sizes(entry: PlanEntry, global_batch: int | None = None) -> list[int]:
    """Whole per-rank batches in group order, in proportion to the plan's per-GPU split, adding up to
    ``global_batch`` (default: the plan's own global batch); largest remainders get the leftover samples."""
    shares = [g.per_device_batch for g in entry.groups for _ in range(g.count * g.gpus_per_instance)]
    total = global_batch if global_batch is not None else round(sum(shares))
    if total < len(shares):
        raise MigrationError(
            f"A global batch of {total} cannot be split over the {len(shares)} GPUs of {entry.fleet}: every rank "
            "needs at least one sample."
        )
    scaled = [s * total / sum(shares) for s in shares]
    sizes = [max(1, int(s)) for s in scaled]
    for i in sorted(range(len(scaled)), key=lambda i: scaled[i] - int(scaled[i]), reverse=True)[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


@dataclass
class Migration:
    when: str
    why: str
    from_fleet: str
    to_fleet: str
    step: int | None
    notice_to_durable_s: float | None  # from the job's SpotPreemption
    downtime_s: float  # from the preempted run's exit to the next fleet's start (provisioning; ~0 locally)


def launch(
    plan: Plan,
    script: list[str],
    *,
    choice: int = 0,
    workdir: str | os.PathLike[str] = "srifty/launch",
    max_migrations: int = 3,
    simulate_notice_after: float | None = None,
    max_local_processes: int = 8,
    echo: Any = print,
) -> list[Migration]:
    """Run ``script`` (a Python file and its arguments) on plan.entries[choice], then the next fleets as needed."""
    from lightning_srifty.preemption import PREEMPTED_MARKER, find_checkpoint

    root = Path(workdir)
    ckpt_dir = root / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    log_path = root / "migrations.jsonl"
    migrations: list[Migration] = []
    current = choice
    resume = ""
    global_batch: int | None = None
    left_at: float | None = None
    while True:
        if left_at is not None:
            migrations[-1].downtime_s = time.monotonic() - left_at
        if current >= len(plan.entries):
            raise MigrationError(
                f"No fleet left in the plan after {len(migrations)} migration(s): re-plan with srifty recommend."
            )
        entry = plan.entries[current]
        # the run keeps its global batch across fleets (same optimisation); only the per-rank split changes
        sizes = rank_batch_sizes(entry, global_batch)
        global_batch = sum(sizes)
        if len(sizes) > max_local_processes:
            raise MigrationError(
                f"{entry.fleet} has {len(sizes)} GPUs: the local provisioner runs one process per GPU and is limited "
                f"to {max_local_processes} (--max-local-processes)."
            )
        env = {
            **os.environ,
            "SRIFTY_BATCH_SIZES": ",".join(map(str, sizes)),
            "SRIFTY_CHECKPOINT_DIR": str(ckpt_dir),
            "SRIFTY_RESUME": resume,
            "SRIFTY_FLEET": entry.fleet,
        }
        (ckpt_dir / PREEMPTED_MARKER).unlink(missing_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={len(sizes)}"]
        echo(f"srifty launch: {entry.fleet} ({entry.market}) as {len(sizes)} local process(es), batches {sizes}")
        imds = None
        if simulate_notice_after is not None and not migrations:
            from lightning_srifty.imds_sim import LocalIMDS

            imds = LocalIMDS(
                {"meta-data/instance-type": entry.groups[0].instance_type, "meta-data/instance-life-cycle": "spot"}
            ).__enter__()
            env.update(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint, AWS_EC2_METADATA_DISABLED="false")
            threading.Timer(simulate_notice_after, imds.notify).start()
        if migrations:
            with log_path.open("a") as f:
                f.write(json.dumps(migrations[-1].__dict__) + "\n")
        try:
            code = subprocess.run([*command, *script], env=env, check=False).returncode
        finally:
            if imds is not None:
                imds.__exit__(None, None, None)
        marker = ckpt_dir / PREEMPTED_MARKER
        if marker.exists():
            info = json.loads(marker.read_text())
            if len(migrations) >= max_migrations:
                raise MigrationError(
                    f"Preempted again after {max_migrations} migrations: giving up (--max-migrations)."
                )
            resume = find_checkpoint(str(ckpt_dir)) or ""
            nxt = plan.entries[current + 1].fleet if current + 1 < len(plan.entries) else "(none)"
            move = Migration(
                dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                str(info.get("why") or "spot notice"),
                entry.fleet,
                nxt,
                info.get("step"),
                info.get("notice_to_durable_s"),
                0.0,
            )
            migrations.append(move)
            left_at = time.monotonic()
            echo(f"srifty launch: preempted at step {move.step} ({move.why}): {move.from_fleet} -> {move.to_fleet}")
            current += 1
            continue
        if code != 0:
            raise MigrationError(f"The job failed on {entry.fleet} with exit status {code} (not a preemption).")
        echo(f"srifty launch: finished on {entry.fleet} after {len(migrations)} migration(s)")
        return migrations
