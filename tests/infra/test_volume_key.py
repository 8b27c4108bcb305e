"""The KMS key of a fleet's root volumes, read as AWS decides whether EC2 Auto Scaling may launch with it: "The
predefined permissions also include access to your AWS managed keys. However, they do not include access to your
customer managed keys" (EC2 Auto Scaling User Guide, key-policy-requirements-EBS-encryption). moto launches a group
whatever its key says; these are the key policies AWS documents and their near misses, judged by
lightning_srifty.provision.aws (volume_key_verdict)."""

from __future__ import annotations

import copy
import json

import pytest

from lightning_srifty.provision.aws import NEW_VOLUME, RE_ENCRYPTED_FROM, RE_ENCRYPTED_TO, RESTORED, launch_volume_keys
from lightning_srifty.provision.aws import VOLUME_KEY_NEEDS as NEEDED
from lightning_srifty.provision.aws import autoscaling_role_arn as role_arn
from lightning_srifty.provision.aws import granted_operations as granted
from lightning_srifty.provision.aws import key_policy_answers as policy_answers
from lightning_srifty.provision.aws import volume_key_verdict as verdict

ACCOUNT = "123456789012"
REGION = "us-east-1"
ROLE = role_arn("aws", ACCOUNT)
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ROOT = {"Sid": "Enable IAM User Permissions", "Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}}
ROOT |= {"Action": "kms:*", "Resource": "*"}
# the two statements the AWS page gives ("Example 1: Key policy sections that allow access to the customer managed
# key"), the role named by its ARN
USE = {
    "Sid": "Allow service-linked role use of the customer managed key",
    "Effect": "Allow",
    "Principal": {"AWS": [ROLE]},
    "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"],
    "Resource": "*",
}
ATTACH = {
    "Sid": "Allow attachment of persistent resources",
    "Effect": "Allow",
    "Principal": {"AWS": [ROLE]},
    "Action": ["kms:CreateGrant"],
    "Resource": "*",
    "Condition": {"Bool": {"kms:GrantIsForAWSResource": True}},
}
# the shape of the AWS managed aws/ebs key's own policy: anyone of the account, through EC2
THROUGH_EC2 = {
    "Effect": "Allow",
    "Principal": {"AWS": "*"},
    "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:CreateGrant"],
    "Resource": "*",
    "Condition": {"StringEquals": {"kms:CallerAccount": ACCOUNT, "kms:ViaService": f"ec2.{REGION}.amazonaws.com"}},
}


