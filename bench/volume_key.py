"""The root volumes' KMS key as ``srifty check`` reads it for an Auto Scaling fleet, on the key policies AWS publishes.

AWS's rule: an Auto Scaling group launches with its service-linked role, which may use no customer managed key unless
the key's policy or a grant lets it ("Required AWS KMS key policy for use with encrypted volumes", EC2 Auto Scaling
User Guide); without it every launch fails. moto launches such a group. Each case below is set up in moto's KMS
(behind the rehearsal's rules proxy, which answers GetEbsDefaultKmsKeyId as EC2 does), made the account's default
key for EBS encryption (what the module's root volumes get), and read by ``check_volume_key`` five times: its verdict
against AWS's documented one, and the median seconds of the check. The last case is moto's own server, without the
proxy: it answers no GetEbsDefaultKmsKeyId.

The second table is a fleet booting a team's own image, copied with ``Encrypted`` and ``KmsKeyId`` (as AWS's
CopyImage encrypts an image's snapshots; the tests' moto keeps it): EC2 restores its root volume under the snapshot's
key, or re-encrypts it from that key to the root's own (``checkpoints.kms_key_arn``), so the group's role needs those
keys, not the account's default ("Use encryption with EBS-backed AMIs", EC2 User Guide). "without the image" is the
check as it read before it read images (the account's default key, aws/ebs here, judged instead).

    python bench/volume_key.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import moto_server
from lightning_srifty.provision.aws import autoscaling_role_arn, clients
from lightning_srifty.provision.preflight import check_volume_key
from lightning_srifty.provision.rehearsal.aws_rules import AwsRulesProxy

ACCOUNT = "123456789012"
ROLE = autoscaling_role_arn("aws", ACCOUNT)
ROOT = {"Sid": "Enable IAM User Permissions", "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
        "Action": "kms:*", "Resource": "*"}  # fmt: skip
# the AWS page's "Example 1: Key policy sections that allow access to the customer managed key"
PAGE = [
    {"Sid": "Allow service-linked role use of the customer managed key", "Effect": "Allow",
     "Principal": {"AWS": [ROLE]},
     "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
     "Resource": "*"},
    {"Sid": "Allow attachment of persistent resources", "Effect": "Allow", "Principal": {"AWS": [ROLE]},
     "Action": ["kms:CreateGrant"], "Resource": "*", "Condition": {"Bool": {"kms:GrantIsForAWSResource": True}}},
]  # fmt: skip
# the shape of the AWS managed aws/ebs key's policy: anyone of the account, through EC2
THROUGH_EC2 = {"Effect": "Allow", "Principal": {"AWS": "*"},
               "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:CreateGrant",
                          "kms:DescribeKey"], "Resource": "*",
               "Condition": {"StringEquals": {"kms:CallerAccount": ACCOUNT,
                                              "kms:ViaService": "ec2.us-east-1.amazonaws.com"}}}  # fmt: skip
# the page's "Example 2" seen from the key's own account: the fleet's account (here another) allowed, its role not
OTHER_ACCOUNT = [ROOT, {**PAGE[0], "Principal": {"AWS": "arn:aws:iam::444455556666:root"}}]
CASES = [
    # (case, key policy statements or None for the account's own aws/ebs, grant?, AWS's verdict)
    ("a new account: the AWS managed aws/ebs", None, False, "ok"),
    ("a customer managed key, its default policy (the account's root)", [ROOT], False, "fail"),
    ("the same, with the page's two statements", [ROOT, *PAGE], False, "ok"),
    ("the default policy and the fix's grant", [ROOT], True, "ok"),
    ("aws/ebs's own shape (any principal of the account, through EC2)", [ROOT, THROUGH_EC2], False, "ok"),
    ("use but no CreateGrant (the page's first statement alone)", [ROOT, PAGE[0]], False, "fail"),
    ("the page's statements behind a VPC endpoint condition", [ROOT, *[{**s, "Condition": {"StringEquals": {
        "aws:SourceVpce": "vpce-1a2b3c4d"}}} for s in PAGE]], False, "fail (EC2 calls, not the endpoint)"),
    ("another account's role named (the page's cross-account example)", OTHER_ACCOUNT, False, "fail"),
    ("the page's two statements, the key disabled", [ROOT, *PAGE], False, "fail"),
]  # fmt: skip


# (case, the image key's statements, a grant on it?, the root's key's statements or None, AWS's verdict)
IMAGE_CASES = [
    ("the image's key, its default policy", [ROOT], False, None, "fail"),
    ("the image's key with the page's two statements", [ROOT, *PAGE], False, None, "ok"),
    ("the image's key, its default policy and the fix's grant", [ROOT], True, None, "ok"),
    ("the image's key allowed, the root's own key its default policy", [ROOT, *PAGE], False, [ROOT], "fail"),
    ("the image's key its default policy, the root's own key allowed", [ROOT], False, [ROOT, *PAGE], "fail"),
    ("both keys with the page's two statements", [ROOT, *PAGE], False, [ROOT, *PAGE], "ok"),
]


def timed(aws: dict, key: str | None, runs: int = 5, image: str | None = None) -> tuple[str, float]:
    """The worst of the check's findings (each key is one) and its median seconds."""
    seconds, status = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        found = check_volume_key(aws, "us-east-1", "asg", key, None, {"id": image} if image else None, ["x86_64"])
        seconds.append(time.perf_counter() - start)
        status = min((f.status for f in found), key=["fail", "warn", "ok"].index)
    return status, statistics.median(seconds)


