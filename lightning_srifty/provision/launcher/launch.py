"""``srifty launch --plan plan.json [--choice N] -- train.py [args]``: run the training job on the plan's fleet and
keep it running through migrations, through a provisioner (``local``: processes on this machine; ``terraform``: the
generated Terraform of the plan, see :mod:`lightning_srifty.provision`).

The job gets its settings as a :class:`~lightning_srifty.protocol.LaunchEnv` (``SRIFTY_*`` variables) and talks back
through typed records beside the checkpoints (:mod:`lightning_srifty.protocol`, which lists both), the one place
reachable from both sides whatever the provisioner. Every record carries this launch's id: records an earlier launch
left in the folder are ignored.

Two kinds of move:

- *involuntary* (a spot notice or SIGTERM): the job checkpoints and leaves (``PREEMPTED.json``); the launcher brings
  the next fleet of the current plan up, starts the job there from the checkpoint, and releases the old fleet (after
  a node lost without a notice on an on-demand fleet, or a node's GPU failed: the same entry again, once per step
  reached);
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
for long. Each fleet has a life cap (``max_life_h``, else the plan's: the later of its predicted time x 1.5 and the
time's 99th percentile, + 1 h). SIGINT, SIGTERM and
SIGHUP release every fleet brought up and end with :class:`~predictor.exceptions.LaunchInterrupted`.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from lightning_srifty import protocol, store
from lightning_srifty.protocol import (
    RESUME_LATEST,
    Failed,
    Finished,
    Leave,
    MoveDeclined,
    MoveRequest,
    Preempted,
    Progress,
    Started,
    entry_strategy,
)
from lightning_srifty.provision.base import Interrupts, LaunchedFleet, Provisioner
from lightning_srifty.provision.launcher.legs import Legs, Migration, Run
from lightning_srifty.provision.launcher.local import LocalProvisioner
from lightning_srifty.provision.launcher.spot_guard import (
    DEFAULT_CHECK_S,
    POLICY_NAMES,
    policy_for,
)
from lightning_srifty.provision.launcher.steering import Steering, set_up_steering
from lightning_srifty.provision.launcher.watches import (
    DEFAULT_STALL_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    HeartbeatWriter,
    Silence,
    StallWatch,
    refuse_a_live_launch,
)
from predictor.documents.checks import Setting, check_settings
from predictor.documents.plan import Plan, check_choice, load_plan
from predictor.exceptions import ConfigError, LaunchInterrupted, MigrationError, ProvisionError
from predictor.model.batch import fleet_batches

OWNER = "launch()"  # whose parameters the settings are (srifty launch names their flags)


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
      died checkpoints and leaves; ``max_life_h``: each fleet's life cap (default: ``PlanEntry.life_cap_h``);
      ``start_timeout_s``: a cloud fleet that has not started the job by then is given up (default 30 min);
      ``stall_timeout_s``: a job that trained and then showed no sign of life (no step, validation batch or checkpoint
      in its ``PROGRESS.json``) for this long hangs, and is restarted from the newest checkpoint on new machines of
      the same entry (default 20 min, under the process group's 30; None: not watched; :class:`~.watches.StallWatch`).
    - ``after_fit_timeout_s``: once the job's training has finished (``FINISHED.json``, written as its fit ends), how
      long the script may still run on the fleet (a test, an export, a model's upload after ``fit()``) before the
      fleet is released anyway, that work cut and the launch failed (default 30 min). The fleet is released as soon
      as the script has ended on every node (a cloud fleet's nodes: their status records, written once the job's
      outputs and log are beside the checkpoints).
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
    stall_timeout_s: float | None = DEFAULT_STALL_TIMEOUT_S
    after_fit_timeout_s: float = protocol.AFTER_FIT_TIMEOUT_S
    spot_policy: str | None = None
    spot_check_s: float = DEFAULT_CHECK_S
    resume: str = ""

    # the numbers and choices, declared once (predictor.documents.checks.Setting): srifty launch names their flags
    SETTINGS: ClassVar[dict[str, Setting]] = {
        "choice": Setting("int", minimum=0),
        "max_migrations": Setting("int", minimum=0),
        "max_local_processes": Setting("int", minimum=1),
        "simulate_notice_after": Setting("number", minimum=0, exclusive=True, optional=True),
        "poll_s": Setting("number", minimum=0, exclusive=True),
        "heartbeat_s": Setting("number", minimum=0, exclusive=True),
        "heartbeat_max_age_s": Setting("number", minimum=0, exclusive=True),
        "max_life_h": Setting("number", minimum=0, exclusive=True, optional=True),
        "start_timeout_s": Setting("number", minimum=0, exclusive=True, optional=True),
        "stall_timeout_s": Setting("number", minimum=0, exclusive=True, optional=True),
        "after_fit_timeout_s": Setting("number", minimum=0, exclusive=True),
        "spot_policy": Setting("choice", choices=POLICY_NAMES, optional=True),
        "spot_check_s": Setting("number", minimum=0, exclusive=True),
    }

    def __post_init__(self) -> None:
        check_settings(OWNER, self.SETTINGS, {f.name: getattr(self, f.name) for f in fields(self)})
        _check_together(self.heartbeat_s, self.heartbeat_max_age_s)

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
        ConfigError: the choice is not an entry of the plan; a heartbeat setting, the life cap or the spot policy
            cannot work; the local provisioner's ``script`` is one torchrun cannot start (``["python", "-c", ...]``,
            a launcher, the interpreter alone).
        MigrationError: the job failed, left for good, or no fleet is left.
        LaunchInterrupted: SIGINT, SIGTERM or SIGHUP (from the main thread); every fleet was released.
        TypeError: a keyword that is not a field of :class:`LauncherSettings`.
    """
    s = (settings or LauncherSettings()).but(**changes) if changes else (settings or LauncherSettings())
    choice = s.choice
    check_choice(plan, choice)  # an index past the plan (IndexError) or a negative one (the last entry, silently)
    spot_policy = policy_for(s.spot_policy, plan.entries[choice], plan)
    if provisioner is None:
        provisioner = _local_provisioner(script, s.max_local_processes, s.simulate_notice_after, echo)
    launch_id = s.launch_id or protocol.new_launch_id()
    root = Path(s.workdir)
    root.mkdir(parents=True, exist_ok=True)
    ckpt = s.checkpoint_dir or getattr(provisioner, "checkpoint_uri", None) or str((root / "checkpoints").resolve())
    _take_the_folder(ckpt, launch_id)
    _announce(echo, launch_id, ckpt, s)
    start_timeout_s = s.start_timeout_s
    if start_timeout_s is None and provisioner.kind != "local":  # local processes are polled directly
        start_timeout_s = DEFAULT_START_TIMEOUT_S
    run = Run(
        ckpt=ckpt, launch_id=launch_id, log_path=root / "migrations.jsonl", name=s.name,
        max_migrations=s.max_migrations, poll_s=s.poll_s, max_life_h=s.max_life_h, start_timeout_s=start_timeout_s,
        spot_policy=spot_policy, spot_check_s=s.spot_check_s, catalog=catalog, resume=s.resume,
        stall_timeout_s=s.stall_timeout_s, after_fit_timeout_s=s.after_fit_timeout_s,
    )  # fmt: skip
    heartbeat = HeartbeatWriter(ckpt, launch_id, s.heartbeat_s, s.heartbeat_max_age_s, echo)
    legs = Legs(provisioner, heartbeat, run, echo, Silence(run.start_timeout_s, echo), StallWatch(run.stall_timeout_s))
    launcher = Launcher(plan, choice, legs)
    with Interrupts(echo, "srifty launch", "still releasing the fleets, please wait"):
        heartbeat.start()
        try:
            return launcher.run()
        except LaunchInterrupted as exc:
            exc.released = [f.name for f in legs.up]
            raise
        finally:
            _release(provisioner, legs.up, echo)
            heartbeat.stop()


