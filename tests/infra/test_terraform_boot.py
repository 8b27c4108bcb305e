"""Terraform that boots and runs the job: the image follows each type's architecture (the Deep Learning AMI's public
SSM parameters, put into moto), one EFA interface per network card on multi-node fleets (what the predictor
assumes), and the generated user_data EXECUTED with bash on this machine (instance metadata from the local IMDS
server, EC2 and S3 from moto's server) until torchrun starts the example training script."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import boto3
import pytest

from _fleet import (
    PARAMS,
    dlami_parameters,
    end_watchdogs,
    plan_json,
    planned,
    planned_types,
    run_boot,
    use_test_parameters,
)
from _fleet import enforce_iam as _enforce_iam
from _fleet import node_credentials as _as_node
from _support import MINIMAL, moto_network, plan_layout
from conftest import tf_run
from imds_server import FakeIMDS
from lightning_srifty.protocol import VARIABLES, entry_strategy
from lightning_srifty.provision.apply import apply, destroy
from lightning_srifty.provision.terraform.generate import TFVARS, Options, generate, tfvars
from lightning_srifty.provision.terraform.money import group_usd_per_hour
from predictor.documents.plan import Plan, load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError
from predictor.model.network import DEFAULT_NETWORK, gpudirect_rdma, host_staging, inter_node_link
from predictor.ranking import Constraints, rank

ROOT = Path(__file__).resolve().parents[2]


def fleet_plan(catalog, allow: tuple[str, ...], fleet: str) -> tuple[Plan, int]:
    """A ranked plan over ``allow`` and the index of ``fleet`` in it."""
    software = {"python": platform.python_version(), "torch": version("torch"), "lightning": version("lightning")}
    profile = load_profile({**MINIMAL, "batch": {"per_device": 8}, "software": software})
    constraints = Constraints(
        steps=10_000_000,
        objective="time",
        market="on-demand",
        allow=allow,
        max_instances=2,
        max_types=2,
        top=30,
        allow_arm64=True,
    )
    plan = rank(profile, constraints, catalog=catalog)
    return plan, [e.fleet for e in plan.entries].index(fleet)


def test_the_module_defaults_to_the_pytorch_dlami_of_each_architecture() -> None:
    variables = (ROOT / "terraform" / "modules" / "training_fleet" / "variables.tf").read_text()
    for arch, name in PARAMS.items():
        assert f'{arch:<6} = "{name}"' in variables


def test_each_group_carries_its_architecture_and_one_ami_serves_one_architecture(catalog) -> None:
    plan, i = fleet_plan(catalog, ("g5g.xlarge", "g5.xlarge"), "g5g.xlarge:1,g5.xlarge:1")
    values = tfvars(plan, i, Options(name="mixed-arch"), catalog)
    assert {g["instance_type"]: g["arch"] for g in values["groups"]} == {"g5g.xlarge": "arm64", "g5.xlarge": "x86_64"}
    assert values["ami"] == {}  # one Deep Learning AMI per architecture, resolved by the module
    # all on demand: one Auto Scaling group would give its whole base to its first type (a trial), so EC2 Fleets of the
    # plan's exact counts; a mix with spot stays an Auto Scaling group
    assert values["capacity"]["mode"] == "fleet"
    with pytest.raises(ConfigError, match="mixes arm64 and x86_64") as info:
        tfvars(plan, i, Options(name="mixed-arch", ami="ami-12345678", setup_command="true"), catalog)
    assert info.value.parameter == "ami"


def test_a_custom_image_needs_a_setup_command(catalog) -> None:
    plan = load_plan(ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json")
    with pytest.raises(ConfigError, match=r"custom image.*Give setup_command true") as info:
        tfvars(plan, 0, Options(name="custom-ami", ami="ami-0123456789abcdef0"), catalog)
    assert (info.value.parameter, info.value.value) == ("setup_command", "")
    assert tfvars(plan, 0, Options(name="custom-ami", ami="ami-01234567", setup_command="true"), catalog)["ami"] == {
        "id": "ami-01234567"
    }


def test_a_custom_image_on_an_efa_fleet_is_told_what_the_plan_priced(catalog, tmp_path) -> None:
    """The plan priced an EFA fleet's nodes meeting through NCCL's aws-ofi-nccl plugin (issue #38 item 3): a custom
    image may not have it, and srifty terraform says so before the apply; the default image, or one node, is not."""
    plan = load_plan(ROOT / "terraform" / "examples" / "multi-node-spot" / "plan.json")  # p4d.24xlarge:4
    custom = Options(name="efa-custom", ami="ami-01234567", setup_command="true")
    notes = generate(plan, tmp_path / "custom", options=custom, catalog=catalog).notes
    assert any("aws-ofi-nccl" in n and "ami-01234567" in n for n in notes), notes
    default = generate(plan, tmp_path / "default", options=Options(name="efa-default"), catalog=catalog).notes
    assert not any("aws-ofi-nccl" in n for n in default)
    single = load_plan(ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json")
    one = generate(single, tmp_path / "one", options=custom, catalog=catalog).notes
    assert not any("aws-ofi-nccl" in n for n in one)


@pytest.mark.parametrize(
    ("itype", "cards", "card_gbit"),
    [("p4d.24xlarge", 4, 100), ("p5.48xlarge", 32, 100), ("p5en.48xlarge", 16, 200), ("g5.48xlarge", 1, 100)],
)
def test_multi_node_fleets_get_every_efa_interface_the_predictor_assumes(catalog, itype, cards, card_gbit) -> None:
    """The predicted inter-node bandwidth is cards x per-card rate, and the generated values attach that many EFA
    interfaces (one per network card); a single-node fleet attaches one."""
    it = catalog.get(itype)
    link = inter_node_link(it)
    assert link.kind == "efa"
    staging = 1.0 if gpudirect_rdma(it) else host_staging(it.gpus)  # g5.48xlarge: 8 GPUs staged through the host
    assert link.gbps == pytest.approx(cards * card_gbit / 8 * DEFAULT_NETWORK.efa_efficiency * staging)
    plan = load_plan(ROOT / "terraform" / "examples" / "multi-node-spot" / "plan.json")  # p4d.24xlarge:4
    entry = plan.entries[0]
    # the same fleet of another type, priced from the catalog (srifty terraform refuses figures that are not)
    g = entry.groups[0]
    usd = group_usd_per_hour(catalog, itype, entry.region, g.on_demand, g.spot)
    groups = [dataclasses.replace(g, instance_type=itype, gpus_per_instance=it.gpus, usd_per_hour=usd)]
    entry = dataclasses.replace(
        entry, groups=groups, fleet=f"{itype}:{g.count}", gpus=g.count * it.gpus, usd_per_hour=usd
    )
    plan = dataclasses.replace(plan, entries=[entry])
    (values,) = tfvars(plan, 0, Options(name="efa-fleet"), catalog)["groups"]
    assert (values["efa"], values["network_interfaces"]) == (True, cards)
    assert it.network_interfaces(multi_node=False) == 1


def test_the_planned_launch_template_has_one_efa_interface_per_card(tf_env, moto_endpoint, tmp_path, catalog) -> None:
    """terraform plan (real CLI, moto's endpoints for the data sources): 4 x p4d.24xlarge get 4 EFA interfaces
    each, on network cards 0-3 (device index 0, then 1), behind a NAT gateway (EC2 gives no public IP to an instance
    with several interfaces). A value of the user's own next to the generated ones reaches the module through the
    root: metadata_hop_limit, which srifty never sets."""
    images = dlami_parameters(moto_endpoint)
    plan = load_plan(ROOT / "terraform" / "examples" / "multi-node-spot" / "plan.json")
    options = Options(name="p4d-efa", aws_endpoint=moto_endpoint)
    infra = use_test_parameters(generate(plan, tmp_path / "p4d", options=options, catalog=catalog).out)
    (infra / "team.auto.tfvars").write_text("metadata_hop_limit = 2\n")
    templates = planned(tf_env, infra, "aws_launch_template")
    (lt,) = templates.values()
    assert [(m["http_tokens"], m["http_put_response_hop_limit"]) for m in lt["metadata_options"]] == [("required", 2)]
    nics = sorted(lt["network_interfaces"], key=lambda n: n["network_card_index"])
    assert [(n["network_card_index"], n["device_index"], n["interface_type"]) for n in nics] == [
        (0, 0, "efa"),
        (1, 1, "efa"),
        (2, 1, "efa"),
        (3, 1, "efa"),
    ]
    assert all(n["associate_public_ip_address"] is None for n in nics)
    assert lt["image_id"] == images["x86_64"]
    assert {"aws_nat_gateway", "aws_subnet"} <= set(planned_types(tf_env, infra))
    # S3 (code, wheels, checkpoints) through a gateway endpoint on both route tables, not the NAT gateway's per-GB
    (endpoint,) = planned(tf_env, infra, "aws_vpc_endpoint").values()
    assert endpoint["vpc_endpoint_type"] == "Gateway" and endpoint["service_name"] == "com.amazonaws.us-east-1.s3"
    changes = plan_json(tf_env, infra)["resource_changes"]
    (s3,) = [c for c in changes if c["type"] == "aws_vpc_endpoint"]
    tables = [c["address"] for c in changes if c["type"] == "aws_route_table"]
    assert len(tables) == 2 and s3["change"]["after_unknown"].get("route_table_ids")  # both, ids known at apply


def put_boot_scripts(env: dict[str, str], folder: Path, endpoint: str) -> None:
    """Without an apply: the boot scripts the plan would upload (aws_s3_object.boot), put into moto's S3 where the
    first stage of user_data fetches them."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for address, values in planned(env, folder, "aws_s3_object").items():
        if ".boot[" in address:
            s3.create_bucket(Bucket=values["bucket"])
            s3.put_object(Bucket=values["bucket"], Key=values["key"], Body=values["content"].encode())


# ---------------------------------------------------------------------------------------------------------------------
# Apply against moto, then run the user_data the instances would run
# ---------------------------------------------------------------------------------------------------------------------

FAKE_TORCHRUN = """#!{python}
# torchrun as the harness sees it: records its argv, then starts the real torch.distributed.run on this machine
# (standalone rendezvous, one process: the fleet's c10d endpoint is a moto address that nothing listens on)
import json, os, sys
env = {{k: v for k, v in os.environ.items() if k.startswith(("SRIFTY_", "PYTHON", "PL_TRAINER_", "PET_"))}}
with open(os.environ["SRIFTY_HARNESS_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": env}}, f)
if os.environ.get("SRIFTY_HARNESS_RECORD_ONLY"):
    sys.exit(0)
os.environ["PL_TRAINER_NUM_NODES"] = "1"  # this one node stands for the fleet: its job trains alone
# the node's address (torchrun's --local-addr) is moto's, which is not this machine's: recorded above, not used here
os.environ.pop("PET_LOCAL_ADDR", None)
args = [a for a in sys.argv[1:] if not a.startswith(("--nnodes", "--nproc_per_node", "--rdzv_"))]
launcher = ["-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=1"]
# the environment user_data activated (the node's own, from the code snapshot), else this test's interpreter
venv = os.path.join(os.environ.get("VIRTUAL_ENV") or "/nonexistent", "bin", "python")
python = venv if os.path.exists(venv) else sys.executable
os.execv(python, [python, *launcher, *args])
"""


def run_user_data(
    user_data: str, moto: str, work: Path, imds: FakeIMDS, **extra_env: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """Execute ``user_data`` with bash as cloud-init would (cwd /), with a fake torchrun first on PATH."""
    if shutil.which("aws") is None or shutil.which("curl") is None:
        pytest.skip("the harness needs the aws CLI and curl on PATH")
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True)
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    torchrun.chmod(torchrun.stat().st_mode | stat.S_IEXEC)
    # never the machine's own shutdown: the life cap and the watchdog call this one
    shutdown = bin_dir / "shutdown"
    shutdown.write_text(f'#!/bin/bash\necho "$*" >>{work / "shutdown.log"}\n')
    shutdown.chmod(shutdown.stat().st_mode | stat.S_IEXEC)
    script = work / "user_data.sh"
    script.write_text(user_data)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
        "AWS_ENDPOINT_URL": moto,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "SRIFTY_USER_DATA_LOG": str(work / "user-data.log"),
        "SRIFTY_HARNESS_RECORD": str(work / "torchrun.json"),
        "SRIFTY_STATE_DIR": str(work / "state"),
        "SRIFTY_PER_BOOT_DIR": str(work / "per-boot"),  # never this machine's cloud-init
        "SRIFTY_WATCHDOG_LOG": str(work / "watchdog.log"),
        "SRIFTY_WATCHDOG_INTERVAL_S": "1",
        **extra_env,
    }
    try:  # failed by a process of its own the script leaves behind (run_boot), as every other boot-script test
        raw = run_boot(["bash", str(script)], cwd="/", env=env, timeout=240)
        run = subprocess.CompletedProcess(
            raw.args, raw.returncode, raw.stdout.decode(errors="replace"), raw.stderr.decode(errors="replace")
        )
    finally:
        # the watchdog (in the background) sees the job gone within a second or two, calls the fake shutdown and
        # exits; one still running after 20 s is killed (none outlives its test)
        end_watchdogs(Path(env["SRIFTY_STATE_DIR"]), within_s=20)
    record = json.loads((work / "torchrun.json").read_text()) if (work / "torchrun.json").exists() else {}
    return run, record


USER_TRAIN = """import json, os, runpy, sys

import lightning_srifty

# what the harness checks: where this ran, and which lightning-srifty it imported
with open(os.environ["SRIFTY_HARNESS_REPORT"], "w") as f:
    json.dump({"lightning_srifty": lightning_srifty.__file__, "cwd": os.getcwd(), "executable": sys.executable}, f)
sys.argv = ["train_digits.py", *sys.argv[1:]]
runpy.run_path("train_digits.py", run_name="__main__")
os.makedirs("outputs", exist_ok=True)  # what a script saves at the end: an output of the job
with open("outputs/model.txt", "w") as f:
    f.write("trained")
"""


def user_project(folder: Path) -> Path:
    """A user's project as git sees it: their train.py (the example, plus a report of where it ran), a
    requirements file, and a data/ folder git ignores."""
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "train_digits.py", folder / "train_digits.py")
    (folder / "train.py").write_text(USER_TRAIN)
    (folder / "requirements.txt").write_text("pyyaml\n")
    (folder / ".gitignore").write_text("data/\n")
    (folder / "data").mkdir()
    (folder / "data" / "shard-0.bin").write_bytes(os.urandom(4096))
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "add", "train.py", ".gitignore"], check=True)  # the rest untracked
    return folder


