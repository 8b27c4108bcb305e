"""The fleet is safe on its own (issues #13, #14): the instance-side watchdog run with bash against a fake aws and a
fake shutdown; the whole user_data rendered by terraform and run with fakes; values that would reach a shell refused
or passed intact; plan money checks against the catalog and the guards; a failed or interrupted apply destroyed."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _fleet import (
    EXAMPLES,
    FAKE_CURL,
    FAKE_TORCHRUN,
    WATCHDOG,
    example,
    exe,
    read,
    render,
    run_user_data,
    template_values,
)
from conftest import tf_run
from lightning_srifty.cli import main
from lightning_srifty.provision import apply as runner
from lightning_srifty.provision.terraform.command import check_bucket_name, check_env_names, check_prefix
from lightning_srifty.provision.terraform.generate import TFVARS, default_max_life_h, generate, tfvars
from lightning_srifty.provision.terraform.money import check_entry, check_values
from predictor.exceptions import ConfigError, ProvisionError

# ---------------------------------------------------------------------------------------------------------------------
# The watchdog alone: bash, a fake aws (the heartbeat from a file; autoscaling calls recorded), a fake shutdown
# ---------------------------------------------------------------------------------------------------------------------

FAKE_AWS = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/aws.log"
case "$1 $2" in
  "s3 cp") [ -f "$FAKE_DIR/heartbeat.json" ] && exec cat "$FAKE_DIR/heartbeat.json"; echo "404" >&2; exit 1 ;;
  "autoscaling describe-auto-scaling-instances") echo "mig-1-20250101" ;;
esac
"""

JOB = """#!/bin/bash
trap 'echo TERM >>"$FAKE_DIR/job.log"; exit 75' TERM
echo started >>"$FAKE_DIR/job.log"
while :; do sleep 0.1; done
"""

STUBBORN_JOB = """#!/bin/bash
trap 'echo TERM-ignored >>"$FAKE_DIR/job.log"' TERM
while :; do sleep 0.1; done
"""


