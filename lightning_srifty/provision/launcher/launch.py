"""``srifty launch --plan plan.json [--choice N] -- train.py [args]``: run the training job on the plan's fleet and
keep it running through migrations, through a provisioner (``local``: processes on this machine; ``terraform``: the
generated Terraform of the plan, see :mod:`lightning_srifty.provision`).

The job gets its settings as a :class:`~lightning_srifty.protocol.LaunchEnv` (``SRIFTY_*`` variables) and talks back
through typed records beside the checkpoints (:mod:`lightning_srifty.protocol`, which lists both), the one place
reachable from both sides whatever the provisioner. Every record carries this launch's id: records an earlier launch
left in the folder are ignored.

Two kinds of move:

- *involuntary* (a spot notice or SIGTERM): the job checkpoints and leaves (``PREEMPTED.json``); the launcher brings
  the next fleet of the current plan up, starts the job there from the checkpoint, and releases the old fleet;
- *voluntary* (:class:`~lightning_srifty.migrate.MigrationTriggers`: drift from the prediction, cheaper prices): the
  job asks (``MOVE_REQUEST.json`` with a re-ranked plan) and keeps training; the launcher brings the new fleet up
  first, then answers ``LEAVE.json``; the job checkpoints and leaves; the new fleet starts from that checkpoint; the
  old fleet is released last. The training stops only for a save, a restart and a load.

Each move is reported in words once the new leg took its first step (``STARTED.json``), with measured times: the
checkpoint, bringing the new fleet up, and the downtime from the old leg's last step to the new leg's first. The
global batch of the first fleet (samples per optimizer step) is kept on every later fleet. Every move is appended to
``migrations.jsonl``.

Reliability: the launcher rewrites ``HEARTBEAT.json`` every ``heartbeat_s``; a job (and the instances) whose heartbeat
is older than ``heartbeat_max_age_s`` checkpoints and leaves, so a launcher killed outright leaves nothing running
for long. Each fleet has a life cap (the plan's predicted time x 1.5 + 1 h, or ``max_life_h``). SIGINT, SIGTERM and
SIGHUP release every fleet brought up and end with :class:`~predictor.exceptions.LaunchInterrupted`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from lightning_srifty import protocol
from lightning_srifty.protocol import (
    Failed,
    Finished,
    Heartbeat,
    LaunchEnv,
    Leave,
    MoveDeclined,
    MoveRequest,
    Preempted,
    Progress,
    Started,
    entry_strategy,
)
from lightning_srifty.provision.base import Interrupts, LaunchedFleet, Provisioner
from lightning_srifty.provision.launcher.local import LocalProvisioner
from lightning_srifty.provision.launcher.spot_guard import (
    DEFAULT_CHECK_S,
    Decision,
    SpotGuard,
    guard_for,
    on_demand_fleet,
    policy_for,
)
from predictor.documents.plan import Plan, PlanEntry, load_plan
from predictor.exceptions import CapacityError, ConfigError, LaunchInterrupted, MigrationError, ProvisionError
from predictor.model import startup
from predictor.model.batch import rank_batches, split_micro


def rank_batch_sizes(entry: PlanEntry, global_batch: int | None = None) -> list[int]:
    """Whole per-rank batches per micro-step in group order, in proportion to the plan's per-GPU split, adding up to
    ``global_batch`` samples per micro-step (default: the plan's own): the ranking's own split
    (:func:`predictor.model.batch.split_micro`, largest remainders get the leftover samples), for one fleet."""
    import numpy as np

    gpus = [g.count * g.gpus_per_instance for g in entry.groups]
    shares = [float(g.per_device_batch) for g in entry.groups]
    a = entry.accumulate_grad_batches
    total = global_batch if global_batch is not None else round(sum(s * n for s, n in zip(shares, gpus)) / a)
    if total < sum(gpus):
        raise MigrationError(
            f"A batch of {total} samples per micro-step cannot be split over the {sum(gpus)} GPUs of "
            f"{entry.fleet}: every rank needs at least one sample."
        )
    lo, plus, _ = split_micro(
        np.array([float(total)]), np.array([shares]), np.array([gpus], dtype=float), np.ones((1, len(gpus)), bool)
    )
    return [b for k, n in enumerate(gpus) for b in rank_batches(lo[0, k], plus[0, k], n)]


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


TRIGGER_WORDS = {
    "spot": "a spot notice",
    "sigterm": "SIGTERM",
    "drift": "a drift from the prediction",
    "price": "a price change",
    "deadline": "the spot policy's deadline check",
}


@dataclass
class Migration:
    when: str
    why: str  # in words, from the job
    trigger: str  # spot (a notice), sigterm, drift, price
    voluntary: bool
    from_fleet: str
    to_fleet: str
    step: int | None
    notice_to_durable_s: float | None  # from the job's SpotPreemption
    downtime_s: float | None  # measured: the old leg's last step to the new leg's first (None: no first step seen)
    provisioned_while_training_s: float  # voluntary moves: bringing the new fleet up, while the old one trained
    durable_unix: float | None = None  # when the checkpoint was durable (the job's clock)
    checkpoint_s: float | None = None  # the save, from the job
    up_s: float | None = None  # bringing the new fleet up (spot moves: while nothing trains)
    restart_s: float | None = None  # the launcher's part: the old job gone -> the new one started
    last_step_unix: float | None = None
    first_step_unix: float | None = None
    started_unix: float | None = None  # when the launcher started the job on the new fleet

    def describe(self) -> str:
        """``moved from g5.xlarge:1 to g5.2xlarge:1 after a spot notice at step 120: checkpoint 3.2 s, new fleet up
        1.1 s, downtime 6.4 s``."""

        def s(value: float | None) -> str:
            return "not measured" if value is None else f"{value:.1f} s"

        up = s(self.up_s) + (" (while training)" if self.voluntary and self.up_s is not None else "")
        down = s(self.downtime_s) if self.downtime_s is not None else "not measured (the new leg took no step)"
        return (
            f"moved from {self.from_fleet} to {self.to_fleet} after {TRIGGER_WORDS.get(self.trigger, self.trigger)} "
            f"at step {self.step}: checkpoint {s(self.checkpoint_s)}, new fleet up {up}, downtime {down}"
        )


def _up_or_next(
    provisioner: Any,
    plan: Plan,
    choice: int,
    names: Any,
    echo: Any,
    *,
    max_attempts: int = 6,
    max_s: float = 1800.0,
    up: list[LaunchedFleet] | None = None,
    only: bool = False,
) -> tuple[LaunchedFleet, float]:
    """Bring ``plan.entries[choice]`` up; when EC2 cannot start it now (:class:`CapacityError`: no capacity, spot
    capacity not available, a quota, the type not offered in the zone), first the same fleet in other zones of its
    region when the refusal was about a zone (the provisioner's ``zones_after``: cheapest first, at most 2), then the
    next entries of the plan in rank order (each within the plan's constraints and budget); at most ``max_attempts``
    tries and ``max_s`` seconds. Says what it tried and what the fleet it started costs next to the first choice.
    ``only``: that entry alone, in its other zones too (the spot guard's fleets: it chose that one).

    Raises:
        CapacityError: none of the fleets tried could start (naming each and why).

    The fleet started goes into ``up`` as soon as it is up (see :func:`_timed_up`).
    """
    tried: list[str] = []
    started = time.monotonic()
    for index in range(choice, choice + 1 if only else len(plan.entries)):
        entry = plan.entries[index]
        queue: list[Any] = [None]  # the default zone, then the provisioner's others
        zones_tried: list[str | None] = []
        while queue:
            zone = queue.pop(0)
            where = f" in {zone.zone}" if zone is not None else ""
            try:
                fleet, took = _timed_up(provisioner, plan, index, next(names), zone.zone if zone else None, up)
            except CapacityError as exc:
                tried.append(f"{entry.fleet} ({entry.market}){where}: {exc.code}")
                echo(f"srifty launch: {entry.fleet} ({entry.market}) could not start{where}: {exc.code}")
                if len(tried) >= max_attempts or time.monotonic() - started > max_s:
                    raise _exhausted(tried, started) from None
                zones_tried.append(zone.zone if zone else None)
                if zone is None and hasattr(provisioner, "zones_after"):
                    others = provisioner.zones_after(plan, index, exc.code, zones_tried)
                    if others:
                        echo(
                            f"srifty launch: trying {entry.fleet} ({entry.market}) in "
                            + "; ".join(f"{z.zone} ({z.note})" if z.note else z.zone for z in others)
                            + " before the plan's next entry"
                        )
                    queue.extend(others)
                continue
            if index != choice or zone is not None:
                echo(_instead(plan, choice, index, zone, tried))
            return fleet, took
    raise _exhausted(tried, started)


def _instead(plan: Plan, choice: int, index: int, zone: Any, tried: list[str]) -> str:
    """The line for a fleet started in place of the first choice (another entry, or the same in another zone): what
    it is, what it is predicted to take and cost next to the first choice, and what was tried first."""
    first, entry = plan.entries[choice], plan.entries[index]
    dt_pct = (entry.time_h / first.time_h - 1) * 100 if first.time_h else 0.0
    dc_pct = (entry.cost_usd / first.cost_usd - 1) * 100 if first.cost_usd else 0.0
    place = f" in {zone.zone} ({zone.note})" if zone is not None else ""
    what = f"entry {index} of the plan, {entry.fleet} ({entry.market}){place}"
    instead = f"instead of {first.fleet}" if index != choice else "instead of the plan's zone"
    return (
        f"srifty launch: started {what}, {instead}: predicted {entry.time_h:.2f} h and "
        f"${entry.cost_usd:,.2f} ({dt_pct:+.0f}% time, {dc_pct:+.0f}% cost against the first choice); "
        f"tried: {'; '.join(tried)}"
    )


def _exhausted(tried: list[str], started: float) -> CapacityError:
    return CapacityError(
        f"No fleet of the plan could start ({len(tried)} tried in {time.monotonic() - started:.0f} s: "
        f"{'; '.join(tried)}). Re-rank with srifty recommend --launchable (what this account can start now), another "
        "region, or a quota increase (srifty check says which).",
        code="exhausted",
    )


def _timed_up(
    provisioner: Any,
    plan: Any,
    choice: int,
    name: str,
    zone: str | None = None,
    up: list[LaunchedFleet] | None = None,
) -> tuple[LaunchedFleet, float]:
    """``provisioner.up`` and the seconds it took; a cloud provisioner's time to bring the fleet up is recorded for
    the ranking's start-up figures (``predictor.model.startup``: the median per instance type replaces the default).

    The fleet goes into ``up`` (the launcher's fleets to release) the moment ``provisioner.up`` returns it, before
    anything else: a signal from then on releases it (it used to arrive while the time was recorded, before the
    launcher had the fleet in its list, and the fleet was left running)."""
    t0 = time.monotonic()
    fleet = provisioner.up(plan, choice, name) if zone is None else provisioner.up(plan, choice, name, zone)
    if up is not None:
        up.append(fleet)
    took = time.monotonic() - t0
    if provisioner.kind != "local":  # local processes say nothing about EC2
        # when the instances were asked for and how long they took: the first step's time, less these, is the
        # nodes' boot, install and warm-up (_Silence.check records it)
        fleet.data["up_unix"], fleet.data["provision_s"] = time.time() - took, took

        startup.record([g.instance_type for g in plan.entries[choice].groups], took)
    return fleet, took


class _HeartbeatWriter:
    """Rewrites ``HEARTBEAT.json`` every ``every_s`` in a thread (a terraform apply of minutes must not stop it)."""

    def __init__(self, ckpt: str, launch_id: str, every_s: float, max_age_s: float, echo: Any) -> None:
        self.ckpt, self.launch_id, self.every_s, self.max_age_s, self.echo = ckpt, launch_id, every_s, max_age_s, echo
        self.max_life_until_unix: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="srifty-heartbeat", daemon=True)
        self._failing = False

    def beat(self) -> None:
        record = Heartbeat(
            launch_id=self.launch_id,
            written_unix=time.time(),
            max_age_s=self.max_age_s,
            max_life_until_unix=self.max_life_until_unix,
        )
        try:
            protocol.write_record(self.ckpt, record)
            self._failing = False
        except Exception as exc:  # noqa: BLE001 - keep trying: the jobs leave only when it stays away max_age_s
            if not self._failing:
                self.echo(f"srifty launch: the heartbeat could not be written ({exc}); retrying every {self.every_s} s")
            self._failing = True

    def start(self) -> None:
        self.beat()  # there before any job starts
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.every_s + 5)
        with contextlib.suppress(Exception):
            protocol.clear_records(self.ckpt, Heartbeat)  # this launch is over: nobody should wait for it


DEFAULT_START_TIMEOUT_S = 1800.0  # provisioning, boot, setup and the first step of a remote fleet, at most


class _Silence:
    """A fleet that never reports (failed boot or setup, OOM, the store unreachable) is detected: progress every
    minute while the job has not taken its first step, and a MigrationError after ``timeout_s`` (the launcher then
    releases every fleet)."""

    def __init__(self, timeout_s: float | None, echo: Any) -> None:
        self.timeout_s, self.echo = timeout_s, echo
        self.since: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.heard: set[str] = set()
        self.next_note = 0.0

    def started(self, fleet: LaunchedFleet) -> None:
        self.since[fleet.name], self.wall[fleet.name] = time.monotonic(), time.time()
        self.next_note = time.monotonic() + 60

    def check(self, fleet: LaunchedFleet, started: Any) -> None:
        if self.timeout_s is None or fleet.name in self.heard or fleet.name not in self.since:
            return
        # the job's first step on this leg (its clock may differ from ours by minutes: 300 s of slack)
        if started is not None and (started.first_step_unix or 0) >= self.wall[fleet.name] - 300:
            self.heard.add(fleet.name)
            if "up_unix" in fleet.data and not started.resumed_from:  # a cloud fleet's first leg: a node's boot
                ready = started.first_step_unix - fleet.data["up_unix"] - fleet.data["provision_s"]
                startup.record_ready([g.instance_type for g in fleet.entry.groups], ready)
            return
        waited = time.monotonic() - self.since[fleet.name]
        if waited > self.timeout_s:
            folder = fleet.data.get("folder")  # a root module: its nodes' logs outlive it, beside the checkpoints
            if "process" in fleet.data:  # local processes write to this terminal: no log file of their own (#37 L)
                why = "its output is above: the local processes write to this terminal"
            elif folder:
                why = (
                    "what its nodes logged (boot, setup, training) stays beside the checkpoints: "
                    f"srifty logs --dir {folder}"
                )
            else:
                why = "the instances' console output and /var/log/srifty-user-data.log on them say why"
            raise MigrationError(
                f"The job on {fleet.entry.fleet} ({fleet.name}) has not reported in {waited / 60:.0f} min (no first "
                "step, no record): its boot or setup failed, it ran out of memory, or it cannot reach the checkpoint "
                f"folder. The fleet is released; {why}. Raise --start-timeout-min if the setup really takes longer."
            )
        if time.monotonic() >= self.next_note:
            self.next_note = time.monotonic() + 60
            self.echo(
                f"srifty launch: waiting for the job on {fleet.entry.fleet} to take its first step: "
                f"{waited / 60:.0f} of at most {self.timeout_s / 60:.0f} min"
            )


def _refuse_a_live_launch(ckpt: str, launch_id: str) -> None:
    """Two launches in one checkpoint folder would take each other's checkpoints: refuse while another one's
    heartbeat is fresh."""
    other = protocol.read_record(ckpt, Heartbeat)
    if other is not None and other.launch_id != launch_id and not other.stale():
        until = dt.datetime.fromtimestamp(other.written_unix + other.max_age_s, dt.timezone.utc)
        raise MigrationError(
            f"Another srifty launch ({other.launch_id}) is live in {ckpt}: its heartbeat was written "
            f"{other.age_s():.0f} s ago. Give this run another checkpoint folder, or stop that launch; if it was "
            f"killed, its jobs leave by {until:%H:%M:%S} UTC and then delete {protocol.path(ckpt, protocol.HEARTBEAT)}."
        )


def life_until(entry: PlanEntry, max_life_h: float | None, now: float | None = None) -> float:
    """The hard cap on a fleet's life (unix seconds): ``max_life_h`` from now, else the plan's predicted time for the
    fleet x 1.5 + 1 h."""
    hours = max_life_h if max_life_h is not None else entry.time_h * 1.5 + 1.0
    return (time.time() if now is None else now) + hours * 3600


@dataclass(frozen=True)
class LauncherSettings:
    """How :func:`launch` runs a plan: each field is a flag of ``srifty launch`` (``heartbeat_max_age_s`` is
    ``--heartbeat-max-age``, ``start_timeout_s`` is ``--start-timeout-min`` x 60, the others their own name).

    - ``choice``: the plan's entry to start on; ``workdir``: where the migration log and (local) checkpoints go;
      ``checkpoint_dir``: the checkpoint folder (default ``<workdir>/checkpoints``, or the terraform provisioner's S3
      prefix); ``name``: the fleets are ``<name>-1``, ``<name>-2`` ...
    - ``max_migrations``: moves before giving up; ``max_local_processes``, ``simulate_notice_after``: the default
      (local) provisioner's; ``poll_s``: how often the launcher looks at the job.
    - ``heartbeat_s`` / ``heartbeat_max_age_s``: the launcher's heartbeat, and the age at which a job whose launcher
      died checkpoints and leaves; ``max_life_h``: each fleet's life cap (default: the plan's time x 1.5 + 1 h);
      ``start_timeout_s``: a cloud fleet that has not started the job by then is given up (default 30 min).
    - ``spot_policy`` (``srifty``, ``greedy``, ``uniform``, ``off``; None: ``srifty`` for a spot or mixed entry of a
      plan with a deadline, else ``off``) steers the fleet between spot and the same fleet on-demand against the
      plan's deadline, checking every ``spot_check_s`` seconds (:mod:`lightning_srifty.provision.launcher.spot_guard`).
    - ``resume``: the checkpoint the first fleet's job resumes from (``srifty launch --resume`` finds the newest
      sound one an interrupted launch left); ``""``: a fresh start. ``launch_id``: None makes a new one.

    Raises:
        ConfigError: when made, a heartbeat setting, the life cap or the spot check's period that cannot work.
    """

    choice: int = 0
    workdir: str | os.PathLike[str] = "srifty/launch"
    checkpoint_dir: str | None = None
    name: str = "srifty"
    max_migrations: int = 3
    max_local_processes: int = 8
    simulate_notice_after: float | None = None
    poll_s: float = 0.5
    heartbeat_s: float = 30.0
    heartbeat_max_age_s: float = 600.0
    max_life_h: float | None = None
    launch_id: str | None = None
    start_timeout_s: float | None = None
    spot_policy: str | None = None
    spot_check_s: float = DEFAULT_CHECK_S
    resume: str = ""

    def __post_init__(self) -> None:
        _check_settings(self.heartbeat_s, self.heartbeat_max_age_s, self.max_life_h, self.spot_check_s)

    def but(self, **changes: Any) -> LauncherSettings:
        """These settings with ``changes`` (field names; an unknown one is named with the fields there are).

        Raises:
            TypeError: a name that is not a field.
        """
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(
                f"launch() got unknown setting(s) {', '.join(map(repr, unknown))}: LauncherSettings has "
                f"{', '.join(sorted(known))}."
            )
        return replace(self, **changes)


def launch(
    plan: Plan,
    script: list[str] | None = None,
    *,
    settings: LauncherSettings | None = None,
    provisioner: Provisioner | None = None,
    echo: Any = print,
    catalog: Any = None,
    **changes: Any,
) -> list[Migration]:
    """Run the job on the plan's entry ``settings.choice`` and keep it running through migrations (see the module
    doc), as :class:`LauncherSettings` say; keyword ``changes`` are fields of those settings (``launch(plan, script,
    workdir="run", max_migrations=1)``).

    ``provisioner`` defaults to the local one running ``script``; ``catalog`` prices the on-demand fleet the spot
    guard falls back to when the plan has none (default ``Catalog.load()``).

    Raises:
        ConfigError: a heartbeat setting, the life cap or the spot policy cannot work.
        MigrationError: the job failed, left for good, or no fleet is left.
        LaunchInterrupted: SIGINT, SIGTERM or SIGHUP (from the main thread); every fleet was released.
        TypeError: a keyword that is not a field of :class:`LauncherSettings`.
    """
    s = (settings or LauncherSettings()).but(**changes) if changes else (settings or LauncherSettings())
    choice = s.choice
    spot_policy = policy_for(s.spot_policy, plan.entries[choice], plan)
    if provisioner is None:
        provisioner = _local_provisioner(script, s.max_local_processes, s.simulate_notice_after, echo)
    launch_id = s.launch_id or protocol.new_launch_id()
    root = Path(s.workdir)
    root.mkdir(parents=True, exist_ok=True)
    ckpt = s.checkpoint_dir or getattr(provisioner, "checkpoint_uri", None) or str((root / "checkpoints").resolve())
    _take_the_folder(ckpt, launch_id)
    echo(f"srifty launch: launch {launch_id}, checkpoints and records in {ckpt}")
    if s.resume:
        echo(f"srifty launch: the job resumes from {s.resume}")
    echo(
        f"srifty launch: if this launcher dies without releasing its fleets (kill -9, a lost machine), their jobs "
        f"checkpoint and leave and the instances shut down once its heartbeat is {s.heartbeat_max_age_s:.0f} s old "
        "(--heartbeat-max-age); each fleet's line says how to release it at once."
    )
    start_timeout_s = s.start_timeout_s
    if start_timeout_s is None and provisioner.kind != "local":  # local processes are polled directly
        start_timeout_s = DEFAULT_START_TIMEOUT_S
    run = _Run(
        ckpt=ckpt, launch_id=launch_id, log_path=root / "migrations.jsonl", name=s.name,
        max_migrations=s.max_migrations, poll_s=s.poll_s, max_life_h=s.max_life_h, start_timeout_s=start_timeout_s,
        spot_policy=spot_policy, spot_check_s=s.spot_check_s, catalog=catalog, resume=s.resume,
    )  # fmt: skip
    heartbeat = _HeartbeatWriter(ckpt, launch_id, s.heartbeat_s, s.heartbeat_max_age_s, echo)
    launcher = Launcher(plan, choice, provisioner, heartbeat, run, echo)
    with Interrupts(echo, "srifty launch", "still releasing the fleets, please wait"):
        heartbeat.start()
        try:
            return launcher.run()
        except LaunchInterrupted as exc:
            exc.released = [f.name for f in launcher.up]
            raise
        finally:
            _release(provisioner, launcher.up, echo)
            heartbeat.stop()


def _check_settings(
    heartbeat_s: float, heartbeat_max_age_s: float, max_life_h: float | None, spot_check_s: float
) -> None:
    """Refuse, before anything starts, the settings a launch cannot work with: each error names the flag to change.

    Raises:
        ConfigError: a heartbeat setting, the life cap or the spot check's period cannot work.
    """
    for option, value in (("heartbeat_s", heartbeat_s), ("heartbeat_max_age_s", heartbeat_max_age_s)):
        if not value > 0:
            raise ConfigError(f"The {option!r} parameter of launch() must be > 0. Got {value!r}.", parameter=option)
    if heartbeat_max_age_s < 2 * heartbeat_s:
        raise ConfigError(
            f"--heartbeat-max-age ({heartbeat_max_age_s} s) must be at least twice --heartbeat-s ({heartbeat_s} s): "
            "otherwise one late write makes the jobs leave. Raise --heartbeat-max-age or lower --heartbeat-s.",
            parameter="heartbeat_max_age_s",
            value=heartbeat_max_age_s,
        )
    if max_life_h is not None and not max_life_h > 0:
        raise ConfigError(
            f"--max-life-h must be > 0 hours. Got {max_life_h!r}.", parameter="max_life_h", value=max_life_h
        )
    if not (isinstance(spot_check_s, (int, float)) and math.isfinite(spot_check_s) and spot_check_s > 0):
        raise ConfigError(
            f"--spot-check-s must be > 0 seconds. Got {spot_check_s!r}.", parameter="spot_check_s", value=spot_check_s
        )


def _local_provisioner(
    script: list[str] | None, max_processes: int, simulate_notice_after: float | None, echo: Any
) -> Provisioner:
    """The default provisioner: ``script`` as processes on this machine.

    Raises:
        MigrationError: no script to run.
    """

    if not script:
        raise MigrationError("The local provisioner needs the training script to run.")
    return LocalProvisioner(script, max_processes=max_processes, simulate_notice_after=simulate_notice_after, echo=echo)


def _take_the_folder(ckpt: str, launch_id: str) -> None:
    """Make the checkpoint folder this launch's: refused while another launch is live there; an earlier launch's
    handovers (never boot from them) and records (they would read as this launch's news) are cleared."""
    _refuse_a_live_launch(ckpt, launch_id)
    old = [n for n in protocol.present(ckpt) if n.startswith("HANDOVER-")]
    protocol.clear(ckpt, *old)
    protocol.clear_records(ckpt, Preempted, Finished, Failed, MoveRequest, MoveDeclined, Leave, Started, Progress)


def _release(provisioner: Provisioner, up: list[LaunchedFleet], echo: Any) -> None:
    """Stop and release every fleet still up, whatever ended the launch, then destroy once more what a failed apply
    left half-made and could not destroy then (the provisioner's ``leftovers``, e.g. a declined move's new fleet); a
    fleet that cannot be released is named with the command that releases it, and the others are still released."""
    for remaining in up:
        try:
            provisioner.stop(remaining)
            provisioner.down(remaining)
        except Exception as exc:  # noqa: BLE001 - report every fleet left behind, keep the first error
            echo(f"srifty launch: releasing {remaining.entry.fleet} ({remaining.name}) failed: {exc}")
    leftovers = getattr(provisioner, "leftovers", [])
    while leftovers:
        half = leftovers.pop(0)
        try:
            provisioner.down(half)
        except Exception as exc:  # noqa: BLE001 - name it and go on with the others
            folder = half.data.get("folder", "?")
            echo(
                f"srifty launch: the partly applied {half.name} could not be destroyed ({exc}): it may still be "
                f"billing; release it with: srifty down --dir {folder}"
            )


@dataclass(frozen=True)
class _Run:
    """What :func:`launch` resolved from its :class:`LauncherSettings` and the provisioner, as the launcher consults
    it while running: where the records go and the limits it keeps."""

    ckpt: str  # the checkpoint folder: the job's checkpoints and both sides' records
    launch_id: str
    log_path: Path  # migrations.jsonl, one line per move
    name: str  # the fleets are <name>-1, <name>-2 ... for the whole launch
    max_migrations: int
    poll_s: float
    max_life_h: float | None
    start_timeout_s: float | None
    spot_policy: str  # off: no spot guard
    spot_check_s: float
    catalog: Any
    resume: str = ""  # the first fleet's checkpoint to resume from ("": a fresh start)


@dataclass(frozen=True)
class _Poll:
    """One look at the job: its fleet's exit status (None: still running) and the records in the folder, from one
    listing; only what is there is read, and only this launch's records."""

    code: int | None
    there: set[str]
    ckpt: str
    launch_id: str

    def has(self, cls: Any) -> bool:
        return cls.FILE in self.there

    def read(self, cls: Any) -> Any:
        return protocol.read_record(self.ckpt, cls, self.launch_id) if self.has(cls) else None


@dataclass(frozen=True)
class _Pending:
    """A move whose new fleet is up while the job still trains on the old one, told to leave (``LEAVE.json``)."""

    fleet: LaunchedFleet
    plan_uri: str  # where the job on the new fleet reads its plan
    request: MoveRequest  # the job's, or the spot guard's
    up_s: float


@dataclass(frozen=True)
class _Leaving:
    """A leg the job left (its ``PREEMPTED.json``), as the move to the next leg is recorded: what that leg resumes
    from and why it moves."""

    left: Preempted
    gone: float  # monotonic: the old leg's processes gone
    resume: str  # the checkpoint the next leg starts from ("": the newest there)
    old: LaunchedFleet
    trigger: str
    voluntary: bool
    while_training: float  # seconds the new fleet took to come up while the old one trained


class _Steer:
    """The spot guard at work in a launch: the spot (or mixed) fleet it watches, that fleet's on-demand twin, where
    the job reads each plan, and when the next check is due. :meth:`target` says which of the two to move to now,
    if any; the launch moves."""

    def __init__(
        self, guard: SpotGuard, spot: tuple[Plan, int, str], od: tuple[Plan, int, str], check_s: float, echo: Any
    ) -> None:
        self.guard, self.spot, self.od, self.check_s, self.echo = guard, spot, od, check_s, echo
        self.next_check = time.monotonic() + check_s
        self.refused = 0  # spot starts refused in a row while on on-demand
        self.retry_at = 0.0  # no return to spot before this (monotonic): 1, 2, 4 ... 16 checks after a refusal

    def spot_refused(self) -> None:
        """Each start costs a provisioning attempt (minutes with Terraform): back off while spot stays away."""
        self.guard.observe(False)
        self.refused += 1
        self.retry_at = time.monotonic() + self.check_s * min(2 ** (self.refused - 1), 16)

    def kind(self, fleet: LaunchedFleet | None) -> str | None:
        """``spot``, ``on-demand`` (the twin), None (no fleet: waiting) or ``other`` (a fleet the guard does not
        steer: another entry the job or a failover moved to)."""
        if fleet is None:
            return None
        for name, (plan, index, _) in (("spot", self.spot), ("on-demand", self.od)):
            if fleet.entry == plan.entries[index]:
                return name
        return "other"

    def due(self) -> bool:
        if time.monotonic() < self.next_check:
            return False
        self.next_check = time.monotonic() + self.check_s
        return True

    def target(self, fleet: LaunchedFleet) -> tuple[tuple[Plan, int, str], Decision] | None:
        """At a check with ``fleet`` running: the fleet to move to and why, or None to stay. On spot the capacity
        is there (no notice came); on the twin the guard is asked whether spot would be worth going back to, and
        the launch then tries to start it."""
        kind = self.kind(fleet)
        if kind == "spot":
            self.guard.observe(True)
            d = self.guard.decide(time.time(), "spot")
            return (self.od, d) if d.action == "on-demand" else None
        if kind == "on-demand" and time.monotonic() >= self.retry_at:
            d = self.guard.decide(time.time(), "on-demand", available=True)
            return (self.spot, d) if d.action == "spot" else None
        return None


class Launcher:
    """One launch at work: the fleet the job runs on, where each plan is kept and when the run began working to it,
    the moves made and those whose new leg has not taken its first step, a voluntary move's fleet waiting for the job
    to leave, and the spot guard's steering.

    :meth:`run` polls until the job finishes; each poll is answered by named steps, in the order that matters
    (:meth:`_answer`). The fleets brought up are in ``up`` from the moment they are up, so that :func:`launch`
    releases them whatever ends the run.
    """

    fleet: LaunchedFleet  # the fleet the job runs on (while waiting for spot: the last one, released)
    plan_uri: str  # where the job on ``fleet`` reads its plan
    global_batch: int  # samples per optimizer step, kept on every later fleet

    def __init__(
        self, plan: Plan, choice: int, provisioner: Provisioner, heartbeat: _HeartbeatWriter, settings: _Run,
        echo: Any,
    ) -> None:  # fmt: skip
        self.plan, self.choice, self.provisioner, self.heartbeat = plan, choice, provisioner, heartbeat
        self.settings, self.echo = settings, echo
        self.up: list[LaunchedFleet] = []  # every fleet brought up and not released yet
        self.migrations: list[Migration] = []
        self.awaiting: list[tuple[Migration, str]] = []  # moves whose new leg has not stepped, and its checkpoint
        self.plan_started: dict[str, float] = {}  # each kept plan -> when the run began working to it
        self.silent = _Silence(settings.start_timeout_s, echo)
        self.names = (f"{settings.name}-{n}" for n in itertools.count(1))  # unique for the whole launch
        self.steer: _Steer | None = None
        self.pending: _Pending | None = None  # a voluntary move's new fleet, up
        self.waiting: _Leaving | None = None  # the guard waits for spot: no fleet; what the next one resumes from

    def run(self) -> list[Migration]:
        """Bring the first fleet up and start the job there, then poll every ``poll_s`` until it finishes; whatever
        ends the run, the moves measured so far are reported."""
        self._bring_up()
        try:
            self._start(self.fleet, self.plan_uri, self.settings.resume)
            while True:
                time.sleep(self.settings.poll_s)
                if self.waiting is not None:
                    self._wait_for_spot(self.steer)  # type: ignore[arg-type]
                elif self._answer(self._poll()):
                    return self.migrations
        finally:
            self._flush()

    # --- the first fleet ---------------------------------------------------------------------------------------

    def _bring_up(self) -> None:
        """Keep the plan where the job reads it, fail a layout srifty launch cannot start before any fleet is up, fix
        the global batch every later fleet keeps, and bring the first fleet up: the plan's choice (or the next
        entries that can start), or its on-demand twin when the spot guard says so from the start."""
        plan, choice = self.plan, self.choice
        self.plan_uri = self._keep_plan(plan)
        entry_strategy(plan.entries[choice])
        sizes, accumulation = fleet_batches(plan.entries[choice])
        self.global_batch = sum(sizes) * accumulation
        if self.settings.spot_policy != "off":
            steer, first = self._set_up_steer()
            if first.action == "on-demand":
                self.fleet, _ = self._up_one(steer.od)
                self.plan_uri = steer.od[2]
                return
        self.fleet, _ = _up_or_next(self.provisioner, plan, choice, self.names, self.echo, up=self.up)

    def _set_up_steer(self) -> tuple[_Steer, Decision]:
        """The spot guard for the plan's choice and its on-demand twin (whose plan, when another, counts its deadline
        from the same start), and its first decision, said with the policy and the fallback's price."""
        s, plan, choice = self.settings, self.plan, self.choice
        od_plan, od_index = on_demand_fleet(plan, choice, s.catalog)
        began = self.plan_started[self.plan_uri]
        od_uri = self.plan_uri if od_plan is plan else self._keep_plan(od_plan, began)
        guard = guard_for(s.spot_policy, plan, choice, od_plan, od_index, started_unix=began,
                          global_batch=self.global_batch, check_s=s.spot_check_s)  # fmt: skip
        steer = _Steer(guard, (plan, choice, self.plan_uri), (od_plan, od_index, od_uri), s.spot_check_s, self.echo)  # type: ignore[arg-type]
        self.steer = steer
        first = steer.guard.decide(time.time(), None, available=True)
        od = od_plan.entries[od_index]
        self.echo(
            f"srifty launch: spot policy {s.spot_policy} against the {plan.constraints.deadline_h:g} h deadline, a "
            f"check every {s.spot_check_s:g} s; on-demand fallback {od.fleet} at ${od.usd_per_hour:,.4f}/h; "
            f"{first.describe()}"
        )
        return steer, first

    # --- each poll ---------------------------------------------------------------------------------------------

    def _poll(self) -> _Poll:
        """The fleet's exit status and one listing of the records."""
        code = self.provisioner.poll(self.fleet)
        return _Poll(code, protocol.present(self.settings.ckpt), self.settings.ckpt, self.settings.launch_id)

    def _answer(self, poll: _Poll) -> bool:
        """Answer one poll; True once the job finished. In order: a move's new leg stepping is measured; a silent
        fleet is caught; a failure ends the run; a move request is answered (not while a move or an end is under
        way); a spot guard's check is due; the end; and last the job leaving."""
        self._on_started(poll)
        finished, left, failed = poll.read(Finished), poll.read(Preempted), poll.read(Failed)
        if poll.code is None and not (finished or left or failed or poll.has(MoveRequest)):
            self.silent.check(self.fleet, poll.read(Started))
        if failed is not None:
            raise MigrationError(f"The job failed on {self.fleet.entry.fleet} at step {failed.step}: {failed.error}")
        busy = self.pending is not None or finished is not None or left is not None
        request = None if busy else poll.read(MoveRequest)
        if request is not None:
            self._answer_move_request(request)
            return False
        if self.steer is not None and not (busy or poll.code is not None) and self.steer.due():
            self._steer_spot(self.steer, poll)
            return False
        if finished is not None or (poll.code == 0 and left is None):
            self._finish()
            return True
        if left is not None:
            self._on_leave(left)
        elif poll.code is not None:
            raise MigrationError(
                f"The job failed on {self.fleet.entry.fleet} with exit status {poll.code} (not a preemption)."
            )
        return False

    def _on_started(self, poll: _Poll) -> None:
        """A move is measured once its new leg took its first step (``STARTED.json`` naming the checkpoint it resumed
        from): the downtime since the old leg's last step, what the restart cost (the spot guard counts on it), and
        the move is reported."""
        started = poll.read(Started) if self.awaiting else None
        if started is None or started.first_step_unix is None:
            return
        for i, (move, resume) in enumerate(self.awaiting):
            if started.resumed_from != resume:
                continue
            move.first_step_unix = started.first_step_unix
            if move.last_step_unix is not None:
                move.downtime_s = max(0.0, started.first_step_unix - move.last_step_unix)
            if self.steer is not None and move.started_unix is not None:
                # the save, bringing the fleet up, the start and the restore: what a restart costs
                self.steer.guard.restarted(
                    (move.checkpoint_s or 0.0) + (move.up_s or 0.0)
                    + max(0.0, started.first_step_unix - move.started_unix)
                )  # fmt: skip
            self._report(self.awaiting.pop(i)[0])
            return

    def _answer_move_request(self, request: MoveRequest) -> None:
        """The job asks to move (drift, prices) with a re-ranked plan: declined past ``max_migrations``; else the new
        fleet is brought up first, while the job trains, and only then is the job told to leave. A new fleet that
        cannot be brought up (no capacity, a failed pre-flight or apply, values over the launcher's own limits: what
        it made is already released) declines the move: the job's fleet is healthy, so the job trains on there. A
        declined move is answered (``MoveDeclined``), so that the job's triggers go on checking (or stop asking, past
        ``max_migrations``)."""
        protocol.clear_records(self.settings.ckpt, MoveRequest)
        if len(self.migrations) >= self.settings.max_migrations:
            self._decline(request, "--max-migrations reached", again=False)
            return
        new_plan = load_plan(request.plan)
        self.echo(f"srifty launch: move requested ({request.why}): {request.reason}")
        try:
            new, up_s = _up_or_next(self.provisioner, new_plan, new_plan.chosen, self.names, self.echo, up=self.up)
        except (ProvisionError, ConfigError) as exc:  # the job trains where it is
            self._decline(request, f"its fleet could not be brought up ({exc})", again=True)
            return
        self._ask_to_leave(_Pending(new, self._keep_plan(new_plan), request, up_s))

    def _decline(self, request: MoveRequest, why: str, *, again: bool) -> None:
        fleet = self.fleet.entry.fleet if self.fleet is not None else "its fleet"
        self.echo(f"srifty launch: move to {request.to_fleet} declined: {why}; the job trains on {fleet}")
        protocol.write_record(
            self.settings.ckpt,
            MoveDeclined(launch_id=self.settings.launch_id, to_fleet=request.to_fleet, reason=why, again=again),
        )

    def _steer_spot(self, steer: _Steer, poll: _Poll) -> None:
        """At a spot guard's check, with the job training: feed it the job's progress and move where it says, the new
        fleet up first, as a voluntary move. Declined past ``max_migrations``; spot refused on the way back from
        on-demand is backed off (on-demand refused is an error: it was the fallback)."""
        progress = poll.read(Progress)
        if progress is not None:
            steer.guard.progress(progress.step, progress.step_time_s)
        move_to = steer.target(self.fleet)
        if move_to is None:
            return
        if len(self.migrations) >= self.settings.max_migrations:
            self.echo("srifty launch: the spot policy's move declined: --max-migrations reached")
            return
        target, d = move_to
        kind = "on-demand" if target is steer.od else "spot"
        self.echo(f"srifty launch: at step {steer.guard.step} on {steer.kind(self.fleet)}; {d.describe()}")
        try:
            new, up_s = self._up_one(target)
        except CapacityError as exc:
            if kind == "on-demand":
                raise
            steer.spot_refused()
            wait_s = steer.retry_at - time.monotonic()
            self.echo(
                f"srifty launch: spot is not there ({exc.code}): staying on on-demand, next try in {wait_s:.0f} s"
            )
            return
        if kind == "spot":
            steer.guard.observe(True)
            steer.refused = 0
        asked = MoveRequest(
            launch_id=self.settings.launch_id, why="deadline", reason=d.describe(), to_fleet=new.entry.fleet
        )
        self._ask_to_leave(_Pending(new, target[2], asked, up_s))

    def _ask_to_leave(self, pending: _Pending) -> None:
        """The new fleet is up: tell the job to checkpoint and leave (``LEAVE.json``) and keep the fleet for then."""
        self.pending = pending
        protocol.write_record(
            self.settings.ckpt, Leave(launch_id=self.settings.launch_id, to_fleet=pending.fleet.entry.fleet)
        )

    def _finish(self) -> None:
        """The job finished: its processes are let go, the moves measured are reported and the run is said."""
        _wait_exit(self.provisioner, self.fleet)
        self._flush()
        self.echo(f"srifty launch: finished on {self.fleet.entry.fleet} after {len(self.migrations)} migration(s)")

    # --- the job left: the next leg ----------------------------------------------------------------------------

    def _on_leave(self, left: Preempted) -> None:
        """The job left (a spot notice, SIGTERM, the move granted, or on its own): once its processes are gone, decide
        what the next leg resumes from, and which fleet takes it: the granted move's, or :meth:`_on_notice`'s.

        Raises:
            MigrationError: it left for good (the launcher's heartbeat, the life cap), or past ``max_migrations``.
        """
        _wait_exit(self.provisioner, self.fleet)
        gone = time.monotonic()
        protocol.clear_records(self.settings.ckpt, Preempted, Leave)
        if left.trigger in ("heartbeat", "max-life"):
            raise self._left_for_good(left)
        resume = self._resume_from(left)
        if self.pending is not None and left.move:
            pending, self.pending = self.pending, None
            leaving = _Leaving(left, gone, resume, self.fleet, pending.request.why, True, pending.up_s)
            self._arrive(pending.fleet, pending.plan_uri, pending.up_s, leaving)
            return
        if len(self.migrations) >= self.settings.max_migrations:
            raise MigrationError(f"Preempted again after {self.settings.max_migrations} migrations: giving up.")
        trigger = left.trigger if left.trigger in ("spot", "sigterm") else "spot"
        self._on_notice(_Leaving(left, gone, resume, self.fleet, trigger, False, 0.0))

    def _left_for_good(self, left: Preempted) -> MigrationError:
        """The job left on the launcher's heartbeat or the life cap: no move, the error with its fix."""
        fix = (
            "raise --max-life-h (the cap counts from each fleet's start)"
            if left.trigger == "max-life"
            else "the launcher's heartbeat did not reach it: check that the checkpoint folder is reachable "
            "and that --heartbeat-max-age is well above --heartbeat-s"
        )
        return MigrationError(
            f"The job on {self.fleet.entry.fleet} left at step {left.step}: {left.why}; its checkpoint is "
            f"{left.checkpoint or '(none)'}: {fix}."
        )

    def _resume_from(self, left: Preempted) -> str:
        """The checkpoint the next leg starts from: the one the job left, unless the store did not take it in time
        (then "": the newest there). One without its manifest fails now, before a fleet starts (the nodes refuse
        it too)."""
        resume = left.checkpoint or ""
        if left.stored != "durable":
            self.echo(
                f"srifty launch: the last checkpoint did not reach {self.settings.ckpt} before the deadline; it is on "
                f"the old fleet's disk ({left.stored.removeprefix('local ')}); resuming from the newest checkpoint "
                "there"
            )
            resume = ""
        if resume:
            protocol.require_manifest(resume)
        return resume

    def _on_notice(self, leaving: _Leaving) -> None:
        """An involuntary move: the fleet of a move granted just before (it is up: use it); the spot guard's choice
        when the fleet was its spot one (:meth:`_after_spot_loss`); else the plan's next entry.

        Raises:
            MigrationError: no entry of the plan left to move to.
        """
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._arrive(pending.fleet, pending.plan_uri, pending.up_s, leaving)
            return
        if self.steer is not None and self.steer.kind(self.fleet) == "spot":
            self._after_spot_loss(self.steer, leaving)
            return
        nxt = self.fleet.index + 1
        if nxt >= len(self.fleet.plan.entries):
            raise MigrationError(
                f"No fleet left in the plan after {len(self.migrations)} migration(s): re-plan with srifty recommend."
            )
        new, up_s = _up_or_next(self.provisioner, self.fleet.plan, nxt, self.names, self.echo, up=self.up)
        self._arrive(new, self.plan_uri, up_s, leaving)

    def _after_spot_loss(self, steer: _Steer, leaving: _Leaving) -> None:
        """Spot is gone under the guard's fleet: the guard decides between its on-demand twin and spot again; if it
        waits for spot (or spot is refused), the old fleet is released now and :meth:`_wait_for_spot` tries at each
        check."""
        left = leaving.left
        steer.guard.progress(left.step)
        steer.guard.observe(False)
        d = steer.guard.decide(time.time(), None)
        self.echo(f"srifty launch: spot gone at step {left.step}; {d.describe()}")
        got = self._start_guards_choice(steer, d)
        if got is None:
            self.provisioner.down(self.fleet)
            self.up.remove(self.fleet)
            steer.next_check = time.monotonic() + self.settings.spot_check_s
            self.waiting = leaving
            return
        self._arrive(*got, leaving)

    def _wait_for_spot(self, steer: _Steer) -> None:
        """No fleet: at each check, the on-demand twin if the guard says so, else another try at spot; the fleet that
        starts takes the job from the checkpoint the last leg left."""
        if not steer.due():
            return
        d = steer.guard.decide(time.time(), None)
        got = self._start_guards_choice(steer, d)
        if got is None:
            return
        if d.action == "on-demand":
            self.echo(f"srifty launch: still no spot; {d.describe()}")
        self._arrive(*got, self.waiting)  # type: ignore[arg-type]
        self.waiting = None

    def _start_guards_choice(self, steer: _Steer, d: Decision) -> tuple[LaunchedFleet, str, float] | None:
        """Bring up the fleet the guard chose: (fleet, where its job reads the plan, seconds to bring it up); None
        when it chose spot and spot was refused."""
        if d.action == "on-demand":
            new, up_s = self._up_one(steer.od)
            return new, steer.od[2], up_s
        got = self._spot_again(steer)
        return None if got is None else (got[0], steer.spot[2], got[1])

    def _up_one(self, target: tuple[Plan, int, str]) -> tuple[LaunchedFleet, float]:
        """The guard's fleet, in other zones too, but never another entry of the plan (the guard chose this one)."""
        return _up_or_next(self.provisioner, target[0], target[1], self.names, self.echo, up=self.up, only=True)

    def _spot_again(self, steer: _Steer) -> tuple[LaunchedFleet, float] | None:
        """A spot start while waiting (its zone failover included); None, and capacity marked gone, if refused."""
        try:
            new = self._up_one(steer.spot)
        except CapacityError as exc:
            steer.guard.observe(False)
            self.echo(f"srifty launch: spot still gone ({exc.code}); next try in {self.settings.spot_check_s:g} s")
            return None
        steer.guard.observe(True)
        return new

    def _arrive(self, new: LaunchedFleet, new_uri: str, up_s: float, leaving: _Leaving) -> None:
        """Start the job on ``new`` from the old leg's checkpoint, record the move (reported once the new leg steps),
        release the old fleet (last: the new one has the job; a wait for spot released it already)."""
        left, old = leaving.left, leaving.old
        self._start(new, new_uri, leaving.resume)
        move = Migration(
            dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            str(left.why or leaving.trigger),
            leaving.trigger,
            leaving.voluntary,
            old.entry.fleet,
            new.entry.fleet,
            left.step,
            left.notice_to_durable_s,
            None,
            leaving.while_training,
            left.durable_unix,
            checkpoint_s=left.save_s,
            up_s=up_s,
            restart_s=time.monotonic() - leaving.gone,
            last_step_unix=left.last_step_unix or left.durable_unix,
            started_unix=time.time(),
        )
        self.migrations.append(move)
        self.awaiting.append((move, leaving.resume))
        if old in self.up:
            self.provisioner.down(old)
            self.up.remove(old)
        self.fleet, self.plan_uri = new, new_uri

    # --- what every leg needs ----------------------------------------------------------------------------------

    def _start(self, fleet: LaunchedFleet, plan_uri: str, resume: str) -> None:
        """Start the job on ``fleet`` with its settings (:class:`LaunchEnv`): the global batch split over its GPUs, its
        layout, the plan it reads and when the run began working to it, and the fleet's life cap, which the
        heartbeat carries from now on."""
        until = life_until(fleet.entry, self.settings.max_life_h)
        self.heartbeat.max_life_until_unix = until
        sizes, accumulation = fleet_batches(fleet.entry, self.global_batch)
        env = LaunchEnv(
            launch_id=self.settings.launch_id,
            checkpoint_uri=self.settings.ckpt,
            resume=resume,
            fleet=fleet.entry.fleet,
            plan=plan_uri,
            choice=fleet.index,
            batch_sizes=tuple(sizes),
            accumulate_grad_batches=accumulation,
            strategy=entry_strategy(fleet.entry),  # a move to another entry may change the layout
            # when the run began working to this plan (its deadline counts from then; a re-ranked plan's from the move)
            plan_started_unix=self.plan_started[plan_uri],
            heartbeat_max_age_s=self.heartbeat.max_age_s,
            max_life_until_unix=until,
        )
        self.heartbeat.beat()  # the new cap, now
        self.provisioner.start(fleet, env.to_env())
        self.silent.started(fleet)

    def _keep_plan(self, plan: Plan, started_unix: float | None = None) -> str:
        """Write ``plan`` where the job reads it and note when the run began working to it (default: now)."""
        uri = protocol.write(self.settings.ckpt, f"plans/plan-{len(self.plan_started) + 1}.json", plan.to_dict())
        self.plan_started[uri] = time.time() if started_unix is None else started_unix
        return uri

    def _report(self, move: Migration) -> None:
        """A move in words, and appended to ``migrations.jsonl``."""
        with self.settings.log_path.open("a") as f:
            f.write(json.dumps(asdict(move)) + "\n")
        self.echo(f"srifty launch: {move.describe()}")

    def _flush(self) -> None:
        """The run ends before a new leg's first step: report what was measured."""
        while self.awaiting:
            self._report(self.awaiting.pop(0)[0])


def _wait_exit(provisioner: Provisioner, fleet: LaunchedFleet, timeout: float = 120.0) -> None:
    """Local processes: wait for them to exit (the marker comes just before) so the next fleet has the machine."""
    wait = getattr(provisioner, "wait", None)
    if wait is not None and wait(fleet, timeout) is None:
        provisioner.stop(fleet)