# 134 s alone (apply, one node's boot); under CI's other worker its apply took 61 s and the boot ran past the suite's
# 300 s (the thirty-fifth session's clean clone): load, not a hang (its boot has its own 240 s bound)
@pytest.mark.timeout(600)
def test_apply_and_boot_an_arm64_and_x86_64_fleet_against_moto(tf_env, moto_endpoint, tmp_path, catalog) -> None:
    """validate and apply (moto) of g5g.xlarge (Graviton, arm64) + g5.xlarge (x86_64) from a user's project folder
    (a git work tree): the apply uploads the code snapshot beside the checkpoints; each launch template has the Deep
    Learning AMI of its type's architecture; the arm64 template's user_data, run with bash, fetches and checks the
    snapshot, bootstraps the profiled environment from it, sets up, finds the 2 fleet members in moto's EC2 and
    starts torchrun in the snapshot with the user's train.py, which imports the snapshot's lightning-srifty and
    trains (examples/train_digits.py, 5 CPU steps)."""
    images = dlami_parameters(moto_endpoint)
    plan, i = fleet_plan(catalog, ("g5g.xlarge", "g5.xlarge"), "g5g.xlarge:1,g5.xlarge:1")
    project = user_project(tmp_path / "project")
    # the fleet's network and checkpoint bucket exist already (test_apply_and_destroy_a_heterogeneous_spot_fleet_
    # against_moto applies and checks the module's own VPC and bucket): this apply skips the provider's fixed waits on
    # a new VPC, subnet (20 s) and bucket lifecycle configuration (about 55 s of polling for a stable read)
    vpc_id, subnet_ids = moto_network(moto_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="boot-checkpoints")
    options = Options(
        name="boot-mixed-arch",
        aws_endpoint=moto_endpoint,
        vpc_id=vpc_id,
        subnet_ids=subnet_ids,
        bucket="boot-checkpoints",
        train_command="python -u train.py --accelerator cpu --max-steps 5",
        setup_command="echo setup ran > setup.txt",  # in the code's folder, in the shell that starts torchrun
        mode="fleet",  # exact counts (asg mode counts throughput units, which moto launches one instance each)
        code=str(project),
        # this machine stands for the image: its torch and lightning satisfy the pins, nothing is downloaded
        base_python=sys.executable,
    )
    generated = generate(plan, tmp_path / "infra", choice=i, options=options, catalog=catalog)
    snapshot = generated.snapshot
    assert snapshot is not None and snapshot.source == "git"
    assert sorted(snapshot.files) == [".gitignore", "requirements.txt", "train.py", "train_digits.py"]  # data/ ignored
    infra = use_test_parameters(generated.out)
    assert json.loads((infra / TFVARS).read_text())["train"]["argv"] == [
        "train.py",
        "--accelerator",
        "cpu",
        "--max-steps",
        "5",
    ]
    assert tf_run(tf_env, infra, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    valid = tf_run(tf_env, infra, "validate", "-no-color")
    assert valid.returncode == 0, valid.stdout + valid.stderr
    started = time.perf_counter()
    out = apply(infra, yes=True, echo=lambda line: None)["fleet"]
    print(f"apply: {time.perf_counter() - started:.1f} s")
    try:
        ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
        data = {
            itype: ec2.describe_launch_template_versions(LaunchTemplateId=lt)["LaunchTemplateVersions"][0][
                "LaunchTemplateData"
            ]
            for itype, lt in out["launch_template_ids"].items()
        }
        for itype, arch in (("g5g.xlarge", "arm64"), ("g5.xlarge", "x86_64")):
            assert data[itype]["ImageId"] == images[arch]
            (image,) = ec2.describe_images(ImageIds=[data[itype]["ImageId"]])["Images"]
            (spec,) = ec2.describe_instance_types(InstanceTypes=[itype])["InstanceTypes"]
            assert image["Architecture"] == arch and spec["ProcessorInfo"]["SupportedArchitectures"] == [arch]
        # the fleet's members, launched from the templates as EC2 would
        members = {
            itype: ec2.run_instances(LaunchTemplate={"LaunchTemplateId": lt}, MinCount=1, MaxCount=1)["Instances"][0]
            for itype, lt in out["launch_template_ids"].items()
        }
        me, other = members["g5g.xlarge"], members["g5.xlarge"]
        # the other node was ready a minute ago (its environment installed first): it is the c10d host
        ready = f"checkpoints/{options.name}/ready/{options.name}/"
        boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").put_object(
            Bucket="boot-checkpoints",
            Key=f"{ready}{other['InstanceId']}.json",
            Body=json.dumps(
                {"instance_id": other["InstanceId"], "ip": other["PrivateIpAddress"], "ready_unix": time.time() - 60}
            ),
        )
        user_data = base64.b64decode(data["g5g.xlarge"]["UserData"]).decode()
        started = time.perf_counter()
        # the code went up with the apply, named by its sha256, beside the checkpoints
        s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
        key = f"checkpoints/{options.name}/code/{snapshot.sha256}.tar.gz"
        assert s3.get_object(Bucket="boot-checkpoints", Key=key)["Body"].read() == snapshot.path.read_bytes()
        home, report = tmp_path / "srifty-home", tmp_path / "report.json"
        metadata = {
            "meta-data/placement/region": "us-east-1",
            "meta-data/instance-id": me["InstanceId"],
            "meta-data/local-ipv4": me["PrivateIpAddress"],
        }
        # every token the metadata service gives lives 5 s at most, however long it was asked for (EC2 keeps a token
        # the seconds asked, at most six hours): the install takes longer, so a token kept from the boot's start is
        # refused by the time the node reads its own address, as EC2 refuses one kept past its TTL
        with FakeIMDS(metadata, token_life_s=5) as imds:
            run, record = run_user_data(
                user_data,
                moto_endpoint,
                tmp_path,
                imds,
                SRIFTY_HOME=str(home),
                PYTHONPATH="",  # nothing from this checkout: the node has only the snapshot
                SRIFTY_HARNESS_REPORT=str(report),
            )
        log = (tmp_path / "user-data.log").read_text() if (tmp_path / "user-data.log").exists() else ""
        assert run.returncode == 0, log[-3000:] + run.stderr[-3000:]
        print(f"user_data harness: {time.perf_counter() - started:.1f} s")
        # torchrun is told the node's own address, not its name (a VPC may not resolve names: pytorch#150532)
        assert record["env"]["PET_LOCAL_ADDR"] == me["PrivateIpAddress"], record["env"]
        code = home / f"code-{snapshot.sha256}"
        assert (code / "setup.txt").read_text() == "setup ran\n"
        assert ("PUT", "/latest/api/token") in imds.requests
        assert [r for r in imds.requests if r == ("GET", "/latest/meta-data/local-ipv4")]
        argv = record["argv"]
        assert argv[:2] == ["--nnodes=2", "--nproc_per_node=1"]
        assert argv[-5:] == ["train.py", "--accelerator", "cpu", "--max-steps", "5"]
        assert record["cwd"] == str(code)
        # the user's own script ran from the snapshot, in the node's environment, importing the snapshot's
        # lightning-srifty (not this checkout's), at the pinned versions
        ran = json.loads(report.read_text())
        venv = home / f"env-{snapshot.sha256}"
        assert ran["cwd"] == str(code) and ran["executable"].startswith(str(venv))
        assert ran["lightning_srifty"].startswith(str(venv)), ran
        installed = json.loads((venv / "srifty-environment.json").read_text())
        assert installed["torch"].split("+")[0] == plan.software.torch.split("+")[0]
        assert installed["lightning"] == plan.software.lightning
        # the rendezvous (issue #35 M1): this node published its readiness and took the first ready as the host
        assert f"--rdzv_endpoint={other['PrivateIpAddress']}:29400" in argv
        assert "--rdzv_conf=join_timeout=1800,read_timeout=300" in argv
        mine = json.loads(
            s3.get_object(Bucket="boot-checkpoints", Key=f"{ready}{me['InstanceId']}.json")["Body"].read()
        )
        assert mine["ip"] == me["PrivateIpAddress"] and mine["ready_unix"] > time.time() - 600
        assert record["env"]["SRIFTY_CHECKPOINT_URI"] == out["checkpoint_uri"]
        assert record["env"]["SRIFTY_RESUME"] == "latest"  # a replacement node resumes where the fleet was (#35 H4)
        assert record["env"]["PYTHONUNBUFFERED"] == "1"
        assert record["env"]["PL_TRAINER_NUM_NODES"] == "2"  # the Trainer's default: one job across the nodes
        assert "`Trainer.fit` stopped: `max_steps=5` reached" in log  # the example trained under torchrun
        # what the job wrote in its folder outlives the instance: beside the checkpoints, under this instance's id
        outputs = f"checkpoints/{options.name}/outputs/{options.name}/{me['InstanceId']}/"
        assert out["outputs_uri"] == f"s3://boot-checkpoints/checkpoints/{options.name}/outputs/{options.name}/"
        shipped = [
            o["Key"][len(outputs) :] for o in s3.list_objects_v2(Bucket="boot-checkpoints", Prefix=outputs)["Contents"]
        ]
        # the model the script saved, and the profile SriftyCallback measured on the node (not the code, nor the
        # setup command's setup.txt, nor .srifty/)
        assert sorted(shipped) == ["outputs/model.txt", "srifty/digits-profile.json"], shipped
        assert f"srifty: the job's outputs ({len(shipped)} files) are in s3://boot-checkpoints/{outputs}" in log
        # the life cap was scheduled at boot, and the watchdog stopped the instance once the job had exited
        shutdowns = (tmp_path / "shutdown.log").read_text().splitlines()
        max_life_min = math.ceil(json.loads((infra / TFVARS).read_text())["max_life_h"] * 60)
        assert shutdowns[0].startswith(f"-h +{max_life_min} ") and shutdowns[-1] == "-h now", shutdowns
        assert "the training job has exited" in (tmp_path / "watchdog.log").read_text()
    finally:
        destroy(infra, yes=True, echo=lambda line: None)