def _announce(echo: Any, launch_id: str, ckpt: str, s: LauncherSettings) -> None:
    """Say where this launch keeps its records, what it resumes from, and what happens if the launcher dies."""
    echo(f"srifty launch: launch {launch_id}, checkpoints and records in {ckpt}")
    if s.resume:
        echo(f"srifty launch: the job resumes from {s.resume}")
    echo(
        f"srifty launch: if this launcher dies without releasing its fleets (kill -9, a lost machine), their jobs "
        f"checkpoint and leave and the instances shut down once its heartbeat is {s.heartbeat_max_age_s:.0f} s old "
        "(--heartbeat-max-age); each fleet's line says how to release it at once."
    )


def _check_together(heartbeat_s: float, heartbeat_max_age_s: float) -> None:
    """Refuse a heartbeat whose max age is under twice its period: one late write would make the jobs leave.

    Raises:
        ConfigError: naming both settings (srifty launch: both flags).
    """
    if heartbeat_max_age_s < 2 * heartbeat_s:
        raise ConfigError.between(
            f"{{heartbeat_max_age_s}} ({heartbeat_max_age_s} s) must be at least twice {{heartbeat_s}} ({heartbeat_s} "
            "s): otherwise one late write makes the jobs leave. Raise {heartbeat_max_age_s} or lower {heartbeat_s}.",
            parameter="heartbeat_max_age_s",
            value=heartbeat_max_age_s,
        )


