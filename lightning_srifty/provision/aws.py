"""AWS as every room of the provisioner meets it: the boto3 clients (short timeouts, one local endpoint for tests
and emulators), what botocore's errors mean for the user (and whether AWS answered at all), the zone facts (zone
IDs, which zones offer a type), the S3 URIs of checkpoint folders, the TLS rule of the bucket the module creates,
and a local stand-in for the instance metadata service (:class:`LocalIMDS`: ``srifty launch
--simulate-notice-after``, the rehearsal's nodes, tests).

boto3 and botocore are imported inside the functions that call AWS, so that commands which never touch it
(``srifty terraform --help``, ``srifty status --help``) start without them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from predictor.exceptions import ConfigError, ProvisionError

ZONE_ID = re.compile(r"^[a-z]{2,5}\d+-az\d+$")  # use1-az1


def offered_zones(ec2: Any, types: list[str], by_id: bool = False) -> dict[str, set[str]]:
    """The availability zones (names, or IDs with ``by_id``) of the client's region that offer each type."""
    zones: dict[str, set[str]] = {t: set() for t in types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone-id" if by_id else "availability-zone",
        Filters=[{"Name": "instance-type", "Values": types}],
    )
    for page in pages:
        for o in page.get("InstanceTypeOfferings", []):
            zones.setdefault(o["InstanceType"], set()).add(o["Location"])
    return zones


def plain_http_upload(bucket: str | None, endpoint: str | None, uploads: bool) -> str | None:
    """Why uploading the code will be refused, or None: the bucket the module creates denies requests without TLS (its
    policy: ``aws:SecureTransport`` false), which AWS always gets, but an emulator's ``http://`` endpoint does not."""
    if not uploads or bucket or not (endpoint or "").startswith("http://"):
        return None
    return (
        "the checkpoint bucket the apply creates refuses requests without TLS (its policy denies aws:SecureTransport "
        f"false), so uploading the code to it through the endpoint {endpoint} will be refused (403 Forbidden)"
    )


PLAIN_HTTP_FIX = "give --bucket an existing bucket, or an https:// endpoint"


def why(exc: Exception) -> str:
    """An AWS error in one line: its code and message (an HTML error page: the code alone), else the exception."""
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    code, message = error.get("Code"), str(error.get("Message") or "")
    if code and message.lstrip().startswith("<"):  # an HTML error page (a proxy, an emulator): the code is enough
        message = ""
    return f"{code}: {message[:200]}".strip(": ") if code else f"{type(exc).__name__}: {str(exc)[:300]}"


def aws_unreachable(exc: Exception) -> bool:
    """The AWS endpoint could not be reached (network, DNS, proxy, TLS, timeout), as opposed to an answer: botocore's
    ConnectionError covers the endpoint, the proxy (ProxyConnectionError), TLS and connect timeouts."""
    from botocore.exceptions import ConnectionError, ReadTimeoutError

    return isinstance(exc, (ConnectionError, ReadTimeoutError))


def aws_words(exc: BaseException) -> str | None:
    """What an error of the AWS SDK means for the user, with the fix (None: not one of botocore's). Recognised by
    its module, so that a command that never touched AWS does not import botocore to find out."""
    if not type(exc).__module__.startswith("botocore"):
        return None
    name = type(exc).__name__
    if name == "ProfileNotFound":
        profile = getattr(exc, "kwargs", {}).get("profile") or os.environ.get("AWS_PROFILE", "")
        return (
            f"the AWS profile {profile!r} (AWS_PROFILE) is in neither ~/.aws/config nor ~/.aws/credentials: name one "
            "that is (aws configure list-profiles), or unset AWS_PROFILE to use the default credentials."
        )
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return (
            f"no usable AWS credentials ({exc}): set AWS_PROFILE to a configured profile, or run aws configure (or "
            "aws sso login); srifty never stores credentials."
        )
    if name in ("TokenRetrievalError", "SSOTokenLoadError", "UnauthorizedSSOTokenError"):
        return f"the AWS SSO session has expired or is missing ({exc}): run aws sso login, then try again."
    if name == "NoRegionError":
        return "no AWS region was given: pass --region, or set AWS_REGION."
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"):
        return f"AWS could not be reached ({exc}): check the network (or --aws-endpoint), then try again."
    if name == "ClientError":
        error = getattr(exc, "response", {}).get("Error", {})
        operation = getattr(exc, "operation_name", "a call")
        return (
            f"AWS refused {operation}: {error.get('Code', 'an error')}: {error.get('Message', exc)}. Check that the "
            "credentials in use (aws sts get-caller-identity) may do it in this account and region."
        )
    return f"the AWS SDK failed: {name}: {exc}."


def clients(region: str, endpoint: str | None = None) -> dict[str, Any]:
    """boto3 clients for the checks (``endpoint``: one local endpoint for every service, tests)."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=15)
    kw: dict[str, Any] = {"region_name": region, "config": config}
    made = {}
    for name, service in (("ec2", "ec2"), ("s3", "s3"), ("sts", "sts"), ("ssm", "ssm"), ("quotas", "service-quotas")):
        # a service's own endpoint variable (AWS_ENDPOINT_URL_SERVICE_QUOTAS ...) wins, as in every AWS SDK
        own = os.environ.get(f"AWS_ENDPOINT_URL_{service.upper().replace('-', '_')}")
        url = own or endpoint
        made[name] = boto3.client(service, **kw, **({"endpoint_url": url} if url else {}))  # type: ignore[call-overload]
    return made


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> (bucket, ``some/prefix/``).

    Raises:
        ConfigError: not an s3:// URI with a bucket.
    """
    match = re.match(r"^s3a?://([^/]+)/?(.*)$", uri or "")
    if not match:
        raise ConfigError.between(
            "The checkpoint URI {uri!r} is not an S3 folder (srifty keeps checkpoints in S3): give it as "
            "s3://bucket/prefix/ ({checkpoint_uri}, an existing bucket), as the root's output checkpoint_uri says.",
            parameter="checkpoint_uri",
            value=uri,
            uri=uri,
        )
    prefix = match.group(2)
    return match.group(1), prefix if not prefix or prefix.endswith("/") else prefix + "/"


