"""Training data in S3 (``srifty terraform --data`` / ``--data-copy``): the instance role may list and read exactly
those folders and write none of them (moto enforcing the role's policy as terraform plans it, the fault proxy
answering S3 as AWS answers a role whose s3:ListBucket carries an s3:prefix condition); the node's boot script,
byte for byte as the plan uploads it, checks a streamed folder, copies a copied one to its own disk and exports
both before torchrun starts; a folder it cannot read ends the node before it trains, with the fix."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from _fleet import (
    MODULE,
    boot_as_node,
    dlami_parameters,
    enforce_iam,
    node_credentials,
    planned,
    use_test_parameters,
)
from lightning_srifty.provision.rehearsal.aws_rules import AwsRulesProxy
from lightning_srifty.provision.terraform.command import DATA_URI, RESERVED_ENV, check_data, check_kms_keys
from lightning_srifty.provision.terraform.generate import Options, generate, tfvars
from predictor.documents.plan import load_plan
from predictor.exceptions import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = MODULE / "templates"
PLAN = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"


# ---------------------------------------------------------------------------------------------------------------------
# The options, refused with the fix
# ---------------------------------------------------------------------------------------------------------------------


def test_data_folders_become_the_modules_entries() -> None:
    got = check_data(["TRAIN=s3://team-data/imagenet/train/", "ALL=s3://team-data/"], ["SHARDS=s3://b-1/x=2026/"])
    assert got == [
        {"name": "TRAIN", "uri": "s3://team-data/imagenet/train/", "copy": False},
        {"name": "ALL", "uri": "s3://team-data/", "copy": False},
        {"name": "SHARDS", "uri": "s3://b-1/x=2026/", "copy": True},
    ]


@pytest.mark.parametrize(
    ("streamed", "copied", "said"),
    [
        (["train=s3://bkt/x/"], [], "'train' is not [A-Z_][A-Z0-9_]*"),
        (["REGION=s3://bkt/x/"], [], "REGION is used by the instances' boot script"),
        (["LOG=s3://bkt/x/"], [], "LOG is used by the instances' boot script"),
        (["NCCL_X=s3://bkt/x/"], [], "NCCL_X is used"),
        (["RANK=s3://bkt/x/"], [], "RANK is used"),  # torchrun sets it in every worker, over the node's
        (["MASTER_ADDR=s3://bkt/x/"], [], "MASTER_ADDR is used"),
        (["OMP_NUM_THREADS=s3://bkt/x/"], [], "OMP_NUM_THREADS is used"),
        (["HF_TOKEN=s3://bkt/x/"], [], "HF_TOKEN is given twice"),  # a secret's name
        (["D=s3://bkt/x/"], ["D=s3://bkt/y/"], "D is given twice"),
        (["D=s3://bucket/imagenet"], [], "is not a folder: end it with a slash (s3://bucket/imagenet/)"),
        (["D=s3://bucket/image*/"], [], "no * or ?"),
        (["D=s3://Bucket/x/"], [], "is not an S3 folder"),
        (["D=/data/imagenet/"], [], "is not an S3 folder"),
        (["D"], [], "is not an S3 folder"),
    ],
)
def test_a_bad_data_folder_is_refused_with_the_fix(streamed, copied, said) -> None:
    with pytest.raises(ConfigError) as refused:
        check_data(streamed, copied, taken=("HF_TOKEN",))
    assert said in str(refused.value)
    assert "Give NAME=s3://bucket/prefix/" in str(refused.value)
    assert refused.value.parameter in ("data", "data_copy")


def test_a_data_key_is_a_key_arn_and_needs_data() -> None:
    data = check_data(["D=s3://bkt/x/"])
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    assert check_kms_keys([key, key], data) == [key]
    with pytest.raises(ConfigError, match=r"is not a KMS key ARN.*an alias cannot be granted"):
        check_kms_keys(["alias/team-data"], data)
    with pytest.raises(ConfigError, match="give the data folders too"):
        check_kms_keys([key], [])


def test_the_terraform_values_carry_the_data_only_when_given(catalog) -> None:
    plan = load_plan(PLAN)
    plain = tfvars(plan, 0, Options(name="d-run", train_command="python train.py"), catalog)
    assert "data" not in plain and "data_kms_key_arns" not in plain
    options = Options(
        name="d-run",
        train_command="python train.py",
        secret_env=("HF_TOKEN=ssm:/team/hf",),
        data=("TRAIN=s3://team-data/train/",),
        data_copy=("VAL=s3://team-data/val/",),
    )
    values = tfvars(plan, 0, options, catalog)
    assert values["data"] == [
        {"name": "TRAIN", "uri": "s3://team-data/train/", "copy": False},
        {"name": "VAL", "uri": "s3://team-data/val/", "copy": True},
    ]
    assert values["data_kms_key_arns"] == []
    with pytest.raises(ConfigError, match="HF_TOKEN is given twice"):
        tfvars(plan, 0, Options(name="d-run", secret_env=("HF_TOKEN=ssm:/a",), data=("HF_TOKEN=s3://bkt/x/",)), catalog)


def test_the_reserved_names_cover_every_variable_the_boot_scripts_set() -> None:
    """A data folder or a secret exported under a name the boot script assigns would be overwritten by it (or change
    what it does): every such name is reserved, and the module refuses the same names and folders as srifty."""
    text = "".join(p.read_text() for p in TEMPLATES.glob("*.tftpl"))
    assigned = set(re.findall(r"(?:^|[\s;(])([A-Z_][A-Z0-9_]*)=", text, flags=re.M))
    for names in re.findall(r"read -r ([A-Z_ ]+)", text):
        assigned |= set(names.split())
    assigned |= set(re.findall(r"local ([a-z_ ]+)", text))  # none upper-case: locals cannot shadow an export
    assert {"LOG", "REGION", "DATA_HOME", "BORN", "RDZV_HOST"} <= assigned
    reserved = re.compile(RESERVED_ENV)
    assert sorted(n for n in assigned if n.isupper() and not reserved.match(n)) == []
    variables = (MODULE / "variables.tf").read_text()
    assert f'!can(regex("{RESERVED_ENV}", d.name))' in variables
    assert f'!can(regex("{RESERVED_ENV}", s.name))' in variables  # a secret is exported the same way
    assert f'can(regex("{DATA_URI}", d.uri))' in variables


# ---------------------------------------------------------------------------------------------------------------------
# The role and the boot, against moto with the role's policy enforced
# ---------------------------------------------------------------------------------------------------------------------

FAKE_TORCHRUN = """#!{python}
# records the data variables and what the copied folder holds, as the job would see them
import json, os, sys
env = {{k: os.environ.get(k) for k in ("TRAIN_DATA", "SHARDS")}}
top = env["SHARDS"] or "/nonexistent"
files = sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs)
json.dump({{"env": env, "files": files}}, open(os.environ["SRIFTY_HARNESS_RECORD"], "w"))
"""


def _root(tmp_path: Path, moto: str, catalog, data: tuple[str, ...], copy: tuple[str, ...]) -> Path:
    dlami_parameters(moto)
    boto3.client("s3", endpoint_url=moto, region_name="us-east-1").create_bucket(Bucket="d-ckpt")
    options = Options(
        name="d-run",
        aws_endpoint=moto,
        bucket="d-ckpt",
        train_command="python train.py",
        setup_command="true",
        data=data,
        data_copy=copy,
    )
    return use_test_parameters(generate(load_plan(PLAN), tmp_path / "infra", options=options, catalog=catalog).out)


def _boot(script: str, endpoint: str, work: Path, node: dict[str, str]) -> subprocess.CompletedProcess:
    """The boot script (the plan's own text) under bash with the node's credentials, a fake torchrun and shutdown."""
    torchrun = FAKE_TORCHRUN.format(python=sys.executable)
    return boot_as_node(script, endpoint, work, node, torchrun, SRIFTY_DATA_RETRY_S="0")


def _as(moto: str, node: dict[str, str]):
    return boto3.client(
        "s3",
        endpoint_url=moto,
        region_name="us-east-1",
        aws_access_key_id=node["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=node["AWS_SECRET_ACCESS_KEY"],
    )


def test_a_node_reads_its_data_under_the_roles_policy_and_writes_none(tf_env, moto_endpoint, tmp_path, catalog):
    infra = _root(
        tmp_path, moto_endpoint, catalog, ("TRAIN_DATA=s3://team-data/imagenet/train/",), ("SHARDS=s3://shards/",)
    )
    (policy,) = planned(tf_env, infra, "aws_iam_role_policy").values()
    statements = {st["Sid"]: st for st in json.loads(policy["policy"])["Statement"]}
    assert statements["ListData0"]["Resource"] == "arn:aws:s3:::team-data"
    assert statements["ListData0"]["Condition"]["StringLike"]["s3:prefix"] == ["imagenet/train/", "imagenet/train/*"]
    assert statements["ListData1"]["Resource"] == "arn:aws:s3:::shards" and "Condition" not in statements["ListData1"]
    read = ["arn:aws:s3:::shards/*", "arn:aws:s3:::team-data/imagenet/train/*"]
    assert sorted(statements["ReadData"]["Resource"]) == read
    assert statements["ReadData"]["Action"] == "s3:GetObject"
    (script,) = [v["content"] for k, v in planned(tf_env, infra, "aws_s3_object").items() if ".boot[" in k]

    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    for bucket in ("team-data", "shards"):
        s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket="team-data", Key="imagenet/train/n01440764/0.JPEG", Body=b"jpeg")
    s3.put_object(Bucket="team-data", Key="imagenet/val/0.JPEG", Body=b"not granted")
    s3.put_object(Bucket="shards", Key="train-000.tar", Body=os.urandom(2048))
    s3.put_object(Bucket="shards", Key="sub/train-001.tar", Body=os.urandom(1024))
    node = node_credentials(moto_endpoint, policy["policy"], "data-node")
    prefixes = ("checkpoints/d-run/", "imagenet/train/")
    proxy = AwsRulesProxy(moto_endpoint, s3_list_prefixes=prefixes, s3_principal=node["AWS_ACCESS_KEY_ID"])
    proxy.s3_open_buckets = ("shards",)
    with proxy as url:
        enforce_iam(moto_endpoint, True)
        try:
            run = _boot(script, url, tmp_path / "node", node)
            log = (tmp_path / "node" / "user-data.log").read_text()
            assert run.returncode == 0, log[-3000:]
            record = json.loads((tmp_path / "node" / "torchrun.json").read_text())
            shards = str(tmp_path / "node" / "opt-srifty" / "data" / "SHARDS")
            assert record["env"] == {"TRAIN_DATA": "s3://team-data/imagenet/train/", "SHARDS": shards}
            assert record["files"] == ["sub/train-001.tar", "train-000.tar"]
            assert "srifty: TRAIN_DATA: s3://team-data/imagenet/train/ is readable" in log
            assert re.search(r"srifty: SHARDS: 2 files, 0\.0 MiB copied from s3://shards/ to \S+ in \d+ s", log)
            # the role reads, never writes; nothing outside the granted folders
            client = _as(url, node)
            assert client.get_object(Bucket="team-data", Key="imagenet/train/n01440764/0.JPEG")["Body"].read()
            for call in (
                lambda: client.put_object(Bucket="team-data", Key="imagenet/train/x", Body=b"x"),
                lambda: client.delete_object(Bucket="shards", Key="train-000.tar"),
                lambda: client.get_object(Bucket="team-data", Key="imagenet/val/0.JPEG"),
                lambda: client.list_objects_v2(Bucket="team-data", Prefix="imagenet/val/"),
            ):
                with pytest.raises(ClientError) as denied:
                    call()
                assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        finally:
            enforce_iam(moto_endpoint, False)


def _forget_the_fleets_life(moto: str, watchdog_log: Path, wait_s: float = 60.0) -> None:
    """Once the node's watchdog has recorded the fleet's end (its log says so), the fleet's life records in the
    checkpoint bucket go, as for a root applied anew."""
    end = time.monotonic() + wait_s
    while "the fleet's life" not in (watchdog_log.read_text() if watchdog_log.exists() else ""):
        assert time.monotonic() < end, "the first node's watchdog never recorded the fleet's end"
        time.sleep(0.2)
    s3 = boto3.client("s3", endpoint_url=moto, region_name="us-east-1")
    for item in s3.list_objects_v2(Bucket="d-ckpt").get("Contents", []):
        if "life/" in item["Key"]:
            s3.delete_object(Bucket="d-ckpt", Key=item["Key"])


def test_a_node_that_cannot_read_its_data_ends_before_it_trains(tf_env, moto_endpoint, tmp_path, catalog):
    infra = _root(tmp_path, moto_endpoint, catalog, ("TRAIN_DATA=s3://empty-data/train/",), ())
    (policy,) = planned(tf_env, infra, "aws_iam_role_policy").values()
    (script,) = [v["content"] for k, v in planned(tf_env, infra, "aws_s3_object").items() if ".boot[" in k]
    node = node_credentials(moto_endpoint, policy["policy"], "data-node")
    enforce_iam(moto_endpoint, True)
    try:
        # the bucket does not exist yet (a typo, another region or account): retried, then the node ends itself
        run = _boot(script, moto_endpoint, tmp_path / "missing", node)
        log = (tmp_path / "missing" / "user-data.log").read_text()
        assert run.returncode == 1, log[-3000:]
        assert "TRAIN_DATA: s3://empty-data/train/ could not be read (attempt 6 of 6)" in log
        assert "may this instance role read it?" in log
        # the reason, again where the node ends (the check ran in the background, its lines far above)
        said = "the training data TRAIN_DATA is not ready: TRAIN_DATA: s3://empty-data/train/ could not be read ("
        assert said in log and "this node cannot train" in log
        assert not (tmp_path / "missing" / "torchrun.json").exists()
        # the bucket, and nothing in the folder, on a fleet applied anew: the first node's watchdog ends the fleet's
        # life in the background after the node ended (a second boot that read the ended life before the data check
        # said anything ended itself: it failed once in CI), so its record goes once it is written
        enforce_iam(moto_endpoint, False)
        _forget_the_fleets_life(moto_endpoint, tmp_path / "missing" / "watchdog.log")
        boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="empty-data")
        enforce_iam(moto_endpoint, True)
        run = _boot(script, moto_endpoint, tmp_path / "empty", node)
        log = (tmp_path / "empty" / "user-data.log").read_text()
        assert run.returncode == 1, log[-3000:]
        assert "TRAIN_DATA: no objects under s3://empty-data/train/: is the folder right?" in log
        assert not (tmp_path / "empty" / "torchrun.json").exists()
    finally:
        enforce_iam(moto_endpoint, False)


# ---------------------------------------------------------------------------------------------------------------------
# The rehearsal: the data folders in the local AWS, and the role's listing as AWS answers it
# ---------------------------------------------------------------------------------------------------------------------


def test_the_rehearsals_data_samples_name_the_fleets_folders(tmp_path) -> None:
    from lightning_srifty.provision.rehearsal.walk import Settings, _data_samples

    values = {"data": [{"name": "TRAIN", "uri": "s3://team-data/train/", "copy": True}]}
    (tmp_path / "sample").mkdir()
    assert _data_samples(Settings(data_samples=(f"TRAIN={tmp_path / 'sample'}",)), values) == {
        "TRAIN": tmp_path / "sample"
    }
    with pytest.raises(ConfigError, match=r"reads no data folder named 'VAL' \(TRAIN\)"):
        _data_samples(Settings(data_samples=(f"VAL={tmp_path}",)), values)
    with pytest.raises(ConfigError, match="is not a folder here"):
        _data_samples(Settings(data_samples=(f"TRAIN={tmp_path / 'nowhere'}",)), values)
    for spec in ("TRAIN", "TRAIN=", "TRAIN= "):  # never this folder by default (a trial uploaded its venv)
        with pytest.raises(ConfigError, match="names the local folder of sample files after the ="):
            _data_samples(Settings(data_samples=(spec,)), values)


def test_the_rehearsals_refusal_names_its_flag(tmp_path, capsys, catalog) -> None:
    from lightning_srifty.cli import main

    options = Options(name="d-run", train_command="python train.py", data=("META=s3://team-data/meta/",))
    infra = generate(load_plan(PLAN), tmp_path / "infra", options=options, catalog=catalog).out
    assert main(["rehearse", "--dir", str(infra), "--data-sample", "META"]) == 2
    err = capsys.readouterr().err
    assert "--data-sample 'META': NAME=DIR names the local folder of sample files after the =" in err, err


def test_a_whole_bucket_of_data_is_listed_as_aws_lists_it() -> None:
    from lightning_srifty.provision.rehearsal.walk import _listing_prefixes, _open_buckets

    policy = json.dumps(
        {
            "Statement": [
                {"Sid": "ListData0", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::shards"},
                {
                    "Sid": "ListData1",
                    "Action": "s3:ListBucket",
                    "Resource": "arn:aws:s3:::team-data",
                    "Condition": {"StringLike": {"s3:prefix": ["train/", "train/*"]}},
                },
                {"Sid": "ReadData", "Action": "s3:GetObject", "Resource": ["arn:aws:s3:::shards/*"]},
            ]
        }
    )
    assert _open_buckets(policy) == ("shards",)
    assert _listing_prefixes(policy) == ("train/", "train/")


# ---------------------------------------------------------------------------------------------------------------------
# The boot's data step with a fake aws: the one-key listing, a disk too small, the instance store
# ---------------------------------------------------------------------------------------------------------------------

FAKE_AWS_DATA = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/aws.calls"
case "$1 $2" in
  "s3api list-objects-v2") [ -n "${FAKE_EMPTY_LISTING:-}" ] && echo None || echo "imagenet/train/n01/0.JPEG" ;;
  "s3 sync")
    if [ -n "${FAKE_SLOW_COPY_S:-}" ]; then  # a large folder: the copy takes long, and says so when it ends
      sleep "$FAKE_SLOW_COPY_S" && touch "$FAKE_DIR/copy.ended"
    fi
    if [ -n "${FAKE_DISK_FULL:-}" ]; then
      echo "download failed: s3://bkt/shards/a.tar to $4a.tar [Errno 28] No space left on device" >&2; exit 1
    fi
    mkdir -p "$4" && echo shard >"$4/a.tar" ;;
  *) exit 0 ;;
esac
"""

FAKE_TORCHRUN_DATA = """#!/bin/bash
printf '%s\\n' "$TRAIN_DATA" "$SHARDS" >"$FAKE_DIR/torchrun.env"
"""


def _boot_with_fakes(tf_env, tmp_path: Path, *, copy_first: bool = False, **env: str):
    from _fleet import FAKE_CURL, render, run_user_data, template_values

    data = [
        {"name": "TRAIN_DATA", "uri": "s3://bkt/imagenet/train/", "copy": False},
        {"name": "SHARDS", "uri": "s3://bkt/shards/", "copy": True},
    ]
    if copy_first:
        data.reverse()
    script = render(tf_env, tmp_path / "console", template_values(name="data", watchdog_grace_s=1, data=data))
    fakes = {"curl": FAKE_CURL, "aws": FAKE_AWS_DATA, "torchrun": FAKE_TORCHRUN_DATA, "shutdown": "#!/bin/bash\n"}
    extra = {"SRIFTY_HOME": str(tmp_path / "home"), "SRIFTY_DATA_RETRY_S": "0", **env}
    run = run_user_data(tmp_path, script, fakes, extra_env=extra)
    calls = (tmp_path / "aws.calls").read_text().splitlines()
    return run, (tmp_path / "user-data.log").read_text(), calls


def test_the_boot_asks_s3_for_one_key_and_copies_to_the_instance_store(tf_env, tmp_path) -> None:
    nvme = Path("/dev/shm")  # a mounted, writable folder stands for /opt/dlami/nvme
    if not os.path.ismount(nvme) or not os.access(nvme, os.W_OK):
        pytest.skip("no writable tmpfs at /dev/shm to stand for the instance store")
    run, log, calls = _boot_with_fakes(tf_env, tmp_path, SRIFTY_NVME_DIR=str(nvme))
    assert run.returncode == 0, log[-3000:]
    (listing,) = [c for c in calls if c.startswith("s3api list-objects-v2")]
    assert "--bucket bkt --prefix imagenet/train/ --max-items 1 --page-size 1" in listing  # never the whole folder
    assert (tmp_path / "torchrun.env").read_text().splitlines() == [
        "s3://bkt/imagenet/train/",
        f"{nvme}/srifty-data/SHARDS",
    ]
    assert f"srifty: SHARDS: 1 files, 0.0 MiB copied from s3://bkt/shards/ to {nvme}/srifty-data/SHARDS in" in log
    shutil.rmtree(nvme / "srifty-data")


def test_a_disk_too_small_for_the_copy_is_said_so_at_once(tf_env, tmp_path) -> None:
    run, log, calls = _boot_with_fakes(tf_env, tmp_path, FAKE_DISK_FULL="1", SRIFTY_NVME_DIR=str(tmp_path / "none"))
    assert run.returncode == 1, log[-3000:]
    assert len([c for c in calls if c.startswith("s3 sync")]) == 1  # no retries: it is not the role's doing
    said = "the training data SHARDS is not ready: SHARDS: the copy of s3://bkt/shards/ does not fit in "
    assert said in log and "give the nodes a larger disk (srifty terraform --root-volume-gb)" in log
    assert "may this instance role read it" not in log
    assert not (tmp_path / "torchrun.env").exists()


def test_a_folder_that_fails_ends_the_node_at_once_and_stops_the_copies_still_running(tf_env, tmp_path) -> None:
    """The copy listed first takes long (a large folder: hours on an instance); the streamed folder after it is empty.
    The node says so as soon as the listing answers, not once the copy is done, and the copy still running is stopped
    with the script (run_user_data fails a test on any process the script leaves behind)."""
    run, log, _ = _boot_with_fakes(
        tf_env,
        tmp_path,
        copy_first=True,
        FAKE_EMPTY_LISTING="1",
        FAKE_SLOW_COPY_S="40",
        SRIFTY_NVME_DIR=str(tmp_path / "none"),
    )
    assert run.returncode == 1, log[-3000:]
    assert "the training data TRAIN_DATA is not ready: TRAIN_DATA: no objects under s3://bkt/imagenet/train/" in log
    assert not (tmp_path / "copy.ended").exists()  # stopped on the way out, never waited for
    assert "SHARDS: 1 files" not in log and not (tmp_path / "torchrun.env").exists()


def test_the_node_waits_for_every_folder_whatever_their_order(tf_env, tmp_path) -> None:
    run, log, _ = _boot_with_fakes(
        tf_env, tmp_path, copy_first=True, FAKE_SLOW_COPY_S="2", SRIFTY_NVME_DIR=str(tmp_path / "none")
    )
    assert run.returncode == 0, log[-3000:]
    assert (tmp_path / "copy.ended").exists()
    assert (tmp_path / "torchrun.env").read_text().splitlines() == [
        "s3://bkt/imagenet/train/",
        f"{tmp_path / 'home'}/data/SHARDS",
    ]


# ---------------------------------------------------------------------------------------------------------------------
# srifty check: the folders answer, and the copies fit
# ---------------------------------------------------------------------------------------------------------------------


class _FakeS3:
    """list_objects_v2 and its paginator over {bucket: {key: size}}; a bucket named in ``refuse`` answers that code."""

    def __init__(self, buckets: dict[str, dict[str, int]], refuse: dict[str, str] | None = None, page: int = 2):
        self.buckets, self.refuse, self.page = buckets, refuse or {}, page

    def _keys(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        if bucket in self.refuse:
            code = self.refuse[bucket]
            raise ClientError({"Error": {"Code": code, "Message": code}}, "ListObjectsV2")
        return sorted((k, s) for k, s in self.buckets[bucket].items() if k.startswith(prefix))

    def list_objects_v2(self, Bucket: str, Prefix: str, MaxKeys: int) -> dict:
        return {"KeyCount": min(MaxKeys, len(self._keys(Bucket, Prefix)))}

    def get_paginator(self, _name: str):
        keys = self._keys

        class Pages:
            def paginate(inner, Bucket: str, Prefix: str):
                found = keys(Bucket, Prefix)
                for i in range(0, len(found), self.page):
                    chunk = found[i : i + self.page]
                    yield {
                        "Contents": [{"Key": k, "Size": s} for k, s in chunk],
                        "IsTruncated": i + self.page < len(found),
                    }

        return Pages()


def test_srifty_check_finds_a_missing_or_empty_folder_and_a_copy_that_does_not_fit(catalog) -> None:
    from lightning_srifty.provision.preflight import check_data_folders, data_room_gb

    s3 = _FakeS3(
        {"team-data": {"train/a": 40 * 10**9, "train/b": 30 * 10**9, "meta/m.json": 10}, "empty-data": {}},
        refuse={"missing-data": "NoSuchBucket", "other-account": "AccessDenied"},
    )
    data = [
        {"name": "META", "uri": "s3://team-data/meta/", "copy": False},
        {"name": "TRAIN", "uri": "s3://team-data/train/", "copy": True},
        {"name": "NONE", "uri": "s3://empty-data/x/", "copy": False},
        {"name": "GONE", "uri": "s3://missing-data/x/", "copy": False},
        {"name": "THEIRS", "uri": "s3://other-account/x/", "copy": False},
    ]
    found = [(f.status, f.message) for f in check_data_folders(s3, data, room_gb=120.0)]
    assert found == [
        ("ok", "META: s3://team-data/meta/ answers (the job reads it from S3)"),
        ("ok", "TRAIN: 70.0 GB in 2 objects"),
        ("fail", "NONE: no objects under s3://empty-data/x/"),
        ("fail", "GONE: s3://missing-data/x/ does not answer (NoSuchBucket: NoSuchBucket)"),
        (
            "warn",
            "THEIRS: your credentials may not list s3://other-account/x/ (AccessDenied: AccessDenied): not checked",
        ),
    ], found
    too_big = check_data_folders(s3, data[1:2], room_gb=60.0)[-1]
    assert too_big.status == "fail" and "70.0 GB, more than the 60 GB the nodes have for them" in too_big.message
    assert "--root-volume-gb" in too_big.fix
    # a folder too large to list in 10 s: what was listed, said as a lower bound
    ticks = iter(range(0, 1000, 20))
    bounded = check_data_folders(_FakeS3(s3.buckets, page=1), data[1:2], room_gb=120.0, clock=lambda: next(ticks))
    assert bounded[0].message == "TRAIN: at least 40.0 GB in 1 objects"
    # the room: the instance store where the type has one (p4d.24xlarge: 8 TB), else the root volume less the AMI's
    assert data_room_gb([{"instance_type": "g4dn.xlarge"}], 200, catalog) == pytest.approx(125 * 0.95)
    assert data_room_gb([{"instance_type": "g5.xlarge"}, {"instance_type": "p3.2xlarge"}], 300, catalog) == 220
    assert data_room_gb([{"instance_type": "p3.2xlarge"}], 200, catalog) == 120