def left_for_good(fleet: str, left: Preempted) -> MigrationError:
    """The job on ``fleet`` left on the launcher's heartbeat or the life cap: no move, the error with its fix (the
    settings named in the caller's words: ``max_life_h`` in Python, ``--max-life-h`` from srifty launch)."""
    fix = (
        "raise {max_life_h} (the cap counts from each fleet's start)"
        if left.trigger == "max-life"
        else "the launcher's heartbeat did not reach it: check that the checkpoint folder is reachable "
        "and that {heartbeat_max_age_s} is well above {heartbeat_s}"
    )
    return MigrationError.named(
        "The job on {fleet} left at step {step}: {why}; its checkpoint is {checkpoint}: " + fix + ".",
        fleet=fleet,
        step=left.step,
        why=left.why,
        checkpoint=left.checkpoint or "(none)",
    )


def wait_for_script(provisioner: Provisioner, fleet: LaunchedFleet, run: Run, echo: Any = print) -> None:
    """Once the job's training has finished on ``fleet``: wait up to ``run.after_fit_timeout_s`` for its script to end
    there, so that the release cuts nothing it does after its fit (a test, an export, an upload). A script that ended
    with an error then is said (the training is done and in its checkpoints: the launch still finished).

    Raises:
        MigrationError: it still ran then (the nodes named, when the provisioner knows them; the fleet is released,
            and that work cut, by the launch's end), or a node's own watch killed it, silent after its training
            (``hung_after_fit``: the same hang, found first by the node), with where to look and the setting, in
            Python and as srifty's flag.
    """
    code = _wait_exit(provisioner, fleet, run.after_fit_timeout_s, after_fit=True)
    hung = fleet.data.get("hung_after_fit")
    if code is not _STILL_RUNNING and not hung:
        if code:
            failed = fleet.data.get("failed_after_fit") or [fleet.name]
            echo(
                f"srifty launch: WARNING: the job's training finished, but its script then exited {code} on "
                f"{', '.join(failed)}: what it does after fit() (a test, an export, an upload) may not have "
                "completed; see its log (srifty logs)"
            )
        return
    finished = protocol.read_record(run.ckpt, Finished, run.launch_id)
    limit = f"{run.after_fit_timeout_s:.0f} s"
    how = (
        f"showed no sign of life for {limit} on {', '.join(hung)}, whose watch killed it"
        if hung
        else f"had not ended {limit} later on {', '.join(fleet.data.get('still_running') or [fleet.name])}"
    )
    raise MigrationError(
        f"The job's training finished on {fleet.entry.fleet} (FINISHED.json at step "
        f"{finished.step if finished else '?'}), but its script {how}: what it does after fit() (a test, an export, "
        "an upload) is cut as the fleet is released. See where it waits in the nodes' logs (srifty logs), and raise "
        "after_fit_timeout_s (`srifty launch --after-fit-timeout-min`) if that work really takes longer."
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
    refuse_a_live_launch(ckpt, launch_id)
    old = [n for n in store.present(ckpt) if n.startswith("HANDOVER-")]
    store.clear(ckpt, *old)
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
                f"billing; release it with: srifty down --dir {shlex.quote(str(folder))}"
            )


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

    def progress(self) -> Progress | None:
        return self.read(Progress)


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

    def __init__(self, plan: Plan, choice: int, legs: Legs) -> None:
        self.plan, self.choice, self.legs = plan, choice, legs
        self.provisioner, self.settings, self.echo = legs.provisioner, legs.run, legs.echo
        self.migrations: list[Migration] = []
        self.awaiting: list[tuple[Migration, str]] = []  # moves whose new leg has not stepped, and its checkpoint
        self.steer: Steering | None = None
        self.pending: _Pending | None = None  # a voluntary move's new fleet, up
        self.lost = LostNodeWatch(self.settings.start_timeout_s)  # a node lost without a notice
        self.waiting: _Leaving | None = None  # the guard waits for spot: no fleet; what the next one resumes from

    def run(self) -> list[Migration]:
        """Bring the first fleet up and start the job there, then poll every ``poll_s`` until it finishes; whatever
        ends the run, the moves measured so far are reported."""
        self._bring_up()
        try:
            self.legs.start(self.fleet, self.plan_uri, self.settings.resume)
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
        self.plan_uri = self.legs.keep_plan(plan)
        entry_strategy(plan.entries[choice])
        sizes, accumulation = fleet_batches(plan.entries[choice])
        self.legs.global_batch = sum(sizes) * accumulation
        if self.settings.spot_policy != "off":
            steer, first = set_up_steering(plan, choice, self.plan_uri, self.legs)
            self.steer = steer
            if first.action == "on-demand":
                self.fleet, _ = self.legs.bring_up(steer.od[0], steer.od[1], only=True)
                self.plan_uri = steer.od[2]
                return
        self.fleet, _ = self.legs.bring_up(plan, choice)

    # --- each poll ---------------------------------------------------------------------------------------------

    def _poll(self) -> _Poll:
        """The fleet's exit status and one listing of the records."""
        code = self.provisioner.poll(self.fleet)
        return _Poll(code, store.present(self.settings.ckpt), self.settings.ckpt, self.settings.launch_id)

    def _answer(self, poll: _Poll) -> bool:
        """Answer one poll; True once the job finished. In order: a move's new leg stepping is measured; a silent
        fleet is caught; a failure ends the run; a lost node or a stuck job leaves; a move request is answered (not
        while a move or an end is under way); a spot guard's check is due; the end; and last the job leaving."""
        self._on_started(poll)
        finished, left, failed = poll.read(Finished), poll.read(Preempted), poll.read(Failed)
        if poll.code is None and not (finished or left or failed or poll.has(MoveRequest)):
            self.legs.silent.check(self.fleet, poll.read(Started))
        if failed is not None or not (finished or left):  # a fleet that lost a node leaves; a failure raises
            lost = self.lost.check(self.provisioner, self.fleet, failed, self.settings.launch_id, poll.progress)
            if lost is None and failed is not None:
                return False  # its nodes are deciding
            left = left or lost
        left = left or (None if finished or failed else self.legs.hung(self.fleet, poll, self.lost))
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
        for i, (move, resume) in reversed(list(enumerate(self.awaiting))):  # "latest": the newest move's leg first
            newer = started.first_step_unix > (move.started_unix or 0.0)  # and the leg's own, not the last one's
            if started.resumed_from != resume and not (resume == RESUME_LATEST and newer):
                continue
            move.first_step_unix = started.first_step_unix
            if move.last_step_unix is not None:
                move.downtime_s = max(0.0, started.first_step_unix - move.last_step_unix)
            if self.steer is not None and move.started_unix is not None:
                # the save, bringing the fleet up, the start and the restore: what a restart costs; and the save
                start_s = max(0.0, started.first_step_unix - move.started_unix)
                self.steer.guard.restarted((move.checkpoint_s or 0.0) + (move.up_s or 0.0) + start_s, move.checkpoint_s)
            self.legs.report(self.awaiting.pop(i)[0])
            return

    def _answer_move_request(self, request: MoveRequest) -> None:
        """The job asks to move (drift, price, deadline) with a new plan: declined past ``max_migrations``; else the new
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
            new, up_s = self.legs.bring_up(new_plan, new_plan.chosen)
        except (ProvisionError, ConfigError) as exc:  # the job trains where it is
            self._decline(request, f"its fleet could not be brought up ({exc})", again=True)
            return
        self._ask_to_leave(_Pending(new, self.legs.keep_plan(new_plan), request, up_s))

    def _decline(self, request: MoveRequest, why: str, *, again: bool) -> None:
        fleet = self.fleet.entry.fleet if self.fleet is not None else "its fleet"
        self.echo(f"srifty launch: move to {request.to_fleet} declined: {why}; the job trains on {fleet}")
        protocol.write_record(
            self.settings.ckpt,
            MoveDeclined(launch_id=self.settings.launch_id, to_fleet=request.to_fleet, reason=why, again=again),
        )

    def _steer_spot(self, steer: Steering, poll: _Poll) -> None:
        """At a spot guard's check, with the job training: feed it the job's progress and move where it says, the new
        fleet up first, as a voluntary move (:meth:`Steering.at_check`; declined past ``max_migrations``)."""
        moves_left = len(self.migrations) < self.settings.max_migrations
        got = steer.at_check(self.fleet, poll.read(Progress), moves_left)
        if got is None:
            return
        new, plan_uri, up_s, d = got
        asked = MoveRequest(
            launch_id=self.settings.launch_id, why="deadline", reason=d.describe(), to_fleet=new.entry.fleet
        )
        self._ask_to_leave(_Pending(new, plan_uri, asked, up_s))

    def _ask_to_leave(self, pending: _Pending) -> None:
        """The new fleet is up: tell the job to checkpoint and leave (``LEAVE.json``) and keep the fleet for then."""
        self.pending = pending
        protocol.write_record(
            self.settings.ckpt, Leave(launch_id=self.settings.launch_id, to_fleet=pending.fleet.entry.fleet)
        )

    def _finish(self) -> None:
        """The job finished: the moves reported, a move's fleet released, its script's end waited for, the run said."""
        self._flush()
        self.pending = _drop_pending(self.pending, self.legs, self.echo)
        wait_for_script(self.provisioner, self.fleet, self.settings, self.echo)
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
        getattr(self.provisioner, "retire", lambda _: None)(self.fleet)  # no node of it takes the job up again
        protocol.clear_records(self.settings.ckpt, Preempted, Leave, Failed)
        self.lost = LostNodeWatch(self.settings.start_timeout_s)
        if left.trigger in ("heartbeat", "max-life"):
            raise left_for_good(self.fleet.entry.fleet, left)
        resume = self._resume_from(left)
        if self.pending is not None and left.move:
            pending, self.pending = self.pending, None
            leaving = _Leaving(left, gone, resume, self.fleet, pending.request.why, True, pending.up_s)
            self._arrive(pending.fleet, pending.plan_uri, pending.up_s, leaving)
            return
        if len(self.migrations) >= self.settings.max_migrations:
            raise MigrationError(f"The job left again ({left.why}) after {len(self.migrations)} moves: max_migrations")
        trigger = left.trigger if left.trigger in ("spot", "sigterm", "node", "stall") else "spot"
        self._on_notice(_Leaving(left, gone, resume, self.fleet, trigger, False, 0.0))

    def _resume_from(self, left: Preempted) -> str:
        """The checkpoint the next leg starts from: the one the job left, unless the store did not take it in time or
        it left none (a node lost without a notice): then the newest there (:data:`RESUME_LATEST`; an empty resume
        is a fresh start to the job, which this said it resumed until a review). One without its manifest fails now,
        before a fleet starts (the nodes refuse it too)."""
        resume = left.checkpoint or RESUME_LATEST
        if left.stored != "durable":
            self.echo(
                f"srifty launch: the last checkpoint did not reach {self.settings.ckpt} before the deadline; it is on "
                f"the old fleet's disk ({left.stored.removeprefix('local ')}); resuming from the newest checkpoint "
                "there"
            )
            resume = RESUME_LATEST
        if resume != RESUME_LATEST:
            store.require_manifest(resume)
        return resume

    def _on_notice(self, leaving: _Leaving) -> None:
        """An involuntary move: the fleet of a move granted just before (it is up: use it); the spot guard's choice
        when the fleet was its spot one (:meth:`_after_spot_loss`); after a machine's fault (``node``) the same entry
        (:func:`restarted_without_progress`); else the plan's next entry.

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
        nxt, twin = self.fleet.index + 1, self.steer is not None and self.steer.kind(self.fleet) == "on-demand"
        if leaving.trigger in MACHINE and not restarted_without_progress(self.migrations, self.fleet, leaving.left):
            nxt = self.fleet.index  # one machine failed, not the market (the guard's twin alone: refused is an error)
        if nxt >= len(self.fleet.plan.entries):
            raise MigrationError(
                f"No fleet left in the plan after {len(self.migrations)} migration(s): re-plan with srifty recommend."
            )
        new, up_s = self.legs.bring_up(self.fleet.plan, nxt, only=twin and nxt == self.fleet.index)
        self._arrive(new, self.plan_uri, up_s, leaving)

    def _after_spot_loss(self, steer: Steering, leaving: _Leaving) -> None:
        """Spot is gone under the guard's fleet (a ``node`` fault: it is there): the guard decides between its
        on-demand twin and spot again; if it waits for spot (or spot is refused), the old fleet is released now and
        :meth:`_wait_for_spot` tries at each check."""
        got = steer.after_loss(leaving.left.step, spot_gone=leaving.trigger not in MACHINE)
        if got is None:
            self.legs.release(self.fleet)
            steer.next_check = time.monotonic() + self.settings.spot_check_s
            self.waiting = leaving
            return
        self._arrive(*got, leaving)

    def _wait_for_spot(self, steer: Steering) -> None:
        """No fleet: at each check, the fleet the guard chooses (:meth:`Steering.while_waiting`) takes the job from
        the checkpoint the last leg left."""
        got = steer.while_waiting()
        if got is not None:
            self._arrive(*got, self.waiting)  # type: ignore[arg-type]
            self.waiting = None

    def _arrive(self, new: LaunchedFleet, new_uri: str, up_s: float, leaving: _Leaving) -> None:
        """Start the job on ``new`` from the old leg's checkpoint, record the move (reported once the new leg steps),
        release the old fleet (last: the new one has the job; a wait for spot released it already)."""
        old = leaving.old
        self.legs.start(new, new_uri, leaving.resume)
        move = _migration(leaving, new, up_s)
        self.migrations.append(move)
        self.awaiting.append((move, leaving.resume))
        if old in self.legs.up:
            self.legs.release(old)
        self.fleet, self.plan_uri = new, new_uri

    # --- what every leg needs ----------------------------------------------------------------------------------

    def _flush(self) -> None:
        """The run ends before a new leg's first step: report what was measured."""
        while self.awaiting:
            self.legs.report(self.awaiting.pop(0)[0])


