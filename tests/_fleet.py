"""What the fleet tests share (not a test module): the module's paths, fake commands, the example plans, user_data
rendered by ``terraform console`` and run under bash with fakes on PATH."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import urllib.request
from pathlib import Path

import boto3
import pytest

from conftest import tf_run
from imds_server import FakeIMDS
from lightning_srifty.provision.terraform.generate import TFVARS, Options
from predictor.documents.plan import load_plan

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "terraform" / "modules" / "training_fleet"
WATCHDOG = MODULE / "templates" / "watchdog.sh"
EXAMPLES = ROOT / "terraform" / "examples"

# the instance metadata service as IMDSv2 answers curl -f: a token only for a PUT with a TTL of 1 to 21,600 s, and a
# metadata read only with that token (else 400 / 401: curl -f exits 22); the token's expiry is LocalIMDS's (tests that
# need it boot against that server)
FAKE_CURL = """#!/bin/bash
case "$*" in
  *api/token*)
    ttl=$(printf '%s' "$*" | sed -n 's/.*metadata-token-ttl-seconds: *\\([0-9]*\\).*/\\1/p')
    case "$*" in *PUT*) ;; *) exit 22 ;; esac
    [ -n "$ttl" ] && [ "$ttl" -ge 1 ] && [ "$ttl" -le 21600 ] || exit 22
    echo token; exit 0 ;;
esac
case "$*" in *"X-aws-ec2-metadata-token: token"*) ;; *) exit 22 ;; esac
case "$*" in
  *placement/region*) echo us-east-1 ;;
  *instance-id*) echo i-0abc ;;
  *) exit 22 ;;
