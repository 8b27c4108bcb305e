"""A local AWS for ``srifty rehearse``: moto's server (EC2, Auto Scaling, S3, IAM, SSM, Secrets Manager, STS) in its
own process on 127.0.0.1, behind :class:`~.aws_rules.AwsRulesProxy`, which keeps the rules of real AWS that moto does
not (user data over 16,384 bytes refused, a conditioned s3:ListBucket answered as AWS answers it, idempotent client
tokens, IAM's RemoveRoleFromInstanceProfile of an absent role, an Auto Scaling update that keeps the group's mixed
instances policy). moto checks every call against IAM once :meth:`LocalAWS.enforce_iam` is on; the nodes then call
with the credentials of a user that holds exactly the instance role's policy (:meth:`LocalAWS.principal`), the
rehearsal itself with an administrator's."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

from lightning_srifty.provision.rehearsal.aws_rules import AwsRulesProxy
from predictor.exceptions import ProvisionError

ADMIN_POLICY = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
BOOT_KEYS = {"AWS_ACCESS_KEY_ID": "srifty-rehearsal", "AWS_SECRET_ACCESS_KEY": "srifty-rehearsal"}  # before IAM is on


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_error_page_as_generic(response_dict: dict[str, Any], **_: Any) -> None:
    """moto's server answers an exception of its own with 500 and Werkzeug's HTML page (``<!doctype html>``), which
    botocore does not take for a generic server error (it looks for ``<html>`` first) and fails to parse as XML: a
    ResponseParserError the SDK does not retry (a rehearsal in CI failed so). Its body emptied, botocore reads it as
    the generic 500 it is, and retries it as AWS's own 500s are retried."""
    body = response_dict.get("body")
    page = isinstance(body, bytes) and body.lstrip()[:15].lower() == b"<!doctype html>"
    if response_dict.get("status_code", 0) >= 500 and page:
        response_dict["body"] = b""


MOTO_SERVER = "lightning_srifty.provision.rehearsal.moto_server"  # moto.server with an AWS rule its models lack


class LocalAWS:
    """``with LocalAWS(region) as aws:``; ``aws.url`` is the endpoint to give terraform and the nodes (the proxy),
    ``aws.client(service)`` a boto3 client with the administrator's credentials."""

    def __init__(self, region: str) -> None:
        self.region = region
        self._proc: subprocess.Popen[bytes] | None = None
        self.proxy: AwsRulesProxy | None = None
        self.moto_url = ""
        self.url = ""
        self.admin = dict(BOOT_KEYS)
        self._enforcing = False

    def __enter__(self) -> LocalAWS:
        port = free_port()
        self._proc = subprocess.Popen(
            # moto's server, with the Auto Scaling rule its models do not keep (a suspended Launch launches nothing)
            [sys.executable, "-m", MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the rehearsal reaches it through __exit__ only
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise ProvisionError(
                        f"moto's server did not start on 127.0.0.1:{port} ({sys.executable} -m {MOTO_SERVER}): "
                        "pip install 'lightning-srifty[rehearse]'"
                    ) from None
                time.sleep(0.2)
        self.moto_url = f"http://127.0.0.1:{port}"
        self.proxy = AwsRulesProxy(self.moto_url, keep_host=True)
        self.url = self.proxy.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._enforcing:
            with contextlib.suppress(OSError):
                self.enforce_iam(False)
        if self.proxy is not None:
            self.proxy.__exit__()
            self.proxy = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def client(self, service: str) -> Any:
        import boto3
        from botocore.config import Config

        # the service is a runtime name, not one of boto3-stubs' literals
        client = boto3.client(  # type: ignore[call-overload]
            service,
            region_name=self.region,
            endpoint_url=self.moto_url,
            aws_access_key_id=self.admin["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.admin["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}, read_timeout=60),
        )
        client.meta.events.register("before-parse", server_error_page_as_generic)
        return client

    def environment(self) -> dict[str, str]:
        """What terraform and the AWS CLI need to reach this AWS as the administrator (no profile, no IMDS)."""
        return {
            **self.admin,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def principal(self, name: str, policy: str) -> dict[str, str]:
        """An IAM user holding exactly ``policy`` (a JSON document) and its credentials, as environment variables."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="instance-role", PolicyDocument=policy)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}

    def enforce_iam(self, on: bool) -> None:
        """moto's IAM enforcement (its /moto-api/reset-auth): every request from now on is checked against the
        caller's policies, or none is. Before it is on, the administrator gets a user of its own."""
        if on and self.admin == BOOT_KEYS:
            self.admin = self.principal("srifty-rehearsal-admin", ADMIN_POLICY)
        if self.proxy is not None:  # the call the proxy makes itself (UpdateAutoScalingGroup's rule) is signed so
            keys = (self.admin["AWS_ACCESS_KEY_ID"], self.admin["AWS_SECRET_ACCESS_KEY"])
            self.proxy.credentials = keys if on else None
        request = urllib.request.Request(
            f"{self.moto_url}/moto-api/reset-auth", b"0" if on else b"inf", headers={"Content-Type": "text/plain"}
        )
        urllib.request.urlopen(request, timeout=30).close()
        self._enforcing = on
