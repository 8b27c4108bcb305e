"""The job <-> launcher protocol of ``srifty launch``, in one place (torch-free): typed records and the environment.

**Records** are small JSON objects in the checkpoint folder, local or ``s3://`` (any fsspec URL), because that is the
one place both the job on the fleet and the launcher can reach whatever the provisioner. Each is written to a
temporary name and renamed into place (a reader never sees half of one), carries ``"protocol": "srifty.launch/1"``
and the ``launch_id`` of the ``srifty launch`` it belongs to, and is read and written only through
:func:`write_record` / :func:`read_record`:

    file                   record       from -> to        what
    MOVE_REQUEST.json      MoveRequest  job -> launcher   a trigger (drift, price, deadline) asks a move: why, plan
    LEAVE.json             Leave        launcher -> job   the new fleet is up: checkpoint at the next step and leave
    MOVE_DECLINED.json     MoveDeclined launcher -> job   the move will not happen (its fleet could not be brought
                                                          up, or --max-migrations): train on; ``again``: may ask later
    PREEMPTED.json         Preempted    job -> launcher   the job left (spot notice, SIGTERM, granted move, lost
                                                          heartbeat, life cap): step, checkpoint, why, timings
    STARTED.json           Started      job -> launcher   a leg took its first step (the end of a move's downtime)
    PROGRESS.json          Progress     job -> launcher   the global step while training and the loop's last sign
                                                          of life, every ``progress_s`` (the spot guard's measured
                                                          progress; the stall watch's evidence)
    FINISHED.json          Finished     job -> launcher   training ended normally: the last step
    FAILED.json            Failed       job -> launcher   training raised: the step and the error
    HANDOVER-<fleet>.json  Handover     launcher -> fleet a remote fleet's ``LaunchEnv`` (``env``), once the previous
                                                          fleet has left (a fleet that boots earlier waits for it);
                                                          its write time opens the leg (``resume_after``)
    HEARTBEAT.json         Heartbeat    launcher -> job,  the launcher is alive (see below)
                                        instances
    exited/<fleet>/<id>.json            node -> nodes,    a node's job has ended (``exit_code``, torchrun's) and the
                                        launcher          node's verdict on it (``final``: null while it decides; 75
                                                          when it leaves to be replaced, a node lost without a notice
                                                          included): the module's boot script writes it, plain JSON
                                                          without ``protocol`` (:func:`node_verdicts`)

``HEARTBEAT.json`` (also read by the instances' watchdog in ``terraform/modules/training_fleet``) has exactly the
fields ``{"protocol", "launch_id", "written_unix", "max_age_s", "max_life_until_unix"}``: the launcher rewrites it
every ``--heartbeat-s`` seconds; a heartbeat older than ``max_age_s`` (``written_unix`` + ``max_age_s`` < now) means
the launcher is gone: the job checkpoints and leaves (exit 75), the instances shut down. ``max_life_until_unix`` is
the hard cap on the current fleet's life (unix seconds; null: none): past it the job checkpoints and leaves too.

Versions: a record of another major version (``srifty.launch/2``, or one without a ``protocol`` field, written by
lightning-srifty 0.1) is refused with a :class:`~predictor.exceptions.MigrationError` naming both versions; unknown
fields of the same major version are ignored with a warning. A record of another launch (``launch_id``) is ignored
with a warning: markers left in the folder by an earlier launch are never taken for this one's.

**The environment** the launcher gives the job is :class:`LaunchEnv`, the only place its ``SRIFTY_*`` variables are
named: the launcher writes ``LaunchEnv(...).to_env()``, the job reads ``LaunchEnv.from_env()``.

The records are written and read through :mod:`lightning_srifty.store` (the checkpoint folder as a store), which
also keeps the data files beside them (plans, ``calibration.json``, ``profile.json``: their own schemas) and the
checkpoints' digests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from lightning_srifty import store
from predictor.exceptions import ConfigError, MigrationError

if TYPE_CHECKING:
    from predictor.documents.plan import PlanEntry

PROTOCOL = "srifty.launch/1"
PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): the job left to be resumed elsewhere; not a failure
_FIX = "use the same lightning-srifty on the launcher and in the training image"

MOVE_REQUEST = "MOVE_REQUEST.json"
LEAVE = "LEAVE.json"
MOVE_DECLINED = "MOVE_DECLINED.json"
PREEMPTED = "PREEMPTED.json"
STARTED = "STARTED.json"
PROGRESS = "PROGRESS.json"
FINISHED = "FINISHED.json"
FAILED = "FAILED.json"
HEARTBEAT = "HEARTBEAT.json"
CALIBRATION = "calibration.json"  # measured/predicted factors by GPU from the fleets the job ran on (for the triggers)
PROFILE = "profile.json"  # the job's profile, kept for the triggers of later legs (a resumed run does not re-profile)


def handover(fleet_name: str) -> str:
    return f"HANDOVER-{fleet_name}.json"


def new_launch_id() -> str:
    """A launch id: UTC time and 6 random hex digits (``20261123T093702-3fa9c1``), unique per ``srifty launch``."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def major(protocol: str | None) -> int | None:
    """1 for ``srifty.launch/1`` or ``srifty.launch/1.3``; None when it is not a ``srifty.launch`` version."""
    name, _, version = str(protocol or "").partition("/")
    try:
        return int(version.split(".")[0]) if name == "srifty.launch" else None
    except ValueError:
        return None