def test_user_data_quotes_every_word_of_the_training_command(tf_env, moto_endpoint, tmp_path, catalog) -> None:
    """A command whose arguments hold spaces, quotes, $ and ; reaches the script word for word; -m goes to
    torchrun's own -m; the checkpoint to resume from is one word too; the plan layout's Lightning strategy (JSON)
    reaches the job's environment as it is."""
    dlami_parameters(moto_endpoint)
    plan = load_plan(ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json")
    entries = [
        dataclasses.replace(e, layout=plan_layout("fsdp:full_shard+ac", "LlamaDecoderLayer")) for e in plan.entries
    ]
    plan = dataclasses.replace(plan, entries=entries)
    (tmp_path / "node").mkdir()
    command = """python3 -m json.tool --indent 2 "it's a $HOME; rm -rf x" """
    options = Options(
        name="quoting", aws_endpoint=moto_endpoint, train_command=command, resume_from="s3://ckpts/ck pt's/$x"
    )
    infra = use_test_parameters(generate(plan, tmp_path / "infra", options=options, catalog=catalog).out)
    (lt,) = planned(tf_env, infra, "aws_launch_template").values()
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    ec2.run_instances(
        ImageId=lt["image_id"],
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "srifty:fleet", "Value": "quoting"}]}],
    )
    put_boot_scripts(tf_env, infra, moto_endpoint)
    with FakeIMDS({"meta-data/placement/region": "us-east-1"}) as imds:
        run, record = run_user_data(
            base64.b64decode(lt["user_data"]).decode(), moto_endpoint, tmp_path, imds, SRIFTY_HARNESS_RECORD_ONLY="1"
        )
    assert record, run.stderr[-2000:]
    assert record["env"][VARIABLES["strategy"]] == entry_strategy(plan.entries[0])
    assert record["env"]["SRIFTY_RESUME"] == "s3://ckpts/ck pt's/$x"  # the given checkpoint, one word
    # after "--", which ends torchrun's options: a script's "--log" was refused as ambiguous (a trial)
    assert record["argv"][-8:] == [
        "-m",
        "--",
        "json.tool",
        "--indent",
        "2",
        "it's a $HOME; rm -rf x",
        "--resume-from",
        "s3://ckpts/ck pt's/$x",
    ]


