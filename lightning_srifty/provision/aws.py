"""AWS as every room of the provisioner meets it: the boto3 clients (short timeouts, one local endpoint for tests
and emulators), what botocore's errors mean for the user (and whether AWS answered at all), the zone facts (zone
IDs, which zones offer a type), the S3 URIs of checkpoint folders, the TLS rule of the bucket the module creates,
a local stand-in for the instance metadata service (:class:`LocalIMDS`: ``srifty launch
--simulate-notice-after``, the rehearsal's nodes, tests), and IAM's condition operators with what a KMS key's policy
and grants let EC2 Auto Scaling do (:func:`volume_key_verdict`: ``srifty check``'s ``volumes``).

boto3 and botocore are imported inside the functions that call AWS, so that commands which never touch it
(``srifty terraform --help``, ``srifty status --help``) start without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

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
    if type(exc).__name__ == "ResponseParserError" and "<html" in str(exc).lower():  # no code to read at all
        return "the endpoint answered with an error page, not AWS's answer (an emulator without the call?)"
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
    for name, service in (
        ("ec2", "ec2"),
        ("s3", "s3"),
        ("sts", "sts"),
        ("ssm", "ssm"),
        ("quotas", "service-quotas"),
        ("kms", "kms"),
    ):
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


# ---------------------------------------------------------------------------------------------------------------------
# Whether EC2 Auto Scaling may use the KMS key of a fleet's root volumes (srifty check's ``volumes``)
# ---------------------------------------------------------------------------------------------------------------------
#
# The rule, AWS's: an Auto Scaling group launches with its service-linked role, ``AWSServiceRoleForAutoScaling``, whose
# "predefined permissions also include access to your AWS managed keys. However, they do not include access to your
# customer managed keys" ("Required AWS KMS key policy for use with encrypted volumes", EC2 Auto Scaling User Guide,
# https://docs.aws.amazon.com/autoscaling/ec2/userguide/key-policy-requirements-EBS-encryption.html). The module's
# launch templates encrypt every root volume: with ``checkpoints.kms_key_arn`` when a root gives one, else with the
# account's default key for EBS encryption, which the same page names as a place a customer managed key comes from
# ("or enable encryption by default"); an organisation that sets its own key as that default gives it to every fleet.
# Unless the key's policy or a grant lets the role use it, every launch fails ("Client.InternalError: Client error on
# launch", AWS re:Post, https://repost.aws/knowledge-center/kms-launch-ec2-instance) and the group stays empty. moto
# launches it.
#
# The keys (:func:`launch_volume_keys`): the launch template gives the root volume ``Encrypted`` and the root's key;
# EC2 restores an image's encrypted snapshot under its own key or re-encrypts it ("Use encryption with EBS-backed
# AMIs", Amazon EC2 User Guide, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/AMIEncryption.html), and each key
# a launch touches must let the role in ("Amazon EC2 Auto Scaling failed to launch instances with encrypted AMI or
# encrypted volumes", the re:Post page above).
#
# What is read of each key (preflight.check_volume_key): the key (``kms:DescribeKey``: aws/ebs needs nothing; a
# disabled or asymmetric key serves no launch), the grants to the role (``kms:ListGrants``) and the key's policy
# (``kms:GetKeyPolicy``). A policy statement counts when its principal is the role's ARN or ``*`` (the account's root
# principal is not the role: it delegates to IAM policies, and the role's has no KMS), its actions cover the
# operation, and each of its conditions holds for such a call, judged on the keys the call carries
# (:func:`autoscaling_call_context`); a condition on any other key, or an operator not read here, makes the answer
# unknown, never a refusal: ``srifty apply`` stops only on what is certain.
#
# What is asked of a key, by its use: what EBS is documented to ask (a need: an operation, or a tuple of operations
# any one of which serves), whose lack fails; and what the page's statements also grant and EBS may ask there
# (undocumented), whose lack is a warning, never a pass.

AUTOSCALING_ROLE = "role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
Need = str | tuple[str, ...]
# a new volume from an unencrypted snapshot: the grant EBS keeps for the volume, the volume's data key, that key
# decrypted at attachment ("How Amazon EBS uses AWS KMS", AWS KMS Developer Guide,
# https://docs.aws.amazon.com/kms/latest/developerguide/services-ebs.html)
VOLUME_KEY_NEEDS: tuple[Need, ...] = ("kms:CreateGrant", "kms:GenerateDataKeyWithoutPlaintext", "kms:Decrypt")
# (needs, what it may also ask) of a key by its use:
# a volume restored from a snapshot under the same key: its attachment (the grant, the data key decrypted)
RESTORED = (("kms:CreateGrant", "kms:Decrypt"), ("kms:GenerateDataKeyWithoutPlaintext",))
# a volume re-encrypted to the key from a snapshot's: its attachment, and its data key made or re-encrypted under it
RE_ENCRYPTED_TO = (("kms:CreateGrant", "kms:Decrypt"), ("kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncryptTo"))
# the snapshot's key a volume is re-encrypted from: its data key read, by Decrypt or by ReEncrypt
RE_ENCRYPTED_FROM = ((("kms:Decrypt", "kms:ReEncryptFrom"),), ("kms:CreateGrant", "kms:Decrypt", "kms:ReEncryptFrom"))
NEW_VOLUME: tuple[tuple[Need, ...], tuple[str, ...]] = (VOLUME_KEY_NEEDS, ())
# the operations the fix grants: the AWS page's statements' actions, as grant operations
GRANT_OPERATIONS = (
    "Encrypt Decrypt ReEncryptFrom ReEncryptTo GenerateDataKey GenerateDataKeyWithoutPlaintext DescribeKey CreateGrant"
)
KEY_POLICY_PAGE = "https://docs.aws.amazon.com/autoscaling/ec2/userguide/key-policy-requirements-EBS-encryption.html"

KeyAnswer = Literal["allowed", "denied", "missing", "unknown"]
# the string condition operators :func:`iam_condition` reads, with "IfExists" and the ForAnyValue/ForAllValues
# prefixes (on a single-valued key both prefixes reduce to the plain operator)
_STRING_OPS = {"StringEquals", "StringEqualsIgnoreCase", "StringLike", "ArnEquals", "ArnLike", "Bool"}
_NEGATED_OPS = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "ArnNotEquals", "ArnNotLike"}

# the condition keys judged (lower-cased): those :func:`autoscaling_call_context` gives a value, on some operation
AUTOSCALING_CALL_KEYS = frozenset(
    {"kms:calleraccount", "kms:viaservice", "aws:principalarn", "aws:principalaccount", "kms:grantisforawsresource"}
)


def autoscaling_role_arn(partition: str, account: str) -> str:
    return f"arn:{partition}:iam::{account}:{AUTOSCALING_ROLE}"


def autoscaling_call_context(role: str, account: str, region: str, action: str) -> dict[str, str]:
    """The condition keys a KMS call that EC2 makes for the Auto Scaling role carries, lower-cased: the role's
    account calls (``kms:CallerAccount``, ``aws:PrincipalAccount``) through EC2 (``kms:ViaService``, as the AWS
    managed ``aws/ebs`` key's own policy requires of every use), and a grant for a volume is for an AWS resource."""
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"  # the China regions' own domain
    context = {
        "kms:calleraccount": account,
        "kms:viaservice": f"ec2.{region}.{domain}",
        "aws:principalarn": role,
        "aws:principalaccount": account,
    }
    if action.lower() == "kms:creategrant":
        context["kms:grantisforawsresource"] = "true"
    return context


def policy_values(value: Any) -> list[str]:
    """A policy element's value as the list of strings IAM reads it as (one value or a list of them)."""
    if value is None:
        return []
    return [str(v) for v in (value if isinstance(value, list) else [value])]


def _principal_is(principal: Any, role: str, deny: bool = False) -> bool:
    """Whether a statement's principal is the role: its ARN or ``*``; for a Deny, the role's account too (an
    account named in a resource policy stands for every principal of it: an Allow only delegates to the account's
    IAM policies, which for this role hold no KMS, while a Deny binds them all)."""
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        return False
    account = role.split(":")[4]
    mine = {"*", role, *([account, f"arn:{role.split(':')[1]}:iam::{account}:root"] if deny else [])}
    return any(p in mine for p in policy_values(principal.get("AWS")))


def iam_like(value: str, pattern: str) -> bool:
    """IAM's wildcard match: ``*`` any run of characters, ``?`` one; every other character, ``[`` included, itself
    (fnmatch would read ``[...]`` as a class)."""
    return re.fullmatch("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern), value,
                        re.S) is not None  # fmt: skip


def iam_condition(operator: str, values: list[str], present: str | None) -> bool | None:
    """One condition on one single-valued key whose value is ``present`` (None: the request has no such key), as IAM
    evaluates it ("IAM JSON policy elements: Condition operators", IAM User Guide,
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html): the
    string, ARN and Bool operators and their negations, ``NumericEquals``, ``Null``; ``...IfExists`` holds where the
    key is absent, as a negated operator does. True, False, or None: an operator not read here (the rehearsal's Auto
    Scaling rule takes that as not holding, ``srifty check`` as unknown)."""
    every = operator.startswith("ForAllValues:")  # over no values at all (an absent key), it holds
    op = operator.split(":", 1)[-1]  # ForAnyValue:/ForAllValues: on a single-valued key: the plain operator
    if op == "Null":
        return any((present is None) == (v.lower() == "true") for v in values)
    if_exists = op.endswith("IfExists")
    op = op.removesuffix("IfExists")
    if op not in _STRING_OPS | _NEGATED_OPS | {"NumericEquals"}:
        return None
    if present is None:  # the key is absent: IfExists, ForAllValues and the negated operators hold, the rest do not
        return if_exists or every or op in _NEGATED_OPS
    if op == "NumericEquals":
        try:
            return any(float(present) == float(v) for v in values)
        except ValueError:
            return False
    fold = op.endswith("IgnoreCase") or op == "Bool"
    like = op.endswith("Like") or op.startswith("Arn")  # ARN operators take wildcards as StringLike does
    seen = present.lower() if fold else present

    def matches(pattern: str) -> bool:
        pattern = pattern.lower() if fold else pattern
        return iam_like(seen, pattern) if like else seen == pattern

    hit = any(matches(v) for v in values)
    return not hit if op in _NEGATED_OPS else hit


def _conditions_hold(conditions: dict[str, Any], context: dict[str, str]) -> bool | None:
    """Every condition of a statement holds (True), one does not (False), or one cannot be judged (None): a key
    outside :data:`AUTOSCALING_CALL_KEYS` or an operator not read here."""
    result: bool | None = True
    for operator, keys in conditions.items():
        for key, values in (keys or {}).items():
            name = key.lower()
            if name not in AUTOSCALING_CALL_KEYS:
                result = None
                continue
            holds = iam_condition(operator, policy_values(values), context.get(name))
            if holds is False:
                return False
            if holds is None:
                result = None
    return result


def _statement_applies(
    statement: dict[str, Any], role: str, key_arn: str, action: str, context: dict[str, str]
) -> bool | None:
    """Whether a policy statement applies to the role's call of ``action`` on the key: True, False or None."""
    if "NotPrincipal" in statement or "NotResource" in statement:
        return None  # forms not judged here
    if not _principal_is(statement.get("Principal"), role, deny=statement.get("Effect") == "Deny"):
        return False
    act = action.lower()
    if "Action" in statement:
        if not any(iam_like(act, a.lower()) for a in policy_values(statement["Action"])):
            return False
    elif not policy_values(statement.get("NotAction")) or any(
        iam_like(act, a.lower()) for a in policy_values(statement.get("NotAction"))
    ):
        return False
    if "Resource" in statement and not any(iam_like(key_arn, r) for r in policy_values(statement["Resource"])):
        return False
    return _conditions_hold(statement.get("Condition") or {}, context)


@dataclass(frozen=True)
class KeyUse:
    """A KMS key a launch of the fleet uses: ``key`` (as read: an ARN or id; None: the account's default key for EBS
    encryption, read where it is judged), said as ``f"{what} {whose}, <key>"``; ``needs`` of the Auto Scaling role
    on it and what the launch ``may`` also ask (:data:`RESTORED`...); ``unread``: the snapshot whose key could not
    be read (``key`` None then)."""

    key: str | None
    what: str
    whose: str
    needs: tuple[Need, ...]
    may: tuple[str, ...] = ()
    unread: str | None = None


DEFAULT_KEY_WORDS = "this account's default key for EBS encryption"
LAUNCH_KEY_WORDS = "the key the root gives (checkpoints.kms_key_arn)"


def merge_key_uses(uses: Iterable[KeyUse]) -> list[KeyUse]:
    """One use a key: the first's words, the needs joined (what one use needs, another may not ask as a maybe)."""
    merged: dict[tuple[str | None, str | None], KeyUse] = {}
    for use in uses:
        seen = merged.get((use.key, use.unread))
        if seen is not None:
            needs = tuple(dict.fromkeys((*seen.needs, *use.needs)))
            use = dataclasses.replace(seen, needs=needs, may=tuple(dict.fromkeys((*seen.may, *use.may))))
        merged[(use.key, use.unread)] = use
    return list(merged.values())


def launch_volume_keys(
    launch_key: str | None,
    images: Iterable[dict[str, Any]],
    snapshots: dict[str, dict[str, Any]],
    account: str,
    by_default: bool,
) -> list[KeyUse]:
    """The keys the module's launches use, as EC2 restores an image's volumes ("Use encryption with EBS-backed AMIs"):
    the root volume is given ``Encrypted`` and ``launch_key`` (None: none) by the module, the image's other volumes
    nothing. A snapshot that is not encrypted becomes a volume under the key given, else the account's default (for
    another volume only when encryption by default is on: ``by_default``); an encrypted one this account owns stays
    under its key unless a key is given, when it is re-encrypted to that; an encrypted one shared with this account is
    re-encrypted to the key given, else to the account's default. ``images``: DescribeImages's; ``snapshots``:
    DescribeSnapshots's, by id; a snapshot not in it is read from its image (``Ebs.Encrypted``, the image's owner),
    its key unread. An image without a mapping for its root device gets a new volume there."""
    uses: list[KeyUse] = []
    for image in images:
        mappings = [m for m in image.get("BlockDeviceMappings") or [] if m.get("Ebs") is not None]
        if all(m.get("DeviceName") != image.get("RootDeviceName") for m in mappings):
            mappings.append({"DeviceName": image.get("RootDeviceName"), "Ebs": {"Encrypted": False}})
        for mapping in mappings:
            uses += _mapping_key_uses(image, mapping, launch_key, snapshots, account, by_default)
    return merge_key_uses(uses)


def _mapping_key_uses(
    image: dict[str, Any],
    mapping: dict[str, Any],
    launch_key: str | None,
    snapshots: dict[str, dict[str, Any]],
    account: str,
    by_default: bool,
) -> list[KeyUse]:
    """The keys one of an image's volumes uses (:func:`launch_volume_keys`)."""
    ebs, root = mapping["Ebs"], mapping.get("DeviceName") == image.get("RootDeviceName")
    given = launch_key if root else None
    volume = "the root volumes" if root else f"the {mapping.get('DeviceName')} volumes"
    target = (given, f"{volume} are encrypted with", LAUNCH_KEY_WORDS if given else DEFAULT_KEY_WORDS)
    snapshot = snapshots.get(ebs.get("SnapshotId") or "")
    if snapshot is None and ebs.get("SnapshotId") and ebs.get("Encrypted") is not False:
        snapshot = {"Encrypted": True, "OwnerId": image.get("OwnerId")}  # its key unread
    if not (snapshot or {}).get("Encrypted"):
        if not (root or by_default or ebs.get("Encrypted")):
            return []
        key = given or ebs.get("KmsKeyId")
        whose = LAUNCH_KEY_WORDS if given else "the key the image names" if key else DEFAULT_KEY_WORDS
        return [KeyUse(key, f"{volume} are encrypted with", whose, *NEW_VOLUME)]
    assert snapshot is not None
    source = snapshot.get("KmsKeyId")
    of = f"the key of the image {image.get('ImageId')}'s snapshot {ebs['SnapshotId']}"
    unread = None if source else ebs["SnapshotId"]
    if snapshot.get("OwnerId") != account:
        of += f" (of account {snapshot.get('OwnerId')})"
    elif given is None or given == source:  # this account's own snapshot: restored under its key
        return [KeyUse(source, f"{volume} are encrypted with", of, *RESTORED, unread=unread)]
    return [
        KeyUse(source, f"{volume} are re-encrypted from", of, *RE_ENCRYPTED_FROM, unread=unread),
        KeyUse(*target, *RE_ENCRYPTED_TO),
    ]


def need_operations(needs: Iterable[Need]) -> tuple[str, ...]:
    """Every operation the needs name, once each, in order."""
    return tuple(dict.fromkeys(op for need in needs for op in ((need,) if isinstance(need, str) else need)))


def key_policy_answers(
    policy: str | dict[str, Any],
    role: str,
    account: str,
    region: str,
    key_arn: str,
    needs: Iterable[Need] = VOLUME_KEY_NEEDS,
) -> dict[str, KeyAnswer]:
    """For each operation of ``needs``: whether the key policy lets the role do it (an explicit deny wins)."""
    document = json.loads(policy) if isinstance(policy, str) else policy
    statements = _listed_statements(document.get("Statement"))
    answers: dict[str, KeyAnswer] = {}
    for action in need_operations(needs):
        context = autoscaling_call_context(role, account, region, action)
        allow: set[bool | None] = set()
        deny: set[bool | None] = set()
        for statement in statements:
            applies = _statement_applies(statement, role, key_arn, action, context)
            (deny if statement.get("Effect") == "Deny" else allow).add(applies)
        if True in deny:
            answers[action] = "denied"
        elif None in deny or (True not in allow and None in allow):
            answers[action] = "unknown"
        else:
            answers[action] = "allowed" if True in allow else "missing"
    return answers


def _listed_statements(value: Any) -> list[dict[str, Any]]:
    return [s for s in (value if isinstance(value, list) else [value]) if isinstance(s, dict)]


def granted_operations(
    grants: Iterable[dict[str, Any]], role: str, needs: Iterable[Need] = VOLUME_KEY_NEEDS
) -> dict[str, bool]:
    """The operations of ``needs`` that grants to the role allow: True without constraints, False where only a grant
    held to an encryption context does (not judged here: whether the volume's context meets it)."""
    wanted = need_operations(needs)
    out: dict[str, bool] = {}
    for grant in grants:
        if grant.get("GranteePrincipal") != role:
            continue
        for op in grant.get("Operations", []):
            name = f"kms:{op}"
            if name in wanted:
                out[name] = out.get(name, False) or not grant.get("Constraints")
    return out


@dataclass(frozen=True)
class KeyVerdict:
    """What the key's policy and grants say: ``answer`` over every needed operation, ``lacking`` those not allowed,
    ``how`` what allowed it (``"the key's policy"``, ``"a grant"``, or both)."""

    answer: KeyAnswer
    lacking: tuple[str, ...]
    how: str


def volume_key_verdict(
    answers: dict[str, KeyAnswer] | None, grants: dict[str, bool] | None, needs: Iterable[Need] = VOLUME_KEY_NEEDS
) -> KeyVerdict:
    """The key's verdict from its policy's ``answers`` (None: unread) and the operations ``grants`` give
    (:func:`granted_operations`; None: unread), over ``needs``: an explicit deny in the policy wins over a grant; a
    need none of whose operations either allows is lacking, which is certain only when both were read, the policy's
    answer for each of its operations is certain and no constrained grant gives one; it is denied when the policy
    denies every one of them, and unknown when it denies one and another is allowed."""
    grants_known = grants is not None
    grants = grants or {}
    lacking, unknown, denied, via = [], False, False, set()
    for need in needs:
        ops = (need,) if isinstance(need, str) else need
        said = {op: answers.get(op) if answers is not None else "unknown" for op in ops}
        served = [
            "the key's policy" if said[op] == "allowed" else "a grant"
            for op in ops
            if said[op] == "allowed" or (said[op] != "denied" and grants.get(op))
        ]
        if served and not any(said[op] == "denied" for op in ops):
            via.add(served[0])
            continue
        lacking.append(" or ".join(ops))
        if served:  # one allowed, another denied: which of them EBS calls is not documented
            unknown = True
            continue
        if all(said[op] == "denied" for op in ops):
            denied = True
        else:
            unknown = (
                unknown
                or not grants_known
                or any(said[op] == "unknown" or (op in grants and said[op] != "denied") for op in ops)
            )
    if denied:
        return KeyVerdict("denied", tuple(lacking), "")
    if not lacking:
        return KeyVerdict("allowed", (), " and ".join(sorted(via)))
    return KeyVerdict("unknown" if unknown else "missing", tuple(lacking), "")
