"""How the installed moto authorizes a node's S3 calls under an exact policy, with and without the rehearsal's rule.

A user holding exactly ``s3:ListBucket`` on a bucket and ``s3:GetObject`` on its objects (an instance role's grant)
makes each call of a node that reads its data, against moto's plain server and against the rehearsal's
(``lightning_srifty.provision.rehearsal.moto_server``, whose ``authorize_s3_by_iam_action`` checks the IAM action moto
names for the request). AWS allows the first four and refuses the last two (each operation's "Permissions" in the S3
API reference). moto 5.2.6 refused the listings and HeadObject on its plain server.

    python bench/moto_s3_auth.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import version

import boto3
from botocore.exceptions import ClientError

POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::bench-auth"},
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::bench-auth/data/*"},
    ],
}
AWS_SAYS = {"ListObjectsV2": "ok", "ListObjects": "ok", "GetObject": "ok", "HeadObject": "ok",
            "GetObject (another prefix)": "AccessDenied", "PutObject": "AccessDenied"}  # fmt: skip
SERVERS = {
    "moto's own": [sys.executable, "-m", "moto.server"],
    "with the rule": [sys.executable, "-m", "lightning_srifty.provision.rehearsal.moto_server"],
}


def calls(url: str) -> dict[str, str]:
    admin = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    admin.create_bucket(Bucket="bench-auth")
    for key in ("data/a", "other/b"):
        admin.put_object(Bucket="bench-auth", Key=key, Body=b"x")
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1")
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="role", PolicyDocument=json.dumps(POLICY))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    enforce = urllib.request.Request(f"{url}/moto-api/reset-auth", b"0", headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(enforce, timeout=30).close()  # moto's IAM enforcement, from the next request on
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key["AccessKeyId"],
                      aws_secret_access_key=key["SecretAccessKey"])  # fmt: skip
    made = {
        "ListObjectsV2": lambda: s3.list_objects_v2(Bucket="bench-auth", Prefix="data/"),
        "ListObjects": lambda: s3.list_objects(Bucket="bench-auth", Prefix="data/"),
        "GetObject": lambda: s3.get_object(Bucket="bench-auth", Key="data/a"),
        "HeadObject": lambda: s3.head_object(Bucket="bench-auth", Key="data/a"),
        "GetObject (another prefix)": lambda: s3.get_object(Bucket="bench-auth", Key="other/b"),
        "PutObject": lambda: s3.put_object(Bucket="bench-auth", Key="data/c", Body=b"c"),
    }
    said = {}
    for name, call in made.items():
        try:
            call()
            said[name] = "ok"
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            said[name] = "AccessDenied" if code in ("403", "AccessDenied") else code
    return said


def served(cmd: list[str]) -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"moto's server did not start: {' '.join(cmd)}") from None
                time.sleep(0.2)
        return calls(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_EC2_METADATA_DISABLED="true")
    results = {name: served(cmd) for name, cmd in SERVERS.items()}
    print(f"moto {version('moto')}\n")
    print("| call (the role's exact grant) | AWS | " + " | ".join(results) + " |")
    print("|---|---|" + "---|" * len(results))
    for call, aws in AWS_SAYS.items():
        print(f"| {call} | {aws} | " + " | ".join(r[call] for r in results.values()) + " |")


if __name__ == "__main__":
    main()
