"""Infrastructure details (issue #14): srifty terraform deletes only what it wrote; SSH CIDR rules the AWS provider
accepts and that cannot add up to the internet; no SSM permission unless asked; secrets by name, read at boot; tags
AWS accepts."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _fleet import FAKE_CURL, FAKE_TORCHRUN, example, read, render, run_user_data, template_values
from _support import bench_module
from conftest import tf_run
from lightning_srifty.cli import main
from lightning_srifty.provision.terraform.command import check_secret_env
from lightning_srifty.provision.terraform.generate import (
    MARKER,
    NAME_MAX,
    NAME_MAX_OWN_BUCKET,
    TFVARS,
    default_name,
    generate,
    sanitize_tags,
    ssh_cidr_blocks,
    tfvars,
)
from predictor.exceptions import ConfigError, ProvisionError

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "terraform" / "modules" / "training_fleet"

# ---------------------------------------------------------------------------------------------------------------------
# 10. srifty terraform deletes only what it wrote
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("evil", ["../victim.txt", "ABSOLUTE", "link/victim.txt", "modules/../../victim.txt"])
def test_a_crafted_manifest_deletes_nothing_outside_the_folder(tmp_path, catalog, evil) -> None:
    plan, choice, options = example("single-node-on-demand")
    out = tmp_path / "infra"
    generate(plan, out, choice=choice, options=options, catalog=catalog)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "link").symlink_to(tmp_path, target_is_directory=True)
    evil = str(victim) if evil == "ABSOLUTE" else evil
    marker = json.loads((out / MARKER).read_text())
    marker["files"] = [*marker["files"], evil]
    (out / MARKER).write_text(json.dumps(marker))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ProvisionError, match="not inside") as info:
        generate(plan, out, choice=choice, options=dataclasses.replace(options, root_volume_gb=300), catalog=catalog)
    assert repr(evil) in str(info.value) and "nothing was deleted" in str(info.value)
    assert victim.read_text() == "keep me"
    assert before == {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}  # nothing written either


def test_a_manifest_that_is_not_a_list_of_paths_is_refused(tmp_path, catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    out = tmp_path / "infra"
    generate(plan, out, choice=choice, options=options, catalog=catalog)
    (out / MARKER).write_text(json.dumps({"files": "../victim.txt"}))
    with pytest.raises(ProvisionError, match="list of relative paths"):
        generate(plan, out, choice=choice, options=options, catalog=catalog)


def test_stale_files_inside_the_folder_are_still_removed(tmp_path, catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    out = tmp_path / "infra"
    generate(plan, out, choice=choice, options=options, catalog=catalog)
    (out / "modules" / "training_fleet" / "old.tf").write_text("# gone next time\n")
    marker = json.loads((out / MARKER).read_text())
    (out / MARKER).write_text(json.dumps({**marker, "files": [*marker["files"], "modules/training_fleet/old.tf"]}))
    assert generate(plan, out, choice=choice, options=options, catalog=catalog).changed
    assert not (out / "modules" / "training_fleet" / "old.tf").exists()


# ---------------------------------------------------------------------------------------------------------------------
# 11. SSH: a description the AWS provider accepts; CIDRs parsed strictly, their union bounded
# ---------------------------------------------------------------------------------------------------------------------

EC2_DESCRIPTION = re.compile(r"^[a-zA-Z0-9. _\-:/()#,@\[\]+=&;{}!$*]*$")


def test_every_security_group_description_is_one_ec2_accepts() -> None:
    text = (MODULE / "main.tf").read_text()
    descriptions = re.findall(r'^\s*description\s*=\s*"(.*)"\s*$', text, re.M)
    assert len(descriptions) >= 5
    bad = [d for d in descriptions if not EC2_DESCRIPTION.match(re.sub(r"\$\{[^}]*\}", "x", d))]
    assert not bad, bad


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        (["0.0.0.0/0"], "every IPv4 address"),
        (["0.0.0.0/00"], "every IPv4 address"),
        (["0.0.0.0/1", "128.0.0.0/1"], "every IPv4 address"),
        (["10.0.0.0/7"], "more than a /8"),
        (["10.0.0.0/8", "11.0.0.0/8"], "more than a /8"),
        (["203.0.113.7/24"], "no host bits"),
        (["203.0.113.07/32"], "not an IPv4 CIDR"),
        (["203.0.113.7"], "not an IPv4 CIDR"),
        (["2001:db8::/32"], "not an IPv4 CIDR"),
        (["203.0.113.0/33"], "not an IPv4 CIDR"),
    ],
)
def test_wide_or_malformed_ssh_cidrs_are_refused(blocks, message, catalog) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        ssh_cidr_blocks(blocks)
    assert info.value.parameter == "ssh_cidr"
    plan, choice, options = example("single-node-on-demand")
    with pytest.raises(ConfigError, match=message):
        tfvars(plan, choice, dataclasses.replace(options, ssh_cidr=tuple(blocks)), catalog)


def test_ssh_cidrs_are_normalised_and_wide_ones_need_the_flag() -> None:
    assert ssh_cidr_blocks(["203.0.113.7/32", "203.0.113.0/25", "203.0.113.128/25", "198.51.100.1/032"]) == [
        "198.51.100.1/32",
        "203.0.113.0/24",
    ]
    assert ssh_cidr_blocks(["10.0.0.0/8"]) == ["10.0.0.0/8"]  # exactly a /8 is allowed
    assert ssh_cidr_blocks(["0.0.0.0/1"], allow_wide=True) == ["0.0.0.0/1"]
    with pytest.raises(ConfigError, match="every IPv4 address"):
        ssh_cidr_blocks(["0.0.0.0/1", "128.0.0.0/1"], allow_wide=True)


def test_the_module_mirrors_the_ssh_rule(tf_env, tmp_path, catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    root = generate(plan, tmp_path / "root", choice=choice, options=options, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    values = json.loads((root / TFVARS).read_text())
    for blocks, wide, message in (
        (["0.0.0.0/00"], False, "canonical form"),
        (["203.0.113.7/24"], False, "canonical form"),
        (["0.0.0.0/1", "128.0.0.0/1"], False, "more than a /8"),
        (["0.0.0.0/1", "128.0.0.0/1"], True, "more than a /8"),  # never all of IPv4, whatever the flag
        (["0.0.0.0/1"], True, None),
        (["203.0.113.0/24", "198.51.100.7/32"], False, None),
    ):
        (root / TFVARS).write_text(json.dumps({**values, "ssh_cidr_blocks": blocks, "allow_wide_ssh": wide}))
        result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
        stderr = " ".join(result.stderr.split())
        if message is None:
            assert "ssh_cidr_blocks" not in stderr, (blocks, stderr)
        else:
            assert result.returncode != 0 and message in stderr, (blocks, stderr)


# ---------------------------------------------------------------------------------------------------------------------
# 12. SSM Session Manager only when asked, and scoped
# ---------------------------------------------------------------------------------------------------------------------


def test_ssm_session_is_off_by_default_and_scoped_when_on(tmp_path, catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    assert tfvars(plan, choice, options, catalog)["enable_ssm"] is False
    assert tfvars(plan, choice, dataclasses.replace(options, ssm_session=True), catalog)["enable_ssm"] is True
    variables = (MODULE / "variables.tf").read_text()
    block = variables[variables.index('variable "enable_ssm"') :]
    assert re.search(r"default\s*=\s*false", block[: block.index("\n}")])
    root_vars = (ROOT / "terraform" / "root" / "variables.tf").read_text()
    block = root_vars[root_vars.index('variable "enable_ssm"') :]
    assert re.search(r"default\s*=\s*false", block[: block.index("\n}")])
    main_tf = (MODULE / "main.tf").read_text()
    assert "policy_arn" not in main_tf.split('"ssm_session"')[1].split("resource ")[0]
    assert not re.search(r'"arn:[^"]*AmazonSSMManagedInstanceCore"', main_tf)
    # the instance needs no SSM otherwise: the DLAMI id is a plan-time data source, user_data calls no ssm API
    template = (MODULE / "templates" / "user_data.sh.tftpl").read_text()
    outside_secrets = re.sub(r"%\{ for s in secrets ~\}.*?%\{ endfor ~\}", "", template, flags=re.S)
    assert "%{ for s in secrets" in template and not re.search(r"\bssm\b|ssmmessages", outside_secrets)
    assert (
        main(
            [
                "terraform",
                "--plan",
                str(ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"),
                "--out",
                str(tmp_path / "infra"),
                "--name",
                "ssm-run",
                "--ssm-session",
                "--no-code",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "infra" / TFVARS).read_text())["enable_ssm"] is True


# ---------------------------------------------------------------------------------------------------------------------
# 13. Secrets by name: only names/ARNs reach Terraform; user_data reads them at boot
# ---------------------------------------------------------------------------------------------------------------------

SECRET_VALUE = "s3cr3t 'quoted' $HOME `id` \"x\""


def test_secret_env_is_parsed_to_names_only(catalog) -> None:
    assert check_secret_env(["HF_TOKEN=ssm:/team/hf-token", "WANDB_API_KEY=secretsmanager:team/wandb"]) == [
        {"name": "HF_TOKEN", "source": "ssm", "id": "/team/hf-token"},
        {"name": "WANDB_API_KEY", "source": "secretsmanager", "id": "team/wandb"},
    ]
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:team/wandb-AbCdEf"
    assert check_secret_env([f"K=secretsmanager:{arn}"])[0]["id"] == arn
    for bad, why in (
        ("hf_token=ssm:/x", r"\[A-Z_\]"),
        ("PATH=ssm:/x", "used by"),
        ("AWS_SECRET_ACCESS_KEY=ssm:/x", "used by"),
        ("A=ssm:/x$(id)", "not an SSM parameter"),
        ("A=ssm:/x y", "not an SSM parameter"),
        ("A=secretsmanager:x'y", "not a Secrets Manager"),
        ("A=vault:x", "source must be"),
        ("A=hunter2", "source must be"),
        ("A", "source must be"),
    ):
        with pytest.raises(ConfigError, match=why) as info:
            check_secret_env([bad])
        assert info.value.value == bad and info.value.parameter == "secret_env"
    with pytest.raises(ConfigError, match="twice"):
        check_secret_env(["A=ssm:/x", "A=ssm:/y"])
    plan, choice, options = example("single-node-on-demand")
    values = tfvars(plan, choice, dataclasses.replace(options, secret_env=("HF_TOKEN=ssm:/team/hf-token",)), catalog)
    assert values["secrets"] == [{"name": "HF_TOKEN", "source": "ssm", "id": "/team/hf-token"}]


def _moto_image(endpoint: str) -> str:
    """An image moto has (the module looks its root device up: a made-up id fails the plan, as on AWS)."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    return ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


