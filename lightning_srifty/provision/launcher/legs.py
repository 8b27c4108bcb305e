"""Bringing fleets up and starting the job on them, for the launcher's state machine (:mod:`.launch`): a fleet brought
up or the plan's next entries when EC2 refuses it (:func:`up_or_next`), a move as measured (:class:`Migration`), and
:class:`Legs`, what every leg needs: the fleets up (released whatever ends the launch), the batch every fleet keeps
(:func:`predictor.model.batch.fleet_batches`), the plans kept where the job reads them, the job started with its
settings, and each move reported.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from lightning_srifty import protocol, store
from lightning_srifty.protocol import LaunchEnv, Preempted, Started, entry_strategy, rank_batch_fields
from lightning_srifty.provision.base import LaunchedFleet
from predictor.documents.plan import Plan, PlanEntry
from predictor.exceptions import CapacityError, MigrationError
from predictor.model.batch import fleet_batches
from predictor.runs import startup
from predictor.runs.deadline import planned_interval_s

TRIGGER_WORDS = {
    "spot": "a spot notice",
    "sigterm": "SIGTERM",
    "node": "a node lost without a notice (its host or its GPU)",
    "stall": "a hung job (no progress within --stall-timeout-min)",
    "drift": "a drift from the prediction",
    "price": "a price change",
    "deadline": "a deadline check (the spot policy's, or the job's at its measured speed)",
}


@dataclass
class Migration:
    when: str
    why: str  # in words, from the job
    trigger: str  # spot (a notice), sigterm, node (a machine lost without a notice), stall (a hung job), drift, price,
    # deadline
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
    from_market: str = ""  # "spot", "on-demand" or "mixed" ("": not recorded)
    to_market: str = ""

    def describe(self) -> str:
        """``moved from g5.xlarge:1 to g5.2xlarge:1 after a spot notice at step 120: checkpoint 3.2 s, new fleet up
        1.1 s, downtime 6.4 s``."""

        def s(value: float | None) -> str:
            return "not measured" if value is None else f"{value:.1f} s"

        up = s(self.up_s) + (" (while training)" if self.voluntary and self.up_s is not None else "")
        down = s(self.downtime_s) if self.downtime_s is not None else "not measured (the new leg took no step)"
        old, new = self.from_fleet, self.to_fleet
        if self.from_market != self.to_market:  # a trial read "moved from g4dn.xlarge:1 to g4dn.xlarge:1"
            old, new = f"{old} ({self.from_market or 'market not recorded'})", f"{new} ({self.to_market})"
        return (
            f"moved from {old} to {new} after {TRIGGER_WORDS.get(self.trigger, self.trigger)} "
            f"at step {self.step}: checkpoint {s(self.checkpoint_s)}, new fleet up {up}, downtime {down}"
        )


def up_or_next(
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
    the ranking's start-up figures (``predictor.runs.startup``: the median per instance type replaces the default).

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
        # nodes' boot, install and warm-up (Silence.check records it)
        fleet.data["up_unix"], fleet.data["provision_s"] = time.time() - took, took

        startup.record([g.instance_type for g in plan.entries[choice].groups], took)
    return fleet, took


def life_until(entry: PlanEntry, max_life_h: float | None, now: float | None = None) -> float:
    """The hard cap on a fleet's life (unix seconds): ``max_life_h`` from now, else the plan's default for the fleet
    (:meth:`~predictor.documents.plan.PlanEntry.life_cap_h`: the later of its predicted time x 1.5 and the time's
    99th percentile, + 1 h)."""
    hours = max_life_h if max_life_h is not None else entry.life_cap_h()
    return (time.time() if now is None else now) + hours * 3600


@dataclass(frozen=True)
class Run:
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
    stall_timeout_s: float | None = None  # a job that trained and then showed no sign of life this long hangs
    after_fit_timeout_s: float = protocol.AFTER_FIT_TIMEOUT_S  # the script's time after its training finished


class Legs:
    """What every leg of a launch needs, whichever way the launch moves: the fleets brought up (``up``: released
    whatever ends the launch), a fleet brought up (or the plan's next entries), the plans kept where the job reads
    them and when the run began working to each, the job started on a fleet with its settings, and each move
    reported. ``global_batch`` (samples per optimizer step) is fixed by the first fleet and kept on every later one.
    """

    def __init__(self, provisioner: Any, heartbeat: Any, run: Run, echo: Any, silent: Any, stall: Any = None) -> None:
        self.provisioner, self.heartbeat, self.run, self.echo, self.silent = provisioner, heartbeat, run, echo, silent
        self.stall = stall  # the StallWatch of the leg running (None: none)
        self.up: list[LaunchedFleet] = []  # every fleet brought up and not released yet
        self.plan_started: dict[str, float] = {}  # each kept plan -> when the run began working to it
        self.names = (f"{run.name}-{n}" for n in itertools.count(1))  # unique for the whole launch
        self.global_batch = 0  # samples per optimizer step: fixed by the first fleet before any job starts

    def bring_up(self, plan: Plan, index: int, *, only: bool = False) -> tuple[LaunchedFleet, float]:
        """``plan.entries[index]`` up (or, unless ``only``, the plan's next entries), in ``up`` at once; the fleet
        and the seconds it took (:func:`up_or_next`)."""
        return up_or_next(self.provisioner, plan, index, self.names, self.echo, up=self.up, only=only)

    def release(self, fleet: LaunchedFleet) -> None:
        """Take ``fleet`` down now (not at the launch's end); one released already is left as it is."""
        if fleet not in self.up:
            return
        self.provisioner.down(fleet)
        self.up.remove(fleet)

    def hung(self, fleet: LaunchedFleet, poll: Any, lost: Any = None) -> Preempted | None:
        """The leave of a job still running on ``fleet`` (``poll``, the launcher's look: its exit status and its
        records) that trained and then stopped moving (:meth:`.watches.StallWatch.leave`), its fleet released at once:
        the job is stuck, nothing of it is worth waiting for, and a job that woke up later must not train beside the
        next leg. The launcher moves it as after a lost node (``stall``): new machines of the same entry, from the
        newest checkpoint. Not while a node its group started in place of a lost one has its time to carry the job
        (``lost``, the launcher's LostNodeWatch, decides then; the silence is measured afresh after it).

        Raises:
            MigrationError: it hung past the same step on an earlier leg too: the job, not a machine (its fleet is
                killed and released first).
        """
        if self.stall is None or poll.code is not None:
            return None
        if lost is not None and lost.replacing():
            self.stall.mark = None  # what happens while the replacement boots is the lost-node watch's
            return None
        try:
            left = self.stall.leave(fleet, poll.read, self.run.launch_id)
        except MigrationError:
            self._stop_hung(fleet)
            raise
        if left is None:
            return None
        self.echo(f"srifty launch: {left.why}; releasing {fleet.name}")
        self._stop_hung(fleet)
        cap = self.heartbeat.max_life_until_unix
        if cap is not None and time.time() >= cap:  # it hung leaving at the fleet's life cap: no new machines
            return replace(left, trigger="max-life", why=f"the fleet's life cap was reached, and then {left.why}")
        return left

    def _stop_hung(self, fleet: LaunchedFleet) -> None:
        getattr(self.provisioner, "kill", lambda _: None)(fleet)  # local: at once (a hung rank ignores SIGTERM)
        self.release(fleet)

    def keep_plan(self, plan: Plan, started_unix: float | None = None) -> str:
        """Write ``plan`` where the job reads it and note when the run began working to it (default: now)."""
        uri = store.write(self.run.ckpt, f"plans/plan-{len(self.plan_started) + 1}.json", plan.to_dict())
        self.plan_started[uri] = time.time() if started_unix is None else started_unix
        return uri

    def start(self, fleet: LaunchedFleet, plan_uri: str, resume: str) -> None:
        """Start the job on ``fleet`` with its settings (:class:`LaunchEnv`): the global batch split over its GPUs, its
        layout, the plan it reads and when the run began working to it, and the fleet's life cap, which the
        heartbeat carries from now on."""
        until = life_until(fleet.entry, self.run.max_life_h)
        self.heartbeat.max_life_until_unix = until
        sizes, accumulation = fleet_batches(fleet.entry, self.global_batch)
        # a fleet's nodes: on a mix whose ranks take different batches, by node group (ranks number in join order)
        batches = (
            rank_batch_fields(fleet.entry, sizes)
            if self.provisioner.ranks_in_join_order
            else {"batch_sizes": tuple(sizes)}
        )
        env = LaunchEnv(
            launch_id=self.run.launch_id,
            checkpoint_uri=self.run.ckpt,
            resume=resume,
            fleet=fleet.entry.fleet,
            plan=plan_uri,
            choice=fleet.index,
            **batches,
            accumulate_grad_batches=accumulation,
            strategy=entry_strategy(fleet.entry),  # a move to another entry may change the layout
            # when the run began working to this plan (its deadline counts from then; a re-ranked plan's from the move)
            plan_started_unix=self.plan_started[plan_uri],
            heartbeat_max_age_s=self.heartbeat.max_age_s,
            max_life_until_unix=until,
            checkpoint_every_s=planned_interval_s(fleet.plan, fleet.index) or None,
        )
        self.heartbeat.beat()  # the new cap, now
        # the last leg's first step is not this one's (the same entry's fleet has the same name in it: the watches
        # took it for the new leg's, and its progress with it); its job has left or been stopped by now
        try:
            protocol.clear_records(self.run.ckpt, Started)
        except Exception as exc:  # noqa: BLE001 - a store's hiccup must not fail the move (its start-up watch is late)
            self.echo(f"srifty launch: could not clear the last leg's {protocol.STARTED}: {exc}")
        self.provisioner.start(fleet, env.to_env())
        self.silent.started(fleet)
        if self.stall is not None:
            self.stall.started(fleet)

    def report(self, move: Migration) -> None:
        """A move in words, and appended to ``migrations.jsonl``."""
        with self.run.log_path.open("a") as f:
            f.write(json.dumps(asdict(move)) + "\n")
        self.echo(f"srifty launch: {move.describe()}")