MACHINE = ("node", "stall")  # moves for one machine's fault (a lost node, a hung job), not the market's
LOST_NODE_WAIT_S = 300.0  # a failed job's nodes say within this whether their fleet lost one (their boot: 2-4 min)
# a node's verdict 75 with no record of the job's: a notice's PREEMPTED.json comes within the job's leave deadline
# (SpotPreemption's leave_deadline_s, 100 s at most after the notice), its other nodes' verdicts within seconds
SILENT_LEAVE_S = 180.0
# while the job runs (no FAILED.json), its nodes' exit records are listed this often, not at every poll: one S3 list
# each, on every Terraform fleet (one-node fleets too since they write records); a leave without a record waits
# SILENT_LEAVE_S anyway
VERDICT_READ_S = 15.0


def restarted_without_progress(migrations: list[Migration], fleet: LaunchedFleet, left: Preempted) -> bool:
    """Whether the last move already restarted ``fleet``'s entry after a lost node and the job has not got past that
    move's step since: a fault that follows the entry (its type's driver, its image) then goes to the plan's next
    entry, not round the same one until ``max_migrations`` (a review)."""
    if not migrations:
        return False
    last = migrations[-1]
    same = last.trigger in MACHINE and last.to_fleet == fleet.entry.fleet
    return same and (left.step is None or last.step is None or left.step <= last.step)


