"""moto's server with a rule of real AWS's that its models do not keep, for the rehearsal's local AWS.

``python -m lightning_srifty.provision.rehearsal.moto_server -H 127.0.0.1 -p PORT`` runs ``moto.server`` with:

- an Auto Scaling group whose Launch process is suspended launches no instance. AWS: "Launch: Adds instances to the
  Auto Scaling group when the group scales out, or when Amazon EC2 Auto Scaling chooses to launch instances for other
  reasons"; suspended, it does neither
  (https://docs.aws.amazon.com/autoscaling/ec2/userguide/as-suspend-resume-processes.html). moto records the
  suspension and then launches to the desired capacity on every change (a DetachInstances included), so a fleet's
  finished nodes, which suspend their group's launches and leave it, were replaced at once: the group's desired
  capacity is set and no instance is started; scale-in (the Terminate process, never suspended by the module) and
  a group's deletion still terminate as moto does.

Rules that need the request (the role's policy, user data's size, S3's answers) are the proxy's (:mod:`.aws_rules`).
"""

from __future__ import annotations

from typing import Any

from moto.autoscaling.models import FakeAutoScalingGroup

_moto_launch = FakeAutoScalingGroup.replace_autoscaling_group_instances


def replace_autoscaling_group_instances(self: Any, count_needed: int, propagated_tags: dict[str, str]) -> None:
    """moto's launch of ``count_needed`` instances into the group, unless its Launch process is suspended."""
    if "Launch" in {p["ProcessName"] for p in self.suspended_processes}:
        return
    _moto_launch(self, count_needed, propagated_tags)


def main() -> None:
    FakeAutoScalingGroup.replace_autoscaling_group_instances = replace_autoscaling_group_instances  # type: ignore[method-assign]
    from moto.server import main as serve

    serve()


if __name__ == "__main__":
    main()
