"""The rules of real AWS that moto does not keep, kept by a proxy in front of moto's server (srifty rehearse, and the
tests): every request is passed through unchanged, except

- user data over EC2's limit, refused as EC2 refuses it (moto takes any size): "User data is limited to 16 KB, in raw
  form, before it is base64-encoded" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html), for
  RunInstances and launch templates alike;
- with ``s3_list_prefixes``, S3 as AWS answers a role whose s3:ListBucket carries an s3:prefix condition (the module's
  instance policy), which moto does not evaluate: a listing whose prefix is outside those is refused (403), and a HEAD
  or GET of a missing key is 403, not 404 ("If you don't have the s3:ListBucket permission, Amazon S3 returns an HTTP
  status code 403", https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html; a conditioned ListBucket
  does not grant it for a request without that prefix). With ``s3_principal`` (an access key id) the rule binds only
  the requests that key signed, as a policy binds only its role: terraform's own calls pass;
- IAM's RemoveRoleFromInstanceProfile of a role that is not (or no longer) in the profile is NoSuchEntity (404, as
  the IAM API reference lists it: https://docs.aws.amazon.com/IAM/latest/APIReference/API_RemoveRoleFromInstanceProfile.html),
  which the AWS provider takes as done; moto's server answers 500 (a ValueError), which the SDK retries for minutes:
  on a loaded machine a removal whose answer came late was retried, and the rehearsal's destroy hung 8.5 min;
- EC2's DeleteLaunchTemplate of a template ID that does not exist (or no longer does) is
  InvalidLaunchTemplateId.NotFound ("The specified launch template ID does not exist",
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html), which the AWS provider's delete takes
  as done (hashicorp/terraform-provider-aws, internal/service/ec2: resourceLaunchTemplateDelete); moto answers
  InvalidLaunchTemplateName.NotFoundException, which the provider's delete does not take: a deletion whose answer was
  lost under load was retried, and the destroy stopped on the retry's answer (two CI runs, 2026-12-01);
- an Auto Scaling UpdateAutoScalingGroup that names no launch specification (no MixedInstancesPolicy,
  LaunchTemplate or LaunchConfigurationName) leaves the group's mixed instances policy as it was ("Any properties that
  you don't specify are not changed by this update request",
  https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_UpdateAutoScalingGroup.html); moto's server sets it to
  none. While moto checks no signatures the proxy adds the policy the group was last given through it to the update
  itself (one call: a capacity the update also sets is met with the fleet's types and weights); once it does (IAM
  enforced: the client's signed body cannot change) it puts the policy back with a second UpdateAutoScalingGroup,
  signed with :attr:`AwsRulesProxy.credentials`, before it answers the first (an update that also resizes the group
  is then met by moto without the policy, and a call between the two sees none: the rehearsal's nodes only lower
  the minimum). Every in-place update of the group the AWS provider makes without a change to its policy (a second
  apply after a transient error re-sends what moto does not echo back) and the nodes' watchdog (``--min-size 0``)
  would otherwise leave a mixed fleet without its instance types (CI, 2026-11-30: an apply retried under load lost
  the heterogeneous fleet's policy);
- with ``asg_statements`` (the statements of the policy the ``s3_principal`` key holds), the Auto Scaling calls that
  key signs on a group (``AutoScalingGroupName``: SuspendProcesses, DetachInstances, UpdateAutoScalingGroup...) are
  decided as IAM decides them, on the group's ARN and tags and the request's own values, which moto does not evaluate
  (it finds no value for ``autoscaling:ResourceTag/...`` and denies every such conditioned statement, so the
  module's nodes could never leave their group in a rehearsal): an explicit Deny, or no Allow whose action, resource
  and every condition match, is AccessDenied as AWS words it; an Allow is carried out with the administrator's keys.
  The conditions the module's policy uses are evaluated (StringEquals, StringLike, NumericEquals, Null, on
  ``autoscaling:``/``aws:ResourceTag/<key>`` and ``autoscaling:MinSize``/``MaxSize``/``DesiredCapacity``,
  https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2autoscaling.html, and the
  operators of https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html);
  any other operator or key makes its statement not apply (a deny where AWS might allow: the rehearsal fails loud);
- EC2's GetEbsDefaultKmsKeyId (the key a volume encrypted without one of its own gets), which moto's server does not
  implement (500), is answered as EC2 answers it: ``alias/aws/ebs`` (the AWS managed key, a new account's default,
  "The AWS managed key is used for encryption unless you specify a customer managed key",
  https://docs.aws.amazon.com/autoscaling/ec2/userguide/key-policy-requirements-EBS-encryption.html) until a
  ModifyEbsDefaultKmsKeyId through the proxy sets another (moto checks the key and carries it out), and again after a
  ResetEbsDefaultKmsKeyId: ``srifty check`` reads it to tell whether an Auto Scaling group may launch
  (lightning_srifty.provision.aws.volume_key_verdict);
- calls that carry a ClientToken are idempotent, as on EC2 (a repeated token gets the first call's answer, nothing is
  made twice), which moto's server is not: an SDK retry of a launch, or of a CreateLaunchTemplate, whose answer was
  lost or slow on a loaded machine would otherwise make a second fleet or template outside terraform's state.

For the tests' fault injection it also answers EC2 calls that launch instances (CreateFleet, RunInstances) of the
types in ``refuse`` with the error EC2 gives when it has no capacity, and the first call of each action in ``lose``
with EC2's 500 InternalError although moto carried it out (an answer lost on its way back: the AWS SDK retries).
Point the AWS provider (srifty's aws_endpoint) and the AWS CLI (AWS_ENDPOINT_URL) at it.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import html
import http.client
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Set as AbstractSet
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lightning_srifty.provision.aws import iam_condition, policy_values

LAUNCHES = ("CreateFleet", "RunInstances")
ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code><Message>We currently do not '
    "have sufficient {itype} capacity in the Availability Zone you requested. Our system will be working on "
    "provisioning additional capacity.</Message></Error></Errors><RequestID>srifty-fault-proxy</RequestID></Response>"
)


NO_SUCH_ROLE_IN_PROFILE = (
    '<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type><Code>NoSuchEntity'
    "</Code><Message>The role is not in the instance profile.</Message></Error><RequestId>srifty-fault-proxy"
    "</RequestId></ErrorResponse>"
)
NO_SUCH_TEMPLATE_ID = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InvalidLaunchTemplateId.NotFound</Code>'
    "<Message>The specified launch template, with template ID {id}, does not exist.</Message></Error></Errors>"
    "<RequestID>srifty-fault-proxy</RequestID></Response>"
)
EBS_DEFAULT_KEY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    "<requestId>srifty-fault-proxy</requestId><kmsKeyId>{key}</kmsKeyId></{action}Response>"
)
AWS_EBS_KEY = "alias/aws/ebs"
USER_DATA_LIMIT = 16_384  # bytes of raw user data (before base64), EC2's documented limit (module docstring)
TOO_LONG = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InvalidParameterValue</Code><Message>User '
    "data is limited to 16384 bytes</Message></Error></Errors><RequestID>srifty-fault-proxy</RequestID></Response>"
)


def user_data_sizes(form: dict[str, list[str]]) -> list[int]:
    """The raw size of every user data an EC2 query-API call carries (``UserData``, ``LaunchTemplateData.UserData``)."""
    sizes = []
    for key, values in form.items():
        if key == "UserData" or key.endswith(".UserData"):
            for value in values:
                try:
                    sizes.append(len(base64.b64decode(value, validate=False)))
                except (binascii.Error, ValueError):
                    sizes.append(len(value))
    return sizes


S3_DENIED = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
    "<RequestId>srifty-fault-proxy</RequestId></Error>"
)


#: The query-API fields of an Auto Scaling group's launch specification (UpdateAutoScalingGroup's rule, module
#: docstring); ``MixedInstancesPolicy.`` fields are what the proxy keeps
LAUNCH_SPECIFICATION = ("MixedInstancesPolicy.", "LaunchTemplate.", "LaunchConfigurationName", "InstanceId")
# the actions whose request carries a group's sizes and launch specification: the size condition keys
# (ASG_REQUEST_KEYS) are context of these only, and a node-signed launch specification in them is refused
GROUP_SPEC_ACTIONS = ("CreateAutoScalingGroup", "UpdateAutoScalingGroup")
ASG_POLICY = "MixedInstancesPolicy."


def signed_form(
    url: str, form: dict[str, str], service: str, region: str, keys: tuple[str, str]
) -> urllib.request.Request:
    """A query-API POST of ``form`` to ``url``, signed (SigV4) with ``keys``: moto checks signatures once its IAM
    enforcement is on."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    body = urllib.parse.urlencode(form)
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    )
    SigV4Auth(Credentials(*keys), service, region).add_auth(request)
    return urllib.request.Request(url, body.encode(), headers=dict(request.headers.items()), method="POST")