def check_protocol(theirs: str | None, where: str) -> None:
    """Refuse another major version of the protocol, naming both and the fix."""
    if major(theirs) != major(PROTOCOL):
        shown = repr(theirs) if theirs else "no protocol field (lightning-srifty 0.1)"
        raise MigrationError(f"{where} speaks protocol {shown}; this lightning-srifty speaks {PROTOCOL!r}: {_FIX}.")


# --- the records ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Record:
    """Base of every record: the launch it belongs to (``""`` for a job run without ``srifty launch``)."""

    FILE: ClassVar[str] = ""
    launch_id: str = ""

    @property
    def file(self) -> str:
        return self.FILE

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, **dataclasses.asdict(self)}


@dataclass(frozen=True, kw_only=True)
class MoveRequest(Record):
    FILE: ClassVar[str] = MOVE_REQUEST
    why: str = ""  # drift, price, deadline (the job's, or the spot guard's)
    reason: str = ""
    from_fleet: str = ""
    to_fleet: str = ""
    step: int | None = None
    plan: dict[str, Any] = field(default_factory=dict)  # the re-ranked plan (srifty.plan/v1)
    measured_throughput_samples_s: float | None = None
    predicted_throughput_samples_s: float | None = None
    savings: float | None = None
    migration_cost_usd: float | None = None


@dataclass(frozen=True, kw_only=True)
class Leave(Record):
    FILE: ClassVar[str] = LEAVE
    to_fleet: str = ""


@dataclass(frozen=True, kw_only=True)
class MoveDeclined(Record):
    """The launcher will not carry out the job's :class:`MoveRequest`; the job trains on where it is."""

    FILE: ClassVar[str] = MOVE_DECLINED
    to_fleet: str = ""
    reason: str = ""
    again: bool = True  # the job may ask again after its next check (False: not in this launch: --max-migrations)


@dataclass(frozen=True, kw_only=True)
class Preempted(Record):
    FILE: ClassVar[str] = PREEMPTED
    step: int | None = None
    checkpoint: str = ""
    why: str = ""  # in words, e.g. "spot interruption notice: terminate at 14:02:00 UTC (in 118 s)"
    trigger: str = "spot"  # spot, sigterm, node (lost without a notice: the launcher's), stall (a hung job: the
    # launcher's), heartbeat, max-life, drift, price, deadline
    move: bool = False  # a voluntary move the launcher granted (LEAVE)
    to_fleet: str | None = None
    last_step_unix: float | None = None  # the end of the last step trained before the checkpoint
    durable_unix: float | None = None  # when the checkpoint was complete
    save_s: float | None = None
    notice_to_durable_s: float | None = None
    # "durable" (in the checkpoint folder), or "local <host>:<path>" when the remote store did not take the save
    # before the deadline (the launcher then resumes from the newest durable checkpoint)
    stored: str = "durable"