def _policy(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": [copy.deepcopy(s) for s in statements]}


def _answer(policy: dict, grants: list[dict] | None = ()) -> str:
    answers = policy_answers(policy, ROLE, ACCOUNT, REGION, KEY)
    return verdict(answers, None if grants is None else granted(grants, ROLE)).answer


def _variant(statement: dict, **changes) -> dict:
    out = copy.deepcopy(statement)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@pytest.mark.parametrize(
    ("statements", "expected"),
    [
        ((ROOT, USE, ATTACH), "allowed"),  # the AWS page's policy
        ((ROOT,), "missing"),  # the default key policy: the account's root delegates to IAM; the role's IAM has no KMS
        ((ROOT, USE), "missing"),  # no CreateGrant: EBS keeps a grant for every volume
        ((ROOT, ATTACH), "missing"),  # CreateGrant alone: no data key
        ((ROOT, THROUGH_EC2), "allowed"),  # aws/ebs's shape: the role calls from the account, through EC2
        ((ROOT, _variant(THROUGH_EC2, Condition={"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}})),
         "missing"),  # through S3 only
        ((ROOT, _variant(THROUGH_EC2, Condition={"StringEquals": {"kms:CallerAccount": "210987654321"}})),
         "missing"),  # another account's callers
        ((ROOT, _variant(THROUGH_EC2, Condition={"StringLike": {"kms:ViaService": "ec2.*.amazonaws.com"}})),
         "allowed"),
        ((ROOT, _variant(THROUGH_EC2, Condition={"StringEquals": {"aws:SourceVpce": "vpce-1a2b3c4d"}})),
         "unknown"),  # a key this module does not judge: never a refusal
        ((ROOT, _variant(THROUGH_EC2, Condition={"DateGreaterThan": {"kms:ViaService": "x"}})), "unknown"),
        ((ROOT, USE, _variant(ATTACH, Condition={"BoolIfExists": {"kms:GrantIsForAWSResource": "true"}})), "allowed"),
        ((ROOT, USE, _variant(ATTACH, Condition={"Bool": {"kms:GrantIsForAWSResource": "false"}})), "missing"),
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": "*", "Action": "kms:Decrypt", "Resource": "*"}),
         "denied"),  # an explicit deny wins over every allow
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": "*", "Action": "kms:*", "Resource": "*",
                              "Condition": {"StringNotEquals": {"kms:CallerAccount": ACCOUNT}}}),
         "allowed"),  # a deny of other accounts does not bind the role
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": "*", "Action": "kms:*", "Resource": "*",
                              "Condition": {"StringNotEquals": {"aws:SourceIp": "10.0.0.0/8"}}}),
         "unknown"),  # a deny that might bind: not told
        ((ROOT, _variant(USE, Principal={"AWS": f"arn:aws:iam::{ACCOUNT}:role/Admin"}), ATTACH), "missing"),
        ((ROOT, _variant(USE, Action=None, NotAction=["kms:ScheduleKeyDeletion"]), ATTACH), "allowed"),
        ((ROOT, _variant(USE, Action=None, NotAction=["kms:Decrypt"]), ATTACH), "missing"),
        ((ROOT, _variant(USE, Resource="arn:aws:kms:us-east-1:123456789012:key/other"), ATTACH), "missing"),
        ((ROOT, {"Effect": "Allow", "NotPrincipal": {"AWS": "arn:aws:iam::1:root"}, "Action": "kms:*",
                 "Resource": "*"}), "unknown"),
        ((ROOT, {"Effect": "Allow", "Principal": "*", "Action": "kms:*", "Resource": "*"}), "allowed"),
        # a deny naming the role's account binds every principal of it (an allow so named only delegates to IAM)
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                              "Action": "kms:Decrypt", "Resource": "*"}), "denied"),
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": {"AWS": ACCOUNT}, "Action": "kms:Decrypt",
                              "Resource": "*"}), "denied"),
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": {"AWS": "arn:aws:iam::210987654321:root"},
                              "Action": "kms:*", "Resource": "*"}), "allowed"),
        ((ROOT, _variant(USE, Resource=None, NotResource="arn:aws:kms:*:*:key/other"), ATTACH), "unknown"),
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": "*", "Action": "kms:*", "NotResource": KEY}), "unknown"),
        # ForAllValues over an absent key holds (IAM: no values, nothing to fail), so this deny binds Decrypt
        ((ROOT, USE, ATTACH, {"Effect": "Deny", "Principal": "*", "Action": "kms:*", "Resource": "*",
                              "Condition": {"ForAllValues:StringEquals": {"kms:GrantIsForAWSResource": "false"}}}),
         "denied"),
        # IAM's wildcards are * and ? only: "[" is itself
        ((ROOT, _variant(USE, Action=["kms:[DE]ecrypt", "kms:GenerateDataKey*"]), ATTACH), "missing"),
        ((ROOT, _variant(USE, Action=["kms:?ecrypt", "kms:GenerateDataKey*"]), ATTACH), "allowed"),
    ],
)  # fmt: skip
def test_a_key_policy_is_read_as_aws_decides_for_the_auto_scaling_role(statements, expected) -> None:
    assert _answer(_policy(*statements)) == expected