TEAM_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
DATA_KEY = "arn:aws:kms:us-east-1:123456789012:key/5678abcd-12ab-34cd-56ef-1234567890ab"


def test_a_secrets_own_kms_key_is_a_key_arn_given_with_secrets(catalog) -> None:
    """--secret-kms-key: a SecureString parameter or a secret under a key of the team's own (or a secret of another
    account, which always is) cannot be read without kms:Decrypt on that key; before, nothing could grant it and every
    node failed its boot on the read. An alias cannot be granted, and a key without secrets is a mistake."""
    plan, choice, options = example("single-node-on-demand")
    given = dataclasses.replace(options, secret_env=("HF_TOKEN=ssm:/team/hf-token",), secret_kms_keys=(TEAM_KEY,))
    assert tfvars(plan, choice, given, catalog)["secret_kms_key_arns"] == [TEAM_KEY]
    assert "secret_kms_key_arns" not in tfvars(plan, choice, dataclasses.replace(given, secret_kms_keys=()), catalog)
    alias = "arn:aws:kms:us-east-1:123456789012:alias/team"
    with pytest.raises(ConfigError, match="is not a KMS key ARN") as refused:
        tfvars(plan, choice, dataclasses.replace(given, secret_kms_keys=(alias,)), catalog)
    assert refused.value.parameter == "secret_kms_key" and "--secret-kms-key" in refused.value.in_words("cli")
    with pytest.raises(ConfigError, match="give them too") as refused:
        tfvars(plan, choice, dataclasses.replace(given, secret_env=()), catalog)
    assert "--secret-env" in refused.value.in_words("cli")