@pytest.fixture
def watchdog(tmp_path):
    """Run the module's watchdog.sh against fakes; returns (completed process, folder with the fakes' logs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe(bin_dir / "aws", FAKE_AWS)
    exe(bin_dir / "shutdown", f'#!/bin/bash\necho "$*" >>{tmp_path / "shutdown.log"}\n')
    state = tmp_path / "state"
    state.mkdir()
    jobs: list[subprocess.Popen] = []

    def run(
        heartbeat: dict | None = None,
        *,
        job: str | None = JOB,
        life_s: int = 30,
        asg: bool = False,
        max_age_s: int = 300,
        grace_s: int = 5,
        timeout: float = 30,
    ) -> tuple[subprocess.CompletedProcess, Path]:
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_DIR": str(tmp_path),
            "SRIFTY_WD_STATE_DIR": str(state),
            "SRIFTY_WD_INTERVAL_S": "1",
            "SRIFTY_WD_GRACE_S": str(grace_s),
            "SRIFTY_WD_LIFE_UNTIL": str(int(time.time()) + life_s),
            "SRIFTY_WD_MAX_AGE_S": str(max_age_s),
            "SRIFTY_WD_HEARTBEAT_URI": "s3://runs/job-1/HEARTBEAT.json" if heartbeat is not None else "",
            "SRIFTY_WD_ASG": "1" if asg else "0",
            "SRIFTY_WD_INSTANCE_ID": "i-0123456789abcdef0",
        }
        if heartbeat:
            (tmp_path / "heartbeat.json").write_text(json.dumps(heartbeat))
        if job is not None:
            proc = subprocess.Popen(["bash", "-c", job], env=env)
            jobs.append(proc)
            (state / "job.pid").write_text(f"{proc.pid}\n")
        done = subprocess.run(
            ["bash", str(WATCHDOG)], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        for proc in jobs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        return done, tmp_path

    yield run
    for proc in jobs:  # only the jobs this fixture started
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def beat(age_s: float = 0, max_age_s: int = 120, life_s: float = 3600) -> dict:
    now = time.time()
    return {
        "protocol": "srifty.heartbeat/v1",
        "launch_id": "launch-1",
        "written_unix": now - age_s,
        "max_age_s": max_age_s,
        "max_life_until_unix": now + life_s,
    }


@pytest.mark.slow  # the watchdog's loop under bash, 5-10 s
def test_a_fresh_heartbeat_keeps_the_job_until_the_life_cap(watchdog) -> None:
    started = time.monotonic()
    done, logs = watchdog(beat(age_s=1), life_s=4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started >= 3  # a fresh heartbeat did not stop it before the cap
    assert "stopping: the fleet's life cap has passed" in done.stdout
    assert read(logs / "job.log").splitlines() == ["started", "TERM"]  # SIGTERM: the job checkpointed and left
    assert read(logs / "shutdown.log") == "-h now\n"
    assert read(logs / "aws.log").count("s3 cp s3://runs/job-1/HEARTBEAT.json -") >= 3


@pytest.mark.slow  # the watchdog's loop under bash, 5-10 s
def test_a_stale_heartbeat_stops_the_job_leaves_the_asg_and_shuts_down(watchdog) -> None:
    done, logs = watchdog(beat(age_s=400, max_age_s=120), asg=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # 400 s old when written; a second or two more by the time a loaded machine reads it
    assert re.search(r"the launcher's heartbeat is 40\ds old \(max_age_s 120\)", done.stdout), done.stdout
    assert read(logs / "job.log").splitlines() == ["started", "TERM"]
    calls = [line for line in read(logs / "aws.log").splitlines() if line.startswith("autoscaling")]
    assert calls == [
        "autoscaling describe-auto-scaling-instances --region us-east-1 --instance-ids i-0123456789abcdef0 "
        "--query AutoScalingInstances[0].AutoScalingGroupName --output text",
        # weighted units: DetachInstances decrements by 1 per instance, not by its 100 units (issue #35 row L)
        "autoscaling suspend-processes --region us-east-1 --auto-scaling-group-name mig-1-20250101 "
        "--scaling-processes Launch",
        "autoscaling update-auto-scaling-group --region us-east-1 --auto-scaling-group-name mig-1-20250101 "
        "--min-size 0",
        "autoscaling detach-instances --region us-east-1 --auto-scaling-group-name mig-1-20250101 --instance-ids "
        "i-0123456789abcdef0 --should-decrement-desired-capacity",
    ]
    assert read(logs / "shutdown.log") == "-h now\n"


@pytest.mark.slow  # the watchdog's loop under bash, 5-10 s
def test_the_launchers_life_cap_in_the_heartbeat_stops_the_fleet(watchdog) -> None:
    done, logs = watchdog(beat(age_s=1, life_s=-5))
    assert "the launcher's max_life_until_unix" in done.stdout
    assert read(logs / "shutdown.log") == "-h now\n"


@pytest.mark.slow  # the watchdog's loop under bash, 5-10 s
def test_an_unreadable_heartbeat_stops_the_fleet_after_max_age(watchdog) -> None:
    started = time.monotonic()
    done, logs = watchdog({}, max_age_s=2)  # a heartbeat URI, but no record behind it
    assert "no readable heartbeat at s3://runs/job-1/HEARTBEAT.json" in done.stdout
    assert 2 <= time.monotonic() - started < 15
    assert read(logs / "job.log").splitlines() == ["started", "TERM"]


@pytest.mark.slow  # the watchdog's loop under bash, 5-10 s
def test_a_malformed_heartbeat_counts_as_unreadable(watchdog) -> None:
    done, logs = watchdog({"written_unix": "soon", "max_age_s": 60}, max_age_s=2)
    assert "no readable heartbeat" in done.stdout and read(logs / "shutdown.log") == "-h now\n"


@pytest.mark.slow  # the watchdog's loop under bash, 5-10 s
def test_without_heartbeat_the_job_exit_stops_the_fleet(watchdog) -> None:
    done, logs = watchdog(None, job="sleep 1")  # a job that ends by itself
    assert "stopping: the training job has exited" in done.stdout
    assert read(logs / "shutdown.log") == "-h now\n" and "s3 cp" not in read(logs / "aws.log")


@pytest.mark.slow  # the watchdog's loop under bash, 5 s
def test_the_instance_shuts_down_after_the_boot_scripts_status_record(watchdog, tmp_path) -> None:
    """The job exits; the boot script is still writing its log and status record beside the checkpoints (on_exit):
    shutdown would stop the upload in flight (found by srifty rehearse: a status record missing). The watchdog waits
    for user_data.done, bounded."""
    state = tmp_path / "state"
    boot = subprocess.Popen(
        ["bash", "-c", f"sleep 3; echo written >{tmp_path / 'status.log'}; touch {state}/user_data.done; sleep 2"]
    )
    try:
        (state / "user_data.pid").write_text(f"{boot.pid}\n")
        saw = tmp_path / "saw.log"  # what the shutdown found written
        exe(
            tmp_path / "bin" / "shutdown",
            f'#!/bin/bash\necho "$*" >>{tmp_path / "shutdown.log"}\n'
            f"cat {tmp_path / 'status.log'} >>{saw} 2>/dev/null\n",
        )
        done, logs = watchdog(None, job="sleep 0.5", grace_s=0)
        assert "stopping: the training job has exited" in done.stdout
        assert read(saw) == "written\n"  # the status record was written before the power went
        assert read(logs / "shutdown.log") == "-h now\n"
    finally:
        boot.kill()
        boot.wait()


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(watchdog) -> None:
    started = time.monotonic()
    done, logs = watchdog(beat(age_s=999), job=STUBBORN_JOB, grace_s=2)
    assert "still running after 2s: SIGKILL" in done.stdout
    assert time.monotonic() - started >= 2 and read(logs / "shutdown.log") == "-h now\n"


# ---------------------------------------------------------------------------------------------------------------------
# user_data as terraform renders it, run with bash against fakes (no cloud): values intact, life cap, watchdog
# ---------------------------------------------------------------------------------------------------------------------


def test_rendered_user_data_passes_odd_values_intact_and_starts_the_safety_net(tf_env, tmp_path) -> None:
    odd_uri = 's3://b/it\'s a $HOME `touch x` "q" $(id)/'  # the module refuses such a prefix; the quoting holds anyway
    odd_arg = 'it\'s a $HOME; `touch pwned` "q" $(touch pwned2)'
    odd_env = {"SRIFTY_STRATEGY": '{"layout": "fsdp:full_shard+ac"}', "SRIFTY_ODD": odd_arg}  # the plan's settings
    values = template_values(
        name="quoting",
        argv=" ".join("'" + a.replace("'", "'\\''") + "'" for a in ["train.py", odd_arg]),
        checkpoint_uri_b64=base64.b64encode(odd_uri.encode()).decode(),
        resume_from="'" + odd_arg.replace("'", "'\\''") + "'",
        env_count=len(odd_env),
        env_b64=base64.b64encode(json.dumps(odd_env).encode()).decode(),
        heartbeat=True,
    )
    script = render(tf_env, tmp_path / "console", values)
    work = tmp_path / "cwd"
    work.mkdir()
    fakes = {
        "curl": FAKE_CURL,
        "aws": FAKE_AWS.replace('"autoscaling describe', '"ec2 describe-instances") echo 10.0.0.5 ;;\n  "x'),
        "torchrun": FAKE_TORCHRUN.format(python=sys.executable),
        "shutdown": f'#!/bin/bash\necho "$*" >>{tmp_path / "shutdown.log"}\n',
    }
    run = run_user_data(tmp_path, script, fakes, cwd=work, extra_env={"AWS_DEFAULT_REGION": ""})
    assert run.returncode == 0, read(tmp_path / "user-data.log")[-3000:]
    record = json.loads((tmp_path / "torchrun.json").read_text())
    assert record["env"]["SRIFTY_CHECKPOINT_URI"] == odd_uri
    assert record["env"]["AWS_DEFAULT_REGION"] == "us-east-1"  # the instance's (IMDS), for the job's S3 calls
    assert record["env"]["PL_TRAINER_NUM_NODES"] == "1"  # the fleet's nodes, the Trainer's default num_nodes
    assert record["env"]["LT_NUM_NODES"] == "1"  # and Lightning Fabric's
    assert record["argv"][-3:] == [odd_arg, "--resume-from", odd_arg]
    assert {k: record["env"][k] for k in odd_env} == odd_env  # train.env reached the job, byte for byte
    assert not list(work.iterdir()) and not (Path("/") / "pwned").exists()  # nothing ran
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "-h now" not in read(tmp_path / "shutdown.log"):
        time.sleep(0.2)
    shutdowns = read(tmp_path / "shutdown.log").splitlines()
    assert shutdowns[0].startswith("-h +90 ") and shutdowns[-1] == "-h now", shutdowns  # the cap, then the watchdog
    log = read(tmp_path / "watchdog.log")
    assert f"heartbeat {odd_uri}HEARTBEAT.json" in log and "the training job has exited" in log
    # the script's exit status went beside the checkpoints (#14 item 3), to the exact (odd) URI
    assert f"s3 cp - {odd_uri}status/quoting-i-0abc.json --region us-east-1" in read(tmp_path / "aws.log")


# ---------------------------------------------------------------------------------------------------------------------
# Values that reach a shell: refused by srifty terraform and by the module
# ---------------------------------------------------------------------------------------------------------------------

MALICIOUS = [
    ({"bucket": "mybucket$(touch /tmp/x)"}, "bucket", "not a valid S3 bucket name"),
    ({"bucket": "my..bucket"}, "bucket", "two adjacent dots"),
    ({"bucket": "192.168.1.10"}, "bucket", "IP address"),
    ({"bucket": "xn--bucket"}, "bucket", "must not start with"),
    ({"checkpoint_prefix": "runs/$(touch /tmp/x)/"}, "checkpoint_prefix", "folders of letters"),
    ({"checkpoint_prefix": "runs/`id`/"}, "checkpoint_prefix", "folders of letters"),
    ({"checkpoint_prefix": "runs/*/"}, "checkpoint_prefix", "folders of letters"),
    ({"checkpoint_prefix": "runs/../x/"}, "checkpoint_prefix", "folders of letters"),
]


@pytest.mark.parametrize(("change", "parameter", "message"), MALICIOUS)
def test_srifty_terraform_refuses_a_malicious_bucket_or_prefix(change, parameter, message, catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    with pytest.raises(ConfigError, match=message) as info:
        tfvars(plan, choice, dataclasses.replace(options, **change), catalog)
    assert (info.value.parameter, info.value.value) == (parameter, next(iter(change.values())))


def test_the_s3_name_rules() -> None:
    for good in ("abc", "my-team.checkpoints", "a" * 63, "b1-2-3"):
        assert check_bucket_name(good) == good
    for bad in ("ab", "a" * 64, "Upper", "-start", "end-", "b_x", "a b", "x-s3alias", "sthree-x", "amzn-s3-demo-x"):
        with pytest.raises(ConfigError):
            check_bucket_name(bad)
    for good in ("checkpoints/run-1/", "a/", "a.b/c_d/"):
        assert check_prefix(good) == good
    for bad in ("", "/", "/abs/", "no-slash", "a//b/", ".hidden/", "a b/", "a'b/", "x/" * 300):
        with pytest.raises(ConfigError):
            check_prefix(bad)
    assert check_env_names({"SRIFTY_RESUME": "x", "_A1": ""})
    for bad in ("lower", "1ABC", "A-B", "A;touch x", "PATH=x"):
        with pytest.raises(ConfigError, match=r"\[A-Z_\]\[A-Z0-9_\]\*") as info:
            check_env_names({bad: "v"})
        assert info.value.value == bad


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("bucket", "mybucket$(touch /tmp/x)", "must be a valid S3 bucket name"),
        ("prefix", "runs/$(touch /tmp/x)/", "must be folders of letters"),
    ],
)
def test_terraform_refuses_a_malicious_bucket_or_prefix(tf_env, tmp_path, catalog, key, value, message) -> None:
    plan, choice, options = example("single-node-on-demand")
    root = generate(plan, tmp_path / "root", choice=choice, options=options, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    values = json.loads((root / TFVARS).read_text())
    values["checkpoints"] = {"create_bucket": False, "bucket": "ok-bucket", "prefix": "runs/", key: value}
    (root / TFVARS).write_text(json.dumps(values))
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-refresh=false")
    assert result.returncode != 0 and message in " ".join(result.stderr.split()), result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Money: the plan's figures recomputed from the catalog; the guards
# ---------------------------------------------------------------------------------------------------------------------


def _tamper(plan, choice: int, group: dict | None = None, **entry_change):
    entry = plan.entries[choice]
    groups = list(entry.groups)
    if group:
        groups[0] = dataclasses.replace(groups[0], **group)
    entries = list(plan.entries)
    entries[choice] = dataclasses.replace(entry, groups=tuple(groups), **entry_change)
    return dataclasses.replace(plan, entries=entries)


@pytest.mark.parametrize(
    ("example_name", "group", "entry", "field"),
    [
        ("single-node-on-demand", {"usd_per_hour": 0.01}, {}, "entries[0].groups[0].usd_per_hour"),
        ("single-node-on-demand", {}, {"usd_per_hour": 0.5}, "entries[0].usd_per_hour"),
        ("single-node-on-demand", {"gpus_per_instance": 8}, {}, "entries[0].groups[0].gpus_per_instance"),
        ("multi-node-spot", {"count": 9}, {}, "entries[0].groups[0].count"),
        ("multi-node-spot", {"on_demand": 4, "spot": 0}, {}, "entries[0].groups[0].usd_per_hour"),
        ("multi-node-spot", {}, {"nodes": 2}, "entries[0].nodes"),
        ("multi-node-spot", {}, {"market": "on-demand"}, "entries[0].market"),
        ("multi-node-spot", {}, {"fleet": "p4d.24xlarge:1"}, "entries[0].fleet"),
    ],
)
def test_a_tampered_or_stale_plan_is_refused(example_name, group, entry, field, catalog) -> None:
    plan, choice, options = example(example_name)
    assert check_entry(plan, choice, catalog) == pytest.approx(plan.entries[choice].usd_per_hour)
    bad = _tamper(plan, choice, group, **entry)
    with pytest.raises(ConfigError, match=r"stale .* or was edited") as info:
        tfvars(bad, choice, options, catalog)
    assert info.value.parameter == field, str(info.value)
    plan_value = info.value.value
    assert repr(plan_value) in str(info.value) and "the catalog gives" in str(info.value)


def test_an_unknown_type_cannot_be_priced(catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    bad = _tamper(plan, choice, {"instance_type": "g9.mega"}, fleet="g9.mega:1")
    with pytest.raises(ConfigError, match=r"'g9\.mega' is not in the catalog") as info:
        tfvars(bad, choice, options, catalog)
    assert info.value.parameter == "entries[0].groups[0].instance_type"


def test_the_default_life_cap_lets_a_run_inside_its_own_interval_finish(catalog) -> None:
    """A trial: a fleet predicted at 1.41 h with an 80 % interval of 0.50-4.4 h (a wide one: a profile without an
    operator table) was capped at 1.41 x 1.5 + 1 = 3.1 h, so a run well inside its own prediction was stopped before
    it finished. The cap is the later of that and the time's 99th percentile (the interval's end read as a log-normal's
    90th), + 1 h; a narrow interval keeps the x 1.5 rule."""
    plan, choice, _ = example("multi-node-spot")
    entry = plan.entries[choice]
    wide = dataclasses.replace(entry, time_h=1.41, time_interval_h=(0.50, 4.4))
    p99 = 1.41 * (4.4 / 1.41) ** (2.3263 / 1.2816)  # 11.2 h
    assert wide.life_cap_h() == pytest.approx(p99 + 1) and wide.life_cap_h() > 4.4 * 2
    assert default_max_life_h(wide) == pytest.approx(math.ceil((p99 + 1) * 60) / 60)
    narrow = dataclasses.replace(entry, time_h=1.41, time_interval_h=(1.30, 1.55))
    assert narrow.life_cap_h() == pytest.approx(1.41 * 1.5 + 1)


def test_the_guards_default_to_the_plans_constraints_and_can_be_tightened(catalog) -> None:
    plan, choice, options = example("multi-node-spot")  # 4 x p4d.24xlarge spot
    values = tfvars(plan, choice, options, catalog)
    assert values["limits"] == {"max_instances": plan.constraints.max_instances, "max_hourly_usd": None}
    assert values["max_life_h"] == default_max_life_h(plan.entries[choice])
    entry = plan.entries[choice]
    high = entry.time_range_h()[1]
    p99 = entry.time_h * (high / entry.time_h) ** (2.3263 / 1.2816)
    assert values["max_life_h"] == pytest.approx(max(entry.time_h * 1.5, p99) + 1, abs=1 / 60)
    with pytest.raises(ConfigError, match="4 instances, more than max_instances = 3") as info:
        tfvars(plan, choice, dataclasses.replace(options, max_instances=3), catalog)
    assert info.value.parameter == "max_instances"
    usd = plan.entries[choice].usd_per_hour
    with pytest.raises(ConfigError, match=r"more than max_hourly_usd = \$5.0000/h") as info:
        tfvars(plan, choice, dataclasses.replace(options, max_hourly_usd=5.0), catalog)
    assert info.value.value == pytest.approx(usd)
    ok = tfvars(plan, choice, dataclasses.replace(options, max_hourly_usd=usd + 1, max_life_h=2.5), catalog)
    assert ok["limits"]["max_hourly_usd"] == usd + 1 and ok["max_life_h"] == 2.5
    with pytest.raises(ConfigError, match=r"'max_life_h' parameter .* a number >= 0.25 and <= 720") as info:
        dataclasses.replace(options, max_life_h=0.0)  # refused when the options are made
    assert info.value.parameter == "max_life_h"


def test_cli_guards_and_life_cap(tmp_path, capsys) -> None:
    plan = EXAMPLES / "multi-node-spot" / "plan.json"
    base = ["terraform", "--plan", str(plan), "--out", str(tmp_path / "infra"), "--name", "guarded", "--no-code"]
    assert main([*base, "--max-instances", "2"]) == 2
    assert "more than max_instances = 2" in capsys.readouterr().err
    assert main([*base, "--max-hourly", "1.5"]) == 2
    assert "more than max_hourly_usd = $1.5000/h" in capsys.readouterr().err
    assert not (tmp_path / "infra").exists()
    assert main([*base, "--max-life-h", "3", "--max-hourly", "100"]) == 0
    values = json.loads((tmp_path / "infra" / TFVARS).read_text())
    assert values["max_life_h"] == 3 and values["limits"] == {"max_instances": 4, "max_hourly_usd": 100}


def test_apply_rechecks_the_written_values_before_running_terraform(tmp_path, catalog, monkeypatch) -> None:
    plan, choice, options = example("multi-node-spot")
    infra = generate(plan, tmp_path / "infra", choice=choice, options=options, catalog=catalog).out
    values = json.loads((infra / TFVARS).read_text())
    assert check_values(values, catalog) == pytest.approx(plan.entries[choice].usd_per_hour)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # terraform is never reached
    for edit, field in (
        (lambda v: v["groups"][0].update(spot=40), "predicted.usd_per_hour"),
        (lambda v: v["predicted"].update(usd_per_hour=1.0), "predicted.usd_per_hour"),
        (lambda v: v["limits"].update(max_instances=2), "max_instances"),
        (lambda v: v["limits"].update(max_hourly_usd=1.0), "max_hourly_usd"),
        (lambda v: v.pop("limits"), "limits.max_instances"),
        (lambda v: v.update(groups=[]), "groups"),  # was a TypeError (a positional to ConfigError; mypy found it)
        # a trial: a group's GPUs and EFA interfaces left as another type's (price and count mended by hand)
        (lambda v: v["groups"][0].update(gpus_per_instance=1), "groups[0].gpus_per_instance"),
        (lambda v: v["groups"][0].update(network_interfaces=64), "groups[0].network_interfaces"),
    ):
        bad = json.loads(json.dumps(values))
        edit(bad)
        (infra / TFVARS).write_text(json.dumps(bad))
        with pytest.raises(ConfigError) as info:
            runner.apply(infra, yes=True, catalog=catalog, check=False)
        assert info.value.parameter == field, str(info.value)
        assert "The plan's" not in str(info.value)  # the written values are what was checked (a trial)


def test_the_module_refuses_a_fleet_over_its_limits_at_plan(tf_env, moto_endpoint, tmp_path, catalog) -> None:
    """terraform plan (moto's endpoints for the data sources): the preconditions refuse more instances than
    limits.max_instances and a predicted $/h above limits.max_hourly_usd; a plan within them has
    instance_initiated_shutdown_behavior = terminate on every launch template and lets the role leave only its
    fleet's Auto Scaling group."""
    import boto3

    plan, choice, options = example("heterogeneous-mixed")
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]  # the module looks its root device up
    opts = dataclasses.replace(options, aws_endpoint=moto_endpoint, ami=image, setup_command="true")
    root = generate(plan, tmp_path / "root", choice=choice, options=opts, catalog=catalog).out
    assert tf_run(tf_env, root, "init", "-backend=false", "-input=false", "-no-color").returncode == 0
    good = json.loads((root / TFVARS).read_text())
    result = tf_run(tf_env, root, "plan", "-input=false", "-no-color", "-out=tfplan")
    assert result.returncode == 0, result.stdout + result.stderr
    show = json.loads(tf_run(tf_env, root, "show", "-json", "tfplan").stdout)
    resources = show["planned_values"]["root_module"]["child_modules"][0]["resources"]
    templates = [r["values"] for r in resources if r["type"] == "aws_launch_template"]
    assert len(templates) == 2 and all(t["instance_initiated_shutdown_behavior"] == "terminate" for t in templates)
    policy = json.loads(next(r["values"]["policy"] for r in resources if r["type"] == "aws_iam_role_policy"))
    (leave,) = [s for s in policy["Statement"] if s.get("Sid") == "LeaveOwnAutoScalingGroup"]
    assert sorted(leave["Action"]) == [
        "autoscaling:DetachInstances",
        "autoscaling:SuspendProcesses",  # the group launches nothing more (weighted units: issue #35 row L)
    ]
    assert leave["Resource"].endswith(f"autoScalingGroupName/{good['name']}-*")
    assert leave["Condition"] == {"StringEquals": {"autoscaling:ResourceTag/srifty:fleet": good["name"]}}
    # a trial: the role could raise its own group's size (any code on a node); it may only lower the minimum to 0
    (lower,) = [s for s in policy["Statement"] if s.get("Sid") == "LowerOwnAutoScalingGroupMinimum"]
    assert lower["Action"] == "autoscaling:UpdateAutoScalingGroup" and lower["Resource"] == leave["Resource"]
    assert lower["Condition"] == {
        "StringEquals": {"autoscaling:ResourceTag/srifty:fleet": good["name"]},
        "NumericEquals": {"autoscaling:MinSize": "0"},
        "Null": {"autoscaling:MaxSize": "true", "autoscaling:DesiredCapacity": "true"},
    }
    # the policy as IAM decides the watchdog's calls (the rehearsal's Auto Scaling rule: moto denies every conditioned
    # statement, and the rehearsal's nodes could never leave their group until --finish found it)
    from lightning_srifty.provision.rehearsal.aws_rules import asg_allowed

    arn = f"arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:0f1e:autoScalingGroupName/{good['name']}-2026"
    ours = {"srifty:fleet": good["name"]}
    for action in ("SuspendProcesses", "DetachInstances"):
        assert asg_allowed(policy["Statement"], action, arn, ours, {}) == "LeaveOwnAutoScalingGroup"
        assert asg_allowed(policy["Statement"], action, arn, {"srifty:fleet": "another"}, {}) is None
        assert asg_allowed(policy["Statement"], action, arn.replace(good["name"], "another"), ours, {}) is None
    assert asg_allowed(policy["Statement"], "ResumeProcesses", arn, ours, {}) is None
    lowered = {"AutoScalingGroupName": f"{good['name']}-2026", "MinSize": "0"}
    assert asg_allowed(policy["Statement"], "UpdateAutoScalingGroup", arn, ours, lowered) == (
        "LowerOwnAutoScalingGroupMinimum"
    )
    for more in ({"MinSize": "1"}, {"DesiredCapacity": "9"}, {"MaxSize": "9"}):
        assert asg_allowed(policy["Statement"], "UpdateAutoScalingGroup", arn, ours, {**lowered, **more}) is None
    for limits, sentence in (
        ({"max_instances": 2}, "more than limits.max_instances (2)"),
        ({"max_instances": 3, "max_hourly_usd": 10}, "than limits.max_hourly_usd: choose a cheaper fleet"),
    ):
        (root / TFVARS).write_text(json.dumps({**good, "limits": limits}))
        result = tf_run(tf_env, root, "plan", "-input=false", "-no-color")
        assert result.returncode != 0 and sentence in " ".join(result.stderr.split()), result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# A failed or interrupted apply leaves nothing billing (a fake terraform binary behind python-terraform)