def test_a_grant_to_the_role_stands_for_the_policy_and_is_certain_only_when_both_were_read() -> None:
    full = [{"GranteePrincipal": ROLE, "Operations": ["Decrypt", "GenerateDataKeyWithoutPlaintext", "CreateGrant"]}]
    assert _answer(_policy(ROOT), full) == "allowed"
    said = verdict(policy_answers(_policy(ROOT), ROLE, ACCOUNT, REGION, KEY), granted(full, ROLE))
    assert said.how == "a grant"
    # a grant to another principal, or one held to an encryption context, counts for nothing
    other = [{**full[0], "GranteePrincipal": f"arn:aws:iam::{ACCOUNT}:role/Admin"}]
    assert _answer(_policy(ROOT), other) == "missing"
    constrained = [{**full[0], "Constraints": {"EncryptionContextSubset": {"aws:ebs:id": "vol-1"}}}]
    assert _answer(_policy(ROOT), constrained) == "unknown"  # whether the volume's context meets it: not judged
    # half from the policy, half from a grant
    assert _answer(_policy(ROOT, USE), [{"GranteePrincipal": ROLE, "Operations": ["CreateGrant"]}]) == "allowed"
    # an explicit deny in the policy wins over a grant
    deny = {"Effect": "Deny", "Principal": "*", "Action": "kms:CreateGrant", "Resource": "*"}
    assert _answer(_policy(ROOT, deny), full) == "denied"
    # unread grants: a policy that lacks an operation may still be made whole by one; unread policy, full grants
    assert _answer(_policy(ROOT), None) == "unknown"
    assert verdict(None, granted(full, ROLE)).answer == "allowed"
    assert verdict(None, set()).answer == "unknown"
    lacking = verdict(policy_answers(_policy(ROOT, USE), ROLE, ACCOUNT, REGION, KEY), set()).lacking
    assert lacking == ("kms:CreateGrant",)


def test_ec2_in_the_china_regions_is_under_their_own_domain() -> None:
    role = role_arn("aws-cn", ACCOUNT)
    through = _variant(THROUGH_EC2, Condition={"StringEquals": {"kms:ViaService": "ec2.cn-north-1.amazonaws.com.cn"}})
    answers = policy_answers(_policy(ROOT, through), role, ACCOUNT, "cn-north-1", KEY)
    assert set(answers.values()) == {"allowed"}


def test_the_role_is_the_partitions_and_every_needed_operation_is_judged() -> None:
    assert role_arn("aws-cn", "1") == "arn:aws-cn:iam::1:role/aws-service-role/autoscaling.amazonaws.com/" + (
        "AWSServiceRoleForAutoScaling"
    )
    answers = policy_answers(_policy(ROOT, USE, ATTACH), ROLE, ACCOUNT, REGION, KEY)
    assert set(answers) == set(NEEDED) and set(answers.values()) == {"allowed"}
    # a policy as GetKeyPolicy returns it (a JSON string), one statement not in a list
    assert policy_answers(json.dumps({"Statement": ROOT}), ROLE, ACCOUNT, REGION, KEY)["kms:Decrypt"] == "missing"


class _Fake:
    """The few EC2, KMS and STS answers check_volume_key reads, as given."""

    def __init__(self, **answers) -> None:
        self.answers = answers

    def __getattr__(self, name):
        answer = self.answers[name]
        if isinstance(answer, Exception):

            def refuse(**kwargs):
                raise answer

            return refuse
        return answer if callable(answer) else lambda **kwargs: answer

    def get_paginator(self, name):
        answer = self.answers[name]
        return _Fake(paginate=lambda **kwargs: [answer(**kwargs) if callable(answer) else answer])