def signed_region(authorization: str, default: str = "us-east-1") -> str:
    """The region of a SigV4 Authorization header's credential scope (``Credential=KEY/DATE/REGION/SERVICE/...``)."""
    scope = authorization.split("Credential=", 1)[-1].split(",", 1)[0].split("/")
    return scope[2] if len(scope) == 5 else default


ASG_DENIED = (
    '<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type><Code>'
    "AccessDenied</Code><Message>User: {principal} is not authorized to perform: autoscaling:{action} on resource: "
    "{resource} because no identity-based policy allows the autoscaling:{action} action</Message></Error>"
    "<RequestId>srifty-fault-proxy</RequestId></ErrorResponse>"
)
ASG_NS = "{http://autoscaling.amazonaws.com/doc/2011-01-01/}"
#: the request values an Auto Scaling call's condition keys read (autoscaling:MinSize is the request's MinSize)
ASG_RULE_OPERATORS = frozenset({"StringEquals", "StringLike", "NumericEquals", "Null"})  # what the module's policy uses
ASG_REQUEST_KEYS = {"autoscaling:minsize": "MinSize", "autoscaling:maxsize": "MaxSize",
                    "autoscaling:desiredcapacity": "DesiredCapacity"}  # fmt: skip


def condition_holds(
    operator: str, key: str, expected: list[str], tags: dict[str, str], form: dict[str, str], action: str = ""
) -> bool:
    """One condition of an Auto Scaling call's statement, as IAM evaluates it (module docstring: the operators and
    keys the module's policy uses; any other does not hold)."""
    low = key.lower()
    if low.startswith(("autoscaling:resourcetag/", "aws:resourcetag/")):  # a tag key compares without case
        wanted = key.split("/", 1)[1].lower()
        actual = next((v for k, v in tags.items() if k.lower() == wanted), None)
    elif low in ASG_REQUEST_KEYS and action in GROUP_SPEC_ACTIONS:
        actual = form.get(ASG_REQUEST_KEYS[low])  # context of these two actions only
    else:
        return False
    if operator not in ASG_RULE_OPERATORS:
        return False
    return iam_condition(operator, expected, actual) is True