class LostNodeWatch:
    """Whether the job's fleet lost a node without a spot notice, from what its nodes' boot scripts say of their jobs'
    ends (their verdict 75, :func:`protocol.node_verdicts`; the Terraform fleets): a job that failed (rank 0's
    ``FAILED.json``: its collective lost the node, or its own GPU failed, a one-node fleet's too) or that left no
    record at all (rank 0 was on that node) is then a leave like a notice's, resumed from the newest checkpoint. So
    is a node that EC2 lists no more and that recorded no end (the provisioner's ``vanished``): no peer says it when
    the fleet had one node or lost every node at once."""

    def __init__(self, replace_s: float | None = None) -> None:
        self.since: float | None = None  # monotonic: when a verdict or a failure was first seen
        self.read_at: float | None = None  # monotonic: the last read of the verdicts while the job runs
        # what is up of a fleet that lost a node without a word gets this long to train (its replacement's boot)
        self.replace_s = DEFAULT_START_TIMEOUT_S if replace_s is None else replace_s
        self.lost_at: tuple[float, tuple[Any, ...] | None] | None = None  # when, and the job's progress then
        self.carried_on = False  # the job trained on there since

    def replacing(self) -> bool:
        """Whether what is up of a fleet that lost a node still has its time to carry the job (not yet trained)."""
        return self.lost_at is not None and not self.carried_on and time.monotonic() - self.lost_at[0] <= self.replace_s

    def _carried(self, up: list[str], progress: Callable[[], Progress | None], now: float) -> bool:
        """Whether a node gone without a word is left to what is up of its fleet: a survivor deciding its verdict
        (``lost``, which moves the job), or a replacement its group started, which resumes from the newest checkpoint
        since the handover. Once the job's progress changed since the loss it carries the job; else it gets
        ``replace_s`` (a boot or a setup that hangs would hold the launch until the fleet's life cap, a review)."""
        if not up:
            return False
        last = progress()
        mark = None if last is None else (last.step, last.unix)
        if self.lost_at is None:
            self.lost_at = (now, mark)
        self.carried_on = self.carried_on or mark != self.lost_at[1]
        return self.carried_on or now - self.lost_at[0] <= self.replace_s

    def check(
        self,
        provisioner: Provisioner,
        fleet: LaunchedFleet,
        failed: Failed | None,
        launch_id: str,
        progress: Callable[[], Progress | None] = lambda: None,
    ) -> Preempted | None:
        """The leave, or None: the job runs on, or (``failed``) its nodes are deciding, at most
        :data:`LOST_NODE_WAIT_S`. A leave without ``failed``'s step has the job's last ``progress()``: a second
        lost node on the same entry is then told from a repeat without progress (:func:`restarted_without_progress`).

        Raises:
            MigrationError: the job failed (every node's verdict is its exit, the wait is over, or the
                provisioner's nodes give none: a local fleet).
        """
        now = time.monotonic()
        if failed is None and self.read_at is not None and now - self.read_at < VERDICT_READ_S:
            return None  # the job runs: its nodes' records are listed every VERDICT_READ_S, not at every poll
        self.read_at = now if failed is None else self.read_at
        verdicts = getattr(provisioner, "node_verdicts", lambda _: None)(fleet)
        leaving = verdicts is not None and 75 in verdicts
        gone, up = getattr(provisioner, "vanished", lambda _: ([], []))(fleet)
        faults: list[str] = getattr(provisioner, "node_faults", lambda _: [])(fleet) if leaving or gone else []
        if gone and not faults and not self._carried(up, progress, now):  # EC2 lists them no more
            why = (
                f"{len(gone)} node(s) of the fleet went away without a word ({', '.join(gone[:3])}: EC2 no longer "
                "lists them, and they recorded no end)"
                + (f"; what is up of it has not trained in {self.replace_s / 60:.0f} min" if up else "")
                + ": resuming from the newest checkpoint"
            )
            return Preempted(launch_id=launch_id, step=_step(failed, progress), why=why, trigger=_lost_trigger(fleet))
        if leaving:
            self.since = self.since or now
            step = _step(failed, progress)
            if faults:  # a node's own GPU failed: its record says so, no notice is on its way
                why = f"a node's GPUs failed under the job ({faults[0]}): resuming from the newest checkpoint"
                return Preempted(launch_id=launch_id, step=step, why=why, trigger="node")
            if failed is not None or now - self.since > SILENT_LEAVE_S:
                why = "a node of the fleet was lost without a spot notice: resuming from the newest checkpoint"
                return Preempted(launch_id=launch_id, step=step, why=why, trigger=_lost_trigger(fleet))
            return None
        decided = verdicts is not None and bool(verdicts) and None not in verdicts
        if failed is None:  # every node that said has ended its job, none to be replaced, and no record came
            self.since = (self.since or now) if decided else None
            if decided and now - (self.since or now) > SILENT_LEAVE_S:
                raise MigrationError(
                    f"The job ended on {fleet.entry.fleet} without a record of its own (its nodes' exits: "
                    f"{sorted(set(verdicts or []))}): see its nodes' logs (srifty logs)."
                )
            return None
        self.since = self.since or now
        if verdicts is None or decided or now - self.since > LOST_NODE_WAIT_S:
            raise MigrationError(f"The job failed on {fleet.entry.fleet} at step {failed.step}: {failed.error}")
        return None


