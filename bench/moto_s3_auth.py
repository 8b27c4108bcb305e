"""How the installed moto authorizes a node's S3 calls under an exact policy, with and without the rehearsal's rule.

A user holding exactly ``s3:ListBucket`` on a bucket and ``s3:GetObject`` on its objects (an instance role's grant)
makes each call of a node that reads its data, against moto's own server and against one with the rehearsal's rule
(``lightning_srifty.provision.rehearsal.moto_server.authorize_s3_by_iam_action``: the IAM action moto names for the
request is checked; the tests' moto server runs it). AWS allows the first four and refuses the last two (each
operation's "Permissions" in the S3 API reference). moto 5.2.6 refused the listings and HeadObject on its own server.

    python bench/moto_s3_auth.py
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _fleet import enforce_iam, node_credentials, s3_calls_under
from conftest import moto_server

POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::bench-auth"},
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::bench-auth/data/*"},
    ],
}
AWS_SAYS = {"ListObjectsV2 data/": "ok", "ListObjects data/": "ok", "HeadObject data/a": "ok", "GetObject data/a": "ok",
            "GetObject other/b": "AccessDenied", "PutObject data/c": "AccessDenied"}  # fmt: skip


def calls(url: str) -> dict[str, str]:
    admin = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    admin.create_bucket(Bucket="bench-auth")
    for key in ("data/a", "other/b"):
        admin.put_object(Bucket="bench-auth", Key=key, Body=b"x")
    keys = node_credentials(url, json.dumps(POLICY), "reader")  # an IAM user holding exactly the policy
    enforce_iam(url, True)  # moto's IAM enforcement, from the next request on
    return s3_calls_under(url, keys, "bench-auth")


def main() -> None:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_EC2_METADATA_DISABLED="true")
    results = {}
    for name, rule in [("moto's own", False), ("with the rule", True)]:
        with moto_server(s3_by_iam_action=rule) as url:
            results[name] = calls(url)
    print(f"moto {version('moto')}\n")
    print("| call (the role's exact grant) | AWS | " + " | ".join(results) + " |")
    print("|---|---|" + "---|" * len(results))
    for call, aws in AWS_SAYS.items():
        print(f"| {call} | {aws} | " + " | ".join(r[call] for r in results.values()) + " |")


if __name__ == "__main__":
    main()
