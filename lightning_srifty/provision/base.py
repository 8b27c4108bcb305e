"""What ``srifty launch`` needs from a provisioner: capacity up, the job started on it, the job's state, capacity
down. Two implementations: :class:`~lightning_srifty.provision.launcher.local.LocalProvisioner` (processes on this
machine) and :class:`~lightning_srifty.provision.launcher.terraform_fleet.TerraformProvisioner` (the generated
Terraform of a plan). And the guard every command that holds fleets runs under (:class:`Interrupts`: SIGINT, SIGTERM
and SIGHUP become an exception, so that what was started is released)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from predictor.documents.plan import Plan, PlanEntry
from predictor.exceptions import LaunchInterrupted


@dataclass
class LaunchedFleet:
    """One fleet of one plan, as brought up by a provisioner."""

    plan: Plan
    index: int  # in plan.entries
    name: str  # unique within a launch (resource names, the handover object)
    data: dict[str, Any] = field(default_factory=dict)  # the provisioner's own (processes, folders, outputs)

    @property
    def entry(self) -> PlanEntry:
        return self.plan.entries[self.index]


@dataclass(frozen=True)
class ZoneChoice:
    """Another availability zone to try a refused fleet in, and what it costs there in words."""

    zone: str  # a zone ID (use1-az4) or name
    note: str = ""  # e.g. "spot $0.45/h there, the plan used $0.41/h"


class Provisioner(Protocol):
    """What the launcher drives. A provisioner may also keep ``leftovers``, a list of fleets a failed ``up`` left
    half-made and could not release then: the launcher releases them with ``down`` when the launch ends; and have
    ``node_verdicts(fleet)``, what each node of a fleet said of its job's end (the Terraform fleets' boot scripts:
    :func:`lightning_srifty.protocol.node_verdicts`), which tells a job that failed because the fleet lost a node
    without a notice from one that failed (:class:`lightning_srifty.provision.launcher.launch.LostNodeWatch`), and
    ``node_faults(fleet)``, what failed on its nodes' GPUs (a machine's fault, not the market's). ``wait(fleet,
    timeout)``, where it has it, waits for the job's processes to exit (the local machine the next leg needs: after
    every leave and at the end); ``wait_after_fit(fleet, timeout)`` only once the job's training finished, for its
    script to end on every node (a cloud fleet: before its release). Each answers the job's exit status, or None when
    it still ran ``timeout`` s later."""

    kind: str
    # torchrun numbers the job's ranks in the order the fleet's nodes join its rendezvous (instances that boot apart),
    # not in the plan's group order: a mix whose ranks take different batches then gets them by node group
    ranks_in_join_order: bool

    def up(self, plan: Plan, index: int, name: str, zone: str | None = None) -> LaunchedFleet:
        """Bring the capacity of ``plan.entries[index]`` up (nothing runs on it yet), in ``zone`` when given (else
        where the plan's price was)."""

    def zones_after(self, plan: Plan, index: int, code: str, tried: list[str | None]) -> list[ZoneChoice]:
        """Other zones to try the same fleet in after EC2 refused it with ``code`` in the zones ``tried`` (None: the
        default zone), cheapest first; [] when the refusal is not about a zone (a quota, a price) or the
        provisioner has no zones."""

    def start(self, fleet: LaunchedFleet, env: dict[str, str]) -> None:
        """Start the job on the fleet with these SRIFTY_* settings."""

    def poll(self, fleet: LaunchedFleet) -> int | None:
        """The job's exit status once it is known to have ended; None while running or when it cannot be seen
        (remote fleets: the markers beside the checkpoints tell)."""

    def stop(self, fleet: LaunchedFleet) -> None:
        """Stop the job if it still runs (a failure elsewhere)."""

    def down(self, fleet: LaunchedFleet) -> None:
        """Release the capacity."""


# Signals that end a command which started something (a fleet, a local AWS, nodes): they become an exception, so
# that the command's ``finally`` releases what it started before it ends. Python's default SIGTERM and SIGHUP end
# the process at once and run no ``finally``: a rehearsal stopped by SIGTERM left its moto server, its nodes' boot
# scripts and their training running.


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP raise :class:`LaunchInterrupted` once (main thread only); a second signal while
    the command releases what it started is answered with ``busy`` (a line), not a second interruption."""

    SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

    def __init__(self, echo: Any, who: str, busy: str) -> None:
        self.echo, self.who, self.busy = echo, who, busy
        self.fired: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.fired is not None:
            self.echo(f"{self.who}: {signal.Signals(signum).name}: {self.busy}")
            return
        self.fired = signum
        raise LaunchInterrupted(signum, self.who)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