# ---------------------------------------------------------------------------------------------------------------------

# what terraform's state lists of what an apply read (data sources: nothing made, nothing billing)
DATA_SOURCES = (
    'module.fleet.data.aws_ami.image["ami-0abc"]',
    "module.fleet.data.aws_iam_policy_document.instance",
    "data.aws_region.current",
)

FAKE_TERRAFORM = """#!{python}
import json, os, sys
DATA_SOURCES = {data_sources!r}
here = os.getcwd()
state = os.path.join(here, "fake.state")
with open(os.path.join(here, "calls.log"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
args = [a for a in sys.argv[1:] if not a.startswith("-")]
read = lambda: [l for l in open(state).read().splitlines() if l] if os.path.exists(state) else []
if args[0] == "plan":
    sys.exit(2)
if args[0] == "show":
    print(json.dumps({{"resource_changes": [{{"type": "aws_iam_role", "change": {{"actions": ["create"]}}}}]}}))
elif args[:2] == ["state", "list"]:
    print("\\n".join(read()))
elif args[0] == "apply":
    with open(state, "a") as f:
        f.write("module.fleet.aws_iam_role.instance\\nmodule.fleet.aws_launch_template.group[\\"g5.xlarge\\"]\\n")
        f.write("".join(line + "\\n" for line in DATA_SOURCES))  # what the apply read, which it did not make
    if os.environ.get("FAKE_TF_APPLY") == "fail":
        print("Error: creating Auto Scaling Group: ValidationError", file=sys.stderr)
        sys.exit(1)
elif args[0] == "destroy":
    if os.environ.get("FAKE_TF_DESTROY") == "fail":
        print("Error: deleting IAM role: DeleteConflict", file=sys.stderr)
        sys.exit(1)
    open(state, "w").close()
elif args[0] == "output":
    print("{{}}")
"""


