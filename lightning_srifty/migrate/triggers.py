"""Voluntary moves decided inside the training job: drift from the prediction, and cheaper prices.

``MigrationTriggers()`` sits beside :class:`~.preemption.SpotPreemption` (which does the checkpoint
and the leaving). After ``first_check_steps`` steps, then every ``check_every_s`` seconds, rank 0 measures the
throughput of the current fleet (the median step time of the steps since the last check, so a checkpoint or a
validation pause does not count) and, in a background thread so that training never waits:

- *drift*: when the measurement is more than ``drift_threshold`` off the plan's prediction for this fleet, the
  measurement calibrates a re-ranking of the remaining work (``predictor.ranking.replan``); with ``predictor_url`` it is
  also posted to ``srifty serve`` as an observation;
- *deadline*: when, at the measured speed, the current fleet would finish the remaining work after the plan's deadline
  (a drift under the threshold can do it when the plan had little to spare), the remaining work is re-ranked under
  what is left of the deadline, and a fleet that meets it is asked for whatever it costs;
- *price*: when the catalog (``Catalog.load()``: the newest ``srifty catalog refresh`` copy) is not the one the plan was
  made from, the remaining work is re-ranked at today's prices.

When moving saves more than ``savings_threshold`` after the cost of the move (or staying misses the deadline), rank 0
writes ``MOVE_REQUEST.json`` (why, the reason in words, the re-ranked plan) beside the checkpoints and goes on
training. ``srifty launch`` brings the new fleet up and answers with ``LEAVE.json``; the next step boundary then
checkpoints and leaves, as on a spot notice. Nobody answering (no launcher) costs nothing: the run just goes on. One
request per run; factors measured on earlier fleets are kept in ``calibration.json`` so that a job does not move back
to a GPU it found slow.

Settings from ``srifty launch``: its :class:`~lightning_srifty.protocol.LaunchEnv` (the plan, the fleet of it this
run is on, the checkpoint folder, the per-rank batches and accumulation that make the global batch, when the plan
began); ``$SRIFTY_CHECK_EVERY_S``.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_srifty import protocol as markers
from lightning_srifty import store
from lightning_srifty.profiling.steps import batches_stepped
from lightning_srifty.protocol import LaunchEnv, Leave, MoveDeclined, MoveRequest
from predictor.documents.checks import Setting, check_settings
from predictor.documents.plan import load_plan
from predictor.exceptions import ConfigError

log = logging.getLogger("lightning_srifty")


class MigrationTriggers(Callback):
    """Advise a move to another fleet when the run is off its prediction or prices changed (see the module doc).

    Args:
        plan: the plan the run was launched from (a ``Plan`` or a path; default the launcher's ``LaunchEnv.plan``).
        current: the index in ``plan.entries`` of the fleet this run is on (default ``LaunchEnv.choice``, else the
            plan's recommendation).
        dirpath: where the markers go, beside the checkpoints (default ``LaunchEnv.checkpoint_uri``, else the
            SpotPreemption callback's folder).
        profile: the run's profile (default: the SriftyCallback's of this Trainer, else the copy a previous leg
            kept beside the checkpoints).
        global_batch: samples per optimizer step over every rank, accumulation included (default: the sum of
            ``LaunchEnv.batch_sizes`` x ``LaunchEnv.accumulate_grad_batches``, else the plan entry's, else the
            profile's: :func:`predictor.documents.work.global_batch`).
        drift_threshold: relative deviation of the measured throughput that triggers a re-ranking (0.2 = 20 %).
        savings_threshold: share of the remaining cost (time, with the time objective) a move must save.
        check_every_s: seconds between checks (default ``$SRIFTY_CHECK_EVERY_S``, else 600).
        first_check_steps: steps measured before the first check.
        catalog_loader: returns today's catalog (default ``Catalog.load``).
        predictor_url: a ``srifty serve`` service to post drift observations to.
        predictor_token: the service's bearer token for those posts (default: ``$SRIFTY_SERVICE_TOKEN``).
        work_from: what the remaining work is counted from: ``"trainer"`` (its max_steps or epochs, the default) or
            ``"plan"`` (the work the plan was made for, when the Trainer runs only a part of it).
    """

    SETTINGS: ClassVar[dict[str, Setting]] = {  # declared once (predictor.documents.checks.Setting): checked when made
        "current": Setting("int", minimum=0, optional=True),
        "drift_threshold": Setting("number", minimum=0, exclusive=True, maximum=10),  # a share such as 0.2
        "savings_threshold": Setting("number", minimum=0, exclusive=True, maximum=10),
        "check_every_s": Setting("number", minimum=0, exclusive=True, optional=True),
        "first_check_steps": Setting("int", minimum=1),
        "work_from": Setting("choice", choices=("trainer", "plan")),
    }

    def __init__(
        self,
        plan: Any = None,
        current: int | None = None,
        dirpath: str | None = None,
        *,
        profile: Any = None,
        global_batch: int | None = None,
        drift_threshold: float = 0.2,
        savings_threshold: float = 0.15,
        check_every_s: float | None = None,
        first_check_steps: int = 30,
        catalog_loader: Callable[[], Any] | None = None,
        predictor_url: str | None = None,
        work_from: str = "trainer",
        predictor_token: str | None = None,
    ) -> None:
        check_settings("MigrationTriggers()", self.SETTINGS, locals())
        self.launch = launch = LaunchEnv.from_env()
        self.plan = _launched_plan(plan, launch)
        env_choice = launch.choice if launch is not None else None
        self.current = current if current is not None else env_choice if env_choice is not None else self.plan.chosen
        if not 0 <= self.current < len(self.plan.entries):
            raise ConfigError(
                f"current={self.current} is not a fleet of the plan (it has {len(self.plan.entries)}).",
                parameter="current",
                value=self.current,
            )
        self.work_from = work_from
        self.dirpath = dirpath or (launch.checkpoint_uri if launch is not None else None)
        self.profile = profile
        sizes = launch_sizes(launch)
        accumulation = launch.accumulate_grad_batches if launch is not None else 1
        entry = self.plan.entries[self.current]
        planned = entry.rank_batches()
        self.global_batch = global_batch or (
            sum(sizes) * accumulation if sizes else sum(planned) * entry.accumulate_grad_batches if planned else None
        )
        self.drift_threshold, self.savings_threshold = drift_threshold, savings_threshold
        self.check_every_s = (
            check_every_s if check_every_s is not None else float(os.environ.get("SRIFTY_CHECK_EVERY_S", "600"))
        )
        self.first_check_steps = max(3, first_check_steps)
        self.catalog_loader = catalog_loader
        self.predictor_url, self._predictor_token = predictor_url, predictor_token
        self.poll_s = float(os.environ.get("SRIFTY_SPOT_POLL_S", "5"))
        self.decisions: list[Any] = []  # every MoveDecision taken, newest last
        self.requested: MoveRequest | None = None
        self._durations: list[float] = []
        self._last_end: float | None = None
        self._last_check: float | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._preemption: Any = None
        self._started = time.monotonic()

    # --- Lightning hooks ---------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from lightning_srifty.migrate.preemption import SpotPreemption

        found = [cb for cb in trainer.callbacks if isinstance(cb, SpotPreemption)]  # type: ignore[attr-defined]
        if not found:
            raise ConfigError(
                "MigrationTriggers leaves through SpotPreemption: add SpotPreemption(dirpath) to the Trainer's "
                "callbacks too.",
                parameter="callbacks",
                value=None,
            )
        self._preemption = found[0]
        self.dirpath = self.dirpath or self._preemption.dirpath
        self._started = time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        now = time.monotonic()
        if self._last_end is not None:
            self._durations.append(now - self._last_end)
        self._last_end = now
        if not trainer.is_global_zero or self.requested is not None or self._busy():
            return
        due = self._last_check is None or now - self._last_check >= self.check_every_s
        if len(self._durations) < self.first_check_steps or not due:
            return
        step_s = statistics.median(self._durations)
        self._durations.clear()
        self._last_check = now
        remaining = None if self.work_from == "plan" else _remaining_steps(trainer)
        if remaining is not None and remaining <= 0:
            return
        args_ = (trainer, step_s, remaining)
        self._thread = threading.Thread(target=self._check_safely, args=args_, name="srifty-triggers", daemon=True)
        self._thread.start()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_end = None  # a validation pause is not a training step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop.set()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop.set()

    def _busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a check in progress (tests, and a clean exit)."""
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the check (rank 0, background thread) -----------------------------------------------------------------------

    def _check_safely(self, trainer: pl.Trainer, step_s: float, remaining_steps: int | None) -> None:
        try:
            self._check(trainer, step_s, remaining_steps)
        except Exception as exc:  # noqa: BLE001 - a failed check must never stop training
            log.warning("MigrationTriggers: the check failed and is skipped: %s", exc)

    def _check(self, trainer: pl.Trainer, step_s: float, remaining_steps: int | None) -> None:
        from predictor.catalog import Catalog
        from predictor.ranking.replan import decide_move, drift, late

        profile = self._profile(trainer)
        if profile is None:
            log.info("MigrationTriggers: no profile yet (SriftyCallback still profiling): the check waits")
            self._last_check = None
            return
        # one vocabulary (predictor.documents.work): the durations are of batches, the remaining work of optimizer steps
        from predictor.documents.work import Work
        from predictor.documents.work import global_batch as profile_global_batch

        gb = int(self.global_batch or profile_global_batch(profile))
        accumulation = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        measured = gb / accumulation / step_s
        entry = self.plan.entries[self.current]
        off = drift(measured, entry.throughput_samples_s)
        catalog = self.catalog_loader() if self.catalog_loader else Catalog.load()
        known = store.read(self._folder, markers.CALIBRATION) or {}
        remaining = (
            Work.of_steps(remaining_steps, gb, accumulation).samples
            if remaining_steps is not None
            else self.plan.constraints.work_samples - batches_stepped(trainer) * gb
        )
        if remaining <= 0:
            return
        behind = late(self.plan, entry, remaining, measured, self._elapsed_h())
        why = self._why_replan(off, catalog, behind is not None)
        if why is None:
            said = "%s at %.1f samples/s, %+.0f%% of the prediction; prices unchanged; on time: no re-plan"
            log.info("MigrationTriggers: " + said, entry.fleet, measured, 100 * off)
            return
        if why == "drift":
            transport = self.plan.constraints.transport or "auto"  # the fleet's nodes meet as its plan priced them
            step = step_s * accumulation  # an observation's iteration is an optimizer step
            _post_observation(self.predictor_url, self._predictor_token, profile, entry.fleet, measured, step,
                              transport)  # fmt: skip
        decision = decide_move(
            profile,
            self.plan,
            self.current,
            remaining,
            why=why,
            measured_throughput=measured,
            catalog=catalog,
            threshold=self.savings_threshold,
            elapsed_h=self._elapsed_h(),
            known=known,
        )
        self.decisions.append(decision)
        if decision.plan is not None and decision.plan.calibration:
            factors = {c.gpu: c.factor for c in decision.plan.calibration}
            store.write(self._folder, markers.CALIBRATION, {**known, **factors})
        log.warning("MigrationTriggers (%s, %+.0f%% of the prediction): %s", why, 100 * off, decision.reason)
        if not decision.move or decision.plan is None or decision.target is None:
            return
        self._ask_launcher(trainer, decision, why, measured)

    def _why_replan(self, off: float, catalog: Any, behind: bool) -> Literal["drift", "price", "deadline"] | None:
        """``"drift"`` (the measurement is off the prediction by more than the threshold), ``"deadline"`` (``behind``:
        at the measured speed this fleet finishes after the plan's deadline, a drift under the threshold included),
        ``"price"`` (today's catalog is not the plan's), or None."""
        if abs(off) > self.drift_threshold:
            return "drift"
        if behind:
            return "deadline"
        made_from = (self.plan.catalog_source, self.plan.catalog_snapshot)
        return "price" if (catalog.info.source, catalog.info.snapshot) != made_from else None

    def _ask_launcher(self, trainer: pl.Trainer, decision: Any, why: str, measured: float) -> None:
        """Write ``MOVE_REQUEST.json`` and wait for the launcher's answer: ``LEAVE.json`` (the new fleet is up:
        checkpoint and leave at the next step) or ``MOVE_DECLINED.json`` (training goes on here)."""
        entry = self.plan.entries[self.current]
        launch_id = self.launch.launch_id if self.launch is not None else ""
        self.requested = MoveRequest(
            launch_id=launch_id,
            why=why,
            reason=decision.reason,
            from_fleet=entry.fleet,
            to_fleet=decision.target.fleet,
            step=trainer.global_step,
            measured_throughput_samples_s=measured,
            predicted_throughput_samples_s=entry.throughput_samples_s,
            savings=decision.savings,
            migration_cost_usd=decision.migration_cost_usd,
            plan=decision.plan.to_dict(),
        )
        markers.write_record(self._folder, self.requested)
        # the launcher answers: LEAVE once the new fleet is up, or MOVE_DECLINED (training goes on here)
        while not self._stop.wait(self.poll_s):
            if markers.read_record(self._folder, Leave, launch_id or None) is not None:  # not an earlier launch's
                self._preemption.request_leave(
                    f"{why}: {decision.reason}", move=True, to_fleet=decision.target.fleet, trigger=why
                )
                return
            declined = markers.read_record(self._folder, MoveDeclined, launch_id or None)
            if declined is not None:
                markers.clear_records(self._folder, MoveDeclined)
                log.warning(
                    "MigrationTriggers: the launcher declined the move to %s (%s); training goes on%s",
                    declined.to_fleet,
                    declined.reason,
                    f", next check in {self.check_every_s:g} s" if declined.again else "; no more moves asked",
                )
                if declined.again:  # the next check is check_every_s after this answer
                    self.requested = None
                    self._last_check = time.monotonic()
                return

    @property
    def _folder(self) -> str:
        """The markers' folder (the launcher's, or SpotPreemption's once training started)."""
        if not self.dirpath:
            raise ConfigError(
                "MigrationTriggers has no folder for its markers: pass dirpath= (beside the checkpoints), or add "
                "SpotPreemption(dirpath) to the Trainer's callbacks.",
                parameter="dirpath",
                value=None,
            )
        return self.dirpath

    def _elapsed_h(self) -> float:
        """Time spent on the plan's work: since the launcher began this plan (``LaunchEnv.plan_started_unix``; it
        carries over spot moves, which keep the plan), else since this run's training started."""
        started = self.launch.plan_started_unix if self.launch is not None else None
        if started:
            return max(0.0, time.time() - started) / 3600
        return (time.monotonic() - self._started) / 3600

    def _profile(self, trainer: pl.Trainer) -> Any:
        from predictor.documents.profile import load_profile

        if self.profile is not None:
            if not hasattr(self.profile, "batch"):
                self.profile = load_profile(self.profile)
            return self.profile
        for cb in trainer.callbacks:  # type: ignore[attr-defined]
            # a callback that says it profiles the run (SriftyCallback does): no import of profiling's callback here
            if getattr(type(cb), "PROVIDES_PROFILE", False) and getattr(cb, "profile", None) is not None:
                self.profile = cb.profile
                if not store.exists(self._folder, markers.PROFILE):  # for the next fleet's run
                    store.write(self._folder, markers.PROFILE, self.profile.to_dict())
                return self.profile
        kept = store.read(self._folder, markers.PROFILE)
        if kept is not None:
            self.profile = load_profile(kept)
        return self.profile


def _post_observation(
    url: str | None, token: str | None, profile: Any, fleet: str, throughput: float, step_s: float, transport: str
) -> None:
    """The drift measured, posted to the ``srifty serve`` service at ``url`` as an observation, with the transport
    its plan priced the fleet with (never raises)."""
    if not url:
        return
    try:
        from lightning_srifty.profiling.recommendation import run_identity
        from predictor.service.client import ServiceClient

        ServiceClient(url, token=token).observe(
            profile,
            fleet,
            throughput,
            iteration_time_s=step_s,
            source="srifty MigrationTriggers",
            run=run_identity(),
            transport=transport,
        )
    except Exception as exc:  # noqa: BLE001 - the service being away must not matter to training
        log.warning("MigrationTriggers: the observation was not posted: %s", exc)


def _remaining_steps(trainer: pl.Trainer) -> int | None:
    from lightning_srifty.profiling.recommendation import planned_steps

    planned = planned_steps(trainer)
    return None if planned is None else planned - batches_stepped(trainer)  # steps of the global batch, both


def _launched_plan(plan: Any, launch: LaunchEnv | None) -> Any:
    """The plan the run was launched from: ``plan`` (a Plan, a path, or a URI beside the checkpoints), else the
    launcher's."""
    plan = plan if plan is not None else (launch.plan or None) if launch is not None else None
    if plan is None:
        raise ConfigError(
            "MigrationTriggers needs the plan the run was launched from: pass plan= (a Plan or a plan.json path) "
            f"or run under `srifty launch`, which sets ${markers.VARIABLES['plan']}.",
            parameter="plan",
            value=None,
        )
    if isinstance(plan, str) and "://" in plan:  # the launcher keeps plans beside the checkpoints (s3://...)
        folder, _, name = plan.rpartition("/")
        found = store.read(folder, name)
        if found is None:
            raise ConfigError(
                f"The plan {plan} does not exist (${markers.VARIABLES['plan']} is set by srifty launch; check the "
                "URI).",
                parameter="plan",
                value=plan,
            )
        plan = found
    return plan if hasattr(plan, "entries") else load_plan(plan)


def launch_sizes(launch: LaunchEnv | None) -> tuple[int, ...]:
    """The launch's per-rank batches: its list, or on a fleet of a mix its groups' (a review: MigrationTriggers took
    the plan's there, which a launch with another global batch does not train)."""
    if launch is None:
        return ()
    return launch.batch_sizes or tuple(b for _, group in launch.batch_groups for b in group)