def empty_bucket(s3: Any, bucket: str) -> None:
    """Every version of every object of ``bucket`` deleted."""
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        items = page.get("Versions", []) + page.get("DeleteMarkers", [])
        for start in range(0, len(items), 1000):  # DeleteObjects takes 1,000 keys a call
            chunk = [{"Key": i["Key"], "VersionId": i["VersionId"]} for i in items[start : start + 1000]]
            s3.delete_objects(Bucket=bucket, Delete={"Objects": chunk, "Quiet": True})


def client(service: str, region: str | None, endpoint: str | None = None) -> Any:
    """A boto3 client with short timeouts (``endpoint``: a local AWS-compatible endpoint; else boto3's own, which
    honours ``AWS_ENDPOINT_URL``)."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=5,
        read_timeout=30,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint else {},
    )
    return boto3.client(service, region_name=region, endpoint_url=endpoint or None, config=config)  # type: ignore[call-overload]


@contextlib.contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """Re-word boto3's errors (no credentials, access denied, no endpoint) as a ProvisionError saying what was being
    done (``what``) and the fix."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except NoCredentialsError:
        raise ProvisionError(
            f"No AWS credentials found while {what}. Set AWS_PROFILE (after `aws sso login` or `aws configure`), or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and try again."
        ) from None
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "NoSuchBucket":
            raise ProvisionError(
                f"The bucket does not exist while {what} ({error.get('BucketName') or error.get('Message')}): check "
                "the checkpoint folder (the launch's checkpoint_uri, `srifty launch --checkpoint-uri`; the fleet's "
                "srifty:checkpoints tag; the root's output checkpoint_uri) and the account of your credentials."
            ) from None
        raise ProvisionError(
            f"AWS refused {what}: {error.get('Code', '?')}: {error.get('Message', exc)}. Check that your credentials "
            "are current and may do it (ec2:DescribeInstances; s3:ListBucket and s3:GetObject on the checkpoint "
            "folder)."
        ) from None
    except BotoCoreError as exc:
        if aws_unreachable(exc):
            raise ProvisionError(
                f"AWS could not be reached while {what}: {exc}. Check the network (a proxy, a VPN; AWS_ENDPOINT_URL "
                "for an emulator such as moto), then try again."
            ) from None
        raise ProvisionError(f"The AWS call failed while {what}: {aws_words(exc) or exc}") from None


# A local IMDSv2-compatible metadata server, for trying spot interruptions without EC2 (``srifty launch
# --simulate-notice-after``), the rehearsal's nodes and tests: a token endpoint, a token required on every read and
# good for the seconds it was asked for, 404 on ``spot/instance-action`` until :meth:`LocalIMDS.notify` is called.
# A token's "session duration ... can be a minimum of one second and a maximum of six hours. ... After the specified
# duration expires, you must create a new session token" ("How Instance Metadata Service Version 2 works", Amazon EC2
# User Guide: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-metadata-v2-how-it-works.html); a read with
# an expired token is answered 401
TOKEN_TTL_MAX_S = 21_600


class LocalIMDS:
    """``metadata`` maps paths under ``/latest/`` (e.g. ``meta-data/instance-type``) to bodies; every request is
    recorded in ``requests`` as (method, path). ``token_life_s`` shortens every token's life to at most that many
    seconds (a test of a client that keeps a token past its TTL); None: the TTL each token was asked for, as EC2."""

    def __init__(self, metadata: dict[str, str] | None = None, token_life_s: float | None = None) -> None:
        self.metadata = dict(metadata if metadata is not None else {"meta-data/instance-life-cycle": "spot"})
        self.requests: list[tuple[str, str]] = []
        self.tokens: dict[str, float] = {}  # each token issued: its monotonic expiry
        owner = self

        def issue(ttl_text: str | None) -> str | None:
            try:
                ttl = int(ttl_text or "")
            except ValueError:
                return None
            if not 1 <= ttl <= TOKEN_TTL_MAX_S:
                return None
            token = secrets.token_hex(16)
            life = ttl if token_life_s is None else min(ttl, token_life_s)
            owner.tokens[token] = time.monotonic() + life
            return token

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_PUT(self) -> None:
                owner.requests.append(("PUT", self.path))
                token = None
                if self.path == "/latest/api/token":
                    token = issue(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"))
                self._reply(200 if token else 400, token or "bad token request (a TTL of 1 to 21600 seconds)")

            def do_GET(self) -> None:
                owner.requests.append(("GET", self.path))
                expiry = owner.tokens.get(self.headers.get("X-aws-ec2-metadata-token") or "")
                if expiry is None or time.monotonic() >= expiry:
                    self._reply(401, "missing, wrong or expired token")
                    return
                body = owner.metadata.get(self.path.removeprefix("/latest/"))
                self._reply(200 if body is not None else 404, body if body is not None else "not found")

            def _reply(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="srifty-local-imds", daemon=True)

    def notify(self, action: str = "terminate", when: str | None = None) -> None:
        """Post a spot notice as AWS does: the action and an ISO 8601 UTC time (default: two minutes from now)."""
        if when is None:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        self.metadata["meta-data/spot/instance-action"] = json.dumps({"action": action, "time": when})

    def __enter__(self) -> LocalIMDS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
