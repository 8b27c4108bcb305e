"""Pre-flight before any money is spent (issue #22 item 3): boto3 against moto's server (EC2 offerings and instances,
S3, STS) and a local fake of the Service Quotas API (moto's knows only VPC quotas); `srifty check` and `srifty
apply`, which refuses before terraform runs."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from quotas_server import FakeServiceQuotas

from lightning_srifty.cli import main
from lightning_srifty.provision.apply import apply
from lightning_srifty.provision.preflight import (
    Group,
    check_bucket_answers,
    check_imports,
    clients,
    preflight,
    preflight_root,
    quota_class,
)
from lightning_srifty.provision.terraform.generate import TFVARS, Options, generate
from lightning_srifty.provision.terraform.script_imports import imported_modules
from lightning_srifty.provision.terraform.snapshot import build_snapshot
from predictor.documents.plan import load_plan
from predictor.exceptions import PreflightError

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"  # g5.xlarge x 1, on demand
VCPUS = {"g5.xlarge": 4, "g5.12xlarge": 48, "p4d.24xlarge": 96, "p5.48xlarge": 192, "m5.large": 2}


@pytest.fixture
def aws(moto_endpoint, monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    return moto_endpoint


CLASSES = "p5.48xlarge:p5 p5en.48xlarge:p5 p4d.24xlarge:p g6e.xlarge:g vt1.3xlarge:g trn1.32xlarge:trn inf2.xlarge:inf"


@pytest.mark.parametrize(
    ("itype", "cls"), [pair.split(":") for pair in (CLASSES + " dl1.24xlarge:dl m5.large:standard").split()]
)
def test_instance_types_map_to_their_vcpu_quota_class(itype, cls) -> None:
    assert quota_class(itype) == cls


def test_a_fleet_over_the_accounts_quota_is_caught_with_the_request_to_file(aws, monkeypatch) -> None:
    ec2 = boto3.client("ec2", endpoint_url=aws, region_name="us-east-1")
    ec2.run_instances(ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1, MaxCount=1)  # 4 vCPUs in use
    with FakeServiceQuotas({"Running On-Demand G and VT instances": 8.0}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        report = preflight(
            region="us-east-1",
            groups=[Group("g5.xlarge", 2, 0), Group("p4d.24xlarge", 0, 1)],
            vcpus=VCPUS.__getitem__,
            aws=clients("us-east-1", aws),
        )
    quota = {f.message.split(":")[0]: f for f in report.findings if f.check == "quota"}
    g = quota["Running On-Demand G and VT instances (L-DB2E81BA)"]
    assert g.status == "fail" and "needs 8 vCPUs, the quota is 8 with 4 in use" in g.message
    assert g.fix.startswith(
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA "
        "--desired-value 12 --region us-east-1"
    )
    p = quota["All P4, P3 and P2 Spot Instance Requests (L-7212CCBC)"]
    assert p.status == "fail" and "--desired-value 96" in p.fix
    assert not report.ok and "2 problem(s): nothing was started" in report.text()
    assert {f.check: f.status for f in report.findings if f.check != "quota"} == {
        "credentials": "ok",
        "offering": "ok",
        "bucket": "ok",
        "volumes": "warn",  # moto's server answers no GetEbsDefaultKmsKeyId (a 500): not checked, and said
    }


def test_quotas_that_cannot_be_read_are_a_warning_that_says_so(aws, monkeypatch) -> None:
    with FakeServiceQuotas(fail="AccessDeniedException") as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        report = preflight(
            region="us-east-1",
            groups=[Group("g5.xlarge", 1, 0)],
            vcpus=VCPUS.__getitem__,
            aws=clients("us-east-1", aws),
        )
    (quota,) = [f for f in report.findings if f.check == "quota"]
    assert quota.status == "warn" and "AccessDeniedException" in quota.message and report.ok


def test_a_quota_server_answering_a_string_leaves_that_quota_unchecked(aws, monkeypatch) -> None:
    """Issue #36 L4: a quota whose value is not a number (a string) was a traceback; it is "not checked", as a
    missing one is, and the others are still checked."""
    with FakeServiceQuotas({"Running On-Demand G and VT instances": "lots"}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        report = preflight(
            region="us-east-1",
            groups=[Group("g5.xlarge", 1, 0), Group("m5.large", 1, 0)],
            vcpus=VCPUS.__getitem__,
            aws=clients("us-east-1", aws),
        )
    quota = sorted(f.message for f in report.findings if f.check == "quota")
    assert "no quota named 'Running On-Demand G and VT instances' in us-east-1's listing: not checked" in quota
    assert any(m.startswith("Running On-Demand Standard") and "allowed" in m for m in quota), quota


def test_an_aws_profile_that_does_not_exist_is_one_line_with_the_fix(monkeypatch, capsys, tmp_path) -> None:
    """Issue #36 L4: AWS_PROFILE=nope was a botocore traceback in check, apply and recommend --launchable."""
    from lightning_srifty.cli import main

    monkeypatch.setenv("AWS_PROFILE", "nope")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    profile = str(ROOT / "examples/profiles/resnet50-v100.json")
    code = main(["recommend", "--profile", profile, "--steps", "1000", "--launchable", "--region", "us-east-1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "the AWS profile 'nope' (AWS_PROFILE) is in neither ~/.aws/config nor ~/.aws/credentials" in err
    # srifty status (and logs, down: aws.aws_errors) said "The config profile (nope) could not be found." with
    # no fix (the hardening probe, bench/hardening_probe.py)
    assert main(["status", "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert "(AWS_PROFILE) is in neither" in err and "unset AWS_PROFILE" in err, err


def test_a_type_missing_from_the_subnets_zone_names_the_zones_that_have_it(aws, monkeypatch) -> None:
    with FakeServiceQuotas({"Running On-Demand G and VT instances": 64}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        made = clients("us-east-1", aws)
        ok = preflight(region="us-east-1", groups=[Group("g5.xlarge", 1, 0)], vcpus=VCPUS.__getitem__, aws=made)
        zones = next(f.message for f in ok.findings if f.check == "offering")  # "every type is offered in ..."
        assert ok.ok and zones.startswith("every type is offered in us-east-1")
        bad = preflight(
            region="us-east-1",
            groups=[Group("g5.xlarge", 1, 0)],
            vcpus=VCPUS.__getitem__,
            zone="us-east-1z",
            bucket="no-such-bucket-srifty",
            aws=made,
        )
    failed = {f.check: f for f in bad.failed()}
    assert "g5.xlarge is not offered in us-east-1z" in failed["offering"].message
    assert failed["offering"].fix.startswith("srifty terraform --availability-zone us-east-1")
    assert "the checkpoint bucket no-such-bucket-srifty does not answer" in failed["bucket"].message


def test_a_fleet_in_the_teams_own_subnets_is_checked_in_their_zones(aws, monkeypatch) -> None:
    """An infra team's subnet in a zone without the fleet's type passed as "every type is offered in
    us-east-1a...f", and a subnet that does not exist went unchecked: on AWS the Auto Scaling group never launches
    while the apply reports success. The subnets' zones are read (describe_subnets) and each type must be offered in
    one of them; an EFA fleet, which the module puts in the first subnet alone, in that one."""
    from lightning_srifty.provision.aws import offered_zones

    ec2 = boto3.client("ec2", endpoint_url=aws, region_name="us-east-1")
    zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]]
    itype, offered = next(
        (t, z) for t, z in offered_zones(ec2, ["g6.12xlarge", "g5.12xlarge", "p4d.24xlarge"]).items()
        if z and set(zones) - z
    )  # fmt: skip
    missing, there = sorted(set(zones) - offered)[0], sorted(offered)[0]
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    subnet = {
        zone: ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.7.{i}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        for i, zone in enumerate((missing, there))
    }
    with FakeServiceQuotas({"Running On-Demand G and VT instances": 512, "Running On-Demand P instances": 512}) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", url)
        made = clients("us-east-1", aws)

        def offering(subnets, efa=False):
            report = preflight(region="us-east-1", groups=[Group(itype, 1, 0)], vcpus=lambda t: 8, aws=made,
                               subnet_ids=subnets, efa=efa)  # fmt: skip
            return next(f for f in report.findings if f.check == "offering")

        alone = offering([subnet[missing]])
        assert (
            alone.status == "fail" and f"{itype} is offered in none of the subnets' zones ({missing})" in alone.message
        )
        assert alone.fix.startswith("add a subnet in ") and there in alone.fix
        both = offering([subnet[missing], subnet[there]])
        assert both.status == "ok" and missing in both.message and there in both.message
        efa = offering([subnet[missing], subnet[there]], efa=True)  # the first subnet alone
        assert efa.status == "fail" and f"{itype} is not offered in {missing}, the fleet's subnet's zone" in efa.message
        gone = offering(["subnet-0123456789abcdef0"])
        assert gone.status == "fail" and "could not be read in us-east-1" in gone.message, gone


def _snapshot(tmp_path: Path, script: str, requirements: str | None = None):
    project = tmp_path / "project"
    (project / "mylib").mkdir(parents=True)
    (project / "mylib" / "__init__.py").write_text("")
    (project / "train.py").write_text(script)
    spec = {"packages": ["torch==2.13.0", "lightning==2.6.6"], "requirements": None}
    if requirements is not None:
        (project / "requirements.txt").write_text(requirements)
        spec["requirements"] = "requirements.txt"
    return build_snapshot(project, tmp_path / "out", spec)


def test_the_scripts_imports_must_resolve_in_the_nodes_environment(tmp_path) -> None:
    script = "import os, json\nimport numpy as np\nimport lightning.pytorch as pl\nfrom mylib import x\nimport wandb\n"
    assert set(imported_modules(script)) == {"os", "json", "numpy", "lightning", "mylib", "wandb"}
    assert not any(imported_modules(script).values())  # every one is needed to run
    findings = check_imports(_snapshot(tmp_path / "a", script), ["train.py"])
    (imports,) = [f for f in findings if f.check == "imports"]
    assert imports.status == "fail" and "imports wandb, which neither" in imports.message
    # numpy comes with torch, lightning with its pin, mylib with the code; wandb once it is a requirement
    findings = check_imports(_snapshot(tmp_path / "b", script, "wandb>=0.16  # logging\n"), ["train.py"])
    assert [f.status for f in findings] == ["ok", "ok", "ok"]
    broken = check_imports(_snapshot(tmp_path / "c", "def f(:\n"), ["train.py"])
    assert broken[0].status == "fail" and "does not parse" in broken[0].message


@pytest.mark.parametrize(
    ("script", "setup", "status", "said"),
    [
        # an optional logger: the script runs without it, so the nodes train (a warning names it)
        ("try:\n    import wandb\nexcept ImportError:\n    wandb = None\n", None, "warn", "only under try/except"),
        (
            "try:\n    from wandb import init\nexcept (ModuleNotFoundError, OSError):\n    init = None\n",
            None,
            "warn",
            "only under try/except",
        ),
        ("try:\n    import wandb\nexcept:\n    pass\n", None, "warn", "only under try/except"),
        # types only: never imported at run time
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import wandb\n", None, "ok", ""),
        ("import typing\nif typing.TYPE_CHECKING:\n    from wandb import Run\n", None, "ok", ""),
        # a handler that does not take an ImportError, or the same name imported plainly elsewhere: needed
        ("try:\n    import wandb\nexcept ValueError:\n    pass\n", None, "fail", "imports wandb, which neither"),
        ("try:\n    import wandb\nexcept ImportError:\n    pass\nimport wandb.sdk\n", None, "fail", "imports wandb,"),
        (
            "try:\n    pass\nexcept ImportError:\n    import wandb\n",
            None,
            "fail",
            "imports wandb,",
        ),  # the fallback runs
        # a handler that re-raises or exits with a message makes the import required
        (
            "try:\n    import wandb\nexcept ImportError as e:\n    raise SystemExit('pip install wandb') from e\n",
            None,
            "fail",
            "imports wandb,",
        ),
        (
            "import sys\ntry:\n    import wandb\nexcept ImportError:\n    sys.exit('no wandb')\n",
            None,
            "fail",
            "imports wandb,",
        ),
        # a function's body runs later, outside the try around its def; TYPE_CHECKING wins over a try inside it
        ("try:\n    def log():\n        import wandb\nexcept ImportError:\n    pass\n", None, "fail", "imports wandb,"),
        ("if TYPE_CHECKING:\n    try:\n        import wandb\n    except ImportError:\n        pass\n", None, "ok", ""),
        # a setup command that installs packages may provide it: not refused, but said; `true` installs nothing
        ("import wandb\n", "pip install wandb", "warn", "unless the --setup-command installs it"),
        ("import wandb\n", "true", "fail", "imports wandb,"),
    ],
)
def test_an_import_the_script_can_run_without_is_not_refused(tmp_path, script, setup, status, said) -> None:
    """A trial's note: an import the nodes' environment does not provide failed the check (`srifty apply` refused
    the fleet) even where the script guards it with ``try: ... except ImportError`` (an optional logger), imports it
    only for type checkers, or the --setup-command installs it."""
    findings = [f for f in check_imports(_snapshot(tmp_path, script), ["train.py"], setup) if f.check == "imports"]
    worst = (
        "fail"
        if any(f.status == "fail" for f in findings)
        else "warn"
        if any(f.status == "warn" for f in findings)
        else "ok"
    )
    assert worst == status, findings
    assert said in " ".join(f.message for f in findings), findings


@pytest.mark.parametrize(
    ("script", "argv", "status", "where"),
    [
        (
            'import lightning as L\nt = L.Trainer(max_steps=5, accelerator="cpu", devices=1)\n',
            [],
            "fail",
            ":2: Trainer(",
        ),
        ("from lightning.fabric import Fabric\nf = Fabric(accelerator='mps')\n", [], "fail", ":2: Fabric("),
        ('import lightning.pytorch as pl\nt = pl.Trainer(accelerator="auto")\n', [], "ok", ""),
        ('import lightning.pytorch as pl\nt = pl.Trainer(accelerator="cpu" if CPU else "gpu")\n', [], "ok", ""),
        (
            ARGPARSE
            := 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--accelerator", default="cpu")\n',
            ["--max-steps", "9"],
            "warn",
            ":3: --accelerator defaults to 'cpu'",
        ),
        (ARGPARSE, ["--accelerator", "gpu"], "ok", ""),
        (ARGPARSE, ["--accelerator=auto"], "ok", ""),
        (ARGPARSE, ["--accelerator", "cpu"], "warn", "the train command passes --accelerator cpu:"),
        (ARGPARSE, ["--accel", "gpu"], "ok", ""),  # argparse's prefix of the flag
        # a CPU fallback, an export helper beside the training Trainer, a debug branch: likely, not certain
        (
            "import torch, lightning as L\nif torch.cuda.is_available():\n    t = L.Trainer(accelerator='gpu')\n"
            "else:\n    t = L.Trainer(accelerator='cpu')\n",
            [],
            "warn",
            ":5: Trainer(",
        ),
        (
            "import lightning as L\ndef export(m):\n    L.Trainer(accelerator='cpu').predict(m)\n"
            "def main():\n    L.Trainer(max_steps=9).fit(M())\n",
            [],
            "warn",
            ":3: Trainer(",
        ),
        (
            "import lightning as L\ndef main():\n    t = L.Trainer(accelerator='CPU')\n    t.fit(M())\n",
            [],
            "fail",
            ":3: Trainer(",
        ),
    ],
)
def test_a_script_that_pins_its_training_to_the_cpu_does_not_reach_a_gpu_fleet(
    tmp_path, script, argv, status, where
) -> None:
    """A script profiled on a laptop often says accelerator="cpu": torchrun would then train on the nodes' CPUs, quietly
    and far slower than predicted (found on a new user's walk). A literal in a Trainer / Fabric call fails the check;
    an --accelerator flag defaulting to it that the train command leaves unset, or the train command's own
    --accelerator cpu, warns; a value chosen at run time passes."""
    findings = check_imports(_snapshot(tmp_path, script), ["train.py", *argv])
    (device,) = [f for f in findings if f.check == "device"]
    assert device.status == status, device
    if where:
        assert (
            where if where.startswith("the train") else f"train.py{where}"
        ) in device.message and "far slower than predicted" in device.message
        assert "auto" in device.fix


TRAINS = "import lightning\n"  # a module that needs nothing the nodes lack


# each: the project's files, the command's argv, the check's worst status, a part of what it says
WALK_CASES = [
    # a helper module's package, reached through the script's import: what the script never names
    (
        {"train.py": "from models.net import Net\n", "models/__init__.py": "", "models/net.py": "import timm\n"},
        ["train.py"],
        "fail",
        "models/net.py (train.py -> models/net.py) imports timm, which neither",
    ),
    # a package's __init__ runs, and its relative imports bring their modules in
    (
        {
            "train.py": "import models\n",
            "models/__init__.py": "from .net import Net\n",
            "models/net.py": "import timm\n",
        },
        ["train.py"],
        "fail",
        "models/net.py (train.py -> models/__init__.py -> models/net.py) imports timm,",
    ),
    # the script's own and a module's, each said with its file (the script's first)
    (
        {"train.py": "import wandb\nimport helpers\n", "helpers.py": "from albumentations import Compose\n"},
        ["train.py"],
        "fail",
        "train.py imports wandb; helpers.py (train.py -> helpers.py) imports albumentations: what neither",
    ),
    # a module only a guarded import reaches: the script runs without it
    (
        {
            "train.py": "try:\n    import extras\nexcept ImportError:\n    extras = None\n",
            "extras.py": "import wandb\n",
        },
        ["train.py"],
        "warn",
        "extras.py (train.py -> extras.py) imports wandb only under try/except ImportError, an if asking whether",
    ),
    # ...unless another import reaches it unguarded
    (
        {
            "train.py": "try:\n    import extras\nexcept ImportError:\n    pass\nimport helpers\n",
            "helpers.py": "import extras\n",
            "extras.py": "import wandb\n",
        },
        ["train.py"],
        "fail",
        "extras.py (train.py -> helpers.py -> extras.py) imports wandb, which",
    ),
    # a script in a folder finds its neighbours first (sys.path[0] is its folder)
    (
        {"scripts/train.py": "import utils\n", "scripts/utils.py": "import timm\n", "utils/__init__.py": ""},
        ["scripts/train.py"],
        "fail",
        "scripts/utils.py (scripts/train.py -> scripts/utils.py) imports timm,",
    ),
    # python -m runs the packages' __init__ first
    (
        {"pkg/__init__.py": "import timm\n", "pkg/train.py": TRAINS},
        ["-m", "pkg.train"],
        "fail",
        "pkg/__init__.py (python -m pkg.train -> pkg/__init__.py) imports timm,",
    ),
    # from a package import a module of it; a namespace package (no __init__.py)
    (
        {"train.py": "from pkg import sub\n", "pkg/__init__.py": "", "pkg/sub.py": "import timm\n"},
        ["train.py"],
        "fail",
        "pkg/sub.py (train.py -> pkg/sub.py) imports timm,",
    ),
    (
        {"train.py": "from space.mod import f\n", "space/mod.py": "import timm\n"},
        ["train.py"],
        "fail",
        "space/mod.py (train.py -> space/mod.py) imports timm,",
    ),
    # an import under a test of whether the package is there (Lightning's and transformers' idiom): optional; the
    # else branch runs when it is not there
    (
        {
            "train.py": "import helpers\n",
            "helpers.py": "from flags import _SERVE_AVAILABLE\nif _SERVE_AVAILABLE:\n    import litserve\n",
            "flags.py": "from lightning_utilities.core.imports import RequirementCache\n"
            "_SERVE_AVAILABLE = RequirementCache('litserve')\n",
        },
        ["train.py"],
        "warn",
        "helpers.py (train.py -> helpers.py) imports litserve only under try/except ImportError, an if asking",
    ),
    (
        {
            "train.py": "import helpers\n",
            "helpers.py": "import importlib.util\nif importlib.util.find_spec('wandb') is not None:\n"
            "    import wandb\nelse:\n    import timm\n",
        },
        ["train.py"],
        "fail",
        "helpers.py (train.py -> helpers.py) imports timm, which",
    ),
    # a library's lazy import, in a project module's function: the nodes fail only if the job calls it
    (
        {"train.py": "import helpers\n", "helpers.py": "def export():\n    import onnx\n"},
        ["train.py"],
        "warn",
        "helpers.py (train.py -> helpers.py) imports onnx only in a function's body (there, or on the way",
    ),
    (
        {
            "train.py": "import helpers\n",
            "helpers.py": "def plot():\n    from viz import draw\n",
            "viz.py": "import matplotlib_srifty_absent\n",
        },
        ["train.py"],
        "warn",
        "viz.py (train.py -> helpers.py -> viz.py) imports matplotlib_srifty_absent only in a function's body",
    ),
    # ...the script's own functions run (its main), and a module-level import of the same name wins
    (
        {"train.py": "def main():\n    import helpers\n", "helpers.py": "import timm\n"},
        ["train.py"],
        "fail",
        "helpers.py (train.py -> helpers.py) imports timm, which",
    ),
    (
        {"train.py": "import helpers\n", "helpers.py": "import timm\ndef f():\n    import timm.layers\n"},
        ["train.py"],
        "fail",
        "helpers.py (train.py -> helpers.py) imports timm, which",
    ),
    # a module of the project this machine's Python cannot parse (the nodes' may be newer): a warning
    (
        {"train.py": "import helpers\n", "helpers.py": "def f(:\n"},
        ["train.py"],
        "warn",
        "helpers.py (train.py -> helpers.py) does not parse with this machine's Python",
    ),
    # a module's own test block never runs when it is imported (the script's does: it is __main__)
    (
        {"train.py": "import net\n", "net.py": "X = 1\nif __name__ == '__main__':\n    import torchsummary\n"},
        ["train.py"],
        "ok",
        "with those of the 1 project modules it imports",
    ),
    # a device's availability is no package's: on the GPU nodes that branch runs
    (
        {
            "train.py": "import helpers\n",
            "helpers.py": "import torch\nif torch.cuda.is_available():\n    import apex\n",
        },
        ["train.py"],
        "fail",
        "helpers.py (train.py -> helpers.py) imports apex, which",
    ),
    # a branch on the Python version or the platform: which one runs is the nodes' Python's
    (
        {
            "train.py": "import cfg\n",
            "cfg.py": "import sys\nif sys.version_info >= (3, 11):\n    import tomllib\nelse:\n    import tomli\n",
        },
        ["train.py"],
        "warn",
        "cfg.py (train.py -> cfg.py) imports tomli only under",
    ),
    # a method's import too: a LightningModule's run, but a library's many DataModules (litgpt's) run one
    (
        {
            "train.py": "from model import Net\n",
            "model.py": "import lightning as L\nclass Net(L.LightningModule):\n    def configure_model(self):\n"
            "        import timm\n",
        },
        ["train.py"],
        "warn",
        "model.py (train.py -> model.py) imports timm only in a function's body",
    ),
    # a data folder (no Python beneath) is no package: an installed one of that name wins (wandb's run folder); a
    # folder of data in the script's folder does not hide the top's regular package either
    (
        {"train.py": "import wandb\n", "wandb/run-1/files/config.yaml": "a: 1\n"},
        ["train.py"],
        "fail",
        "train.py imports wandb, which",
    ),
    (
        {
            "scripts/train.py": "import sys\nsys.path.insert(0, '.')\nimport data\n",
            "scripts/data/x.csv": "1\n",
            "data/__init__.py": "import timm\n",
        },
        ["scripts/train.py"],
        "fail",
        "data/__init__.py (scripts/train.py -> data/__init__.py) imports timm,",
    ),
    # a script in a subfolder whose imports are at the code folder's top: Python does not look there
    (
        {"scripts/train.py": "from mypkg.model import Net\n", "mypkg/__init__.py": "", "mypkg/model.py": TRAINS},
        ["scripts/train.py"],
        "warn",
        "scripts/train.py imports mypkg, found at the code folder's top, not in scripts/ where Python looks",
    ),
    # ...unless the script puts the top on sys.path itself (rootutils' setup_root, sys.path.insert)
    (
        {
            "scripts/train.py": "import sys\nsys.path.insert(0, '.')\nfrom mypkg.model import Net\n",
            "mypkg/__init__.py": "",
            "mypkg/model.py": TRAINS,
        },
        ["scripts/train.py"],
        "ok",
        "with those of the 2 project modules it imports",
    ),
    # what is never imported at run time, a cycle, a module nothing imports, a requirement: nothing missing
    (
        {
            "train.py": "from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import typed\n",
            "a.py": "import b\n" + TRAINS,
            "b.py": "import a\nimport c\n",
            "c.py": "import numpy\n",
            "typed.py": "import timm\n",
            "unused.py": "import timm\n",
        },
        ["train.py"],
        "ok",
        "with those of the 3 project modules it imports",
    ),
    # a relative import in a script run by its path: it has no package (Python: "attempted relative import with
    # no known parent package"); as a module from the top it has one
    (
        {"train.py": "from .model import Net\n", "model.py": TRAINS},
        ["train.py"],
        "fail",
        "train.py runs 'from .model import Net', a relative import, but python runs train.py by its path",
    ),
    (
        {"pkg/__init__.py": "", "pkg/train.py": "from .model import Net\n", "pkg/model.py": TRAINS},
        ["pkg/train.py"],
        "fail",
        "pkg/train.py runs 'from .model import Net', a relative import",
    ),
    (
        {"pkg/__init__.py": "", "pkg/train.py": "from .model import Net\n", "pkg/model.py": TRAINS},
        ["-m", "pkg.train"],
        "ok",
        "with those of the 2 project modules it imports",
    ),
    # ...and above the top package, or in a top-level module a script imports
    (
        {"pkg/__init__.py": "", "pkg/train.py": "from ..common import f\n", "common.py": TRAINS},
        ["-m", "pkg.train"],
        "fail",
        "a relative import, but it goes above the top package it is imported in (1 package(s) deep): every node fails "
        "with 'ImportError: attempted relative import beyond top-level package'",
    ),
    (
        {"train.py": "import helpers\n", "helpers.py": "from .util import f\n", "util.py": TRAINS},
        ["train.py"],
        "fail",
        "helpers.py (train.py -> helpers.py) runs 'from .util import f', a relative import, but it is imported as a",
    ),
    # ...but not the dual-use idiom: the relative import guarded, its absolute fallback followed
    (
        {
            "train.py": "try:\n    from .model import Net\nexcept ImportError:\n    from model import Net\n",
            "model.py": "import timm\n",
        },
        ["train.py"],
        "fail",
        "model.py (train.py -> model.py) imports timm, which",
    ),
    # from a package import a name its __init__.py binds: the submodule of that name does not run...
    (
        {
            "train.py": "from pkg import build\n",
            "pkg/__init__.py": "def build():\n    pass\n",
            "pkg/build.py": "import timm\n",
        },
        ["train.py"],
        "ok",
        "with those of the 1 project modules it imports",
    ),
    # ...bound by an import of another name too; one it does not bind is imported (a PEP 562 __getattr__ or not)
    (
        {
            "train.py": "from pkg import build\n",
            "pkg/__init__.py": "from .impl import build\n",
            "pkg/impl.py": "def build():\n    pass\n",
            "pkg/build.py": "import timm\n",
        },
        ["train.py"],
        "ok",
        "with those of the 2 project modules it imports",
    ),
    (
        {
            "train.py": "from pkg import build\n",
            "pkg/__init__.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
            "pkg/build.py": "import timm\n",
        },
        ["train.py"],
        "fail",
        "pkg/build.py (train.py -> pkg/build.py) imports timm,",
    ),
    # from a package import *: the submodules its __all__ names run; without an __all__, none
    (
        {
            "train.py": "from pkg import *\n",
            "pkg/__init__.py": "__all__ = ['net']\n",
            "pkg/net.py": "import timm\n",
        },
        ["train.py"],
        "fail",
        "pkg/net.py (train.py -> pkg/net.py) imports timm,",
    ),
    (
        {"train.py": "from pkg import *\n", "pkg/__init__.py": "", "pkg/net.py": "import timm\n"},
        ["train.py"],
        "ok",
        "with those of the 1 project modules it imports",
    ),
    # a review's cases: the dual-use script that asks how it was run (the branch for __main__ runs; `if __package__:`
    # either); a guard that takes ModuleNotFoundError only (a refused relative import raises a plain ImportError)
    (
        {
            "train.py": "if __name__ == '__main__':\n    from model import Net\nelse:\n    from .model import Net\n",
            "model.py": TRAINS,
        },
        ["train.py"],
        "ok",
        "with those of the 1 project modules it imports",
    ),
    (
        {
            "scripts/train.py": "import os, sys\nif __package__:\n    from ..utils import helper\nelse:\n"
            "    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
            "    from utils import helper\n",
            "utils.py": "helper = 1\n",
        },
        ["scripts/train.py"],
        "ok",
        "with those of the 1 project modules it imports",
    ),
    (
        {"train.py": "from . import model as m\n", "model.py": TRAINS},
        ["train.py"],
        "fail",
        "fix: import absolutely ('import model as m'",
    ),
    (
        {
            "train.py": "try:\n    from .model import Net\nexcept ModuleNotFoundError:\n    from model import Net\n",
            "model.py": TRAINS,
        },
        ["train.py"],
        "fail",
        "train.py runs 'from .model import Net', a relative import",
    ),
    # ...a package's __init__.py that imports its submodule, then rebinds the name: the submodule runs; one whose
    # dotted name only ends like the package's is another package's
    (
        {
            "train.py": "import pkg\n",
            "pkg/__init__.py": "from . import version\nversion = version.V\n",
            "pkg/version.py": "import timm\nV = 1\n",
        },
        ["train.py"],
        "fail",
        "pkg/version.py (train.py -> pkg/__init__.py -> pkg/version.py) imports timm,",
    ),
    (
        {
            "train.py": "from pkg import y\n",
            "pkg/__init__.py": "from other.pkg import y\n",
            "other/__init__.py": "",
            "other/pkg.py": "y = 1\n",
            "pkg/y.py": "import timm\n",
        },
        ["train.py"],
        "ok",
        "with those of the 3 project modules it imports",
    ),
    # ...the same relative import reached lazily and then for sure: said for sure
    (
        {
            "train.py": "import a\nimport b\n",
            "a.py": "def f():\n    import helpers\n",
            "b.py": "import helpers\n",
            "helpers.py": "from .x import y\n",
            "x.py": "y = 1\n",
        },
        ["train.py"],
        "fail",
        "helpers.py (train.py -> b.py -> helpers.py) runs 'from .x import y'",
    ),
    # an import by a name written out, as importlib's
    (
        {
            "train.py": "import importlib\nnet = importlib.import_module('models.net')\n",
            "models/__init__.py": "",
            "models/net.py": "import timm\n",
        },
        ["train.py"],
        "fail",
        "models/net.py (train.py -> models/net.py) imports timm,",
    ),
    # a Hydra _target_ in a config file: runs if the job's config names it; a LightningCLI class_path in the
    # command's --config file: runs
    (
        {
            "train.py": TRAINS,
            "configs/model/net.yaml": "_target_: models.net.Net\nlr: 0.1\n",
            "models/__init__.py": "",
            "models/net.py": "import timm\n",
        },
        ["train.py"],
        "warn",
        "models/net.py (configs/model/net.yaml -> models/net.py) imports timm only through a config file's",
    ),
    (
        {"train.py": TRAINS, "conf/optim.yaml": "optimizer:\n  _target_: timm.optim.Lamb\n"},
        ["train.py"],
        "warn",
        "conf/optim.yaml imports timm only through a config file's _target_, class_path or target",
    ),
    # a latent-diffusion config's target (CompVis/stable-diffusion's instantiate_from_config) is followed as well; a
    # target of one dot is a word of the config's own (a metric, a file), not followed
    (
        {
            "main.py": TRAINS,
            "configs/ldm.yaml": "model:\n  target: ldm.models.net.Net\n  params:\n    depth: 2\n",
            "ldm/__init__.py": "",
            "ldm/models/__init__.py": "",
            "ldm/models/net.py": "import timm\n",
        },
        ["main.py"],
        "warn",
        "ldm/models/net.py (configs/ldm.yaml -> ldm/models/net.py) imports timm only through a config file's",
    ),
    (
        {"main.py": TRAINS, "conf.yaml": "early_stop:\n  target: val.loss\ndata:\n  target: labels.csv\n"},
        ["main.py"],
        "ok",
        "its 1 required imports resolve",
    ),
    # ...nor one of two dots that names no module of the project nor one installed here (a host, a versioned file),
    # even in the command's --config file: a value of the config's own is never a package the nodes lack
    (
        {"main.py": TRAINS, "cfg.yaml": "serve:\n  target: api.example.com\nckpt:\n  target: labels.v2.csv\n"},
        ["main.py", "fit", "--config", "cfg.yaml"],
        "ok",
        "its 1 required imports resolve",
    ),
    # ...a config's __main__ target is the script's own; a target the package binds is its attribute, not a module
    (
        {"main.py": TRAINS, "config.yaml": "model:\r\n  class_path: __main__.Net\r\n"},
        ["main.py", "fit", "--config", "config.yaml"],
        "ok",
        "its 1 required imports resolve",
    ),
    (
        {
            "main.py": TRAINS,
            "config.yaml": "model:\r\n  class_path: pkg.build\r\n",
            "pkg/__init__.py": "def build():\n    pass\n",
            "pkg/build.py": "import timm\n",
        },
        ["main.py", "fit", "--config", "config.yaml"],
        "ok",
        "with those of the 1 its config files name",
    ),
    # ...a config's target found only at the code folder's top, for a script in a subfolder: as its own import would be
    (
        {"sub/main.py": TRAINS, "config.yaml": "model:\n  class_path: models.Net\n", "models/__init__.py": "Net = 1\n"},
        ["sub/main.py", "fit", "--config", "config.yaml"],
        "warn",
        "config.yaml imports models, found at the code folder's top, not in sub/",
    ),
    (
        {
            "main.py": TRAINS,
            "config.yaml": "\ufeffmodel:\r\n  class_path: models.net.Net\r\n",
            "models/__init__.py": "",
            "models/net.py": "import timm\n",
        },
        ["main.py", "fit", "--config", "config.yaml"],
        "fail",
        "models/net.py (config.yaml -> models/net.py) imports timm, which",
    ),
]


@pytest.mark.parametrize(("files", "argv", "status", "said"), WALK_CASES)
def test_the_imports_of_the_project_modules_the_script_imports_are_checked_too(
    tmp_path, files, argv, status, said
) -> None:
    """The check read the script alone: a package a helper module imports (`train.py` -> `models/net.py` -> `import
    timm`), which the requirements lack, passed, and every node of the fleet failed importing it. It now follows the
    project's modules the script imports, as Python runs them (the script's folder first, packages' `__init__.py`,
    relative imports, `from package import module`, namespace packages, guards carried along the way)."""
    project = tmp_path / "project"
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    snapshot = build_snapshot(project, tmp_path / "out", {"packages": ["torch==2.13.0", "lightning==2.6.6"]})
    findings = [f for f in check_imports(snapshot, argv) if f.check == "imports"]
    worst = (
        "fail"
        if any(f.status == "fail" for f in findings)
        else "warn"
        if any(f.status == "warn" for f in findings)
        else "ok"
    )
    assert worst == status, findings
    assert any(said in f.message or said in f"fix: {f.fix}" for f in findings), findings  # the message, or its fix


# the cases where the check differs from what this machine's Python does, on purpose: a part of the case's files (as
# repr() writes them) -> why
DIFFERS_FROM_HERE = {
    "def main():\\n    import helpers": "the script's own functions are taken to run (its main); the case calls none",
    "torch.cuda.is_available()": "a CUDA-only branch runs on the GPU nodes, not on this machine",
    "def f(:": "a warning: the nodes' Python may be newer and parse it",
    "wandb/run-1/files": "a data folder imports as an empty namespace package where the package is not installed: "
    "the job fails at its first use, not its import",
    "'scripts/train.py': 'from mypkg.model": "a warning: the job may add the code folder's top to sys.path",
    "class_path: models.net.Net": "LightningCLI reads the --config file at run time; the case's main.py "
    "stands in for it",
}


def test_the_walk_agrees_with_python_on_every_case(tmp_path) -> None:
    """The import walk is static; each case above is run by this machine's Python too (each case's stand-in for a
    module that trains, `import lightning`, left out: a case needs no more than that), and its ImportError or its
    lack matches the check's failure or its lack, but where the check differs on purpose (:data:`DIFFERS_FROM_HERE`,
    each said why). A walk that strays from CPython's rules (a relative import that cannot run, a submodule a
    package's own name hides) fails here, not on the nodes."""
    import subprocess
    import sys

    strayed = []
    for n, (files, argv, status, _said) in enumerate(WALK_CASES):
        project = tmp_path / f"case{n}"
        for name, text in files.items():
            (project / name).parent.mkdir(parents=True, exist_ok=True)
            here = text.replace(TRAINS, "Net = None\n").replace("import lightning as L\n", "")
            (project / name).write_text(here.replace("L.LightningModule", "object"))
        run = subprocess.run([sys.executable, *argv], cwd=project, capture_output=True, text=True, timeout=60)
        fails_here = run.returncode != 0
        differs = next((why for key, why in DIFFERS_FROM_HERE.items() if key in repr(files)), None)
        if fails_here != (status == "fail") and differs is None:
            strayed.append((argv, files, status, run.stderr.strip().splitlines()[-1:]))
        elif differs is not None and fails_here == (status == "fail"):
            strayed.append((argv, files, "no longer differs", differs))
    assert not strayed, strayed


def test_check_repeats_what_srifty_terraform_said_of_a_plain_http_upload() -> None:
    """`srifty terraform` warns that the code upload to the module's TLS-only bucket through an emulator's http://
    endpoint will be refused; `srifty check` said "ok" right after (a new user's walk). Both now use one rule."""
    refused = check_bucket_answers(None, None, "http://127.0.0.1:5140", uploads=True)
    assert [f.status for f in refused] == ["warn"] and "403" in refused[0].message and "--bucket" in refused[0].fix
    for bucketless in (
        check_bucket_answers(None, None, "https://s3.local:5140", uploads=True),
        check_bucket_answers(None, None, "http://127.0.0.1:5140", uploads=False),
        check_bucket_answers(None, None, None, uploads=True),
    ):
        assert [f.status for f in bucketless] == ["ok"], bucketless


def test_an_import_a_pinned_package_not_installed_here_may_bring_is_a_warning(tmp_path) -> None:
    """With the 'infra' extra only, torch and lightning are not installed where srifty check runs: what they depend on
    is unknown there, so an import nothing else provides is a warning that says why, not a failure."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import srifty_maybe_from_the_pin\n")
    spec = {"packages": ["srifty-not-installed-here==1.0"], "requirements": None}
    findings = check_imports(build_snapshot(project, tmp_path / "out", spec), ["train.py"])
    (imports,) = [f for f in findings if f.check == "imports"]
    assert imports.status == "warn", imports
    assert "unless srifty-not-installed-here brings it: not installed here" in imports.message
    # a requirement the checking machine lacks brings the module its name names (hydra-core's hydra, PyYAML's yaml,
    # Pillow's PIL): the lightning-hydra-template's train.py was refused for `import hydra`. What it brings besides
    # (hydra-core's omegaconf) is not known here: still a failure, whose fix says to install the requirements here
    (project / "requirements.txt").write_text("srifty-absent-core==1.3.2\npyyaml-srifty-absent\nPillow-srifty\n")
    spec = {"packages": ["torch==2.13.0"], "requirements": "requirements.txt"}
    (project / "train.py").write_text("import srifty_absent\nfrom srifty_absent_dependency import Config\n")
    findings = check_imports(build_snapshot(project, tmp_path / "out2", spec), ["train.py"])
    (imports,) = [f for f in findings if f.check == "imports"]
    assert imports.status == "fail", imports
    assert "train.py imports srifty_absent_dependency, which neither" in imports.message
    assert (
        "or install the requirements here (pillow-srifty, pyyaml-srifty-absent, srifty-absent-core not " in imports.fix
    )


def test_srifty_check_and_apply_refuse_a_root_the_account_cannot_launch(aws, tmp_path, monkeypatch, capsys) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import lightning\n")
    boto3.client("s3", endpoint_url=aws, region_name="us-east-1").create_bucket(Bucket="ckpt-preflight")
    options = Options(name="preflight", code=str(project), aws_endpoint=aws, bucket="ckpt-preflight")
    # moto publishes no Deep Learning AMI parameters: the pre-flight says so and what to give instead
    bare = generate(load_plan(PLAN), tmp_path / "bare", options=options).out
    with FakeServiceQuotas({"Running On-Demand G and VT instances": 64}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        (image,) = [f for f in preflight_root(bare).findings if f.check == "image"]
    assert image.status == "fail" and "the machine image cannot be found here" in image.message
    assert image.fix.startswith("give --ami with an image id of this region")
    ec2 = boto3.client("ec2", endpoint_url=aws, region_name="us-east-1")
    ami = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])
    options = Options(
        name="preflight",
        code=str(project),
        aws_endpoint=aws,
        bucket="ckpt-preflight",
        ami=ami["Images"][0]["ImageId"],
        setup_command="true",
    )
    root = generate(load_plan(PLAN), tmp_path / "infra", options=options).out
    with FakeServiceQuotas({"Running On-Demand G and VT instances": 0}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        assert main(["check", "--dir", str(root)]) == 1
        out = capsys.readouterr().out
        assert "[FAIL] quota: Running On-Demand G and VT instances (L-DB2E81BA): the fleet needs 4 vCPUs" in out
        assert "[ok  ] imports" in out and "[ok  ] bucket: the checkpoint bucket ckpt-preflight answers" in out
        assert f"[ok  ] image: the AMI {options.ami} (x86_64) exists" in out
        with pytest.raises(PreflightError, match=r"quota-code L-DB2E81BA --desired-value 4") as refused:
            apply(root, yes=True, echo=lambda line: None)
        assert refused.value.report["ok"] is False
        assert not (root / ".terraform").exists()  # terraform never ran
        assert main(["check", "--dir", str(root), "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["schema"] == "srifty.preflight/v1" and report["zone"] is None
    with FakeServiceQuotas({"Running On-Demand G and VT instances": 64}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        assert preflight_root(root).ok
    assert json.loads((root / TFVARS).read_text())["train"]["code"]


def test_the_subnet_is_in_the_zone_whose_spot_price_the_plan_used_and_that_zone_is_checked(aws, tmp_path) -> None:
    from predictor.catalog.catalog import Catalog

    plan = load_plan(ROOT / "terraform" / "examples" / "multi-node-spot" / "plan.json")  # p4d.24xlarge x 4, spot
    entry = plan.entries[0]
    priced = Catalog.load().get("p4d.24xlarge").price(entry.region, "spot")
    values = generate(plan, tmp_path / "infra", options=Options(name="zoned")).values
    assert values["network"] == {"create_vpc": True, "availability_zone_id": priced.availability_zone}
    assert priced.availability_zone.startswith("use1-az")
    made = clients("us-east-1", aws)
    report = preflight(
        region="us-east-1",
        groups=[Group("p4d.24xlarge", 0, 4)],
        vcpus=VCPUS.__getitem__,
        zone=priced.availability_zone,
        aws=made,
    )
    (offering,) = [f for f in report.findings if f.check == "offering"]
    assert offering.status == "ok" and offering.message == f"every type is offered in {priced.availability_zone}"
    with pytest.raises(Exception, match="neither a zone of the fleet's region us-east-1"):
        generate(plan, tmp_path / "other", options=Options(name="zoned", availability_zone="eu-west-1a"))


def test_recommend_launchable_keeps_what_the_account_can_start_and_says_what_a_quota_would_buy(
    aws, monkeypatch, capsys, tmp_path
) -> None:
    profile = str(ROOT / "examples" / "profiles" / "resnet50-v100.json")
    ask = ["recommend", "--profile", profile, "--steps", "200000", "--objective", "time", "--market", "on-demand"]
    ask += ["--allow", "p4d.24xlarge,g5.xlarge,g5.2xlarge", "--max-instances", "2", "--format", "json"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws)
    assert main(ask) == 0
    everything = json.loads(capsys.readouterr().out)
    assert everything["entries"][0]["fleet"].startswith("p4d.24xlarge")  # the fastest, for an account with room
    with FakeServiceQuotas({"Running On-Demand P instances": 0, "Running On-Demand G and VT instances": 8}) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", url)
        assert main([*ask, "--launchable", "--out", str(tmp_path / "plan.json")]) == 0
    said = capsys.readouterr()
    assert json.loads(said.out)["schema"] == "srifty.plan/v1"  # --format json: stdout is the JSON alone
    plan = load_plan(tmp_path / "plan.json")
    fleets = [e.fleet for e in plan.entries]
    # P quota 0; G and VT 8 vCPUs: one g5.xlarge (4) or one g5.2xlarge (8), never two of the latter
    assert fleets and all(f in ("g5.xlarge:1", "g5.xlarge:2", "g5.2xlarge:1") for f in fleets), fleets
    note = plan.notes[-1]
    assert note.startswith(f"--launchable: {len(fleets)} of the ") and "a quota increase would buy p4d.24xlarge" in note
    assert "Running On-Demand P instances (L-417A185B) 0 vCPUs with 0 in use, " in note
    assert "The best fleet this account can start now is" in plan.why and "plan written to" in said.err
    with FakeServiceQuotas({"Running On-Demand P instances": 0, "Running On-Demand G and VT instances": 0}) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", url)
        assert main([*ask, "--launchable"]) == 2
    assert "None of the" in capsys.readouterr().err


def test_unreachable_aws_and_wrong_folders_are_one_line_with_the_fix(tmp_path, monkeypatch, capsys) -> None:
    from botocore.exceptions import ReadTimeoutError

    from lightning_srifty.provision.aws import why
    from lightning_srifty.provision.preflight import account_limits, check_credentials
    from predictor.exceptions import ProvisionError

    assert main(["check", "--dir", str(tmp_path)]) == 2
    assert "is not a root module written by `srifty terraform`" in capsys.readouterr().err
    assert why(ReadTimeoutError(endpoint_url="http://127.0.0.1:9/")).startswith("ReadTimeoutError: Read timeout")
    for name, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    dead = clients("us-east-1", "http://127.0.0.1:9")  # nothing listens on port 9
    (finding,) = check_credentials(dead["sts"])
    assert finding.status == "fail" and finding.message.startswith("AWS could not be reached")
    assert "check the network" in finding.fix
    with pytest.raises(ProvisionError, match=r"--launchable needs to read this account's EC2 offerings .* network"):
        account_limits("us-east-1", ["g5.xlarge"], VCPUS.__getitem__, dead)
    # a proxy that does not answer (nothing listens on its port) is the network too, not the credentials
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    proxied = clients("us-east-1", "http://aws.example.invalid")
    with pytest.raises(ProvisionError, match=r"\(ProxyConnectionError: .* check the network \(a proxy"):
        account_limits("us-east-1", ["g5.xlarge"], VCPUS.__getitem__, proxied)
    (finding,) = check_credentials(proxied["sts"])
    assert finding.message.startswith("AWS could not be reached (ProxyConnectionError") and "network" in finding.fix


def test_quotas_behind_an_unreachable_endpoint_say_to_check_the_network() -> None:
    from botocore.exceptions import EndpointConnectionError

    from lightning_srifty.provision.preflight import check_quotas

    class Unreachable:
        def get_paginator(self, name: str):
            raise EndpointConnectionError(endpoint_url="https://servicequotas.us-east-1.amazonaws.com/")

    (finding,) = check_quotas(Unreachable(), None, "us-east-1", {("G", "on-demand"): 4}, VCPUS.__getitem__)
    assert finding.status == "warn" and "EndpointConnectionError" in finding.message
    assert finding.fix.startswith("check the network") and "does not serve" not in finding.fix


def test_config_targets_reads_the_three_keys_and_leaves_a_words_target() -> None:
    """The keys a config names a class or function to build by: Hydra's _target_, LightningCLI's class_path, and the
    latent-diffusion target (CompVis/stable-diffusion's configs/*.yaml); a bare target needs two dots, so a metric or
    a file named by a config (``target: val.loss``, ``target: labels.csv``) is not taken for a module."""
    from lightning_srifty.provision.terraform.script_imports import config_targets

    text = (
        "model:\n  target: ldm.models.diffusion.ddpm.LatentDiffusion\n  params:\n"
        "    first_stage_config:\n      target: ldm.models.autoencoder.AutoencoderKL\n"
        "    cond_stage_config:\n      target: torch.nn.Identity\n"
        "data:\n  target: main.DataModuleFromConfig\n"  # one dot: the script's own module, walked anyway
        "loss:\n  target: val.loss\nlabels:\n  target: labels.csv\n"
        "optim:\n  _target_: torch.optim.AdamW\ntrainer:\n  class_path: lightning.pytorch.Trainer\n"
        "target: ldm.models.diffusion.ddpm.LatentDiffusion\n"  # the same target again: once
    )
    assert config_targets(text) == [
        "ldm.models.diffusion.ddpm.LatentDiffusion",
        "ldm.models.autoencoder.AutoencoderKL",
        "torch.nn.Identity",
        "torch.optim.AdamW",
        "lightning.pytorch.Trainer",
    ]


def test_an_auto_scaling_fleet_whose_volume_key_the_group_may_not_use_is_refused_with_the_grant_to_make(
    aws, tmp_path, monkeypatch, capsys
) -> None:
    """AWS's rule (lightning_srifty.provision.aws.volume_key_verdict): an Auto Scaling group launches with its service-
    linked role, which may use no customer managed key unless the key lets it; the module's root volumes are encrypted
    with the account's default key for EBS encryption, which an organisation may set to its own. moto launches such a
    group; `srifty check` reads the key (through the rules proxy, which answers GetEbsDefaultKmsKeyId as EC2 does) and
    `srifty apply` refuses before terraform runs; the grant the fix names is what makes it pass."""
    import shlex

    from lightning_srifty.provision.rehearsal.aws_rules import AwsRulesProxy

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import lightning\n")
    ec2 = boto3.client("ec2", endpoint_url=aws, region_name="us-east-1")
    ami = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])
    boto3.client("s3", endpoint_url=aws, region_name="us-east-1").create_bucket(Bucket="ckpt-volumes")
    with AwsRulesProxy(aws) as url, FakeServiceQuotas({"Running On-Demand G and VT instances": 64}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        options = Options(
            name="volumes", code=str(project), aws_endpoint=url, bucket="ckpt-volumes",
            ami=ami["Images"][0]["ImageId"], setup_command="true",
        )  # fmt: skip
        root = generate(load_plan(PLAN), tmp_path / "infra", options=options).out
        assert json.loads((root / TFVARS).read_text())["capacity"]["mode"] == "asg"
        # a new account's default: the AWS managed key, which the group needs no grant for
        (volumes,) = [f for f in preflight_root(root).findings if f.check == "volumes"]
        assert volumes.status == "ok" and "AWS managed key aws/ebs" in volumes.message
        # the organisation's own key as the default: the group's launches would all fail
        kms = boto3.client("kms", endpoint_url=url, region_name="us-east-1")
        key = kms.create_key(Description="the organisation's EBS key")["KeyMetadata"]["Arn"]
        boto3.client("ec2", endpoint_url=url, region_name="us-east-1").modify_ebs_default_kms_key_id(KmsKeyId=key)
        assert main(["check", "--dir", str(root)]) == 1
        out = capsys.readouterr().out
        said = "[FAIL] volumes: the root volumes are encrypted with this account's default key for EBS encryption"
        assert f"{said}, {key}, and neither its policy nor a grant allows" in out
        assert "kms:CreateGrant, kms:GenerateDataKeyWithoutPlaintext, kms:Decrypt: every launch would fail" in out
        with pytest.raises(PreflightError, match="volumes"):
            apply(root, yes=True, echo=lambda line: None)
        assert not (root / ".terraform").exists()  # terraform never ran
        # the fix's grant, as its command says it
        command = shlex.split(out.split("aws kms create-grant", 1)[1].split(" (a new account", 1)[0])
        words = dict(zip(command[0:6:2], command[1:6:2]))
        assert words == {"--region": "us-east-1", "--key-id": key, "--grantee-principal": volume_role(aws)}
        assert command[6] == "--operations"
        kms.create_grant(KeyId=key, GranteePrincipal=words["--grantee-principal"], Operations=command[7:])
        report = preflight_root(root)
        (volumes,) = [f for f in report.findings if f.check == "volumes"]
        assert report.ok and volumes.status == "ok"
        assert "a grant lets Auto Scaling's service-linked role use it" in volumes.message
        # an instant EC2 Fleet launches with terraform's own credentials: no such rule, nothing said
        fleet = generate(load_plan(PLAN), tmp_path / "fleet", options=dataclasses_replace(options, mode="fleet")).out
        assert not [f for f in preflight_root(fleet).findings if f.check == "volumes"]
        # a disabled key: every launch fails, whoever may use it
        kms.disable_key(KeyId=key.rsplit("/", 1)[1])  # by its id: moto 5.2.6 answers a key ARN here with a 500
        (volumes,) = [f for f in preflight_root(root).findings if f.check == "volumes"]
        assert volumes.status == "fail" and f"{key}, which is Disabled: every launch fails" in volumes.message
        assert volumes.fix.startswith("enable the key (aws kms enable-key")
        # the account's default set back: the AWS managed key again, as EC2 answers it
        proxied = boto3.client("ec2", endpoint_url=url, region_name="us-east-1")
        proxied.reset_ebs_default_kms_key_id()
        assert proxied.get_ebs_default_kms_key_id()["KmsKeyId"] == "alias/aws/ebs"


def test_a_fleet_booting_an_image_whose_snapshot_key_the_group_may_not_use_is_refused_until_the_grant_is_made(
    aws, tmp_path, monkeypatch, capsys
) -> None:
    """AWS's rule for an image's encrypted snapshots ("Use encryption with EBS-backed AMIs", EC2 User Guide: an
    encrypted snapshot this account owns is restored under its own key; with another key given it is re-encrypted to
    that): an Auto Scaling group's launches use the snapshot's key, which its service-linked role may not use unless
    the key lets it ("Amazon EC2 Auto Scaling failed to launch instances with encrypted AMI", AWS re:Post). moto
    launches such a group. The image is made as a team makes one, by CopyImage with Encrypted and KmsKeyId (moto
    keeps that encryption through the tests' moto_server); the account's default key is aws/ebs, which the check used
    to judge, and passed."""
    import shlex

    from lightning_srifty.provision.rehearsal.aws_rules import AwsRulesProxy

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import lightning\n")
    boto3.client("s3", endpoint_url=aws, region_name="us-east-1").create_bucket(Bucket="ckpt-image-key")
    with AwsRulesProxy(aws) as url, FakeServiceQuotas({"Running On-Demand G and VT instances": 64}) as quotas_url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", quotas_url)
        ec2 = boto3.client("ec2", endpoint_url=url, region_name="us-east-1")
        kms = boto3.client("kms", endpoint_url=url, region_name="us-east-1")
        public = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": ["x86_64"]}])
        image_key = kms.create_key(Description="the team's image key")["KeyMetadata"]["Arn"]
        copied = ec2.copy_image(SourceImageId=public["Images"][0]["ImageId"], SourceRegion="us-east-1",
                                Name="team-dlami-encrypted", Encrypted=True, KmsKeyId=image_key)["ImageId"]  # fmt: skip
        (mapping,) = ec2.describe_images(ImageIds=[copied])["Images"][0]["BlockDeviceMappings"]
        assert mapping["Ebs"]["Encrypted"] is True
        options = Options(
            name="imagekey", code=str(project), aws_endpoint=url, bucket="ckpt-image-key", ami=copied,
            setup_command="true",
        )  # fmt: skip
        root = generate(load_plan(PLAN), tmp_path / "infra", options=options).out
        assert main(["check", "--dir", str(root)]) == 1
        out = capsys.readouterr().out
        said = (
            f"[FAIL] volumes: the root volumes are encrypted with the key of the image {copied}'s snapshot "
            f"{mapping['Ebs']['SnapshotId']}, {image_key}, and neither its policy nor a grant allows Auto Scaling's "
            "service-linked role kms:CreateGrant, kms:Decrypt: every launch would fail"
        )
        assert said in out and "aws/ebs" not in out  # the account's default key is not what these volumes use
        with pytest.raises(PreflightError, match="volumes"):
            apply(root, yes=True, echo=lambda line: None)
        assert not (root / ".terraform").exists()

        def grant_as_printed(printed: str) -> str:
            command = shlex.split(printed.split("aws kms create-grant", 1)[1].split(" (a new account", 1)[0])
            kms.create_grant(KeyId=command[3], GranteePrincipal=command[5], Operations=command[7:])
            return command[3]

        assert grant_as_printed(out) == image_key
        report = preflight_root(root)
        (volumes,) = [f for f in report.findings if f.check == "volumes"]
        assert report.ok and volumes.status == "ok" and "a grant lets" in volumes.message
        # the root's own key given: the image's snapshot is re-encrypted from its key (the grant serves) to that one
        values = json.loads((root / TFVARS).read_text())
        root_key = kms.create_key(Description="the checkpoints' key")["KeyMetadata"]["Arn"]
        values["checkpoints"]["kms_key_arn"] = root_key
        (root / TFVARS).write_text(json.dumps(values, indent=2))
        found = [f for f in preflight_root(root).findings if f.check == "volumes"]
        assert [(f.status, f.message.split(", ")[0]) for f in found] == [
            ("ok", f"the root volumes are re-encrypted from the key of the image {copied}'s snapshot "
                   f"{mapping['Ebs']['SnapshotId']}"),
            ("fail", "the root volumes are encrypted with the key the root gives (checkpoints.kms_key_arn)"),
        ]  # fmt: skip
        assert grant_as_printed(found[1].fix) == root_key
        report = preflight_root(root)
        assert report.ok and [f.status for f in report.findings if f.check == "volumes"] == ["ok", "ok"]


def volume_role(endpoint: str) -> str:
    from lightning_srifty.provision.aws import autoscaling_role_arn as role_arn

    sts = boto3.client("sts", endpoint_url=endpoint, region_name="us-east-1")
    return role_arn("aws", sts.get_caller_identity()["Account"])


def dataclasses_replace(options: Options, **changes) -> Options:
    import dataclasses

    return dataclasses.replace(options, **changes)


@pytest.mark.parametrize(
    ("script", "config", "requirements", "status", "said"),
    [
        # a LightningCLI script: lightning imports, jsonargparse it does not install (a trial's nodes would all fail)
        ("from lightning.pytorch.cli import LightningCLI\nLightningCLI()\n", None, None, "fail",
         "train.py uses LightningCLI, which Lightning runs only with jsonargparse[signatures] installed"),
        ("import lightning.pytorch as pl\npl.cli.LightningCLI()\n", None, None, "fail", "uses LightningCLI"),
        ("from lightning.pytorch.cli import LightningCLI\n", None, "jsonargparse[signatures]>=4.27\n", None, ""),
        # a logger named in the command's config: its package is the requirements'; a bare class name too
        ("from lightning.pytorch.cli import LightningCLI\n",
         "trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.WandbLogger\n",
         "jsonargparse[signatures]\n", "fail", "config.yaml uses WandbLogger, which Lightning runs only with wandb"),
        ("import lightning\n", "trainer:\n  logger:\n    - class_path: MLFlowLogger\n", None, "fail", "MLFlowLogger"),
        ("import lightning\n", "trainer:\n  strategy: deepspeed_stage_2\n", None, "fail", "uses DeepSpeedStrategy"),
        ("import lightning\n", "trainer:\n  logger:\n    class_path: WandbLogger\n", "wandb\n", None, ""),
        # a comment or a string names nothing
        ("import lightning  # LightningCLI later\nx = 'WandbLogger'\n", None, None, None, ""),
        # TensorBoardLogger takes tensorboard or tensorboardX
        ("from lightning.pytorch.loggers import TensorBoardLogger\n", None, "tensorboardX\n", None, ""),
        # a script's own flag named deepspeed is no strategy (a review's false failure); the strategy's string is
        ("import argparse\nargs = argparse.Namespace(deepspeed=False)\nif args.deepspeed:\n    pass\n", None, None,
         None, ""),
        ('import lightning\nlightning.Trainer(strategy="deepspeed_stage_2")\n', None, None, "fail",
         "uses DeepSpeedStrategy"),
    ],
)  # fmt: skip
def test_a_lightning_class_that_runs_on_a_package_lightning_does_not_install_is_a_requirement(
    tmp_path, script, config, requirements, status, said
) -> None:
    """A LightningCLI project passed the import check (lightning resolves) and its nodes would all have died at the
    start: 'Requirement jsonargparse[signatures]>=4.27.7 not met' (a trial); a config's WandbLogger the same. The
    classes Lightning builds only with another package are found in the walked code, the command's configs and its
    arguments, and their package must be in the requirements."""
    snap_dir = tmp_path / "s"
    project = snap_dir / "project"
    project.mkdir(parents=True)
    (project / "train.py").write_text(script)
    spec = {"packages": ["torch==2.13.0", "lightning==2.6.6"], "requirements": None}
    if requirements is not None:
        (project / "requirements.txt").write_text(requirements)
        spec["requirements"] = "requirements.txt"
    argv = ["train.py", "fit"]
    if config is not None:
        (project / "config.yaml").write_text(config)
        argv += ["--config", "config.yaml"]
    snapshot = build_snapshot(project, snap_dir / "out", spec)
    found = [f for f in check_imports(snapshot, argv) if "Lightning runs only with" in f.message]
    if status is None:
        assert found == []
        return
    (finding,) = found
    assert finding.status == status and said in finding.message, finding
    assert "every node fails at the job's start" in finding.message
    assert finding.fix.startswith("add ") and "requirements.txt" in finding.fix
    with_setup = check_imports(snapshot, argv, setup_command="pip install -r extra.txt")
    assert [f.status for f in with_setup if "Lightning runs only with" in f.message] == ["warn"]
