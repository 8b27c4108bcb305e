"""moto's server with rules of real AWS's that its models do not keep, for the rehearsal's local AWS.

``python -m lightning_srifty.provision.rehearsal.moto_server -H 127.0.0.1 -p PORT`` runs ``moto.server`` with:

- an S3 request is authorized by its IAM action, as AWS authorizes it: ListObjectsV2 by ``s3:ListBucket`` on the
  bucket, HeadObject by ``s3:GetObject`` on the object ("Permissions" in each operation's API reference:
  https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html,
  https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html; the table in
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-with-s3-policy-actions.html). moto 5.2.6 checks the
  caller's policy against the operation's name instead (``s3:ListObjectsV2``, ``s3:HeadObject``: actions no policy
  grants, since IAM has none of those names), so an instance role's exact policy was refused its own bucket's
  listing. moto names the IAM action of every S3 request it authorizes (its ``ACTION_MAP``, in the request's data,
  which moto 5.2.5 and earlier checked); that name is checked again. ``authorize_s3_by_iam_action`` applies this rule
  alone (the tests' moto);

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

import functools
import inspect
from typing import Any

from moto.autoscaling.models import FakeAutoScalingGroup
from moto.iam.access_control import S3IAMRequest

_moto_set_desired_capacity = FakeAutoScalingGroup.set_desired_capacity


def set_desired_capacity(self: Any, new_capacity: int | None) -> None:
    """moto's, unless the group's Launch process is suspended: then the capacity is recorded and nothing launched."""
    if "Launch" in {p["ProcessName"] for p in self.suspended_processes}:
        self.desired_capacity = self.min_size if new_capacity is None else new_capacity
        return
    _moto_set_desired_capacity(self, new_capacity)


def authorize_s3_by_iam_action() -> None:
    """S3 requests checked against the IAM action moto names for them (the module's docstring), once per process."""
    original = S3IAMRequest.__init__
    if getattr(original, "_srifty_iam_action", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        data = bound.arguments.get("data")
        named = data.get("Action") if isinstance(data, dict) else None
        if isinstance(named, list):  # a query string's value
            named = named[0] if named else None
        if isinstance(named, str) and named:
            bound.arguments["action"] = named
        original(*bound.args, **bound.kwargs)

    __init__._srifty_iam_action = True  # type: ignore[attr-defined]
    S3IAMRequest.__init__ = __init__  # type: ignore[method-assign]


def serve() -> None:
    """moto's own server, on this process's command line (``-H``, ``-p``)."""
    from moto.server import main as moto_main

    moto_main()


def main() -> None:
    FakeAutoScalingGroup.set_desired_capacity = set_desired_capacity  # type: ignore[method-assign]
    authorize_s3_by_iam_action()
    serve()


if __name__ == "__main__":
    main()