FAKE_DOCKER = """#!{python}
# docker as the harness sees it: `pull` is recorded; `run` is recorded and its command run on this machine, in a
# fresh virtual environment standing for the image (this test's packages visible through a .pth file, as torch and
# lightning would be in the image), with the -v folder at -w, the --env-file variables and the -e names
import json, os, subprocess, sys, venv
args = sys.argv[1:]
record = os.environ["SRIFTY_HARNESS_DOCKER"]
calls = json.load(open(record)) if os.path.exists(record) else []
calls.append(args)
json.dump(calls, open(record, "w"))
if args[0] == "pull":
    sys.exit(0)
assert args[0] == "run", args
valued = {{"--env-file", "-e", "-v", "-w", "--ulimit", "--device", "--gpus", "--network", "--ipc", "--cidfile"}}
i, opts = 1, []
while args[i].startswith("-"):
    if args[i] in valued:
        opts.append((args[i], args[i + 1]))
        i += 2
    else:
        opts.append((args[i], None))
        i += 1
image, command = args[i], args[i + 1:]
env = dict(os.environ)
for flag, value in opts:
    if flag == "--env-file":
        for line in open(value).read().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
mounts = dict(v.split(":", 1)[::-1] for f, v in opts if f == "-v")
cwd = mounts.get(dict(opts).get("-w"), os.getcwd())
# the container sees the host's files only where they are mounted: a node state folder that is not is the
# container's own (gone with it), as on a real host
state = env.get("SRIFTY_NODE_STATE")
if state and not any(state == t or state.startswith(t.rstrip("/") + "/") for t in mounts):
    import tempfile
    env["SRIFTY_NODE_STATE"] = tempfile.mkdtemp(prefix="container-own-")
home = os.path.join(os.environ["SRIFTY_HARNESS_IMAGE_DIR"], "image-venv")
venv.EnvBuilder(with_pip=True, clear=True).create(home)
site = subprocess.run([home + "/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      capture_output=True, text=True, check=True).stdout.strip()
open(os.path.join(site, "zz_image.pth"), "w").write("{site}\\n")
env.update(VIRTUAL_ENV=home, PATH=home + "/bin:" + env["PATH"], PYTHONPATH="")
sys.exit(subprocess.run(command, cwd=cwd, env=env).returncode)
"""