def image_rows(aws: dict, ec2) -> list[tuple[str, str, str, str, float]]:
    """The second table: each case's image made by CopyImage under its key; the check without and with the image."""
    ec2.reset_ebs_default_kms_key_id()
    public = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])
    rows = []
    for case, statements, grant, root_statements, expected in IMAGE_CASES:
        key = aws["kms"].create_key(Policy=json.dumps({"Version": "2012-10-17", "Statement": statements}))
        arn = key["KeyMetadata"]["Arn"]
        if grant:
            operations = "Decrypt GenerateDataKeyWithoutPlaintext ReEncryptFrom ReEncryptTo CreateGrant"
            aws["kms"].create_grant(KeyId=arn, GranteePrincipal=ROLE, Operations=operations.split())
        image = ec2.copy_image(SourceImageId=public["Images"][0]["ImageId"], SourceRegion="us-east-1",
                               Name=f"team-image-{len(rows)}", Encrypted=True, KmsKeyId=arn)["ImageId"]  # fmt: skip
        root_key = None
        if root_statements:
            policy = json.dumps({"Version": "2012-10-17", "Statement": root_statements})
            root_key = aws["kms"].create_key(Policy=policy)["KeyMetadata"]["Arn"]
        before, _ = timed(aws, root_key, runs=1)
        status, median = timed(aws, root_key, image=image)
        rows.append((case, expected, before, status, median))
    return rows


def main() -> None:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_EC2_METADATA_DISABLED="true")  # fmt: skip
    rows = []
    with moto_server() as moto, AwsRulesProxy(moto) as url:
        aws = clients("us-east-1", url)
        ec2 = boto3.client("ec2", endpoint_url=url, region_name="us-east-1")
        for case, statements, grant, expected in CASES:
            if statements is None:
                ec2.reset_ebs_default_kms_key_id()
            else:
                key = aws["kms"].create_key(Policy=json.dumps({"Version": "2012-10-17", "Statement": statements}))
                arn = key["KeyMetadata"]["Arn"]
                if grant:
                    operations = "Decrypt GenerateDataKeyWithoutPlaintext ReEncryptFrom ReEncryptTo CreateGrant"
                    aws["kms"].create_grant(KeyId=arn, GranteePrincipal=ROLE, Operations=operations.split())
                ec2.modify_ebs_default_kms_key_id(KmsKeyId=arn)
                if "disabled" in case:
                    aws["kms"].disable_key(KeyId=key["KeyMetadata"]["KeyId"])
            status, median = timed(aws, None)
            rows.append((case, expected, status, median))
        images = image_rows(aws, ec2)
        bare = clients("us-east-1", moto)
        status, median = timed(bare, None, runs=3)
        rows.append(("moto's own server (no GetEbsDefaultKmsKeyId)", "(cannot tell: warn)", status, median))
    print("| case | AWS | srifty check | median ms |\n|---|---|---|---:|")
    for case, expected, status, median in rows:
        print(f"| {case} | {expected} | {status} | {median * 1e3:,.0f} |")
    print("\n| a team's image (CopyImage) | AWS | without the image | srifty check | median ms |")
    print("|---|---|---|---|---:|")
    for case, expected, before, status, median in images:
        print(f"| {case} | {expected} | {before} | {status} | {median * 1e3:,.0f} |")


if __name__ == "__main__":
    main()