@pytest.fixture
def fake_terraform(tmp_path, monkeypatch, catalog):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe(bin_dir / "terraform", FAKE_TERRAFORM.format(python=sys.executable, data_sources=DATA_SOURCES))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    plan, choice, options = example("single-node-on-demand")
    infra = generate(plan, tmp_path / "infra", choice=choice, options=options, catalog=catalog).out

    def calls() -> list[str]:
        return [
            line.split()[0] if line.split()[0] != "state" else "state list"
            for line in read(infra / "calls.log").splitlines()
        ]

    return infra, calls


def test_a_failed_apply_of_a_new_fleet_destroys_what_it_created(fake_terraform, monkeypatch, catalog) -> None:
    infra, calls = fake_terraform
    monkeypatch.setenv("FAKE_TF_APPLY", "fail")
    lines: list[str] = []
    with pytest.raises(ProvisionError, match="everything it had created was destroyed; nothing is left billing"):
        runner.apply(infra, yes=True, echo=lines.append, catalog=catalog, check=False)
    assert calls() == ["init", "plan", "show", "state list", "apply", "state list", "destroy", "state list"]
    assert read(infra / "fake.state").strip() == ""
    assert "Destroying the 2 resources the apply created, so that nothing is left billing." in lines
    destroy_call = next(line for line in read(infra / "calls.log").splitlines() if line.startswith("destroy"))
    assert "-auto-approve" in destroy_call and "-lock-timeout=300s" in destroy_call