LEAVE_ON_A_NOTICE = """import sys
from lightning_srifty.migrate.preemption import mark_preempted
mark_preempted("s3://image-ckpt/checkpoints/image-run/preempt-step=3.ckpt")  # what SpotPreemption does on a notice
sys.exit(75)
"""


@pytest.mark.parametrize("job", ["trains", "leaves on a notice"])
def test_a_container_image_runs_the_users_code_with_the_gpus_and_efa(
    tf_env, moto_endpoint, tmp_path, catalog, job
) -> None:
    """--image: user_data pulls the image and runs the job in it (docker run with every GPU, the EFA devices, the
    host's network, the code snapshot at /workspace), where the snapshot's lightning-srifty is installed into the
    image's Python before torchrun starts the user's train.py (docker faked: it records its arguments and runs the
    command in a fresh virtual environment standing for the image, which sees the host's files where they are
    mounted only). A job that leaves on a notice marks it in the node's state folder, which the container must see:
    it was not mounted, the host saw torchrun's 1, and every node of an --image fleet left its group for good (a
    review)."""
    import sysconfig

    dlami_parameters(moto_endpoint)
    plan, i = fleet_plan(catalog, ("g5.xlarge",), "g5.xlarge:1")
    project = user_project(tmp_path / "project")
    (project / "leave.py").write_text(LEAVE_ON_A_NOTICE)
    leaves = job == "leaves on a notice"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="image-ckpt")
    options = Options(
        name="image-run",
        aws_endpoint=moto_endpoint,
        bucket="image-ckpt",
        code=str(project),
        image="nvcr.io/nvidia/pytorch:25.01-py3",
        train_command="python -u leave.py" if leaves else "python -u train.py --accelerator cpu --max-steps 2",
    )
    generated = generate(plan, tmp_path / "infra", choice=i, options=options, catalog=catalog)
    infra = use_test_parameters(generated.out)
    (lt,) = planned(tf_env, infra, "aws_launch_template").values()
    snapshot = generated.snapshot
    key = f"checkpoints/image-run/code/{snapshot.sha256}.tar.gz"
    s3.put_object(Bucket="image-ckpt", Key=key, Body=snapshot.path.read_bytes())  # what the apply uploads
    put_boot_scripts(tf_env, infra, moto_endpoint)
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    ec2.run_instances(
        ImageId=lt["image_id"],
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "srifty:fleet", "Value": "image-run"}]}],
    )
    bin_dir = tmp_path / "fakes"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable, site=sysconfig.get_paths()["purelib"]))
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    home, report, calls = tmp_path / "home", tmp_path / "report.json", tmp_path / "docker.json"
    with FakeIMDS({"meta-data/placement/region": "us-east-1"}) as imds:
        run, _record = run_user_data(
            base64.b64decode(lt["user_data"]).decode(),
            moto_endpoint,
            tmp_path,
            imds,
            PATH=f"{bin_dir}:{tmp_path / 'bin'}:{os.environ['PATH']}",
            SRIFTY_HOME=str(home),
            PYTHONPATH="",
            SRIFTY_HARNESS_REPORT=str(report),
            SRIFTY_HARNESS_DOCKER=str(calls),
            SRIFTY_HARNESS_IMAGE_DIR=str(tmp_path),
        )
    log = (tmp_path / "user-data.log").read_text() if (tmp_path / "user-data.log").exists() else ""
    if leaves:  # the node's status: preempted with its checkpoint, so the group replaces it (the watchdog)
        assert run.returncode == 75, log[-3000:] + run.stderr[-3000:]
        assert "srifty: the job left on a notice with its checkpoint (s3://image-ckpt/checkpoints/image-run/" in log
        return
    assert run.returncode == 0, log[-3000:] + run.stderr[-3000:]
    pull, docker_run = json.loads(calls.read_text())
    assert pull == ["pull", "nvcr.io/nvidia/pytorch:25.01-py3"]
    code = home / f"code-{snapshot.sha256}"
    state = str(tmp_path / "state")  # run_user_data's SRIFTY_STATE_DIR
    for flag in (["--gpus", "all"], ["--network", "host"], ["--ipc", "host"], ["-v", f"{code}:/workspace"],
                 ["-v", f"{state}:{state}"]):  # fmt: skip
        assert any(docker_run[k : k + 2] == flag for k in range(len(docker_run))), (flag, docker_run)
    assert "nvcr.io/nvidia/pytorch:25.01-py3" in docker_run and docker_run[-5:] == [
        "train.py", "--accelerator", "cpu", "--max-steps", "2",
    ]  # fmt: skip
    ran = json.loads(report.read_text())
    image_env = tmp_path / "image-venv"
    assert ran["cwd"] == str(code) and ran["lightning_srifty"].startswith(str(image_env)), ran
    assert not (home / f"env-{snapshot.sha256}").exists()  # no virtual environment of srifty's own: the image's
    assert "`Trainer.fit` stopped: `max_steps=2` reached" in log


