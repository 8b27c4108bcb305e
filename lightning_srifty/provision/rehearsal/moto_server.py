"""moto's server with a rule of real AWS's that its models do not keep, for the rehearsal's local AWS.

``python -m lightning_srifty.provision.rehearsal.moto_server -H 127.0.0.1 -p PORT`` runs ``moto.server`` with:

- an Auto Scaling group whose Launch process is suspended launches no instance. AWS: "Launch: Adds instances to the
  Auto Scaling group when the group scales out, or when Amazon EC2 Auto Scaling chooses to launch instances for other
  reasons"; suspended, it does neither
  (https://docs.aws.amazon.com/autoscaling/ec2/userguide/as-suspend-resume-processes.html). moto records the
  suspension and then launches to the desired capacity on every change (a DetachInstances included), so a fleet's
  finished nodes, which suspend their group's launches and leave it, were replaced at once: the group's desired
  capacity is set and no instance is started (nor, while launches are suspended, terminated to meet it: scale-in
  is left to the Terminate process, which the module never suspends but nothing here plays).

Rules that need the request (the role's policy, user data's size, S3's answers) are the proxy's (:mod:`.aws_rules`).
"""

from __future__ import annotations

from typing import Any

from moto.autoscaling.models import FakeAutoScalingGroup

_moto_set_desired_capacity = FakeAutoScalingGroup.set_desired_capacity


def set_desired_capacity(self: Any, new_capacity: int | None) -> None:
    """moto's, unless the group's Launch process is suspended: then the capacity is recorded and nothing launched."""
    if "Launch" in {p["ProcessName"] for p in self.suspended_processes}:
        self.desired_capacity = self.min_size if new_capacity is None else new_capacity
        return
    _moto_set_desired_capacity(self, new_capacity)


def main() -> None:
    FakeAutoScalingGroup.set_desired_capacity = set_desired_capacity  # type: ignore[method-assign]
    from moto.server import main as serve

    serve()


if __name__ == "__main__":
    main()