def _step(failed: Failed | None, progress: Callable[[], Progress | None]) -> int | None:
    """The step a job left at without a record of its leave: its failure's, else its last progress report's (or
    None)."""
    if failed is not None:
        return failed.step
    last = progress()
    return last.step if last is not None else None


def _lost_trigger(fleet: LaunchedFleet) -> str:
    """Why a node lost without a notice moves the job: on spot, an instance gone without a notice is most likely a
    reclaim whose notice did not come (AWS: "best effort"): the market's; on-demand, a machine's (a review)."""
    return "node" if fleet.entry.market == "on-demand" else "spot"


_STILL_RUNNING = object()  # _wait_exit's answer for a fleet whose job still ran when its time was up


def _drop_pending(pending: _Pending | None, legs: Legs, echo: Any) -> _Pending | None:
    """The job finished with a move's new fleet up (the job told to leave): released now, not billed while the
    finished job's script ends (:func:`wait_for_script`; a review: it stood until the launch's end). None: no move
    pending any more."""
    if pending is not None:
        echo(f"srifty launch: the job finished before its move: {pending.fleet.name} is released")
        legs.release(pending.fleet)
    return None


def _wait_exit(
    provisioner: Provisioner, fleet: LaunchedFleet, timeout: float = 120.0, *, after_fit: bool = False
) -> object:
    """Wait for the fleet's job to exit (the record comes just before), so that the next leg has the machine (local
    processes: the provisioner's ``wait``); once its training finished (``after_fit``), for its script to end on every
    node, so that the release cuts nothing it does after fit() (a cloud fleet's ``wait_after_fit``, else ``wait``). A
    cloud fleet the job left is not waited for: it stands until the next fleet has the job, and the next leg's apply
    must not wait on it (a review: the voluntary move's new fleet, up and billed, waited 120 s for the old one's
    status records). A provisioner that cannot tell is not waited for. :data:`_STILL_RUNNING` (and the fleet
    stopped) when the job still ran ``timeout`` s later, else its exit status (None: not waited for)."""
    wait = getattr(provisioner, "wait_after_fit", None) if after_fit else None
    wait = wait or getattr(provisioner, "wait", None)
    if wait is None:
        return None
    code = wait(fleet, timeout)
    if code is None:
        provisioner.stop(fleet)
        return _STILL_RUNNING
    return code


def _migration(leaving: _Leaving, new: LaunchedFleet, up_s: float) -> Migration:
    """The record of a move from ``leaving``'s fleet to ``new`` (brought up in ``up_s``), its job just started there:
    reported once the new leg steps."""
    left, old = leaving.left, leaving.old
    return Migration(
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
        from_market=old.entry.market,
        to_market=new.entry.market,
    )