# EC2 takes 16,384 bytes of raw user data (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html); the
# module's user_data is a fixed first stage well under it, whatever the options: 14 KiB is the bound issue #35 set
USER_DATA_BOUND = 14 * 1024


@pytest.mark.parametrize("variant", ["default", "everything"])
def test_user_data_stays_small_whatever_the_options(tf_env, moto_endpoint, tmp_path, catalog, variant) -> None:
    """Issue #35 H3: user_data went over EC2's 16,384 bytes (default 16,213 B; srifty launch's fleet, one
    --secret-env, an FSDP plan, a 40-character --name, a setup command over ~170 characters each pushed it past) and
    the apply failed on AWS (moto takes any size). Now it is a fixed first stage: its size does not grow with the
    options; the boot script it fetches carries them, checked by its sha256. 'everything' is every variant at once
    (a mixed fleet: a template per type)."""
    dlami_parameters(moto_endpoint)
    plan = load_plan(ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json")
    if variant == "default":
        options, choice = Options(aws_endpoint=moto_endpoint, bucket="size-ckpt", stall_timeout_s=60), 0
    else:
        plan, choice = fleet_plan(catalog, ("g5g.xlarge", "g5.xlarge"), "g5g.xlarge:1,g5.xlarge:1")
        entries = [
            dataclasses.replace(e, layout=plan_layout("fsdp:full_shard+ac", "LlamaDecoderLayer")) for e in plan.entries
        ]
        plan = dataclasses.replace(plan, entries=entries)
        options = Options(
            name="a" * 40,
            aws_endpoint=moto_endpoint,
            bucket="size-ckpt",
            handover=True,
            resume_from="s3://size-ckpt/checkpoints/" + "r" * 200 + ".ckpt",
            secret_env=tuple(f"SECRET_{k}=ssm:/team/a-rather-long-parameter-name-{k}" for k in range(8)),
            setup_command="pip install " + " ".join(f"package-number-{k}==1.0" for k in range(200)),  # 5 KB
            train_command="train.py " + " ".join(f"--option-{k} value-{k}" for k in range(100)),
        )
    infra = use_test_parameters(generate(plan, tmp_path / "infra", choice=choice, options=options, catalog=catalog).out)
    templates = planned(tf_env, infra, "aws_launch_template")
    boots = {v["key"]: v["content"] for a, v in planned(tf_env, infra, "aws_s3_object").items() if ".boot[" in a}
    assert len(templates) == len(boots) == len(plan.entries[choice].groups)
    for lt in templates.values():
        first = base64.b64decode(lt["user_data"])
        assert len(first) <= USER_DATA_BOUND, len(first)
        # the first stage names one boot script by its digest, and that script is this group's
        (key,) = [k for k in boots if f"/{lt['instance_type']}-" in k]
        assert hashlib.sha256(boots[key].encode()).hexdigest() in first.decode() and "/boot/" in key
    if variant == "everything":  # what user_data would have been: past EC2's limit, refused at the apply
        assert min(len(text.encode()) for text in boots.values()) > 16_384
    # the nodes' watch, through the root and the module, on every fleet: its limit never shorter than the job's grace
    # (1 min asked for here), which bounds a save; its training-stall rule none under srifty launch (handover and
    # heartbeat), whose launcher watches the training, but a hung teardown and a script silent after its training the
    # nodes' there too (the launcher cannot see them: a review)
    values = json.loads((infra / TFVARS).read_text())["watchdog"]
    grace = values["grace_s"]
    assert grace > 60
    watch, stall = (grace, grace) if variant == "default" else (max(values["stall_s"], grace), 0)
    assert watch >= 1200 or variant == "default"
    for text in boots.values():
        assert "STALLWATCH_PID=$!" in text
        assert f'[ "$age" -ge "${{SRIFTY_STALL_S:-{min(watch, 300)}}}" ] && running; then' in text  # the teardown's
        assert f'[ "$over" = 0 ] && [ {stall} -gt 0 ] || continue' in text  # the training's, or none
        assert f'limit=$(awk -v s="${{SRIFTY_STALL_S:-{stall}}}"' in text


def test_the_fault_proxy_refuses_user_data_over_ec2s_limit(moto_endpoint) -> None:
    """The rule written into the tests' EC2: over 16,384 raw bytes, RunInstances and CreateLaunchTemplate are
    refused (InvalidParameterValue), as EC2 refuses them; moto alone takes them."""
    from botocore.exceptions import ClientError
    from fault_proxy import USER_DATA_LIMIT, FaultProxy

    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    proxy = FaultProxy(moto_endpoint)
    with proxy as url:
        client = boto3.client("ec2", endpoint_url=url, region_name="us-east-1")
        # RunInstances: boto3 base64-encodes UserData itself; a launch template's is given encoded
        client.run_instances(ImageId=image, MinCount=1, MaxCount=1, UserData="#" * USER_DATA_LIMIT)  # at the limit
        with pytest.raises(ClientError, match=r"InvalidParameterValue.*User data is limited to 16384 bytes"):
            client.run_instances(ImageId=image, MinCount=1, MaxCount=1, UserData="#" * (USER_DATA_LIMIT + 1))
        over = base64.b64encode(b"#" * (USER_DATA_LIMIT + 1)).decode()
        with pytest.raises(ClientError, match="InvalidParameterValue"):
            client.create_launch_template(LaunchTemplateName="too-long", LaunchTemplateData={"UserData": over})
        assert proxy.too_long == [f"RunInstances:{USER_DATA_LIMIT + 1}", f"CreateLaunchTemplate:{USER_DATA_LIMIT + 1}"]


def test_the_fault_proxy_keeps_a_groups_mixed_policy_through_an_update_that_names_none(moto_endpoint) -> None:
    """The rule written into the tests' Auto Scaling: an UpdateAutoScalingGroup that names no launch specification
    leaves the group's mixed instances policy as it was ("Any properties that you don't specify are not changed",
    the API reference of UpdateAutoScalingGroup); moto's server drops it. CI met it on 2026-11-30: an apply retried
    after a transient error updated the heterogeneous fleet's group in place (desired_capacity_type, which moto does
    not echo), and the group was left without its instance types. Here an update while moto checks no signatures
    (the policy rides the call), then the node's watchdog's (--min-size 0), made with credentials that hold only that
    action while moto enforces IAM (the proxy's own call, signed by an administrator, puts the policy back)."""
    from fault_proxy import FaultProxy

    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    template = ec2.create_launch_template(
        LaunchTemplateName="mixed", LaunchTemplateData={"ImageId": image, "InstanceType": "g5.48xlarge"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    admin = _as_node(
        moto_endpoint,
        json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}),
        user="admin",
    )
    node = _as_node(
        moto_endpoint,
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "autoscaling:UpdateAutoScalingGroup", "Resource": "*"}],
            }
        ),
    )
    policy = {
        "LaunchTemplate": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
            "Overrides": [
                {"InstanceType": "g5.48xlarge", "WeightedCapacity": "3"},
                {"InstanceType": "g6.48xlarge", "WeightedCapacity": "2"},
            ],
        },
        "InstancesDistribution": {"OnDemandBaseCapacity": 3, "SpotAllocationStrategy": "price-capacity-optimized"},
    }
    proxy = FaultProxy(moto_endpoint, keep_host=True)  # the clients' signed Host passes: moto checks signatures

    def overrides(client) -> list[str]:
        (group,) = client.describe_auto_scaling_groups(AutoScalingGroupNames=["fleet-a"])["AutoScalingGroups"]
        return [
            o["InstanceType"]
            for o in group.get("MixedInstancesPolicy", {}).get("LaunchTemplate", {}).get("Overrides", [])
        ]

    with proxy as url:

        def client(keys: dict[str, str]):
            return boto3.client(
                "autoscaling",
                endpoint_url=url,
                region_name="us-east-1",
                aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
            )

        client(admin).create_auto_scaling_group(
            AutoScalingGroupName="fleet-a",
            MinSize=0,
            MaxSize=12,
            DesiredCapacity=0,
            MixedInstancesPolicy=policy,
            AvailabilityZones=["us-east-1a"],
        )
        # moto checks no signatures (terraform's applies in the tests): the policy rides the update itself
        client(admin).update_auto_scaling_group(AutoScalingGroupName="fleet-a", MaxSize=9)
        assert overrides(client(admin)) == ["g5.48xlarge", "g6.48xlarge"] and proxy.policies_kept == ["fleet-a"]
        # IAM enforced (a rehearsal's nodes): the client's signed call passes as sent, the proxy's own puts it back
        proxy.credentials = (admin["AWS_ACCESS_KEY_ID"], admin["AWS_SECRET_ACCESS_KEY"])
        _enforce_iam(moto_endpoint, True)
        try:
            client(node).update_auto_scaling_group(AutoScalingGroupName="fleet-a", MinSize=0)  # the watchdog's call
            assert overrides(client(admin)) == ["g5.48xlarge", "g6.48xlarge"]
            assert proxy.policies_kept == ["fleet-a", "fleet-a"] and not proxy.policy_failures
            # a group given a single launch template instead is left with it: nothing is put back
            client(admin).update_auto_scaling_group(
                AutoScalingGroupName="fleet-a", LaunchTemplate={"LaunchTemplateId": template, "Version": "$Latest"}
            )
            client(node).update_auto_scaling_group(AutoScalingGroupName="fleet-a", MaxSize=6)
            assert overrides(client(admin)) == [] and proxy.policies_kept == ["fleet-a", "fleet-a"]
        finally:
            _enforce_iam(moto_endpoint, False)


