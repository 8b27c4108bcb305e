"""What ``srifty launch`` needs from a provisioner: capacity up, the job started on it, the job's state, capacity
down. Two implementations: :class:`~lightning_srifty.provision.launcher.local.LocalProvisioner` (processes on this
machine) and :class:`~lightning_srifty.provision.launcher.terraform_fleet.TerraformProvisioner` (the generated
Terraform of a plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from predictor.documents.plan import Plan, PlanEntry


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
    half-made and could not release then: the launcher releases them with ``down`` when the launch ends."""

    kind: str

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