def test_a_failed_apply_after_one_that_only_read_data_sources_still_cleans_up(
    fake_terraform, monkeypatch, catalog
) -> None:
    """The state of an apply that failed before it made anything holds the data sources it read. They made the next
    failed apply's fleet look standing, and what it created was left billing (a review): only what terraform makes
    counts."""
    infra, calls = fake_terraform
    (infra / "fake.state").write_text("".join(line + "\n" for line in DATA_SOURCES))
    monkeypatch.setenv("FAKE_TF_APPLY", "fail")
    lines: list[str] = []
    with pytest.raises(ProvisionError, match="everything it had created was destroyed; nothing is left billing"):
        runner.apply(infra, yes=True, echo=lines.append, catalog=catalog, check=False)
    assert "destroy" in calls()
    assert "Destroying the 2 resources the apply created, so that nothing is left billing." in lines


def test_a_failed_apply_over_a_standing_fleet_destroys_nothing(fake_terraform, monkeypatch, catalog) -> None:
    infra, calls = fake_terraform
    (infra / "fake.state").write_text("module.fleet.aws_autoscaling_group.fleet[0]\n")  # a fleet already there
    monkeypatch.setenv("FAKE_TF_APPLY", "fail")
    with pytest.raises(ProvisionError, match=r"so nothing was destroyed .* `srifty destroy --dir"):
        runner.apply(infra, yes=True, echo=lambda line: None, catalog=catalog, check=False)
    assert "destroy" not in calls()