def _clients(default_key, metadata, aliases=(), policy=None) -> dict:
    identity = {"Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/infra"}
    return {
        "ec2": _Fake(get_ebs_default_kms_key_id={"KmsKeyId": default_key}),
        "kms": _Fake(
            describe_key={"KeyMetadata": metadata},
            list_aliases={"Aliases": [{"AliasName": a} for a in aliases]},
            get_key_policy={"Policy": json.dumps(policy)} if policy else RuntimeError("AccessDeniedException"),
            list_grants={"Grants": []},
        ),
        "sts": _Fake(get_caller_identity=identity),
    }


def test_only_the_aws_managed_key_for_ebs_passes_unread_and_a_key_ebs_cannot_use_fails() -> None:
    from lightning_srifty.provision.preflight import check_volume_key

    ebs = {"Arn": KEY, "KeyId": "k", "KeyManager": "AWS", "KeyState": "Enabled", "KeySpec": "SYMMETRIC_DEFAULT"}
    (said,) = check_volume_key(_clients(None, ebs), REGION, "asg", None)  # no KmsKeyId: EBS's own default
    assert said.status == "ok" and "aws/ebs" in said.message
    (said,) = check_volume_key(_clients(KEY, ebs, aliases=["alias/aws/ebs"]), REGION, "asg", None)
    assert said.status == "ok" and "aws/ebs" in said.message
    # another AWS managed key (aws/s3's, given as checkpoints.kms_key_arn): its policy decides, and it is S3's alone
    through_s3 = _variant(THROUGH_EC2, Condition={"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}})
    s3_key = _clients(KEY, ebs, aliases=["alias/aws/s3"], policy=_policy(ROOT, through_s3))
    (said,) = check_volume_key(s3_key, REGION, "asg", KEY)
    assert said.status == "fail" and "every launch would fail" in said.message
    # a policy that cannot be read and no grant: not told, never refused
    mine = {**ebs, "KeyManager": "CUSTOMER"}
    (said,) = check_volume_key(_clients(KEY, mine), REGION, "asg", None)
    assert said.status == "warn" and "could not be told" in said.message
    for field, value, words in (("KeyState", "PendingDeletion", "which is PendingDeletion"),
                                ("KeySpec", "RSA_2048", "EBS takes symmetric keys only")):  # fmt: skip
        (said,) = check_volume_key(_clients(KEY, {**mine, field: value}), REGION, "asg", None)
        assert said.status == "fail" and words in said.message
    # what cannot be read is a warning, never an exception
    broken = _clients(KEY, mine)
    broken["ec2"] = _Fake(get_ebs_default_kms_key_id=RuntimeError("UnauthorizedOperation"))
    (said,) = check_volume_key(broken, REGION, "asg", None)
    assert said.status == "warn" and "could not be read" in said.message
    assert check_volume_key(broken, REGION, "fleet", None) == []


def test_an_error_page_for_an_answer_is_said_in_one_line() -> None:
    """moto's server answers a call it does not implement (GetEbsDefaultKmsKeyId) with an HTML page, which botocore
    cannot parse: its text, the page itself, is not a reason a user can read."""
    from botocore.parsers import ResponseParserError

    from lightning_srifty.provision.aws import why

    page = ResponseParserError("Unable to parse response (syntax error): invalid XML received:\nb'<!doctype html>\n"
                               "<html lang=en>\n<title>500 Internal Server Error</title>'")  # fmt: skip
    assert why(page) == "the endpoint answered with an error page, not AWS's answer (an emulator without the call?)"
    assert why(ResponseParserError("Unable to parse response: truncated")).startswith("ResponseParserError: ")


# --- the keys a launch uses: EC2's rules for an image's volumes ("Use encryption with EBS-backed AMIs", Amazon EC2
# User Guide, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/AMIEncryption.html, "Instance-launching scenarios")

OTHER = "210987654321"  # an account that shares its image
K0 = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/the-snapshots-key"
SHARED_KEY = f"arn:aws:kms:{REGION}:{OTHER}:key/their-key"
FROM, TO = RE_ENCRYPTED_FROM, RE_ENCRYPTED_TO


def _image(*mappings: dict, root: str = "/dev/xvda", owner: str = ACCOUNT) -> dict:
    return {"ImageId": "ami-0abc", "OwnerId": owner, "RootDeviceName": root, "BlockDeviceMappings": list(mappings)}


def _volume(device: str = "/dev/xvda", snapshot: str | None = "snap-root", encrypted: bool | None = None) -> dict:
    ebs = {"SnapshotId": snapshot} if snapshot else {}
    return {"DeviceName": device, "Ebs": ebs if encrypted is None else {**ebs, "Encrypted": encrypted}}


def _snapshot(key: str | None, owner: str = ACCOUNT, sid: str = "snap-root") -> dict:
    kms = {"KmsKeyId": key} if key else {}
    return {sid: {"SnapshotId": sid, "Encrypted": key is not None, "OwnerId": owner, **kms}}


@pytest.mark.parametrize(
    ("given", "image", "snapshots", "by_default", "expected"),
    [
        # an unencrypted snapshot: the key given, else the account's default; a new data key under it
        (None, _image(_volume(encrypted=False)), {}, False, [(None, NEW_VOLUME, None)]),
        (KEY, _image(_volume(encrypted=False)), {}, False, [(KEY, NEW_VOLUME, None)]),
        # an encrypted snapshot this account owns: "restored to a volume that is encrypted to the same CMK"
        (None, _image(_volume()), _snapshot(K0), False, [(K0, RESTORED, None)]),
        (K0, _image(_volume()), _snapshot(K0), False, [(K0, RESTORED, None)]),
        # ... unless another key is given: "encrypted not to the original CMK, but instead to the specified CMK"
        (KEY, _image(_volume()), _snapshot(K0), False, [(K0, FROM, None), (KEY, TO, None)]),
        # shared with this account: "encrypted by your AWS account's default CMK", or the key given
        (None, _image(_volume()), _snapshot(SHARED_KEY, OTHER), False, [(SHARED_KEY, FROM, None), (None, TO, None)]),
        (KEY, _image(_volume()), _snapshot(SHARED_KEY, OTHER), False, [(SHARED_KEY, FROM, None), (KEY, TO, None)]),
        (SHARED_KEY, _image(_volume()), _snapshot(SHARED_KEY, OTHER), False, [(SHARED_KEY, (FROM[0] + TO[0],
         tuple(dict.fromkeys(FROM[1] + TO[1]))), None)]),
        # the image's other volumes get nothing from the module: unencrypted stays so, unless encryption by default
        (None, _image(_volume(encrypted=False), _volume("/dev/sdb", "snap-data", False)), {}, False,
         [(None, NEW_VOLUME, None)]),
        (KEY, _image(_volume(encrypted=False), _volume("/dev/sdb", "snap-data", False)), {}, True,
         [(KEY, NEW_VOLUME, None), (None, NEW_VOLUME, None)]),
        (KEY, _image(_volume(encrypted=False), _volume("/dev/sdb", "snap-data")), _snapshot(K0, sid="snap-data"),
         False, [(KEY, NEW_VOLUME, None), (K0, RESTORED, None)]),
        # a blank volume the image marks encrypted: the account's default
        (KEY, _image(_volume(encrypted=False), _volume("/dev/sdb", None, True)), {}, False,
         [(KEY, NEW_VOLUME, None), (None, NEW_VOLUME, None)]),
        # one key, two uses: its needs joined
        (None, _image(_volume(encrypted=False), _volume("/dev/sdb", "snap-data")),
         _snapshot(SHARED_KEY, OTHER, "snap-data"), False,
         [(None, (NEW_VOLUME[0], TO[1]), None), (SHARED_KEY, FROM, None)]),
        # an encrypted snapshot not read (a shared image's, as a rule): from its image, its key unread
        (KEY, _image(_volume(encrypted=True), owner=OTHER), {}, False, [(None, FROM, "snap-root"), (KEY, TO, None)]),
        (None, _image(_volume(encrypted=True), owner=OTHER), {}, False, [(None, FROM, "snap-root"), (None, TO, None)]),
        (None, _image(_volume()), {}, False, [(None, RESTORED, "snap-root")]),
        (KEY, _image(_volume()), {}, False, [(None, FROM, "snap-root"), (KEY, TO, None)]),
        # an instance store volume has no key; an image with no mapping for its root device gets a new volume there
        (None, _image(_volume(encrypted=False), {"DeviceName": "/dev/sdc", "VirtualName": "ephemeral0"}), {}, True,
         [(None, NEW_VOLUME, None)]),
        (KEY, _image(_volume("/dev/sdb", encrypted=False)), {}, False, [(KEY, NEW_VOLUME, None)]),
    ],
)  # fmt: skip
def test_the_keys_a_launch_uses_are_those_ec2_restores_the_images_volumes_under(
    given, image, snapshots, by_default, expected
) -> None:
    uses = launch_volume_keys(given, [image], snapshots, ACCOUNT, by_default)
    assert [(u.key, (u.needs, u.may), u.unread) for u in uses] == expected
    shared = image["OwnerId"] == OTHER or any(v["OwnerId"] == OTHER for v in snapshots.values())
    for use in uses:
        kind = "re-encrypted from" if use.needs[0] == FROM[0][0] else "encrypted with"
        assert use.what.endswith(f"volumes are {kind}")
        if use.key in (K0, SHARED_KEY) or use.unread:
            assert "the image ami-0abc's snapshot snap-" in use.whose
            assert use.whose.endswith(f"(of account {OTHER})") == shared


def test_the_key_a_launch_re_encrypts_from_is_read_by_decrypt_or_by_reencrypt() -> None:
    reencrypt = _variant(USE, Action=["kms:ReEncrypt*"])
    ops = (*FROM[0], *FROM[1])
    for statements, expected in (
        ((ROOT, USE), "allowed"),  # Decrypt
        ((ROOT, reencrypt), "allowed"),  # ReEncryptFrom
        ((ROOT,), "missing"),
        ((ROOT, _variant(USE, Action=["kms:GenerateDataKey*"])), "missing"),
        # one allowed and the other denied: which of them EBS calls is not documented
        ((ROOT, reencrypt, {"Effect": "Deny", "Principal": "*", "Action": "kms:Decrypt", "Resource": "*"}), "unknown"),
        ((ROOT, USE, {"Effect": "Deny", "Principal": "*", "Action": ["kms:Decrypt", "kms:ReEncrypt*"],
                      "Resource": "*"}), "denied"),
    ):  # fmt: skip
        said = verdict(policy_answers(_policy(*statements), ROLE, ACCOUNT, REGION, K0, ops), {}, FROM[0])
        assert said.answer == expected, statements
        assert said.lacking in ((), ("kms:Decrypt or kms:ReEncryptFrom",))
    # a grant of either serves
    grant = [{"GranteePrincipal": ROLE, "Operations": ["ReEncryptFrom"]}]
    assert verdict(None, granted(grant, ROLE, ops), FROM[0]).answer == "allowed"
    # a denied operation stays denied whatever constrained grant gives it
    deny = {"Effect": "Deny", "Principal": "*", "Action": ["kms:Decrypt", "kms:ReEncrypt*"], "Resource": "*"}
    constrained = [{**grant[0], "Constraints": {"EncryptionContextSubset": {"aws:ebs:id": "snap-1"}}}]
    answers = policy_answers(_policy(ROOT, USE, deny), ROLE, ACCOUNT, REGION, K0, ops)
    assert verdict(answers, granted(constrained, ROLE, ops), FROM[0]).answer == "denied"
    # the attachment of a restored volume asks no new data key of its key (documented), though it may
    decrypt_only = _policy(ROOT, _variant(USE, Action=["kms:Decrypt"]), ATTACH)
    answers = policy_answers(decrypt_only, ROLE, ACCOUNT, REGION, K0, (*RESTORED[0], *RESTORED[1]))
    assert (
        verdict(answers, {}, RESTORED[0]).answer == "allowed" and verdict(answers, {}, RESTORED[1]).answer == "missing"
    )
    assert verdict(policy_answers(decrypt_only, ROLE, ACCOUNT, REGION, K0), {}).answer == "missing"


def _image_clients(image: dict, snapshots: dict | Exception, policies=None, grants=None, by_default=False) -> dict:
    """check_volume_key's clients for a fleet booting ``image``: the account's default key is aws/ebs; each key's
    policy (unlisted: unreadable, as another account's is) and grants by its ARN."""
    policies, grants = policies or {}, grants or {}

    def describe(KeyId: str, **kwargs) -> dict:
        return {"KeyMetadata": {"Arn": KeyId, "KeyId": KeyId.rsplit("/", 1)[-1], "KeyManager": "CUSTOMER",
                                "KeyState": "Enabled", "KeySpec": "SYMMETRIC_DEFAULT"}}  # fmt: skip

    def policy(KeyId: str, **kwargs) -> dict:
        if KeyId not in policies:
            raise RuntimeError("AccessDeniedException")
        return {"Policy": json.dumps(policies[KeyId])}

    def listed(SnapshotIds: list[str], **kwargs) -> dict:
        if isinstance(snapshots, Exception):
            raise snapshots
        return {"Snapshots": [snapshots[s] for s in SnapshotIds if s in snapshots]}

    out = _clients("alias/aws/ebs", {})
    out["kms"].answers.update(describe_key=describe, get_key_policy=policy,
                              list_grants=lambda KeyId, **kw: {"Grants": grants.get(KeyId, [])})  # fmt: skip
    out["ec2"].answers.update(describe_images={"Images": [image]}, describe_snapshots=listed,
                              get_ebs_encryption_by_default={"EbsEncryptionByDefault": by_default})  # fmt: skip
    out["ssm"] = _Fake(get_parameter={"Parameter": {"Value": image["ImageId"]}})
    return out


def _check(clients: dict, key: str | None = None, ami: dict | None = None) -> list:
    from lightning_srifty.provision.preflight import check_volume_key

    return check_volume_key(clients, REGION, "asg", key, None, {"id": "ami-0abc"} if ami is None else ami, ["x86_64"])


def test_a_custom_images_encrypted_snapshot_is_judged_by_its_own_key() -> None:
    image, page = _image(_volume()), _policy(ROOT, USE, ATTACH)
    # the image's own key, which the role may not use: before, the check judged the account's default (aws/ebs: ok)
    (said,) = _check(_image_clients(image, _snapshot(K0), {K0: _policy(ROOT)}))
    assert said.status == "fail"
    assert said.message.startswith(f"the root volumes are encrypted with the key of the image ami-0abc's snapshot "
                                   f"snap-root, {K0}, and neither its policy nor a grant allows")  # fmt: skip
    assert said.message.endswith("kms:CreateGrant, kms:Decrypt: every launch would fail")
    assert f"--key-id {K0}" in said.fix
    assert [f.status for f in _check(_image_clients(image, _snapshot(K0), {K0: page}))] == ["ok"]
    # documented needs met, the page's other operations not: a warning, never a pass
    (said,) = _check(_image_clients(image, _snapshot(K0), {K0: _policy(ROOT, _variant(USE, Action=["kms:Decrypt"]),
                                                                       ATTACH)}))  # fmt: skip
    assert said.status == "warn" and "but not kms:GenerateDataKeyWithoutPlaintext" in said.message
    # the root's own key given: re-encrypted from the image's key to it, each judged for its part
    found = _check(_image_clients(image, _snapshot(K0), {K0: page, KEY: _policy(ROOT)}), KEY)
    assert [(f.status, f.message.split(",")[0]) for f in found] == [
        ("ok", "the root volumes are re-encrypted from the key of the image ami-0abc's snapshot snap-root"),
        ("fail", "the root volumes are encrypted with the key the root gives (checkpoints.kms_key_arn)"),
    ]
    # the image from the architecture's SSM parameter, as without --ami
    (said,) = _check(_image_clients(image, _snapshot(K0), {K0: _policy(ROOT)}), ami={})
    assert said.status == "fail" and "ami-0abc" in said.message


def test_a_shared_images_snapshot_is_read_from_its_image_and_its_key_is_never_taken_for_allowed() -> None:
    shared = _image(_volume(encrypted=True), owner=OTHER)
    # its snapshot cannot be described from here (AWS shares an image without its snapshots): its key unread, warned,
    # and the volumes it is re-encrypted to judged: the account's default (aws/ebs) or the key given
    found = _check(_image_clients(shared, {}))
    assert [(f.status, f.message.split(",")[0]) for f in found] == [
        ("warn", f"the root volumes are re-encrypted from the key of the image ami-0abc's snapshot snap-root (of "
                 f"account {OTHER})"),
        ("ok", "the root volumes are encrypted with the AWS managed key aws/ebs: Auto Scaling needs no grant"),
    ]  # fmt: skip
    assert "whose key could not be read here (not listed)" in found[0].message
    assert "aws ec2 describe-snapshots --snapshot-ids snap-root" in found[0].fix
    found = _check(_image_clients(shared, RuntimeError("InvalidSnapshot.NotFound"), {KEY: _policy(ROOT)}), KEY)
    assert [f.status for f in found] == ["warn", "fail"] and "(RuntimeError: InvalidSnapshot.NotFound)" in (
        found[0].message
    )
    # described (shared with its snapshot): its key's policy is the other account's, unread; a grant to the role tells
    grant = {"GranteePrincipal": ROLE, "Operations": ["Decrypt", "ReEncryptFrom", "CreateGrant"]}
    found = _check(_image_clients(shared, _snapshot(SHARED_KEY, OTHER), grants={SHARED_KEY: [grant]}))
    assert [f.status for f in found] == ["ok", "ok"] and SHARED_KEY in found[0].message
    (said, _) = _check(_image_clients(shared, _snapshot(SHARED_KEY, OTHER)))
    assert said.status == "warn" and SHARED_KEY in said.message and "aws kms create-grant" in said.fix


def test_what_cannot_be_read_of_an_image_is_a_warning_and_the_root_still_judged() -> None:
    image = _image(_volume())
    # an image that cannot be read: the root volumes judged as before (from an unencrypted snapshot), and said
    broken = _image_clients(image, {})
    broken["ec2"].answers["describe_images"] = RuntimeError("InvalidAMIID.NotFound")
    found = _check(broken)
    assert [f.status for f in found] == ["warn", "ok"] and "the image could not be read" in found[0].message
    # encryption by default, unread, for an image with a second volume
    two = _image(_volume(encrypted=False), _volume("/dev/sdb", "snap-data", False))
    unread = _image_clients(two, {})
    unread["ec2"].answers["get_ebs_encryption_by_default"] = RuntimeError("UnauthorizedOperation")
    found = _check(unread)
    assert [f.status for f in found] == ["warn", "ok"] and "encryption by default" in found[0].message
    # the account's default key the same as the key given: one finding
    same = _image_clients(_image(_volume(encrypted=False), _volume("/dev/sdb", "snap-data", False)), {},
                          {KEY: _policy(ROOT, USE, ATTACH)}, by_default=True)  # fmt: skip
    same["ec2"].answers["get_ebs_default_kms_key_id"] = {"KmsKeyId": KEY}
    assert [f.status for f in _check(same, KEY)] == ["ok"]