def test_the_module_refuses_a_checkpoint_key_alias(tf_env, tmp_path, catalog) -> None:
    """The checkpoint key is the resource of the role's kms statement, where "the policy applies to the alias
    resource, not to any KMS key" (https://docs.aws.amazon.com/kms/latest/developerguide/alias-authorization.html):
    with an alias the nodes could neither read their boot script nor write a checkpoint. moto grants anything."""
    plan, choice, options = example("single-node-on-demand")
    root = generate(plan, tmp_path / "root", choice=choice, options=options, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    values = json.loads((root / TFVARS).read_text())
    alias = {**values["checkpoints"], "kms_key_arn": "arn:aws:kms:us-east-1:123456789012:alias/team"}
    (root / TFVARS).write_text(json.dumps({**values, "checkpoints": alias}))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
    said = " ".join(result.stderr.split())
    assert result.returncode != 0 and "checkpoints.kms_key_arn must be a KMS key ARN" in said, said[-2000:]


def test_the_plan_grants_exactly_the_named_secrets_and_holds_no_value(tf_env, moto_endpoint, tmp_path, catalog):
    plan, choice, options = example("single-node-on-demand")
    options = dataclasses.replace(
        options,
        aws_endpoint=moto_endpoint,
        secret_env=("HF_TOKEN=ssm:/team/hf-token", "WANDB_API_KEY=secretsmanager:team/wandb"),
        secret_kms_keys=(TEAM_KEY,),
        data=("TRAIN=s3://team-data/train/",),
        data_kms_keys=(DATA_KEY,),
    )
    root = generate(plan, tmp_path / "root", choice=choice, options=options, catalog=catalog).out
    assert SECRET_VALUE not in (root / TFVARS).read_text()
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    ami = json.loads((root / TFVARS).read_text())
    ami["ami"] = {"id": _moto_image(moto_endpoint)}  # moto has no DLAMI parameter; the module reads the image
    (root / TFVARS).write_text(json.dumps(ami))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-out=tfplan")
    assert result.returncode == 0, result.stderr
    shown = tf_run(tf_env, root, "show", "-json", "tfplan")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert SECRET_VALUE not in text
    policies = [
        r["values"]["policy"]
        for r in json.loads(text)["planned_values"]["root_module"]["child_modules"][0]["resources"]
        if r["type"] == "aws_iam_role_policy" and isinstance(r["values"].get("policy"), str)
    ]
    statements = {s.get("Sid"): s for p in policies for s in json.loads(p)["Statement"]}
    assert statements["ReadNamedParameters"]["Action"] == "ssm:GetParameter"
    assert statements["ReadNamedParameters"]["Resource"] == "arn:aws:ssm:us-east-1:123456789012:parameter/team/hf-token"
    assert statements["ReadNamedSecrets"]["Resource"] == (
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:team/wandb-??????"
    )
    # the team's own key: decrypt through SSM and Secrets Manager only ("any principal that retrieves the decrypted
    # value must have kms:Decrypt permission on that key", Systems Manager User Guide, ps-restrict-decryption.html)
    decrypt = statements["DecryptSecrets"]
    assert decrypt["Action"] == "kms:Decrypt" and decrypt["Resource"] == TEAM_KEY
    assert decrypt["Condition"] == {
        "StringLike": {"kms:ViaService": ["ssm.*.amazonaws.com", "secretsmanager.*.amazonaws.com"]}
    }
    # the data bucket's key, through S3 only: each key is decrypted through its own services, never directly
    assert statements["DecryptData"]["Resource"] == DATA_KEY
    assert statements["DecryptData"]["Condition"] == {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com"}}
    assert not [sid for sid in statements if sid and sid.startswith("SessionManager")]  # off by default
    # --ssm-session: Session Manager's own actions, no GetParameter* on the account's parameters
    # with them: the team's permissions boundary and IAM path (an infra team's SCPs require one on every role), and
    # the checkpoint bucket's own key, decrypted through S3 only as the data keys are
    keyed = {**ami["checkpoints"], "kms_key_arn": DATA_KEY}
    (root / TFVARS).write_text(json.dumps({**ami, "enable_ssm": True, "checkpoints": keyed}))
    boundary = "arn:aws:iam::123456789012:policy/team-boundary"
    (root / "team.auto.tfvars.json").write_text(json.dumps({"iam_permissions_boundary": boundary, "iam_path": "/ml/"}))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-out=tfplan")
    assert result.returncode == 0, result.stderr
    planned = json.loads(tf_run(tf_env, root, "show", "-json", "tfplan").stdout)["planned_values"]["root_module"]
    resources = planned["child_modules"][0]["resources"]
    (role,) = [r["values"] for r in resources if r["type"] == "aws_iam_role"]
    (profile,) = [r["values"] for r in resources if r["type"] == "aws_iam_instance_profile"]
    assert role["permissions_boundary"] == boundary and role["path"] == profile["path"] == "/ml/"
    key = next(
        s
        for r in resources
        if r["type"] == "aws_iam_role_policy" and r["name"] == "instance"
        for s in json.loads(r["values"]["policy"])["Statement"]
        if s.get("Sid") == "CheckpointKey"
    )
    assert key["Resource"] == DATA_KEY and key["Condition"] == {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com"}}
    assert not [r for r in resources if r["type"] == "aws_iam_role_policy_attachment"]
    session = next(
        json.loads(r["values"]["policy"])["Statement"]
        for r in resources
        if r["type"] == "aws_iam_role_policy" and r["name"] == "ssm_session"
    )
    actions = {a for st in session for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    assert actions == {
        "ssm:UpdateInstanceInformation",
        "ssmmessages:CreateControlChannel",
        "ssmmessages:CreateDataChannel",
        "ssmmessages:OpenControlChannel",
        "ssmmessages:OpenDataChannel",
    }
    register = next(st for st in session if st["Sid"] == "SessionManagerRegister")
    assert register["Resource"] == "arn:aws:ec2:us-east-1:123456789012:instance/*"


FAKE_AWS_SECRETS = """#!/bin/bash
case "$1 $2" in
  "ssm get-parameter") [ "$*" = "ssm get-parameter --with-decryption --name /team/hf-token --query Parameter.Value \
--output text --region us-east-1" ] || exit 254; printf '%s\\n' "$SECRET_SSM" ;;
  "secretsmanager get-secret-value") [ "$4" = "team/wandb" ] || exit 254; printf '%s\\n' "$SECRET_SM" ;;
  "ec2 describe-instances") echo 10.0.0.5 ;;
  *) exit 0 ;;
esac
"""


def _user_data_values(secrets: list[dict]) -> dict:
    return template_values(
        name="secrets",
        setup_command='echo "setup sees HF_TOKEN=$(printf %s "$HF_TOKEN" | wc -c) chars"',
        watchdog_grace_s=1,
        secrets=secrets,
    )


def _run_user_data(tmp_path: Path, script: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    recorded = 'k.startswith(kept) or k == "AWS_DEFAULT_REGION"'  # FAKE_TORCHRUN's filter
    assert recorded in FAKE_TORCHRUN
    torchrun = FAKE_TORCHRUN.format(python=sys.executable).replace(recorded, 'k in ("HF_TOKEN", "WB")')
    fakes = {"curl": FAKE_CURL, "aws": FAKE_AWS_SECRETS, "torchrun": torchrun, "shutdown": "#!/bin/bash\ntrue\n"}
    return run_user_data(tmp_path, script, fakes, extra_env=extra_env)


def test_user_data_reads_secrets_at_boot_without_writing_them(tf_env, tmp_path) -> None:
    secrets = [
        {"name": "HF_TOKEN", "source": "ssm", "id": "/team/hf-token"},
        {"name": "WB", "source": "secretsmanager", "id": "team/wandb"},
    ]
    script = render(tf_env, tmp_path / "console", _user_data_values(secrets))
    assert SECRET_VALUE not in script and "/team/hf-token" not in script  # the ids travel base64-encoded
    run = _run_user_data(tmp_path, script, {"SECRET_SSM": SECRET_VALUE, "SECRET_SM": "sm-" + SECRET_VALUE})
    log = read(tmp_path / "user-data.log")
    assert run.returncode == 0, log[-3000:]
    record = json.loads((tmp_path / "torchrun.json").read_text())
    assert record["env"] == {"HF_TOKEN": SECRET_VALUE, "WB": "sm-" + SECRET_VALUE}
    assert f"setup sees HF_TOKEN={len(SECRET_VALUE)} chars" in log  # available to the setup command too
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "torchrun.json"]
    assert not [p for p in written if SECRET_VALUE in p.read_text(errors="replace")]  # not on disk, not in a log


def test_user_data_stops_when_a_secret_cannot_be_read(tf_env, tmp_path) -> None:
    secrets = [{"name": "HF_TOKEN", "source": "ssm", "id": "/team/missing"}]
    script = render(tf_env, tmp_path / "console", _user_data_values(secrets))
    run = _run_user_data(tmp_path, script, {"SECRET_SSM": SECRET_VALUE})
    assert run.returncode == 1
    assert "could not read HF_TOKEN from ssm:/team/missing" in read(tmp_path / "user-data.log")
    assert not (tmp_path / "torchrun.json").exists()


# ---------------------------------------------------------------------------------------------------------------------
# 14. Tags AWS accepts
# ---------------------------------------------------------------------------------------------------------------------

TAG = re.compile(r"^[\w .:/=+\-@]*$")


def test_tags_from_the_model_name_and_fleet_spec_follow_aws_rules(catalog) -> None:
    plan, choice, options = example("heterogeneous-mixed")
    for model in ("llama<3>\"x'y", "m" * 300, "aws:evil,{x}", "modèle-β 7B"):
        tags = tfvars(dataclasses.replace(plan, model=model), choice, options, catalog)["tags"]
        for key, value in tags.items():
            assert TAG.match(key) and 1 <= len(key) <= 128 and not key.lower().startswith("aws:"), key
            assert TAG.match(value) and len(value) <= 256, value
    tags = tfvars(dataclasses.replace(plan, model="llama<3>\"x'y"), choice, options, catalog)["tags"]
    assert tags["srifty:model"] == "llama_3__x_y"
    assert tags["srifty:fleet-spec"] == "g6.48xlarge:2 g5.48xlarge:1"
    assert (
        len(tfvars(dataclasses.replace(plan, model="m" * 300), choice, options, catalog)["tags"]["srifty:model"]) == 256
    )
    assert sanitize_tags({"aws:x": "1", "k" * 200: "v", "<>": "ok"}) == {"x": "1", "k" * 128: "v", "__": "ok"}


def test_the_module_refuses_tags_aws_would_refuse(tf_env, tmp_path, catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    root = generate(plan, tmp_path / "root", choice=choice, options=options, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    values = json.loads((root / TFVARS).read_text())
    for tags in ({"srifty:model": "llama<3>"}, {"aws:x": "1"}, {"k": "v" * 257}):
        (root / TFVARS).write_text(json.dumps({**values, "tags": tags}))
        result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
        assert result.returncode != 0 and "AWS's tag rules" in " ".join(result.stderr.split()), result.stderr


def _moto_root(tf_env, endpoint: str, tmp_path: Path, catalog, model: str | None = None, **options: object):
    """srifty terraform's root of the single-node example for moto's server at ``endpoint`` (``model``: the plan's
    model; ``options``: Options changed), initialised, and its values with an image moto has (moto has no DLAMI
    parameter; the module reads the image)."""
    plan, choice, given = example("single-node-on-demand")
    plan = dataclasses.replace(plan, model=model) if model else plan
    given = dataclasses.replace(given, aws_endpoint=endpoint, **options)
    root = generate(plan, tmp_path / "root", choice=choice, options=given, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    values = json.loads((root / TFVARS).read_text())
    values["ami"] = {"id": _moto_image(endpoint)}
    return root, values


def test_the_module_refuses_tags_ec2_would_refuse_on_its_instances(tf_env, moto_endpoint, tmp_path, catalog) -> None:
    """Two of EC2's tag rules that moto does not keep: at most 50 user tags on a resource ("Tag restrictions",
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions), and, where an instance's
    tags are in its metadata, keys of letters, digits and + - = . , _ : @ only ("Non-compliance will result in failed
    launches for new instances", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/work-with-tags-in-IMDS.html).
    The module had the metadata tags on, for nothing it reads, so an infra team's "Cost Center" tag would have failed
    every launch on AWS and none here. They are off unless asked for (metadata_tags), and then such keys are refused
    at plan, by name."""
    root, values = _moto_root(tf_env, moto_endpoint, tmp_path, catalog)
    team = {**values["tags"], "Cost Center": "ml-42", "team/owner": "vision", **{f"team:k{i}": "v" for i in range(10)}}

    def plan_with(**extra: object) -> subprocess.CompletedProcess[str]:
        (root / TFVARS).write_text(json.dumps({**values, **extra}))
        return tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false", "-out=tfplan")

    many = {**values["tags"], **{f"team:k{i}": "v" for i in range(48 - len(values["tags"]))}}
    result = plan_with(tags=many)
    said = " ".join(result.stderr.split())
    assert result.returncode != 0 and "The tags are 48" in said and "at most 47" in said, result.stderr[-2000:]

    result = plan_with(tags=team, metadata_tags=True)
    said = " ".join(result.stderr.split())
    assert result.returncode != 0 and "With metadata_tags" in said, result.stderr[-2000:]
    assert '"Cost Center", "team/owner"' in said and "srifty:" not in said.split("these are:")[1], said

    result = plan_with(tags=team)  # the default: the same tags are fine, the metadata has no tags
    assert result.returncode == 0, result.stderr[-2000:]
    shown = json.loads(tf_run(tf_env, root, "show", "-json", "tfplan").stdout)
    templates = [r for r in shown["resource_changes"] if r["type"] == "aws_launch_template"]
    assert templates, "no launch template planned"
    for template in templates:
        after = template["change"]["after"]
        assert after["metadata_options"][0]["instance_metadata_tags"] == "disabled"
        assert after["metadata_options"][0]["http_tokens"] == "required"
        # what a launch makes carries them: the instance, its volumes and its interfaces (an ENI untagged was out of
        # a team's cost and clean-up reports, a review)
        specs = {spec["resource_type"]: spec["tags"] for spec in after["tag_specifications"]}
        assert set(specs) == {"instance", "volume", "network-interface"}, specs
        assert all(tags["Cost Center"] == "ml-42" and "srifty:fleet" in tags for tags in specs.values()), specs
    # every resource carries the team's tags but the S3 objects, where S3 takes 10 ("You can associate up to 10 tags
    # with an object", https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-tagging.html); moto keeps that
    # one, at apply. The root once set them as the provider's default tags too, which reach every object
    tagged = {r["address"]: r["change"]["after"].get("tags_all") or {} for r in shown["resource_changes"]}
    objects = {a: t for a, t in tagged.items() if ".aws_s3_object." in a}
    assert objects and all(t == {"srifty:fleet": values["name"]} for t in objects.values()), objects
    assert tagged["module.fleet.aws_iam_role.instance"].items() >= team.items()

    result = plan_with(tags={**values["tags"], "CostCenter": "ml-42"}, metadata_tags=True)  # keys it allows
    assert result.returncode == 0, result.stderr[-2000:]
    shown = json.loads(tf_run(tf_env, root, "show", "-json", "tfplan").stdout)
    assert {
        r["change"]["after"]["metadata_options"][0]["instance_metadata_tags"]
        for r in shown["resource_changes"]
        if r["type"] == "aws_launch_template"
    } == {"enabled"}


def test_the_module_refuses_a_secret_or_data_folder_named_as_the_boot_scripts_own(tf_env, tmp_path, catalog) -> None:
    """A secret or data folder is exported in the boot script's shell: one named as a variable the script assigns
    (REGION, DATA_JOBS, ...) would be overwritten by it or change what it does. srifty refuses such names, and the
    module does too for a root written by hand (the secrets' check was missing until the fifty-first session)."""
    plan, choice, options = example("single-node-on-demand")
    root = generate(plan, tmp_path / "root", choice=choice, options=options, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    values = json.loads((root / TFVARS).read_text())
    for extra, said in (
        ({"secrets": [{"name": "REGION", "source": "ssm", "id": "/team/token"}]}, "Every secrets entry needs"),
        ({"data": [{"name": "DATA_JOBS", "uri": "s3://team-data/x/"}]}, "Every data entry needs"),
    ):
        (root / TFVARS).write_text(json.dumps({**values, **extra}))
        result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
        assert result.returncode != 0 and said in " ".join(result.stderr.split()), result.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------------
# 15. Names S3 accepts: the bucket the module creates is "<name>-checkpoints-<12-digit account id>"
# ---------------------------------------------------------------------------------------------------------------------


def test_a_default_name_leaves_room_for_the_bucket_named_after_it(catalog) -> None:
    """S3 takes bucket names of 3 to 63 characters (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
    The default name took 24 characters of the model, 40 in all: every LightningModule class name of 23 characters
    or more ("ImageClassificationModule") gave a root whose plan the AWS provider refused (a 65-character bucket),
    and a choice of 10 or more with such a model a name srifty itself refused."""
    plan, _, options = example("single-node-on-demand")
    plan = dataclasses.replace(plan, model="ImageClassificationModule")
    own = dataclasses.replace(options, name=None, bucket=None)
    for index in range(len(plan.entries)):
        name = tfvars(plan, index, own, catalog)["name"]
        assert name.startswith("srifty-imageclassificationmo") and len(name) <= 38, name
    assert len(default_name(plan, 12, NAME_MAX_OWN_BUCKET)) == 38 and len(default_name(plan, 123, NAME_MAX)) == 40
    # with an existing bucket the name keeps the 40 characters it always had (a fleet's name is its resources')
    given = tfvars(plan, 0, dataclasses.replace(own, bucket="team-checkpoints"), catalog)["name"]
    assert given.startswith("srifty-imageclassificationmodul-0-") and len(given) == 40, given
    with pytest.raises(ConfigError, match=r"39 characters.*64 characters.*at most 38.*existing bucket") as refused:
        tfvars(plan, 0, dataclasses.replace(own, name="a" * 39), catalog)
    assert refused.value.parameter == "name"
    assert tfvars(plan, 0, dataclasses.replace(own, name="a" * 39, bucket="team-checkpoints"), catalog)


def test_the_module_refuses_a_name_its_own_bucket_cannot_carry(tf_env, moto_endpoint, tmp_path, catalog) -> None:
    """srifty's root for a model of a long class name plans (the AWS provider refused it before), and a root written
    by hand with a name of 39 or 40 characters and no bucket of its own is refused in the module's words, not the
    provider's ("expected length of bucket to be in the range (0 - 63)")."""
    root, values = _moto_root(tf_env, moto_endpoint, tmp_path, catalog, model="ImageClassificationModule", name=None)
    (root / TFVARS).write_text(json.dumps(values))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-out=tfplan")
    assert result.returncode == 0, result.stderr[-2000:]
    shown = json.loads(tf_run(tf_env, root, "show", "-json", "tfplan").stdout)
    (bucket,) = [r["change"]["after"]["bucket"] for r in shown["resource_changes"] if r["type"] == "aws_s3_bucket"]
    assert bucket.startswith(values["name"] + "-checkpoints-") and len(bucket) <= 63, bucket
    (root / TFVARS).write_text(json.dumps({**values, "name": "a" * 39}))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
    said = " ".join(result.stderr.split())
    assert result.returncode != 0 and "64 characters, but S3 bucket names are at most 63" in said, said[-2000:]


# ---------------------------------------------------------------------------------------------------------------------
# 16. A role's policies IAM accepts
# ---------------------------------------------------------------------------------------------------------------------


def test_the_module_refuses_an_instance_policy_over_iams_size(tf_env, moto_endpoint, tmp_path, catalog) -> None:
    """IAM allows a role's inline policies 10,240 characters together, white space not counted (IAM and AWS STS
    quotas, https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html); moto takes any size. Each
    data folder adds a listing statement and a resource, so 40 shards given one by one would fail the apply on AWS
    after the network and the bucket were made: refused at plan, with the count and the fix."""
    root, values = _moto_root(tf_env, moto_endpoint, tmp_path, catalog)
    shards = [{"name": f"SHARD_{i}", "uri": f"s3://team-training-data/imagenet/shard-{i:04d}/"} for i in range(40)]
    (root / TFVARS).write_text(json.dumps({**values, "data": shards}))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
    said = " ".join(result.stderr.split())
    assert result.returncode != 0 and "IAM allows a role 10,240 in all" in said, said[-2000:]
    chars = int(re.search(r"come to (\d+) characters", said).group(1))
    assert 10240 < chars < 20000, chars
    print(f"the instance role's inline policies with 40 data folders: {chars} characters")
    (root / TFVARS).write_text(json.dumps({**values, "data": shards[:10]}))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
    assert result.returncode == 0, result.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------------
# 17. Rules moto cannot show: the module under `terraform test` with a mocked provider
# ---------------------------------------------------------------------------------------------------------------------

MOCKED_MODULE_TEST = """
mock_provider "aws" {
  mock_data "aws_ami" {
    defaults = {
      root_device_name      = "/dev/sda1"
      block_device_mappings = [
        { device_name = "/dev/sda1", ebs = { volume_size = "300" }, no_device = "", virtual_name = "" },
      ]
    }
  }
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
}

variables {
  name   = "root-test"
  ami    = { id = "ami-12345678" }
  groups = [{ instance_type = "g5.xlarge", gpus_per_instance = 1, on_demand = 0, spot = 2, weighted_capacity = 100 }]
  train  = { argv = ["train.py"], nnodes = 2 }
}

run "a_root_volume_smaller_than_the_images_snapshot" {
  command         = plan
  variables {
    root_volume_gb = 200
  }
  expect_failures = [aws_launch_template.group]
}

run "a_root_volume_as_large_as_the_snapshot" {
  command = plan
  variables {
    root_volume_gb = 300
  }
}
"""


def test_the_module_refuses_a_root_volume_smaller_than_its_images_snapshot(tf_env, tmp_path) -> None:
    """EC2 takes a volume "equal to or larger than the snapshot size" (EbsBlockDevice, Amazon EC2 API Reference:
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html) and refuses every launch of a
    template whose root volume is smaller than its image's root snapshot; moto takes it, and reports every image's
    root as 15 GiB whatever it was registered with, so the rule is shown with terraform's own test runner: the
    provider mocked, an image whose root snapshot is 300 GiB, root_volume_gb 200 (what --root-volume-gb allows, and
    less than a custom image may need) refused at plan, 300 planned."""
    version = json.loads(subprocess.run(["terraform", "version", "-json"], capture_output=True, text=True).stdout)
    if tuple(int(x) for x in version["terraform_version"].split(".")[:2]) < (1, 7):
        pytest.skip("terraform test's mock_provider needs Terraform 1.7 or newer (the module itself takes 1.5)")
    module = tmp_path / "training_fleet"
    shutil.copytree(MODULE, module)
    (module / "tests").mkdir()
    (module / "tests" / "root_volume.tftest.hcl").write_text(MOCKED_MODULE_TEST)
    assert tf_run(tf_env, module, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    result = tf_run(tf_env, module, "test", "-no-color")
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    assert 'run "a_root_volume_smaller_than_the_images_snapshot"... pass' in said, said[-3000:]
    assert "2 passed, 0 failed" in said, said[-3000:]


# ---------------------------------------------------------------------------------------------------------------------
# The boot script's variables: what the tests and bench/user_data_size.py render it with is what main.tf passes
# ---------------------------------------------------------------------------------------------------------------------


def test_the_boot_scripts_renderings_pass_every_variable_main_tf_passes() -> None:
    """templatefile() fails on a variable the template uses and the map lacks, so a rendering (the tests' fake nodes,
    the user data size bench) that lags main.tf fails or measures a script no node runs: bench/user_data_size.py had
    stopped rendering when `data` came in, and nothing said so."""
    main_tf = (MODULE / "main.tf").read_text()
    call = main_tf.split('templatefile("${path.module}/templates/user_data.sh.tftpl", {', 1)[1].split("\n  }) }", 1)[0]
    passed = set(re.findall(r"^    ([a-z_0-9]+)\s*=", call, flags=re.MULTILINE))
    assert {"name", "data", "secrets", "watchdog_b64"} <= passed, passed
    assert set(template_values()) == passed
    assert set(bench_module("user_data_size").stage2_values()) == passed


FAKE_AWS_HOUSE = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/aws.calls"
case "$1 $2" in
  "s3 cp") case "$3" in s3://*code*) cp "$FAKE_DIR/code.tar.gz" "$4" ;; esac ;;
  "s3 sync") case "$3" in
      s3://*) exit 1 ;;  # no wheelhouse yet: the first node builds it
      *) sleep 40 && touch "$FAKE_DIR/upload.ended" ;;  # the wheels' upload: minutes on a real node
    esac ;;
esac
exit 0
"""
# the environment's install as the code's .srifty/bootstrap.py does it, in a moment: a venv, and a wheelhouse it built
FAKE_BOOTSTRAP = """import os, pathlib, sys
venv = pathlib.Path(sys.argv[1]); (venv / "bin").mkdir(parents=True); (venv / "bin" / "activate").write_text("")
house = pathlib.Path(os.environ["SRIFTY_WHEELHOUSE"]) / "cu126"; house.mkdir(parents=True)
(house / "BUILT_HERE").write_text(""); (house / "MANIFEST.json").write_text("{}")
"""


def test_a_node_whose_setup_fails_stops_its_wheelhouse_upload_on_the_way_out(tf_env, tmp_path) -> None:
    """The first node builds the fleet's wheelhouse and uploads it in the background (the wheels, then the manifest)
    while its setup command runs; a setup that fails ends the node, and the upload still going is stopped with it,
    never left to outlive the script (run_user_data fails a test on any process the script leaves behind) nor to
    land its manifest after the node's last words."""
    import base64
    import hashlib
    import io
    import tarfile

    from _fleet import FAKE_CURL, render, run_user_data, template_values

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        data = FAKE_BOOTSTRAP.encode()
        info = tarfile.TarInfo(".srifty/bootstrap.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "code.tar.gz").write_bytes(archive.getvalue())
    values = template_values(
        name="house",
        # the user's setup fails after the install, once the upload has begun (stop 92's CI: a bare `false` on a
        # loaded machine ended the node before the background upload had made its first call, and "begun" failed)
        setup_command=(
            'for _ in $(seq 200); do grep -q "^s3 sync /.*/wheelhouse/" "$FAKE_DIR/aws.calls" 2>/dev/null && break; '
            "sleep 0.1; done; false"
        ),
        code_sha256=hashlib.sha256(archive.getvalue()).hexdigest(),
        code_uri_b64=base64.b64encode(b"s3://b/code/code.tar.gz").decode(),
    )
    script = render(tf_env, tmp_path / "console", values)
    fakes = {"curl": FAKE_CURL, "aws": FAKE_AWS_HOUSE, "shutdown": "#!/bin/bash\n"}
    run = run_user_data(tmp_path, script, fakes, extra_env={"SRIFTY_HOME": str(tmp_path / "home")})
    log = (tmp_path / "user-data.log").read_text()
    assert run.returncode == 1, log[-3000:]
    calls = (tmp_path / "aws.calls").read_text().splitlines()
    assert [c for c in calls if c.startswith(f"s3 sync {tmp_path / 'home'}") and "/wheelhouse/" in c]  # begun
    assert not [c for c in calls if c.startswith("s3 cp") and "MANIFEST.json" in c]  # the next node ignores it
    assert not (tmp_path / "upload.ended").exists()
    assert "a process it started outlives it" not in log  # nothing held the log past the script's end