def test_a_failed_clean_up_says_what_may_still_bill(fake_terraform, monkeypatch, catalog) -> None:
    infra, _ = fake_terraform
    monkeypatch.setenv("FAKE_TF_APPLY", "fail")
    monkeypatch.setenv("FAKE_TF_DESTROY", "fail")
    with pytest.raises(ProvisionError, match=r"failed too \(2 resources still in the state, which may be billing\)"):
        runner.apply(infra, yes=True, echo=lambda line: None, catalog=catalog, check=False)


def test_an_interrupted_apply_destroys_what_it_created(fake_terraform, monkeypatch, catalog) -> None:
    infra, calls = fake_terraform
    real_run = runner._run_shown

    def interrupted(tf, args, echo, **kwargs):
        real_run(tf, args, echo)
        raise KeyboardInterrupt  # Ctrl-C while terraform applies (it has created two resources)

    monkeypatch.setattr(runner, "_run_shown", interrupted)
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        runner.apply(infra, yes=True, echo=lines.append, catalog=catalog, check=False)
    assert calls()[-3:] == ["state list", "destroy", "state list"]
    assert read(infra / "fake.state").strip() == ""
    assert (
        lines[-1]
        == "Interrupted during terraform apply: everything it had created was destroyed; nothing is left billing."
    )


def test_the_heartbeat_names_are_checked_before_the_handover(tmp_path) -> None:
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner

    provisioner = TerraformProvisioner(tmp_path, "s3://runs/job-1")
    with pytest.raises(ConfigError, match="not \\[A-Z_\\]"):
        provisioner.start(None, {"SRIFTY_RESUME": "", "X;touch /tmp/y": "1"})  # type: ignore[arg-type]