@dataclass(frozen=True, kw_only=True)
class Started(Record):
    FILE: ClassVar[str] = STARTED
    fleet: str = ""
    step: int | None = None  # the global step after the leg's first step
    first_step_unix: float | None = None
    resumed_from: str = ""
    # how the job trains (rank 0's Trainer at that step): its ranks, its strategy ("fsdp", "ddp" or the class's name)
    # and what it does otherwise than the plan (launch_checks.launch_mismatches; the rehearsal checks them)
    world_size: int | None = None
    strategy: str = ""
    mismatches: tuple[str, ...] = ()
    # Lightning's global steps a step of the work makes: 1, or the optimizers a manual loop steps a batch on average
    # (a GAN's 2)
    steps_per_batch: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mismatches", tuple(self.mismatches))  # JSON reads back a list


@dataclass(frozen=True, kw_only=True)
class Progress(Record):
    """Where training is, rewritten by rank 0 every ``SpotPreemption(progress_s=...)`` seconds (by a thread of its
    own, so a record keeps coming while the training loop is stuck): the launcher's spot guard weighs the work left
    against the deadline from it (a spot leg may run for hours without another record), and the launcher's stall
    watch sees a job that stopped moving (:class:`~lightning_srifty.provision.launcher.watches.StallWatch`)."""

    FILE: ClassVar[str] = PROGRESS
    fleet: str = ""
    step: int | None = None  # the global step (optimizer steps) after the last step trained
    unix: float | None = None  # when that step ended (the job's clock)
    step_time_s: float | None = None  # measured mean seconds per step on this leg since its first step (None: <2)
    # the last sign of life of the training loop (the job's clock): a step, a validation batch, an epoch's start, a
    # checkpoint save started or ended; and how often rank 0 writes this record (its progress_s). None: a job before 0.2
    active_unix: float | None = None
    every_s: float | None = None
    # Lightning's global steps a step of the plan's work makes (Started's): the guard reads step / this
    steps_per_batch: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Finished(Record):
    FILE: ClassVar[str] = FINISHED
    step: int | None = None


