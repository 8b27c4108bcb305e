"""The spot guard at work in a launch (:class:`Steering`): the spot (or mixed) fleet it watches and that fleet's
on-demand twin, when the next check is due, which of the two to move to, and the tries at spot while waiting for it
(:mod:`lightning_srifty.provision.launcher.spot_guard` decides; this brings its choice up).
"""

from __future__ import annotations

import time

from lightning_srifty.protocol import Progress
from lightning_srifty.provision.base import LaunchedFleet
from lightning_srifty.provision.launcher.legs import Legs
from lightning_srifty.provision.launcher.spot_guard import Decision, SpotGuard, guard_for, on_demand_fleet
from predictor.documents.plan import Plan
from predictor.exceptions import CapacityError


class Steering:
    """The spot guard at work in a launch: the spot (or mixed) fleet it watches, that fleet's on-demand twin, where
    the job reads each plan, and when the next check is due. :meth:`target` says which of the two to move to now,
    if any; the launch moves."""

    def __init__(
        self, guard: SpotGuard, spot: tuple[Plan, int, str], od: tuple[Plan, int, str], check_s: float, legs: Legs
    ) -> None:
        self.guard, self.spot, self.od, self.check_s, self.legs = guard, spot, od, check_s, legs
        self.echo = legs.echo
        self.next_check = time.monotonic() + check_s
        self.refused = 0  # spot starts refused in a row while on on-demand
        self.retry_at = 0.0  # no return to spot before this (monotonic): 1, 2, 4 ... 16 checks after a refusal
        self.per_batch = 1.0  # Lightning's global steps a step of the plan makes (PROGRESS.json: a manual loop's k)

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

    def at_check(
        self, fleet: LaunchedFleet, progress: Progress | None, moves_left: bool
    ) -> tuple[LaunchedFleet, str, float, Decision] | None:
        """At a check with the job training on ``fleet``: feed the guard the job's progress, and bring up the fleet
        it says to move to: (that fleet, where its job reads the plan, seconds to bring it up, why), or None to
        stay. Spot refused on the way back from on-demand is backed off; on-demand refused is an error (it was the
        fallback).

        Raises:
            CapacityError: the on-demand twin could not start.
        """
        if progress is not None:  # in the plan's steps: Lightning counts a manual loop's every optimizer's step
            k = self.per_batch = max(1.0, float(progress.steps_per_batch or 1))
            step_s = None if progress.step_time_s is None else progress.step_time_s * k
            self.guard.progress(None if progress.step is None else int(progress.step / k + 1e-6), step_s)
        move_to = self.target(fleet)
        if move_to is None:
            return None
        if not moves_left:
            self.echo("srifty launch: the spot policy's move declined: --max-migrations reached")
            return None
        target, d = move_to
        kind = "on-demand" if target is self.od else "spot"
        self.echo(f"srifty launch: at step {self.guard.step} on {self.kind(fleet)}; {d.describe()}")
        try:
            new, up_s = self.legs.bring_up(target[0], target[1], only=True)
        except CapacityError as exc:
            if kind == "on-demand":
                raise
            self.spot_refused()
            wait_s = self.retry_at - time.monotonic()
            self.echo(
                f"srifty launch: spot is not there ({exc.code}): staying on on-demand, next try in {wait_s:.0f} s"
            )
            return None
        if kind == "spot":
            self.guard.observe(True)
            self.refused = 0
        return new, target[2], up_s, d

    def after_loss(self, step: int | None, spot_gone: bool = True) -> tuple[LaunchedFleet, str, float] | None:
        """The guard's fleet is gone at ``step``: the fleet the guard chooses, up (its on-demand twin or spot again),
        or None when it waits for spot or spot was refused. ``spot_gone`` False: a node was lost without a notice (its
        host, its GPU), which says nothing of spot's capacity: the guard decides as with spot there."""
        self.guard.progress(
            None if step is None else int(step / self.per_batch + 1e-6)
        )  # the job's last progress said its k
        self.guard.observe(not spot_gone)
        d = self.guard.decide(time.time(), None)
        what = "spot gone" if spot_gone else "a machine's fault (a node lost without a notice, or a hung job)"
        self.echo(f"srifty launch: {what} at step {step}; {d.describe()}")
        return self.choose(d)

    def while_waiting(self) -> tuple[LaunchedFleet, str, float] | None:
        """No fleet: at each check, the on-demand twin if the guard says so, else another try at spot; None until
        one is up."""
        if not self.due():
            return None
        d = self.guard.decide(time.time(), None)
        got = self.choose(d)
        if got is not None and d.action == "on-demand":
            self.echo(f"srifty launch: still no spot; {d.describe()}")
        return got

    def choose(self, d: Decision) -> tuple[LaunchedFleet, str, float] | None:
        """Bring up the fleet the guard chose: (fleet, where its job reads the plan, seconds to bring it up); None
        when it chose spot and spot was refused (capacity marked gone)."""
        if d.action == "on-demand":
            new, up_s = self.legs.bring_up(self.od[0], self.od[1], only=True)
            return new, self.od[2], up_s
        try:
            new, up_s = self.legs.bring_up(self.spot[0], self.spot[1], only=True)
        except CapacityError as exc:
            self.guard.observe(False)
            self.echo(f"srifty launch: spot still gone ({exc.code}); next try in {self.check_s:g} s")
            return None
        self.guard.observe(True)
        return new, self.spot[2], up_s


def set_up_steering(plan: Plan, choice: int, plan_uri: str, legs: Legs) -> tuple[Steering, Decision]:
    """The spot guard for the plan's choice and its on-demand twin (whose plan, when another, counts its deadline
    from the same start), and its first decision, said with the policy and the fallback's price."""
    run = legs.run
    od_plan, od_index = on_demand_fleet(plan, choice, run.catalog)
    began = legs.plan_started[plan_uri]
    od_uri = plan_uri if od_plan is plan else legs.keep_plan(od_plan, began)
    guard = guard_for(run.spot_policy, plan, choice, od_plan, od_index, started_unix=began,
                      global_batch=legs.global_batch, check_s=run.spot_check_s)  # fmt: skip
    steer = Steering(guard, (plan, choice, plan_uri), (od_plan, od_index, od_uri), run.spot_check_s, legs)  # type: ignore[arg-type]
    first = steer.guard.decide(time.time(), None, available=True)
    od = od_plan.entries[od_index]
    legs.echo(
        f"srifty launch: spot policy {run.spot_policy} against the {plan.constraints.deadline_h:g} h deadline, a "
        f"check every {run.spot_check_s:g} s; on-demand fallback {od.fleet} at ${od.usd_per_hour:,.4f}/h; "
        f"{first.describe()}"
    )
    return steer, first