def test_a_one_node_fleets_verdict_is_read_for_the_launch(tmp_path, moto_endpoint, monkeypatch, catalog) -> None:
    """A one-node fleet's node writes its exit record too (its own GPU failed under the job: 75, to be replaced), and
    srifty launch reads it: before, the launcher asked no verdict of one node and a GPU's failure ended the launch."""
    import copy
    import json

    import boto3

    from _support import MINIMAL
    from lightning_srifty.provision.base import LaunchedFleet
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="runs")
    plan = rank(load_profile(copy.deepcopy(MINIMAL)), Constraints(steps=10, max_instances=1), catalog=catalog)
    fleet = LaunchedFleet(plan, 0, "f-1")
    assert fleet.entry.nodes == 1
    provisioner = TerraformProvisioner(tmp_path, "s3://runs/job-1")
    assert provisioner.node_verdicts(fleet) == []
    record = {"instance_id": "i-1", "exit_code": 1, "final": 75, "gpu_fault": "nvidia-smi: GPU is lost."}
    s3.put_object(Bucket="runs", Key="job-1/exited/f-1/i-1.json", Body=json.dumps(record).encode())
    assert provisioner.node_verdicts(fleet) == [75]


def test_the_launch_sees_a_fleets_instance_gone_without_a_word(tmp_path, moto_endpoint, monkeypatch, catalog) -> None:
    """A one-node fleet's instance that goes away without a word (no notice, no record) has no peer to say so, and
    the launch waited with no end (a review). The provisioner now lists the fleet's instances (its srifty:fleet tag,
    pending or running, against moto's EC2): one it listed since the handover, listed no more on
    two looks VANISHED_CONFIRM_S apart, that wrote neither an exit record nor its boot script's status, is gone,
    once no other member is up without a record (a survivor's own verdict comes first; a group's replacement carries
    the job). One that recorded its end is not gone, nor is an instance of another fleet; EC2 unreadable says so
    once and finds none."""
    import copy
    import json

    import boto3

    from _support import MINIMAL
    from lightning_srifty.provision.base import LaunchedFleet
    from lightning_srifty.provision.launcher import terraform_fleet
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from lightning_srifty.provision.terraform.generate import Options
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="runs")
    plan = rank(load_profile(copy.deepcopy(MINIMAL)), Constraints(steps=10, max_instances=1), catalog=catalog)
    fleet = LaunchedFleet(plan, 0, "f-1")
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name=fleet.entry.region)
    image = ec2.describe_images()["Images"][0]["ImageId"]

    def launch(name: str) -> str:
        tags = [{"ResourceType": "instance", "Tags": [{"Key": "srifty:fleet", "Value": name}]}]
        made = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="t3.micro", TagSpecifications=tags)
        return made["Instances"][0]["InstanceId"]

    node, said, failed_setup, survivor, other = (launch(n) for n in ("f-1", "f-1", "f-1", "f-1", "f-10"))
    echo: list[str] = []
    provisioner = TerraformProvisioner(
        tmp_path, "s3://runs/job-1", Options(aws_endpoint=moto_endpoint), echo=echo.append
    )
    # every node listed: the fleet's members, up
    assert provisioner.vanished(fleet) == ([], sorted([node, said, failed_setup, survivor]))
    record = {"instance_id": said, "exit_code": 0, "final": 0}
    s3.put_object(Bucket="runs", Key=f"job-1/exited/f-1/{said}.json", Body=json.dumps(record).encode())
    s3.put_object(Bucket="runs", Key=f"job-1/status/f-1-{failed_setup}.json", Body=b'{"exit_code": 1}')
    ec2.terminate_instances(InstanceIds=[node, said, failed_setup, other])
    monkeypatch.setattr(terraform_fleet, "VANISHED_CONFIRM_S", 0.0)
    # gone: the one that recorded nothing; up: a member still listed that has not ended its job (its verdict tells)
    assert provisioner.vanished(fleet) == ([node], [survivor])
    record = {"instance_id": survivor, "exit_code": 1, "final": None}  # deciding
    s3.put_object(Bucket="runs", Key=f"job-1/exited/f-1/{survivor}.json", Body=json.dumps(record).encode())
    assert provisioner.vanished(fleet) == ([node], [])
    # the group's replacement, up: it may carry the job (from the newest checkpoint since the handover)
    replacement = launch("f-1")
    assert provisioner.vanished(fleet) == ([node], [replacement]) and replacement in fleet.data["members"]
    s3.put_object(Bucket="runs", Key=f"job-1/status/f-1-{replacement}.json", Body=b'{"exit_code": 1}')
    assert provisioner.vanished(fleet) == ([node], [])  # its setup failed: nothing is up
    # gone for less than VANISHED_CONFIRM_S (EC2's API is eventually consistent): not yet concluded, still up
    monkeypatch.setattr(terraform_fleet, "VANISHED_CONFIRM_S", 10.0)
    later = LaunchedFleet(plan, 0, "f-1")
    fresh = TerraformProvisioner(tmp_path, "s3://runs/job-1", Options(aws_endpoint=moto_endpoint))
    later.data["members"] = {node}
    assert fresh.vanished(later) == ([], [node]) and node in later.data["gone_since"]
    later.data["gone_since"][node] -= 11
    assert fresh.vanished(later).gone == [node]

    # the fleet's own Auto Scaling group, when the apply made one: a fleet of the same name elsewhere is not this one
    def tagged(name: str, group: str | None) -> str:
        tags = [{"Key": "srifty:fleet", "Value": name}] + (
            [{"Key": "aws:autoscaling:groupName", "Value": group}] if group else []
        )
        spec = [{"ResourceType": "instance", "Tags": tags}]
        made = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, TagSpecifications=spec)
        return made["Instances"][0]["InstanceId"]

    ours = tagged("f-3", "f-3-20261202")
    tagged("f-3", "f-3-another")  # another launch's
    scoped = LaunchedFleet(plan, 0, "f-3", {"outputs": {"fleet": {"autoscaling_group_name": "f-3-20261202"}}})
    assert provisioner.vanished(scoped).gone == [] and scoped.data["members"] == {ours}
    # the job left a fleet: its handover is withdrawn (a replacement of its nodes then waits, never trains)
    from lightning_srifty import protocol, store

    protocol.write_record("s3://runs/job-1", protocol.Handover(launch_id="L1", fleet="f-1", env={}))
    provisioner.retire(fleet)
    assert not store.exists("s3://runs/job-1", protocol.handover("f-1"))
    # a launcher whose credentials may not list instances: EC2's refusal, said once
    from botocore.stub import Stubber

    refusing = boto3.client("ec2", endpoint_url=moto_endpoint, region_name=fleet.entry.region)
    stub = Stubber(refusing)
    for _ in range(2):
        stub.add_client_error("describe_instances", "UnauthorizedOperation", "not authorized: ec2:DescribeInstances")
    stub.activate()
    monkeypatch.setattr(terraform_fleet, "client", lambda *a, **k: refusing)
    gone, refused = LaunchedFleet(plan, 0, "f-2"), TerraformProvisioner(tmp_path, "s3://runs/job-1", echo=echo.append)
    assert refused.vanished(gone) == ([], []) and refused.vanished(gone) == ([], [])
    assert len([line for line in echo if "could not be listed" in line]) == 1, echo
    assert "UnauthorizedOperation" in echo[-1] and "ec2:DescribeInstances" in echo[-1]