@dataclass(frozen=True, kw_only=True)
class Failed(Record):
    FILE: ClassVar[str] = FAILED
    step: int | None = None
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class Handover(Record):
    fleet: str = ""  # the fleet's name (``<name>-<n>``), which names the file
    env: dict[str, str] = field(default_factory=dict)  # LaunchEnv.to_env(): the one way the settings travel

    @property
    def file(self) -> str:
        return handover(self.fleet)


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Record):
    FILE: ClassVar[str] = HEARTBEAT
    written_unix: float = 0.0
    max_age_s: float = 600.0
    max_life_until_unix: float | None = None

    def age_s(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.written_unix

    def stale(self, now: float | None = None) -> bool:
        return self.age_s(now) > self.max_age_s


RECORDS: tuple[type[Record], ...] = (
    MoveRequest,
    Leave,
    MoveDeclined,
    Preempted,
    Started,
    Progress,
    Finished,
    Failed,
    Handover,
    Heartbeat,
)
R = TypeVar("R", bound=Record)


def parse(cls: type[R], data: Mapping[str, Any], where: str, launch_id: str | None = None) -> R | None:
    """The record in ``data`` (read from ``where``); None, with a warning, when it belongs to another launch.

    Raises:
        MigrationError: it was written with another major version of the protocol.
    """
    if not isinstance(data, Mapping):
        raise MigrationError(f"{where} is not a {cls.__name__} record (a JSON object): got {type(data).__name__}.")
    check_protocol(data.get("protocol"), where)
    known = {f.name for f in dataclasses.fields(cls)}
    extra = sorted(set(data) - known - {"protocol"})
    if extra:
        warnings.warn(
            f"{where} ({data.get('protocol')}) has fields this lightning-srifty does not know: {', '.join(extra)}; "
            f"ignored (a newer minor version of {PROTOCOL}?)",
            stacklevel=3,
        )
    theirs = str(data.get("launch_id") or "")
    if launch_id and theirs != launch_id:
        warnings.warn(
            f"{where} belongs to launch {theirs or '(none)'}, not to this one ({launch_id}): ignored (left over from "
            "an earlier srifty launch in the same checkpoint folder?)",
            stacklevel=3,
        )
        return None
    return cls(**{k: v for k, v in data.items() if k in known})


def write_record(dirpath: str, record: Record) -> str:
    """Write ``record`` atomically under its file name in ``dirpath``; returns where."""
    return store.write(dirpath, record.file, record.to_dict())


def read_record(dirpath: str, cls: type[R], launch_id: str | None = None, *, name: str | None = None) -> R | None:
    """The ``cls`` record in ``dirpath`` (``name``: the file, for :class:`Handover`), or None when there is none or it
    belongs to another launch than ``launch_id`` (None: any launch)."""
    name = name or cls.FILE
    data = store.read(dirpath, name)
    return None if data is None else parse(cls, data, store.path(dirpath, name), launch_id)


def clear_records(dirpath: str, *classes: type[Record]) -> None:
    store.clear(dirpath, *(c.FILE for c in classes))


# --- the environment --------------------------------------------------------------------------------------------------

# field -> variable: the only place the SRIFTY_* settings the launcher passes to the job are named
VARIABLES: dict[str, str] = {
    "protocol": "SRIFTY_PROTOCOL",
    "launch_id": "SRIFTY_LAUNCH_ID",
    "checkpoint_uri": "SRIFTY_CHECKPOINT_URI",
    "resume": "SRIFTY_RESUME",
    "resume_after": "SRIFTY_RESUME_AFTER",
    "fleet": "SRIFTY_FLEET",
    "plan": "SRIFTY_PLAN",
    "choice": "SRIFTY_CHOICE",
    "batch_sizes": "SRIFTY_BATCH_SIZES",
    "batch_groups": "SRIFTY_BATCH_GROUPS",
    "node_group": "SRIFTY_NODE_GROUP",
    "accumulate_grad_batches": "SRIFTY_ACCUMULATE_GRAD_BATCHES",
    "strategy": "SRIFTY_STRATEGY",
    "plan_started_unix": "SRIFTY_PLAN_STARTED_UNIX",
    "heartbeat_max_age_s": "SRIFTY_HEARTBEAT_MAX_AGE_S",
    "max_life_until_unix": "SRIFTY_MAX_LIFE_UNTIL_UNIX",
    "checkpoint_every_s": "SRIFTY_CHECKPOINT_EVERY_S",
}
RESUME_LATEST = "latest"  # LaunchEnv.resume: the newest sound checkpoint under checkpoint_uri, if any
# a srifty fleet node's state folder (user_data exports it): a job that leaves on a notice writes PREEMPTED_MARKER
# there, since torchrun reports a worker's exit 75 as its own 1; the node's status record and watchdog read it
NODE_STATE = "SRIFTY_NODE_STATE"
PREEMPTED_MARKER = "preempted"
# and the node's stall watch reads ALIVE_MARKER there: one line "<global step> <step time s, or -> <0|1>", rewritten by
# each node's local rank 0 at most every ALIVE_EVERY_S on a sign of life after the job's first step (its mtime is the
# sign's time; 1: training is over, what runs until the process ends is not a hang) (lightning_srifty.migrate.alive)
ALIVE_MARKER = "alive"
ALIVE_EVERY_S = 5.0
# and each rank writes EXIT_MARK.<local rank> there when its interpreter begins to exit after a fit that ended with no
# exception since: the boot script takes a job whose every rank wrote one, and whose workers torchrun saw die only by a
# signal (torch's teardown), for finished (lightning_srifty.migrate.exit_mark)
EXIT_MARK = "exit"
# a job that trained, then showed no sign of life for this long, is hung, to the launcher's stall watch and to a
# fleet node's alike: below the process group's timeout (Lightning's default, 30 min), so that a collective waiting on
# a hung rank is found before NCCL ends the job as a failure
STALL_TIMEOUT_S = 1200.0
# once a job's training has finished (FINISHED.json, at its fit's end), how long its script may still run on the fleet
# (a test, an export, a model's upload after fit()) before the fleet is released anyway (srifty launch) and the work
# cut: a script that hangs there bills no longer than this
AFTER_FIT_TIMEOUT_S = 1800.0
# "1": the job trains on the CPU on purpose although CUDA sees GPUs (a local trial, tests); else a job srifty started
# with its Trainer on the CPU stops (launch_checks.refuse_idle_gpus)
ALLOW_CPU = "SRIFTY_ALLOW_CPU"
DEPRECATED: dict[str, str] = {"SRIFTY_CHECKPOINT_DIR": "SRIFTY_CHECKPOINT_URI"}  # old name -> new (read until 0.3)


@dataclass(frozen=True)
class LaunchEnv:
    """What ``srifty launch`` tells the job (see :data:`VARIABLES` for the variable of each field).

    Attributes:
        launch_id: the launch; the job's records carry it.
        checkpoint_uri: where checkpoints and the records go (a folder or an fsspec URL such as ``s3://b/run``).
        resume: the checkpoint to resume from (``""`` on the first start): the one way it is passed.
            ``"latest"`` (:data:`RESUME_LATEST`; what a ``srifty terraform`` fleet's nodes set, which no launcher
            tells): the newest sound checkpoint in ``checkpoint_uri`` when there is one, else a first start; a
            replacement node resumes from where the fleet was.
        resume_after: a record in ``checkpoint_uri`` whose write time opens this leg (a remote fleet's handover,
            ``HANDOVER-<fleet>.json``; ``""``: none): the newest sound checkpoint written after it, when there is one,
            wins over ``resume``. A node that replaces one of the leg's (an Auto Scaling group's replacement of an
            instance lost without a notice, which re-reads the handover) resumes where the fleet was, not where the
            leg began: from step 0 on a first leg, before. The times compared are the store's own (one listing), not
            a node's clock.
        fleet: the fleet, e.g. ``"g4dn.xlarge:2"``.
        plan: where the plan this fleet comes from is kept; choice: its index in the plan's entries.
        batch_sizes: per-rank batches per micro-step; accumulate_grad_batches: micro-steps per optimizer step.
        batch_groups: on a mix of GPU types whose ranks take different batches, where the rank order is known only
            once the nodes have joined (a ``srifty terraform`` fleet: torchrun numbers ranks in join order), the
            plan's groups instead of ``batch_sizes``: each group's key (its instance type) and its GPUs' batches
            per micro-step, in plan order; the variable reads ``g5.xlarge=24,23;g4dn.xlarge=9``. The strategies
            gather every rank's group at set-up and take the plan's batch of each
            (:func:`predictor.model.batch.assign_rank_batches`).
        node_group: this node's group key (its instance type), which the node's boot script exports.
        strategy: the Lightning strategy of the plan entry's layout, JSON ``{"name": "fsdp", "args": {...}}``
            (:func:`strategy_text`; ``""``: ddp), which :func:`lightning_srifty.plan_strategy` builds.
        plan_started_unix: when the run began working to this plan (its deadline counts from then).
        heartbeat_max_age_s: the job leaves when ``HEARTBEAT.json`` is older than this (None: no heartbeat).
        max_life_until_unix: the job leaves at this time, the fleet's life cap (None: no cap).
        checkpoint_every_s: the plan's checkpoint interval for the fleet (Young-Daly, from spot interruptions and
            node failures; under a deadline, for a spot fleet whose save misses the notice, short enough for the
            deadline's slack: ``predictor.runs.deadline.planned_interval_s``), which a ``SpotPreemption`` without its
            own ``every_s`` takes: a node lost without a notice costs at most this much work (None: no periodic
            checkpoint).
    """

    launch_id: str
    checkpoint_uri: str
    resume: str = ""
    resume_after: str = ""
    fleet: str = ""
    plan: str = ""
    choice: int | None = None
    batch_sizes: tuple[int, ...] = ()
    batch_groups: tuple[tuple[str, tuple[int, ...]], ...] = ()
    node_group: str = ""
    accumulate_grad_batches: int = 1
    strategy: str = ""
    plan_started_unix: float | None = None
    heartbeat_max_age_s: float | None = None
    max_life_until_unix: float | None = None
    checkpoint_every_s: float | None = None
    protocol: str = PROTOCOL

    def to_env(self) -> dict[str, str]:
        """The variables, as strings (None and empty values are left out; ``resume`` is always there)."""
        out: dict[str, str] = {}
        for name, variable in VARIABLES.items():
            value = getattr(self, name)
            if name == "batch_groups":
                value = batch_groups_text(value)
            elif isinstance(value, tuple):
                value = ",".join(map(str, value))
            elif isinstance(value, float):
                value = f"{value:.3f}"
            if value is not None and (value != "" or name == "resume"):
                out[variable] = str(value)
        return out

    def node_batches(self) -> tuple[int, ...]:
        """The plan's batches per micro-step of this node's group (``batch_groups``), () when there are none; a
        rank's own is one of them, which one is known after the set-up's gathering."""
        return next((sizes for key, sizes in self.batch_groups if key == self.node_group), ())

    def strategy_spec(self) -> tuple[str, dict[str, Any]]:
        """The Lightning strategy's name and keyword arguments (``("ddp", {})`` when none was given).

        Raises:
            ConfigError: ``$SRIFTY_STRATEGY`` is not a JSON object with a ``name`` and an ``args`` object.
        """
        if not self.strategy:
            return "ddp", {}
        variable = VARIABLES["strategy"]
        try:
            data = json.loads(self.strategy)
        except ValueError:
            data = None
        if not (isinstance(data, dict) and isinstance(data.get("name"), str) and isinstance(data.get("args"), dict)):
            raise ConfigError(
                f'${variable} must be a JSON object {{"name": "fsdp", "args": {{...}}}} (srifty launch sets it from '
                f"the plan's layout). Got {self.strategy!r}: unset it or run the job under srifty launch.",
                parameter=variable,
                value=self.strategy,
            )
        return data["name"], data["args"]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
        """The settings in ``environ`` (default ``os.environ``); None when the job does not run under
        ``srifty launch`` (no checkpoint location set).

        Raises:
            MigrationError: the launcher speaks another major version of the protocol.
            ConfigError: a variable has a value that cannot be read (named, with the value).
        """
        env = dict(os.environ if environ is None else environ)
        for old, new in DEPRECATED.items():
            if old in env and new not in env:
                warnings.warn(
                    f"${old} is deprecated: srifty launch sets ${new} (the old name is read until 0.3)",
                    DeprecationWarning,
                    stacklevel=2,
                )
                env[new] = env[old]
        if not env.get(VARIABLES["checkpoint_uri"]):
            return None
        protocol = env.get(VARIABLES["protocol"])
        if protocol is not None:
            check_protocol(protocol, f"The launcher (${VARIABLES['protocol']})")
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for name, variable in VARIABLES.items():
            raw = env.get(variable)
            if raw is None or (raw == "" and name != "resume"):
                continue
            try:
                if name == "batch_sizes":
                    values[name] = tuple(int(b) for b in raw.split(","))
                elif name == "batch_groups":
                    values[name] = parse_batch_groups(raw)
                elif "int" in str(types[name]):
                    values[name] = int(raw)
                elif "float" in str(types[name]):
                    values[name] = float(raw)
                else:
                    values[name] = raw
            except ValueError:
                raise ConfigError(
                    f"${variable} must be {_FORMATS.get(name, types[name])}"
                    f" (srifty launch sets it). Got {raw!r}: unset it or run the job under srifty launch.",
                    parameter=variable,
                    value=raw,
                ) from None
        values.setdefault("launch_id", "")
        return cls(**values)


_FORMATS = {
    "batch_sizes": "comma-separated whole numbers",
    "batch_groups": "groups key=batch,batch,... separated by ';' (g5.xlarge=24,23;g4dn.xlarge=9)",
}


def rank_batch_fields(entry: PlanEntry, sizes: list[int]) -> dict[str, Any]:
    """The :class:`LaunchEnv` fields that give a fleet's ranks ``sizes`` (per-rank batches in the entry's group order)
    where torchrun numbers the ranks in the order the nodes join: ``batch_sizes`` on one GPU type or where every rank
    takes the same batch, else ``batch_groups`` (each group's slice of ``sizes``, keyed by its instance type), which
    the strategies match to every rank's node group at set-up (``srifty terraform``'s planned batches, and
    ``srifty launch``'s handover to a fleet)."""
    if not (entry.heterogeneous and len(set(sizes)) > 1):
        return {"batch_sizes": tuple(sizes)}
    groups, at = [], 0
    for group in entry.groups:
        ranks = group.count * group.gpus_per_instance
        groups.append((group.instance_type, tuple(sizes[at : at + ranks])))
        at += ranks
    return {"batch_groups": tuple(groups)}


def batch_groups_text(groups: Sequence[tuple[str, Sequence[int]]]) -> str:
    """``LaunchEnv.batch_groups`` as its variable holds it (:func:`parse_batch_groups` reads it back)."""
    return ";".join(f"{key}={','.join(map(str, sizes))}" for key, sizes in groups)


def parse_batch_groups(text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``LaunchEnv.batch_groups`` from its variable's text (``g5.xlarge=24,23;g4dn.xlarge=9``).

    Raises:
        ValueError: a group without a key or ``=``, a batch that is not a whole number >= 1, a key twice.
    """
    groups = []
    for part in text.split(";"):
        key, eq, sizes = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(part)
        batches = tuple(int(b) for b in sizes.split(","))
        if any(b < 1 for b in batches):
            raise ValueError(part)
        groups.append((key.strip(), batches))
    if len({key for key, _ in groups}) != len(groups):
        raise ValueError(text)
    return tuple(groups)


def strategy_text(name: str, args: Mapping[str, Any] | None = None) -> str:
    """``LaunchEnv.strategy``: a Lightning strategy's name and its JSON-ready keyword arguments, one line of JSON."""
    return json.dumps({"name": name, "args": dict(args or {})}, sort_keys=True, separators=(",", ":"))


def entry_strategy(entry: PlanEntry) -> str:
    """``LaunchEnv.strategy`` for ``entry``: the Lightning strategy and arguments its layout records (plans made
    before layouts: ddp).

    Raises:
        MigrationError: the entry's layout cannot be started by srifty launch (a pipeline), with what it would need.
    """
    layout = entry.layout
    if layout is None:
        return strategy_text("ddp")
    if not layout.launchable:
        raise MigrationError.named(
            "{fleet} runs the layout {layout}, which srifty launch cannot start{needs}. Launch another entry of the "
            "plan ({choice}).",
            fleet=entry.fleet,
            layout=layout.name,
            needs=": " + layout.needs if layout.needs else "",
        )
    return strategy_text(layout.lightning_strategy, layout.lightning_args)


def node_verdicts(dirpath: str, fleet: str) -> list[int | None]:
    """The ``final`` word of each node of ``fleet`` whose job has ended (``exited/<fleet>/<instance id>.json`` in the
    checkpoint folder, written by the training_fleet module's boot script): None while the node decides, 75 when it
    left to be replaced (a spot notice, a node of the fleet lost without one, its own GPU failed under the job), else
    its job's exit. An unreadable record counts as undecided. A launch clears the folder before it brings a fleet of
    that name the job (:func:`clear_node_verdicts`): names repeat from one launch to the next."""
    finals: list[int | None] = []
    for record in node_records(dirpath, fleet):
        try:
            final = record.get("final")
            finals.append(int(final) if final is not None else None)
        except (ValueError, TypeError):
            finals.append(None)
    return finals


def node_records(dirpath: str, fleet: str) -> list[dict[str, Any]]:
    """Each node's exit record of ``fleet`` as it wrote it (``instance_id``, ``exit_code``, ``final``, ``gpu_fault``:
    what failed on its GPUs under the job, or None); an unreadable one is ``{}``."""
    folder = store.path(dirpath, f"exited/{fleet}")
    fs = store.filesystem(folder)
    fs.invalidate_cache()
    try:
        names = [str(n) for n in fs.ls(folder.rstrip("/"), detail=False) if str(n).endswith(".json")]
    except FileNotFoundError:
        return []
    records: list[dict[str, Any]] = []
    for name in names:
        try:
            with fs.open(name, "r") as f:
                record = json.load(f)
            records.append(record if isinstance(record, dict) else {})
        except (OSError, ValueError):
            records.append({})
    return records


def clear_node_verdicts(dirpath: str, fleet: str) -> None:
    """Remove what an earlier fleet named ``fleet`` said of its nodes' ends (``exited/<fleet>/``): by the launcher,
    before it hands a fleet of that name the job (a stale 75 would read as a node of the new one lost; a review). No
    clock is compared: the nodes' and the launcher's may differ."""
    folder = store.path(dirpath, f"exited/{fleet}").rstrip("/")
    fs = store.filesystem(folder)
    fs.invalidate_cache()
    with contextlib.suppress(FileNotFoundError):
        fs.rm(folder, recursive=True)