def asg_allowed(
    statements: list[dict[str, Any]], action: str, arn: str, tags: dict[str, str], form: dict[str, str]
) -> str | None:
    """The Sid of the Allow that grants ``autoscaling:<action>`` on the group ``arn`` (its ``tags``, the request's
    ``form``), or None: no Allow applies, or a Deny does (IAM: an explicit deny wins, else an allow, else deny)."""
    allowed = None
    for st in statements:
        if st.get("Effect") == "Deny" and ({"NotAction", "NotResource"} & set(st)):
            return None  # a deny of a form this rule does not model: refused, never a silent allow (a review)
        actions = [a.lower() for a in policy_values(st.get("Action"))]
        if not any(fnmatch.fnmatchcase(f"autoscaling:{action}".lower(), a) for a in actions):
            continue
        if not any(fnmatch.fnmatchcase(arn, r) for r in policy_values(st.get("Resource"))):
            continue
        conditions = st.get("Condition") or {}
        if not all(
            condition_holds(op, key, policy_values(values), tags, form, action)
            for op, keys in conditions.items()
            for key, values in keys.items()
        ):
            continue
        if st.get("Effect") == "Deny":
            return None
        allowed = allowed or st.get("Sid") or "an unnamed statement"
    return allowed


LOST = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InternalError</Code><Message>An internal '
    "error has occurred</Message></Error></Errors><RequestID>srifty-fault-proxy</RequestID></Response>"
)