def test_a_node_finds_and_resumes_its_checkpoint_under_the_instance_roles_policy(
    tf_env, moto_endpoint, tmp_path, catalog, monkeypatch
) -> None:
    """Issue #35 H4: find_checkpoint HEADed the folder's own key (checkpoints/<name>, no slash), which the module's
    instance policy does not grant: every resume on a fleet failed with PermissionError. Here the node's credentials
    hold exactly the policy terraform plans for the role (moto enforces actions and resources), and the fault proxy
    answers S3 as AWS answers a role whose ListBucket carries an s3:prefix condition (a listing outside the prefix,
    and a HEAD of a missing key, are 403). A replacement node (SRIFTY_RESUME=latest, what user_data exports) resumes
    from the newest sound checkpoint; an empty folder is a first start, not an error."""
    import io

    import s3fs
    import torch
    from fault_proxy import FaultProxy

    from lightning_srifty.migrate.checkpoints import DIGEST_SUFFIX, find_checkpoint, resume_checkpoint

    dlami_parameters(moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="iam-ckpt")
    plan = load_plan(ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json")
    options = Options(name="iam-run", aws_endpoint=moto_endpoint, bucket="iam-ckpt")
    infra = use_test_parameters(generate(plan, tmp_path / "infra", options=options, catalog=catalog).out)
    (role_policy,) = planned(tf_env, infra, "aws_iam_role_policy").values()
    prefix = "checkpoints/iam-run/"
    statements = json.loads(role_policy["policy"])["Statement"]
    (listing,) = [st for st in statements if st.get("Sid") == "ListCheckpointPrefix"]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [prefix, prefix + "*"]
    for step in (100, 200):
        buf = io.BytesIO()
        torch.save({"state_dict": {"w": torch.ones(2)}, "global_step": step}, buf)
        s3.put_object(Bucket="iam-ckpt", Key=f"{prefix}step={step}.ckpt", Body=buf.getvalue())
        digest = hashlib.sha256(buf.getvalue()).hexdigest()
        s3.put_object(Bucket="iam-ckpt", Key=f"{prefix}step={step}.ckpt{DIGEST_SUFFIX}", Body=f"{digest}  x\n")
    node = _as_node(moto_endpoint, role_policy["policy"])
    proxy = FaultProxy(moto_endpoint, s3_list_prefixes=(prefix,))
    with proxy as url:
        for name, value in {
            **node,
            "AWS_ENDPOINT_URL": url,
            "SRIFTY_CHECKPOINT_URI": f"s3://iam-ckpt/{prefix}",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("SRIFTY_RESUME", "latest")
        _enforce_iam(moto_endpoint, True)
        try:
            s3fs.S3FileSystem.clear_instance_cache()
            assert find_checkpoint(f"s3://iam-ckpt/{prefix}") == f"s3://iam-ckpt/{prefix}step=200.ckpt"
            resumed = resume_checkpoint(str(tmp_path / "cache"))
            assert resumed == f"s3://iam-ckpt/{prefix}step=200.ckpt"
            # the same role may not read outside its prefix: a refusal is raised, never read as "no checkpoint"
            with pytest.raises(PermissionError):
                find_checkpoint("s3://iam-ckpt/checkpoints/other-run/")
            _enforce_iam(moto_endpoint, False)
            for step in (100, 200):
                for suffix in ("", DIGEST_SUFFIX):
                    s3.delete_object(Bucket="iam-ckpt", Key=f"{prefix}step={step}.ckpt{suffix}")
            s3.put_object(Bucket="iam-ckpt", Key=f"{prefix}logs/iam-run/i-1.log", Body=b"boot")  # not a checkpoint
            _enforce_iam(moto_endpoint, True)
            s3fs.S3FileSystem.clear_instance_cache()
            assert find_checkpoint(f"s3://iam-ckpt/{prefix}") is None  # a first start
            assert resume_checkpoint(str(tmp_path / "cache")) is None
        finally:
            _enforce_iam(moto_endpoint, False)
            s3fs.S3FileSystem.clear_instance_cache()
    assert proxy.s3_refused  # the conditioned-ListBucket rule was met (s3fs's parent listing, or a missing key)


# The two-node walk under the role's policy (boot minutes apart, train together, a spot notice, the resume on the
# Auto Scaling group's replacements) is srifty rehearse's own test: tests/infra/test_rehearse.py.


def test_each_group_of_a_mixed_fleet_tells_its_nodes_their_plan_group(tf_env, moto_endpoint, tmp_path, catalog):
    """Issue #35 item 7 on a mix: torchrun numbers ranks in join order, so the module cannot pass the plan's per-rank
    list; every boot script carries the plan's groups and exports its own group's key (the instance type), which
    the strategies gather at set-up (tests/job/test_multinode.py trains on it)."""
    dlami_parameters(moto_endpoint)
    plan, choice = fleet_plan(catalog, ("g5g.xlarge", "g5.xlarge"), "g5g.xlarge:1,g5.xlarge:1")
    entry = plan.entries[choice]
    assert len(set(entry.rank_batches() or ())) > 1  # the two types take different batches
    options = Options(aws_endpoint=moto_endpoint, bucket="mix-ckpt")
    infra = use_test_parameters(generate(plan, tmp_path / "infra", choice=choice, options=options, catalog=catalog).out)
    boots = {v["key"]: v["content"] for a, v in planned(tf_env, infra, "aws_s3_object").items() if ".boot[" in a}
    groups = ";".join(f"{g.instance_type}={','.join(map(str, g.micro_batches))}" for g in entry.groups)
    for group in entry.groups:
        (text,) = [t for k, t in boots.items() if f"/{group.instance_type}-" in k]
        assert f"export SRIFTY_NODE_GROUP={group.instance_type}\n" in text
        (env_b64,) = re.findall(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d \| python3", text)
        env = json.loads(base64.b64decode(env_b64))
        assert env["SRIFTY_BATCH_GROUPS"] == groups and "SRIFTY_BATCH_SIZES" not in env