def test_the_launch_destroys_a_finished_fleet_only_once_every_nodes_script_has_ended(
    tmp_path, moto_endpoint, monkeypatch, catalog
) -> None:
    """The job's FINISHED.json is written as its fit ends; what the script does after it (a test, an export, a model's
    upload) and what the boot script does then (the job's outputs and its log beside the checkpoints, then its status
    record, last) still run. The launch destroyed the fleet at FINISHED.json and cut them (a review): it now waits
    (``TerraformProvisioner.wait_after_fit``) until every member of the fleet EC2 still lists has written its status
    record, bounded by the launch's after_fit_timeout_s. A member that goes away meanwhile is not waited for, nor an
    instance its group starts after the handover's members are known; the worst exit is the answer; at the timeout
    the nodes still running are named (None), and said while waited for. Credentials that may not list instances:
    the members known since the handover, said once."""
    import copy

    import boto3

    from _support import MINIMAL
    from lightning_srifty.provision.base import LaunchedFleet
    from lightning_srifty.provision.launcher import terraform_fleet
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from lightning_srifty.provision.terraform.generate import Options
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="runs")
    plan = rank(load_profile(copy.deepcopy(MINIMAL)), Constraints(steps=10, max_instances=1), catalog=catalog)
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name=plan.entries[0].region)
    image = ec2.describe_images()["Images"][0]["ImageId"]

    def launch(name: str) -> str:
        tags = [{"ResourceType": "instance", "Tags": [{"Key": "srifty:fleet", "Value": name}]}]
        made = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="t3.micro", TagSpecifications=tags)
        return made["Instances"][0]["InstanceId"]

    def status(fleet: str, instance: str, code: int) -> None:
        s3.put_object(Bucket="runs", Key=f"job-1/status/{fleet}-{instance}.json", Body=f'{{"exit_code": {code}}}')

    echo: list[str] = []
    provisioner = TerraformProvisioner(
        tmp_path, "s3://runs/job-1", Options(aws_endpoint=moto_endpoint), echo=echo.append
    )
    provisioner.finish_look_s = 0.05
    monkeypatch.setattr(terraform_fleet, "FINISH_SAY_S", 0.2)
    first, second, lost = launch("f-1"), launch("f-1"), launch("f-1")
    launch("f-10")  # another fleet's: never waited for
    fleet = LaunchedFleet(plan, 0, "f-1")
    fleet.data["members"] = {first, second, lost}  # as the handover listed them
    status("f-1", first, 0)
    # one node still runs the script's end (an upload): not ended within the time given, named
    ec2.terminate_instances(InstanceIds=[lost])  # gone meanwhile: nothing to wait for
    started = time.monotonic()
    assert provisioner.wait_after_fit(fleet, 0.5) is None
    assert time.monotonic() - started >= 0.5 and fleet.data["still_running"] == [second]
    assert any(f"waiting for its script to end on 1 node(s) of f-1 ({second};" in line for line in echo), echo
    # its status record comes: the wait ends at once with the worst exit; a member the group started later is not
    # waited for (no handover's member)
    launch("f-1")
    status("f-1", second, 0)
    assert provisioner.wait_after_fit(fleet, 30.0) == 0
    failed = LaunchedFleet(plan, 0, "f-1", {"members": {first, second}})
    status("f-1", second, 1)
    assert provisioner.wait_after_fit(failed, 30.0) == 1 and failed.data["failed_after_fit"] == [second]
    # a fleet whose members were never listed: the nodes up now
    unlisted = LaunchedFleet(plan, 0, "f-1")
    assert provisioner.wait_after_fit(unlisted, 0.2) is None and len(unlisted.data["still_running"]) == 1

    # the launcher's credentials may not list instances: the members known since the handover are waited for, said
    def refused(_fleet):
        raise RuntimeError("UnauthorizedOperation: not authorized: ec2:DescribeInstances")

    monkeypatch.setattr(provisioner, "_live", refused)
    known = LaunchedFleet(plan, 0, "f-1", {"members": {first, lost}})
    assert provisioner.wait_after_fit(known, 0.3) is None and known.data["still_running"] == [lost]
    assert sum("could not be listed (UnauthorizedOperation" in line for line in echo) == 1, echo
    status("f-1", lost, 0)
    assert provisioner.wait_after_fit(known, 5.0) == 0
    # nor any member known (never listed): as many status records as the fleet has nodes; before, none was looked
    # for and the wait ended at once (a review)
    blind = LaunchedFleet(plan, 0, "f-2")
    assert provisioner.wait_after_fit(blind, 0.3) is None
    assert blind.data["still_running"] == ["its 1 other node(s), whose ids could not be listed"]
    status("f-2", "i-0123456789abcdef0", 3)
    assert provisioner.wait_after_fit(blind, 5.0) == 3 and blind.data["failed_after_fit"] == ["i-0123456789abcdef0"]