def _ebs_key_of(data: bytes) -> str | None:
    """The key an EC2 answer about the default key for EBS encryption names (its kmsKeyId), or None."""
    found = re.search(rb"<kmsKeyId>([^<]+)</kmsKeyId>", data, re.I)
    return found.group(1).decode() if found else None


class _Server(ThreadingHTTPServer):
    proxy: AwsRulesProxy


class _Handler(BaseHTTPRequestHandler):
    """One request through :class:`AwsRulesProxy` (its rules in the module docstring)."""

    protocol_version = "HTTP/1.1"
    server: _Server

    @property
    def outer(self) -> AwsRulesProxy:
        return self.server.proxy

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _is_key(self) -> bool:
        """A path-style S3 request for an object (/bucket/key), not a bucket operation."""
        return len(urllib.parse.urlsplit(self.path).path.lstrip("/").split("/", 1)) == 2

    def _s3_rule_binds(self, action: str) -> bool:
        """The conditioned-ListBucket rule applies to this request: an S3 call (no query-API action) signed
        by the principal it binds (every request when none is named)."""
        if self.outer.s3_list_prefixes is None or action:
            return False
        if self.outer.s3_principal is None:
            return True
        return f"Credential={self.outer.s3_principal}/" in self.headers.get("Authorization", "")

    def _open_bucket(self) -> bool:
        """The request is to a bucket whose s3:ListBucket the role holds without a condition (a whole bucket of
        training data): any listing of it, and a missing key's 404, are AWS's answers."""
        bucket = urllib.parse.urlsplit(self.path).path.lstrip("/").split("/", 1)[0]
        return bucket in self.outer.s3_open_buckets

    def _s3_list_refused(self) -> bool:
        """Refuse (and answer) a bucket listing whose prefix the conditioned s3:ListBucket does not grant."""
        parts = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
        if self.command != "GET" or self._is_key() or not parts.path.strip("/"):
            return False
        if not ({"list-type", "prefix", "delimiter"} & set(query)) and query:
            return False  # another bucket sub-resource (?location, ?policy...)
        prefix = (query.get("prefix") or [""])[0]
        if any(prefix.startswith(p) for p in self.outer.s3_list_prefixes or ()) or self._open_bucket():
            return False
        self.outer.s3_refused.append(f"LIST {prefix!r}")
        self._send_error(403, S3_DENIED.encode())
        return True

    def _send_error(self, status: int, data: bytes, body: bool = True) -> None:
        data = data if body else b""
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        # the AWS SDK retries these: each retry on a fresh connection, so that the last attempt's error is
        # the one sent, never a read on a connection the server has meanwhile dropped
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _handle(self) -> None:
        body = self._body()
        form = urllib.parse.parse_qs(body.decode("latin-1")) if b"Action=" in body else {}
        action = (form.get("Action") or [""])[0]
        types = {v for k, vs in form.items() if k.endswith("InstanceType") for v in vs}
        hit = sorted(types & self.outer.refuse)
        too_long = [n for n in user_data_sizes(form) if n > USER_DATA_LIMIT]
        if too_long:  # EC2 refuses it; moto would take it
            self.outer.too_long.append(f"{action}:{too_long[0]}")
            self._send_error(400, TOO_LONG.encode())
            return
        if action in LAUNCHES and hit:
            self.outer.refused.append(f"{action}:{hit[0]}")
            self._send_error(400, ERROR.format(code=self.outer.code, itype=hit[0]).encode())
            return
        if self._s3_rule_binds(action) and self._s3_list_refused():
            return
        if self.outer.asg_rule_binds(action, form, self.headers.get("Authorization", "")):
            self._asg_as_iam(action, body, form)
            return
        if self._ebs_default_key_answered(action):
            return
        token = (form.get("ClientToken") or [""])[0]
        key = (action, token)
        if token and key in self.outer.answered:  # EC2's idempotency: a repeated token gets the first answer
            (self.outer.replayed if action in LAUNCHES else self.outer.replayed_other).append(action)
            self._reply(*self.outer.answered[key])
            return
        conn = http.client.HTTPConnection(
            self.outer.upstream.hostname or "127.0.0.1", self.outer.upstream.port, timeout=120
        )
        body = self.outer.with_group_policy(action, body)  # UpdateAutoScalingGroup's rule, while unsigned
        dropped = ("transfer-encoding",) if self.outer.keep_host else ("transfer-encoding", "host")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
        headers["Content-Length"] = str(len(body))
        if not self.outer.keep_host:
            headers["Host"] = f"{self.outer.upstream.hostname}:{self.outer.upstream.port}"
        conn.request(
            self.command,
            self.path,
            body=body if body or self.command not in ("GET", "HEAD") else None,
            headers=headers,
        )
        answer = conn.getresponse()
        data = answer.read()
        if token and answer.status < 300:  # carried out: a retry gets this answer
            self.outer.answered[key] = (answer.status, answer.getheaders(), data)
        if self._answered_as_aws(action, form, answer.status, data):
            conn.close()
            return
        self.outer.group_called(action, body, answer.status, self.headers.get("Authorization", ""))
        self.outer.ebs_default_set(action, answer.status, data)
        if action in self.outer.lose:  # carried out upstream; the client sees a server error instead
            self.outer.lose.discard(action)
            self.outer.lost.append(action)
            conn.close()
            self._send_error(500, LOST.encode())
            return
        self._reply(answer.status, answer.getheaders(), data)
        conn.close()

    def _ebs_default_key_answered(self, action: str) -> bool:
        """GetEbsDefaultKmsKeyId and ResetEbsDefaultKmsKeyId, which moto does not implement, answered as EC2
        answers them (module docstring); whether it was one of them."""
        if action not in ("GetEbsDefaultKmsKeyId", "ResetEbsDefaultKmsKeyId"):
            return False
        if action.startswith("Reset"):
            self.outer.ebs_default_kms_key = None
        ebs_key = html.escape(self.outer.ebs_default_kms_key or AWS_EBS_KEY)
        self._reply(200, [("Content-Type", "text/xml")], EBS_DEFAULT_KEY.format(action=action, key=ebs_key).encode())
        return True

    def _asg_as_iam(self, action: str, body: bytes, form: dict[str, list[str]]) -> None:
        """An Auto Scaling call of the bound principal on a group, decided as IAM decides it (module docstring)."""
        authorization = self.headers.get("Authorization", "")
        region = signed_region(authorization)
        fields = {k: v[0] for k, v in form.items()}
        name = fields["AutoScalingGroupName"]
        arn, tags = self.outer.group_arn_and_tags(name, region)
        sid = asg_allowed(self.outer.asg_statements or [], action, arn, tags, fields) if arn else None
        if action in GROUP_SPEC_ACTIONS and any(k.startswith(LAUNCH_SPECIFICATION) for k in fields):
            sid = None  # a launch specification needs ec2:RunInstances and iam:PassRole too, which a node never holds
        if sid is None:
            self.outer.asg_decided.append(f"{action} {name}: denied")
            principal = f"arn:aws:iam::123456789012:user/{self.outer.s3_principal}"
            denied = ASG_DENIED.format(principal=principal, action=action, resource=html.escape(arn or name))
            self._send_error(403, denied.encode())
            return
        self.outer.asg_decided.append(f"{action} {name}: allowed by {sid}")
        status, headers, data = self.outer.as_administrator(fields, region)
        self.outer.group_called(action, body, status, authorization)
        self._reply(status, headers, data)

    def _answered_as_aws(self, action: str, form: dict[str, list[str]], status: int, data: bytes) -> bool:
        """Where moto's answer is not AWS's (module docstring), answer as AWS does; whether it did."""
        if self._s3_rule_binds(action) and status == 404 and self._is_key() and not self._open_bucket():
            # a missing key, to a role without an unconditioned s3:ListBucket: 403
            self.outer.s3_refused.append(f"{self.command} {self.path}")
            self._send_error(403, S3_DENIED.encode(), body=self.command != "HEAD")
        elif action == "RemoveRoleFromInstanceProfile" and status == 500:  # the role is not in the profile
            self._send_error(404, NO_SUCH_ROLE_IN_PROFILE.encode())
        elif (
            action == "DeleteLaunchTemplate"
            and b"InvalidLaunchTemplateName.NotFound" in data
            and form.get("LaunchTemplateId")
        ):  # EC2's code for a template ID that does not exist
            self._send_error(400, NO_SUCH_TEMPLATE_ID.format(id=html.escape(form["LaunchTemplateId"][0])).encode())
        else:
            return False
        return True

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(k, v)
        if self.command == "HEAD":  # no body, and the object's own length (s3fs sizes its reads by it)
            length = next((v for k, v in headers if k.lower() == "content-length"), "0")
            self.send_header("Content-Length", length)
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle

    def log_message(self, *args: object) -> None:
        pass