esac
"""

FAKE_TORCHRUN = """#!{python}
import json, os, sys
kept = ("SRIFTY_", "PL_TRAINER_", "LT_")
env = {{k: v for k, v in os.environ.items() if k.startswith(kept) or k == "AWS_DEFAULT_REGION"}}
json.dump({{"argv": sys.argv[1:], "env": env}}, open(os.environ["FAKE_DIR"] + "/torchrun.json", "w"))
"""


def exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def example(name: str):
    folder = EXAMPLES / name
    spec = json.loads((folder / "choice.json").read_text())
    opts = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    return load_plan(folder / "plan.json"), spec["choice"], Options(**opts)


def template_values(**overrides: object) -> dict:
    """Every variable the module's user_data template takes, for a one-node job with no code snapshot, no container
    and no secrets (the image and the setup command); ``overrides`` replace any of them."""
    import base64

    values = {
        "name": "job",
        "setup_command": "true",
        "argv": "'train.py'",
        "nnodes": 1,
        "nproc_per_node": 1,
        "group": "g5.xlarge",
        "weights_json": "{}",
        "units": 1,
        "efa": False,
        "rdzv_port": 29400,
        "rendezvous_timeout_s": 1800,
        "checkpoint_uri_b64": base64.b64encode(b"s3://b/checkpoints/").decode(),
        "code_sha256": "",  # test_terraform_boot runs a code snapshot and a container image
        "code_uri_b64": "",
        "image_b64": "",
        "resume_from": "",
        "handover": False,
        "env_count": 0,
        "env_b64": base64.b64encode(b"{}").decode(),
        "max_life_s": 5400,
        "max_life_min": 90,
        "heartbeat": False,
        "watchdog_b64": base64.b64encode(WATCHDOG.read_bytes()).decode(),
        "watchdog_interval_s": 60,
        "watchdog_grace_s": 5,
        "watchdog_max_age_s": 300,
        "watchdog_asg": 0,
        "stall_s": 1200,  # the training's stall limit (main.tf: 0 under srifty launch); watch_s follows it unless given
        "after_fit_s": 1800,
        "secrets": [],
        "data": [],
    }
    # main.tf's: the node's watch (its limit follows the stall limit given), its teardown limit (5 min at most), and
    # no training-stall limit under the heartbeat (srifty launch's fleets) unless given
    values["watch_s"] = overrides.get("stall_s", values["stall_s"])
    values["teardown_s"] = min(int(overrides.get("watch_s", values["watch_s"])), 300)
    if overrides.get("heartbeat"):
        values["stall_s"] = 0
    unknown = set(overrides) - set(values)
    assert not unknown, f"not template variables: {unknown}"
    return {**values, **overrides}


def render(env: dict[str, str], folder: Path, values: dict, template_name: str = "user_data.sh.tftpl") -> str:
    """templatefile() of the module's user_data (or another of its templates), by `terraform console` (no provider,
    no cloud)."""
    folder.mkdir(parents=True, exist_ok=True)
    template = json.dumps(str(MODULE / "templates" / template_name))
    expr = f"templatefile({template}, jsondecode({json.dumps(json.dumps(values))}))"
    run = subprocess.run(
        ["terraform", f"-chdir={folder}", "console"], input=expr, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout.strip()
    assert out.startswith("<<EOT") and out.endswith("EOT"), out[:200]
    return out[len("<<EOT") :].rsplit("EOT", 1)[0].lstrip("\n")


def run_user_data(
    tmp_path: Path, script: str, fakes: dict[str, str], *, cwd: Path | None = None, extra_env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the rendered ``script`` with bash, the ``fakes`` (command name -> script text) first on PATH, the logs and
    state under ``tmp_path`` and the watchdog polling every second."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in fakes.items():
        exe(bin_dir / name, text)
    (tmp_path / "user_data.sh").write_text(script)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "SRIFTY_USER_DATA_LOG": str(tmp_path / "user-data.log"),
        "SRIFTY_STATE_DIR": str(tmp_path / "state"),
        "SRIFTY_PER_BOOT_DIR": str(tmp_path / "per-boot"),  # never this machine's cloud-init
        "SRIFTY_CLOUD_INSTANCE_ID_FILE": str(tmp_path / "cloud-instance-id"),
        "SRIFTY_WATCHDOG_LOG": str(tmp_path / "watchdog.log"),
        "SRIFTY_WATCHDOG_INTERVAL_S": "1",
        **(extra_env or {}),
    }
    try:
        return run_boot(["bash", str(tmp_path / "user_data.sh")], cwd=cwd or tmp_path, env=env, timeout=60)
    finally:
        end_watchdogs(Path(env["SRIFTY_STATE_DIR"]))


LEFT_BEHIND_S = 5.0


def run_boot(
    command: list[str], *, cwd: Path | str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """Run a boot script (its output captured) and fail if it left a process of its own behind: one of its session
    (not the watchdog's, a session of its own that :func:`end_watchdogs` ends) still running :data:`LEFT_BEHIND_S` s
    after the script exited. On an instance such a process outlives the boot script's last words (a watch's nap
    holding the log's ``tee`` open cost every node's exit 5 s); here it held the captured output open, so the test
    waited for it (30 s at most, a peer watch's nap)."""
    import signal
    import threading
    import time

    state = env["SRIFTY_STATE_DIR"].encode()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: dict[str, bytes] = {}

    def read() -> None:
        out["stdout"], out["stderr"] = process.communicate()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    left: list[int] = []
    try:
        code = process.wait(timeout=timeout)
        left = _left_behind(state)
        deadline = time.monotonic() + LEFT_BEHIND_S
        while left and time.monotonic() < deadline:  # tee, and what ends with the script, a moment to go
            time.sleep(0.1)
            left = _left_behind(state)
        lines = [_cmdline(pid) for pid in left]
    finally:  # a script past its time: killed, and everything of its own with it (never left to the next test),
        # looked for again until none is found (one may fork between a look and its kill), for 10 s at most
        process.kill()
        until = time.monotonic() + 10
        while (found := _left_behind(state)) and time.monotonic() < until:
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        reader.join(10)
    run = subprocess.CompletedProcess(command, code, out.get("stdout", b""), out.get("stderr", b""))
    assert not left, f"the boot script left {len(left)} process(es) of its own running after its exit: {lines}"
    assert not reader.is_alive(), "the boot script's output was still held open 10 s after its exit and its leftovers"
    return run


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"


def _left_behind(state: bytes) -> list[int]:
    """The processes of this session (the test's: the boot script ran in it) whose environment names the boot
    script's state folder ``state``: the script's own, never the watchdog's (``setsid``) nor the test runner."""
    session = os.getsid(0)
    mine = b"SRIFTY_STATE_DIR=" + state
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if os.getsid(int(proc.name)) == session and mine in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # gone since the listing, or not ours to read
            pass
    return pids


def _watchdogs(state: Path) -> list[int]:
    """The pids of the watchdogs a boot script under ``state`` started (``setsid nohup bash $STATE/watchdog.sh``:
    each the leader of a session of its own, so no process group of the script's holds them)."""
    mine = str(state / "watchdog.sh").encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if mine in (proc / "cmdline").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
            except OSError:  # gone since the listing
                pass
    return pids


def _in_sessions(leaders: set[int]) -> list[int]:
    """Every process whose session is one of ``leaders``: a watchdog's children too (its ``timeout 30 aws s3 cp``,
    which GNU timeout puts in a process group of its own, so a kill of the watchdog's group would miss it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) in leaders:  # after "pid (comm)": state, ppid, pgrp, session
                pids.append(int(proc.name))
    return pids


def end_watchdogs(state: Path, within_s: float = 30.0) -> None:
    """Let the node's watchdog finish as on an instance (the job has exited: it records the fleet's end where it
    should, leaves its group, calls shutdown and exits), within ``within_s``; then kill what is left of it, its
    children included. A watchdog outliving its test wrote into the next test's records: stop 77's CI failure, where
    a module-wide moto server held a fleet's life record that the previous test's watchdog ended after the next
    test's node had booted. No watchdog is taken for none until two looks 0.3 s apart find none (one may be between
    its fork and its exec)."""
    import signal
    import time

    deadline = time.monotonic() + within_s
    seen: set[int] = set()
    empty = 0
    while empty < 2 and time.monotonic() < deadline:
        left = _watchdogs(state)
        seen.update(left)
        empty = 0 if left else empty + 1
        time.sleep(0.3 if not left else 0.2)
    for pid in _in_sessions(seen):
        with contextlib.suppress(ProcessLookupError):  # it ended since the listing
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------------------------------
# A root against moto: the Deep Learning AMI's parameters, terraform's planned values, the instance role's credentials
# ---------------------------------------------------------------------------------------------------------------------

PARAMS = {
    "x86_64": "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id",
    "arm64": "/aws/service/deeplearning/ami/arm64/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id",
}
TEST_PREFIX = "/srifty-test"


def dlami_parameters(endpoint: str) -> dict[str, str]:
    """The Deep Learning AMI's SSM parameters, in moto: an x86_64 and an arm64 image of moto's catalog. moto refuses
    to write names under /aws/ (reserved for AWS), so they live under /srifty-test/aws/... and
    :func:`use_test_parameters` points a generated root at them."""
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    ssm = boto3.client("ssm", endpoint_url=endpoint, region_name="us-east-1")
    images = {}
    for arch, name in PARAMS.items():
        image = ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": [arch]}])
        images[arch] = image["Images"][0]["ImageId"]
        ssm.put_parameter(Name=TEST_PREFIX + name, Value=images[arch], Type="String", Overwrite=True)
    return images


def use_test_parameters(folder: Path, placement_group: bool | None = None) -> Path:
    """Point a generated root's ami.ssm_parameters at the copies of :func:`dlami_parameters` (and, for an apply,
    drop the cluster placement group: moto's server never reports one available, so terraform waits for it
    until it gives up)."""
    values = json.loads((folder / TFVARS).read_text())
    assert values["ami"] == {}, values["ami"]
    values["ami"] = {"ssm_parameters": {arch: TEST_PREFIX + name for arch, name in PARAMS.items()}}
    if placement_group is not None:
        values["capacity"]["placement_group"] = placement_group
    (folder / TFVARS).write_text(json.dumps(values, indent=2, sort_keys=True))
    return folder


def planned(env: dict[str, str], folder: Path, rtype: str) -> dict[str, dict]:
    """The planned values of every ``rtype`` resource (terraform init, plan -out, show -json)."""
    show = plan_json(env, folder)
    return {
        r["address"]: r["values"]
        for m in [
            show["planned_values"]["root_module"],
            *show["planned_values"]["root_module"].get("child_modules", []),
        ]
        for r in m.get("resources", [])
        if r["type"] == rtype
    }


def planned_types(env: dict[str, str], folder: Path) -> list[str]:
    return [r["type"] for r in plan_json(env, folder)["resource_changes"]]


def plan_json(env: dict[str, str], folder: Path) -> dict:
    cached = folder / ".plan.json"
    if cached.exists():
        return json.loads(cached.read_text())
    init = tf_run(env, folder, "init", "-backend=false", "-input=false", "-no-color")
    assert init.returncode == 0, init.stderr
    result = tf_run(env, folder, "plan", "-input=false", "-no-color", "-out=tfplan")
    assert result.returncode == 0, result.stdout + result.stderr
    show = tf_run(env, folder, "show", "-json", "tfplan")
    assert show.returncode == 0, show.stderr
    cached.write_text(show.stdout)
    return json.loads(show.stdout)


def node_credentials(endpoint: str, policy: str, user: str = "node") -> dict[str, str]:
    """An IAM user in moto holding exactly ``policy`` (the instance role's), and its credentials as environment."""
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1")
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="instance", PolicyDocument=policy)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def enforce_iam(endpoint: str, on: bool) -> None:
    """moto's IAM enforcement (its /moto-api/reset-auth): every request from now on is checked, or none is."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", b"0" if on else b"inf", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=30).close()


def boot_as_node(
    script: str, endpoint: str, work: Path, node: dict[str, str], torchrun: str, **env: str
) -> subprocess.CompletedProcess:
    """A planned boot script (its own text) under bash as instance i-0d47a0000000001 holding the role's credentials
    ``node``: the AWS CLI at ``endpoint`` (moto, or the AWS-rules proxy before it), a fake metadata service, the
    ``torchrun`` given (a script's text) and a recording shutdown first on PATH, the node's folders under ``work``,
    the watchdog looking every second; ``env``: more settings."""
    if shutil.which("aws") is None or shutil.which("curl") is None:
        pytest.skip("the harness needs the aws CLI and curl on PATH")
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in {"torchrun": torchrun, "shutdown": f'#!/bin/bash\necho "$*" >>{work / "shutdown.log"}\n'}.items():
        exe(bin_dir / name, text)
    (work / "boot.sh").write_text(script)
    metadata = {"meta-data/placement/region": "us-east-1", "meta-data/instance-id": "i-0d47a0000000001"}
    with FakeIMDS(metadata) as imds:
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            **node,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
            "AWS_ENDPOINT_URL": endpoint,
            "SRIFTY_HOME": str(work / "opt-srifty"),
            "SRIFTY_STATE_DIR": str(work / "state"),
            "SRIFTY_PER_BOOT_DIR": str(work / "per-boot"),
            "SRIFTY_USER_DATA_LOG": str(work / "user-data.log"),
            "SRIFTY_WATCHDOG_LOG": str(work / "watchdog.log"),
            "SRIFTY_WATCHDOG_INTERVAL_S": "1",
            "SRIFTY_HARNESS_RECORD": str(work / "torchrun.json"),
            **env,
        }
        boot = ["bash", str(work / "boot.sh")]
        try:
            return run_boot(boot, cwd="/", env=environment, timeout=240)
        finally:
            end_watchdogs(Path(environment["SRIFTY_STATE_DIR"]))


def s3_calls_under(url: str, keys: dict[str, str], bucket: str) -> dict[str, str]:
    """Each S3 call of a node that reads its data (``data/a`` in ``bucket``; ``other/b`` beside it), made with
    ``keys``: "ok" or the error's code (a HEAD's bare 403 is AccessDenied)."""
    from botocore.exceptions import ClientError

    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    calls = {
        "ListObjectsV2 data/": lambda: s3.list_objects_v2(Bucket=bucket, Prefix="data/"),
        "ListObjects data/": lambda: s3.list_objects(Bucket=bucket, Prefix="data/"),
        "HeadObject data/a": lambda: s3.head_object(Bucket=bucket, Key="data/a"),
        "GetObject data/a": lambda: s3.get_object(Bucket=bucket, Key="data/a"),
        "GetObject other/b": lambda: s3.get_object(Bucket=bucket, Key="other/b"),
        "PutObject data/c": lambda: s3.put_object(Bucket=bucket, Key="data/c", Body=b"c"),
    }
    said = {}
    for name, call in calls.items():
        try:
            call()
            said[name] = "ok"
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            said[name] = "AccessDenied" if code == "403" else code
    return said
