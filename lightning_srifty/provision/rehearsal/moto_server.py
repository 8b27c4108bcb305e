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

- an image copied with ``Encrypted`` (and ``KmsKeyId``) has its snapshots encrypted, under the key given, else the
  account's default key for EBS encryption, and a copy of an image whose snapshot is encrypted keeps its key, as
  CopyImage does ("Image-copying scenarios", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/AMIEncryption.html);
  DescribeImages says whether each snapshot is encrypted (``Ebs.Encrypted``, as EC2's ``EbsBlockDevice`` does). moto
  5.2.6 gives every image a snapshot of its own, never encrypted, and says nothing of it, so no image with an
  encrypted snapshot could be made: ``srifty check`` reads the keys of an image's snapshots an Auto Scaling group's
  launches use (``keep_image_encryption`` applies this rule alone, for the tests' moto).

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


def keep_image_encryption() -> None:
    """CopyImage's encryption kept and DescribeImages's ``Ebs.Encrypted`` said (the module's docstring), once."""
    from moto.ec2.models.amis import Ami
    from moto.ec2.responses.amis import AmisResponse

    original = AmisResponse.copy_image
    if getattr(original, "_srifty_encryption", False):
        return

    @functools.wraps(original)
    def copy_image(self: Any) -> Any:
        from moto.ec2.exceptions import InvalidParameterDependency
        from moto.ec2.models import ec2_backends
        from moto.kms import kms_backends

        backend = self.ec2_backend
        key, encrypted = self._get_param("KmsKeyId"), str(self._get_param("Encrypted")).lower() == "true"
        if key and not encrypted:
            raise InvalidParameterDependency("KmsKeyId", "Encrypted")  # as EC2 refuses it
        if key:  # a key that does not exist is refused before anything is copied
            key = kms_backends[backend.account_id][backend.region_name].describe_key(key).arn
        region = self._get_param("SourceRegion")
        source = ec2_backends[backend.account_id][region].amis.get(self._get_param("SourceImageId"))
        was = source.ebs_snapshot if source is not None else None
        result = original(self)
        if encrypted or (was is not None and was.encrypted):
            if not key and was is not None and was.encrypted and was.kms_key_id and region == backend.region_name:
                key = was.kms_key_id  # an encrypted snapshot this account owns, copied in its region: the same key
            key = key or backend.default_kms_key_id or backend._create_default_encryption_key()
            snapshot = backend.amis[result.result["ImageId"]].ebs_snapshot  # type: ignore[index]
            snapshot.encrypted, snapshot.kms_key_id = True, key
        return result

    mappings = vars(Ami)["block_device_mappings"].fget

    def block_device_mappings(self: Any) -> list[dict[str, Any]]:
        out = mappings(self)
        for mapping in out:
            mapping["Ebs"]["Encrypted"] = bool(self.ebs_snapshot.encrypted)
        return out

    copy_image._srifty_encryption = True  # type: ignore[attr-defined]
    AmisResponse.copy_image = copy_image  # type: ignore[method-assign]
    Ami.block_device_mappings = property(block_device_mappings)  # type: ignore[method-assign,assignment]


def serve() -> None:
    """moto's own server, on this process's command line (``-H``, ``-p``)."""
    from moto.server import main as moto_main

    moto_main()


def main() -> None:
    FakeAutoScalingGroup.set_desired_capacity = set_desired_capacity  # type: ignore[method-assign]
    authorize_s3_by_iam_action()
    keep_image_encryption()
    serve()


if __name__ == "__main__":
    main()