class AwsRulesProxy:
    """``with AwsRulesProxy(moto_url, ...) as url:`` serves on a free port of 127.0.0.1 in a thread (module
    docstring for the rules); what it refused is recorded in ``too_long``, ``s3_refused``, ``refused``, ``lost``."""

    def __init__(
        self,
        upstream: str,
        refuse: AbstractSet[str] = frozenset(),
        code: str = "InsufficientInstanceCapacity",
        lose: AbstractSet[str] = frozenset(),
        s3_list_prefixes: tuple[str, ...] | None = None,
        s3_principal: str | None = None,
        keep_host: bool | None = None,
    ) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.s3_principal = s3_principal  # the access key id the S3 rule binds (None: every request)
        # the client's Host header passes unchanged (it is signed: SigV4, which moto checks under IAM enforcement);
        # else it is rewritten to moto's address. Default: kept when an S3 rule is on
        self.keep_host = s3_list_prefixes is not None if keep_host is None else keep_host
        self.refuse, self.code, self.lose = refuse, code, set(lose)
        self.refused: list[str] = []
        self.too_long: list[str] = []  # calls refused for their user data's size: "Action:bytes"
        self.s3_list_prefixes = s3_list_prefixes
        self.s3_open_buckets: tuple[str, ...] = ()  # buckets whose s3:ListBucket the role holds unconditioned
        self.s3_refused: list[str] = []  # S3 requests answered 403 by the conditioned-ListBucket rule
        self.lost: list[str] = []
        self.answered: dict[tuple[str, str], tuple[int, list[tuple[str, str]], bytes]] = {}  # by ClientToken
        self.replayed: list[str] = []  # launches answered from an earlier call's token
        self.replayed_other: list[str] = []  # other calls so answered (CreateLaunchTemplate retried by the SDK ...)
        # UpdateAutoScalingGroup's rule: each group's mixed instances policy as last given through the proxy (its
        # query-API fields), the groups whose policy was kept, and the keys that sign the call that puts it back
        # once moto checks signatures (LocalAWS's administrator while it enforces IAM; None: moto checks none, and
        # the policy rides the update itself)
        self.group_policies: dict[str, dict[str, str]] = {}
        self.policies_kept: list[str] = []
        self.policy_failures: list[str] = []
        self.credentials: tuple[str, str] | None = None
        # the Auto Scaling rule: the bound principal's policy statements (None: off), and what it decided
        self.asg_statements: list[dict[str, Any]] | None = None
        self.asg_decided: list[str] = []
        self.ebs_default_kms_key: str | None = None  # the account's default key for EBS encryption (None: aws/ebs)
        self._lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.proxy = self

    def ebs_default_set(self, action: str, status: int, data: bytes) -> None:
        """A ModifyEbsDefaultKmsKeyId moto carried out (it checks the key): the account's default from now on."""
        if action == "ModifyEbsDefaultKmsKeyId" and status < 300:
            self.ebs_default_kms_key = _ebs_key_of(data) or self.ebs_default_kms_key

    def _group_policy(self, action: str, fields: dict[str, list[str]]) -> tuple[str, dict[str, str] | None]:
        """The group an update names, and the policy to keep for it: None unless ``action`` is an update that names
        no launch specification of a group given a mixed instances policy through the proxy."""
        name = (fields.get("AutoScalingGroupName") or [""])[0]
        if action != "UpdateAutoScalingGroup" or any(k.startswith(LAUNCH_SPECIFICATION) for k in fields):
            return name, None
        with self._lock:
            return name, self.group_policies.get(name) or None

    def with_group_policy(self, action: str, body: bytes) -> bytes:
        """The body to forward: while moto checks no signatures, an update that names no launch specification
        carries the group's policy as well (UpdateAutoScalingGroup's rule), so moto keeps it in the same call."""
        if self.credentials is not None or action != "UpdateAutoScalingGroup":
            return body
        name, policy = self._group_policy(action, urllib.parse.parse_qs(body.decode("latin-1")))
        if policy is None:
            return body
        self.policies_kept.append(name)
        return body + b"&" + urllib.parse.urlencode(policy).encode("latin-1")

    def group_called(self, action: str, body: bytes, status: int, authorization: str) -> None:
        """After moto answered ``action`` (``status``): for an Auto Scaling group's it carried out, remember the
        policy the call named (blank fields too: the AWS provider sends ``SpotMaxPrice=``), forget a deleted group's,
        and, once moto checks signatures, give an update that named no launch specification the policy back with a
        call of its own (signed for the region of the client's ``authorization``)."""
        if status >= 300 or not action.endswith("AutoScalingGroup"):
            return
        fields = urllib.parse.parse_qs(body.decode("latin-1"), keep_blank_values=True)
        name, policy = self._group_policy(action, fields)
        with self._lock:
            if action == "DeleteAutoScalingGroup":
                self.group_policies.pop(name, None)
            elif any(k.startswith(LAUNCH_SPECIFICATION) for k in fields):
                self.group_policies[name] = {k: v[0] for k, v in fields.items() if k.startswith(ASG_POLICY)}
        if policy is None or self.credentials is None:
            return
        upstream = f"{self.upstream.scheme}://{self.upstream.netloc}/"
        version = (fields.get("Version") or ["2011-01-01"])[0]
        restore = {"Action": action, "Version": version, "AutoScalingGroupName": name, **policy}
        try:
            urllib.request.urlopen(
                signed_form(upstream, restore, "autoscaling", signed_region(authorization), self.credentials),
                timeout=120,
            ).close()
        except OSError as e:  # the client's own call succeeded and is answered; what failed is recorded
            self.policy_failures.append(f"{name}: {e}")
            return
        self.policies_kept.append(name)

    def asg_rule_binds(self, action: str, form: dict[str, list[str]], authorization: str) -> bool:
        """The Auto Scaling rule decides this call: a query-API call on a group, signed by the bound principal, while
        moto checks signatures (the administrator's keys carry out what it allows)."""
        return (
            self.asg_statements is not None
            and self.credentials is not None
            and self.s3_principal is not None
            and bool(form.get("AutoScalingGroupName"))
            and not action.startswith("Describe")
            and f"Credential={self.s3_principal}/" in authorization
        )

    def as_administrator(self, fields: dict[str, str], region: str) -> tuple[int, list[tuple[str, str]], bytes]:
        """The query-API call ``fields`` to moto, signed with the administrator's keys: its status, headers, body."""
        assert self.credentials is not None
        upstream = f"{self.upstream.scheme}://{self.upstream.netloc}/"
        try:
            with urllib.request.urlopen(
                signed_form(upstream, fields, "autoscaling", region, self.credentials), timeout=120
            ) as answer:
                return answer.status, list(answer.getheaders()), answer.read()
        except urllib.error.HTTPError as e:
            return e.code, list(e.headers.items()), e.read()

    def group_arn_and_tags(self, name: str, region: str) -> tuple[str | None, dict[str, str]]:
        """The group's ARN and tags, from moto (None: no such group)."""
        import xml.etree.ElementTree as ET

        query = {"Action": "DescribeAutoScalingGroups", "Version": "2011-01-01", "AutoScalingGroupNames.member.1": name}
        status, _, data = self.as_administrator(query, region)
        if status >= 300:
            return None, {}
        for group in ET.fromstring(data).iter(f"{ASG_NS}member"):
            arn = group.findtext(f"{ASG_NS}AutoScalingGroupARN")
            if arn and group.findtext(f"{ASG_NS}AutoScalingGroupName") == name:
                tags = {
                    t.findtext(f"{ASG_NS}Key") or "": t.findtext(f"{ASG_NS}Value") or ""
                    for t in group.iterfind(f"{ASG_NS}Tags/{ASG_NS}member")
                }
                return arn, tags
        return None, {}

    def __enter__(self) -> str:

        threading.Thread(target=self.server.serve_forever, name="srifty-aws-rules", daemon=True).start()
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
