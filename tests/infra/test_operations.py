"""Operations (issue #22 item 5): ``srifty status`` (fleets by their tag, cost so far at catalog prices, life cap,
heartbeat), ``srifty logs`` (listing and following the logs the nodes ship beside the checkpoints), the shipping loop of
user_data run with bash against moto's S3, and ``srifty down`` (destroy, then the cost summary). EC2 and S3 are moto's
server on 127.0.0.1, one for the module; every test uses its own fleet names and bucket."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest

from _fleet import FAKE_CURL, MODULE, example, exe, read, render, run_user_data, template_values
from conftest import moto_server
from lightning_srifty.cli import main
from lightning_srifty.cli.operations import _Prefixed
from lightning_srifty.console import fmt_life
from lightning_srifty.provision.operations import fleets
from lightning_srifty.provision.operations.logs import FleetLogs, follow
from lightning_srifty.provision.terraform.generate import TFVARS, generate, tfvars

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_endpoint():
    """One moto server for the module (conftest's is per test); the name keeps the tests in the slow tier."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def aws(moto_endpoint, monkeypatch):
    """boto3 (the commands' and the tests') talks to moto: (ec2, s3, endpoint)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_endpoint)
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=moto_endpoint)
    return ec2, s3, moto_endpoint


_AMI: dict[str, str] = {}


def launch(ec2, fleet: str, itype: str, *, spot: bool = False, **tags: str) -> dict:
    if "id" not in _AMI:  # moto's image listing takes seconds: once per module
        _AMI["id"] = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ami = _AMI["id"]
    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    all_tags = [{"Key": "srifty:fleet", "Value": fleet}, *({"Key": k, "Value": v} for k, v in tags.items())]
    (instance,) = ec2.run_instances(
        ImageId=ami,
        InstanceType=itype,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": all_tags}],
        **extra,
    )["Instances"]
    return instance


def price(catalog, itype: str, market: str) -> float:
    return catalog.get(itype).price_usd_hr(REGION, market)


# ---------------------------------------------------------------------------------------------------------------------
# srifty status
# ---------------------------------------------------------------------------------------------------------------------


def test_status_shows_each_fleet_its_market_cost_life_cap_and_heartbeat(aws, monkeypatch, capsys, catalog) -> None:
    ec2, s3, _ = aws
    uri = "s3://ops-status/checkpoints/ops-a/"
    tags = {"srifty:checkpoints": uri, "srifty:max-life-h": "12"}
    on_demand = launch(ec2, "ops-a", "g5.xlarge", **tags)
    spot = launch(ec2, "ops-a", "g5.xlarge", spot=True, **tags)
    launch(ec2, "ops-b", "g6.xlarge")  # no checkpoint tag: its heartbeat cannot be looked for
    first = min(on_demand["LaunchTime"], spot["LaunchTime"]).timestamp()
    at = first + 2 * 3600
    monkeypatch.setattr(fleets, "now", lambda: at)
    s3.create_bucket(Bucket="ops-status")
    beat = {"protocol": "srifty.launch/1", "launch_id": "l1", "written_unix": at - 42, "max_age_s": 600}
    s3.put_object(Bucket="ops-status", Key="checkpoints/ops-a/HEARTBEAT.json", Body=json.dumps(beat).encode())

    assert main(["status", "--region", REGION, "--json"]) == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)["fleets"]}
    a = records["ops-a"]
    assert a["states"] == {"running": 2} and a["types"] == {"g5.xlarge": 2}
    assert a["markets"] == {"on-demand": 1, "spot": 1}  # from InstanceLifecycle
    hours = {i["InstanceId"]: (at - i["LaunchTime"].timestamp()) / 3600 for i in (on_demand, spot)}
    od, sp = price(catalog, "g5.xlarge", "on-demand"), price(catalog, "g5.xlarge", "spot")
    assert sp < od
    expected = od * hours[on_demand["InstanceId"]] + sp * hours[spot["InstanceId"]]
    assert a["cost_usd"] == pytest.approx(expected, abs=1e-3)
    assert a["usd_per_hour"] == pytest.approx(od + sp, abs=1e-5)
    assert a["max_life_h"] == 12 and a["life_ends_unix"] == pytest.approx(first + 12 * 3600)
    assert a["heartbeat"] == {"found": True, "age_s": 42.0, "max_age_s": 600, "stale": False}
    assert records["ops-b"]["heartbeat"] is None and records["ops-b"]["max_life_h"] is None

    assert main(["status", "--region", REGION]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["FLEET", "REGION", "STATE"]
    line = next(x for x in lines if x.startswith("ops-a "))
    for part in ("2 running", "2 x g5.xlarge", "1 on-demand, 1 spot", "2.0 h", f"${a['cost_usd']:,.2f}"):
        assert part in line, (part, line)
    assert "12 h, ends in 10.0 h" in line and line.endswith("42 s ago")
    assert next(x for x in lines if x.startswith("ops-b ")).endswith("- (checkpoint folder unknown)")

    # the cost follows the clock: an hour later, one more hour of both
    monkeypatch.setattr(fleets, "now", lambda: at + 3600)
    assert main(["status", "--region", REGION, "--json"]) == 0
    later = {r["name"]: r for r in json.loads(capsys.readouterr().out)["fleets"]}["ops-a"]
    assert later["cost_usd"] - a["cost_usd"] == pytest.approx(od + sp, abs=1e-3)
    assert later["heartbeat"]["stale"] is True  # 42 s + 1 h > max_age_s

    # an emulator's endpoint as a flag, as srifty terraform takes it (a new user's walk found only the variable worked)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert main(["status", "--region", REGION, "--json", "--aws-endpoint", aws[2]]) == 0
    flagged = {r["name"]: r for r in json.loads(capsys.readouterr().out)["fleets"]}["ops-a"]
    assert flagged["states"] == {"running": 2} and flagged["heartbeat"]["found"] is True

    # the nodes' life record: the fleet was born before its live instances (they replaced spot nodes), and its cap
    # counts from then; a record that has ended belongs to an earlier life and is not read
    life = {"fleet": "ops-a", "born_unix": first - 5 * 3600, "ended_unix": None}
    s3.put_object(Bucket="ops-status", Key="checkpoints/ops-a/life/ops-a.json", Body=json.dumps(life).encode())
    assert main(["status", "--region", REGION, "--json", "--aws-endpoint", aws[2]]) == 0
    born = {r["name"]: r for r in json.loads(capsys.readouterr().out)["fleets"]}["ops-a"]
    assert born["life_ends_unix"] == pytest.approx(first + 7 * 3600)
    life["ended_unix"] = first - 3600
    s3.put_object(Bucket="ops-status", Key="checkpoints/ops-a/life/ops-a.json", Body=json.dumps(life).encode())
    assert main(["status", "--region", REGION, "--json", "--aws-endpoint", aws[2]]) == 0
    ended = {r["name"]: r for r in json.loads(capsys.readouterr().out)["fleets"]}["ops-a"]
    assert ended["life_ends_unix"] == pytest.approx(first + 12 * 3600)


def test_status_of_a_root_reads_the_checkpoint_folder_from_its_state(aws, tmp_path, monkeypatch, capsys, catalog):
    """A root whose bucket the module created: the folder comes from the output in its state, the cap from its
    values; only that root's fleet is shown."""
    ec2, s3, _ = aws
    plan, choice, options = example("single-node-on-demand")
    options = dataclasses.replace(options, name="ops-root")
    root = generate(plan, tmp_path / "infra", choice=choice, options=options, catalog=catalog).out
    uri = "s3://ops-root-bucket/checkpoints/ops-root/"
    state = {"version": 4, "outputs": {"fleet": {"value": {"checkpoint_uri": uri}, "type": "object"}}}
    (root / "terraform.tfstate").write_text(json.dumps(state))
    mine = launch(ec2, "ops-root", "g5.xlarge")  # as an old root's instances: no srifty:max-life-h tag
    launch(ec2, "ops-other", "g5.xlarge")
    at = mine["LaunchTime"].timestamp() + 600
    monkeypatch.setattr(fleets, "now", lambda: at)
    s3.create_bucket(Bucket="ops-root-bucket")
    assert main(["status", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "ops-other" not in out
    (line,) = [x for x in out.splitlines() if x.startswith("ops-root ")]
    cap = json.loads((root / TFVARS).read_text())["max_life_h"]
    assert "1 running" in line and "10 min" in line and f"{fmt_life(cap)}, ends in" in line and line.endswith("none")


def test_status_without_region_or_fleets(monkeypatch, capsys, aws) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert main(["status"]) == 2
    assert "give --region" in capsys.readouterr().err
    assert main(["status", "--region", "eu-west-3"]) == 0
    assert capsys.readouterr().out.strip() == "No srifty fleet has instances in eu-west-3."
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert main(["status", "--region", "eu-west-3"]) == 2
    err = capsys.readouterr().err
    assert "AWS could not be reached while listing the fleets in eu-west-3" in err and "Check the network" in err


# ---------------------------------------------------------------------------------------------------------------------
# srifty logs
# ---------------------------------------------------------------------------------------------------------------------


def test_logs_lists_prints_and_finds_the_folder_by_tag(aws, capsys) -> None:
    ec2, s3, _ = aws
    s3.create_bucket(Bucket="ops-logs")
    uri = "s3://ops-logs/runs/x/"
    s3.put_object(Bucket="ops-logs", Key="runs/x/logs/ops-l/i-1.log", Body=b"boot\nepoch 1\n")
    s3.put_object(Bucket="ops-logs", Key="runs/x/logs/ops-l/i-2.log", Body=b"boot two\npartial")
    s3.put_object(Bucket="ops-logs", Key="runs/x/status/ops-l-i-1.json", Body=b"{}")
    s3.put_object(Bucket="ops-logs", Key="runs/x/logs/other/i-9.log", Body=b"not this fleet\n")

    assert main(["logs", "ops-l", "--checkpoint-uri", uri, "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [x.split()[0] for x in listed] == ["i-1", "i-2"] and listed[0].endswith("ended")
    assert listed[1].endswith("running")

    assert main(["logs", "ops-l", "--checkpoint-uri", uri]) == 0  # several: each line names its node
    out = capsys.readouterr().out
    assert sorted(out.splitlines()) == ["i-1 | boot", "i-1 | epoch 1", "i-2 | boot two", "i-2 | partial"]

    launch(ec2, "ops-l", "g5.xlarge", **{"srifty:checkpoints": uri})  # the folder from the fleet's tag
    assert main(["logs", "ops-l", "--instance", "i-1"]) == 0
    assert capsys.readouterr().out == "boot\nepoch 1\n"  # one log: as it is
    assert main(["logs", "ops-l", "--instance", "i-7"]) == 2
    assert "no log of instance i-7" in capsys.readouterr().err
    assert main(["logs", "ops-nothing"]) == 2
    assert "--checkpoint-uri" in capsys.readouterr().err
    # --follow of a node that has ended: everything, then it returns at once
    assert main(["logs", "ops-l", "--instance", "i-1", "--follow"]) == 0
    assert capsys.readouterr().out == "boot\nepoch 1\n"


def test_outputs_lists_and_fetches_each_nodes_files_whole_and_only_its_own(aws, capsys, tmp_path) -> None:
    """srifty outputs: what each node's job wrote (user_data copies it to outputs/<fleet>/<instance id>/), listed and
    fetched into a folder per node, each file written whole; a second fetch keeps what is there; a key that would
    climb out of its node's folder is refused, nothing written outside."""
    _, s3, _ = aws
    s3.create_bucket(Bucket="ops-out")
    uri = "s3://ops-out/runs/x/"
    files = {
        "i-1/lightning_logs/version_0/metrics.csv": b"step,loss\n1,0.5\n",
        "i-1/outputs/model.pt": b"weights" * 100,
        "i-2/srifty/profile.json": b"{}",
    }
    for path, body in files.items():
        s3.put_object(Bucket="ops-out", Key=f"runs/x/outputs/ops-o/{path}", Body=body)
    s3.put_object(Bucket="ops-out", Key="runs/x/outputs/other/i-9/x.txt", Body=b"another fleet's")

    assert main(["outputs", "ops-o", "--checkpoint-uri", uri, "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed[:-1]] == sorted(files)
    assert listed[-1] == "3 files of 2 node(s) under s3://ops-out/runs/x/outputs/ops-o/"
    to = tmp_path / "got"
    assert main(["outputs", "ops-o", "--checkpoint-uri", uri, "--to", str(to)]) == 0
    assert "3 files fetched, 0 already here, of 2 node(s)" in capsys.readouterr().out
    assert {p.relative_to(to).as_posix(): p.read_bytes() for p in to.rglob("*") if p.is_file()} == files
    assert main(["outputs", "ops-o", "--checkpoint-uri", uri, "--to", str(to), "--instance", "i-2"]) == 0
    assert "0 files fetched, 1 already here, of 1 node(s)" in capsys.readouterr().out

    s3.put_object(Bucket="ops-out", Key="runs/x/outputs/ops-o/i-3/../../../evil.txt", Body=b"x")
    assert main(["outputs", "ops-o", "--checkpoint-uri", uri, "--to", str(to), "--instance", "i-3"]) == 2
    assert "has a path outside its node's folder" in capsys.readouterr().err
    assert not list(tmp_path.rglob("evil.txt"))
    assert main(["outputs", "ops-nothing", "--checkpoint-uri", "s3://ops-out/none/"]) == 0
    assert "No outputs under s3://ops-out/none/outputs/ops-nothing/ yet" in capsys.readouterr().out


def test_follow_prints_only_new_bytes_and_ends_with_the_status_record(aws) -> None:
    _, s3, _ = aws
    s3.create_bucket(Bucket="ops-follow")
    key = "c/logs/f/i-5.log"
    s3.put_object(Bucket="ops-follow", Key=key, Body=b"boot\n")
    steps = iter(
        [
            lambda: None,  # nothing new: nothing printed
            lambda: s3.put_object(Bucket="ops-follow", Key=key, Body=b"boot\nsetup\nepoch 1\n"),
            # the last copy, then the status record (as on_exit does): the end is printed, then it stops
            lambda: (
                s3.put_object(Bucket="ops-follow", Key=key, Body=b"boot\nsetup\nepoch 1\nepoch 2\nexited 0\n"),
                s3.put_object(Bucket="ops-follow", Key="c/status/f-i-5.json", Body=b"{}"),
            ),
        ]
    )
    chunks: list[bytes] = []
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        next(steps)()

    logs = FleetLogs(s3, "s3://ops-follow/c/", "f")
    seen = follow(logs, lambda _, data: chunks.append(data), interval_s=0.5, sleep=sleep)
    assert seen == {"i-5"} and naps == [0.5, 0.5, 0.5]
    assert chunks == [b"boot\n", b"setup\nepoch 1\n", b"epoch 2\nexited 0\n"]


def test_prefixed_output_keeps_lines_whole() -> None:
    out = io.StringIO()
    write = _Prefixed(out, prefix=True)
    write("i-1", b"a\nb")
    write("i-2", b"x\n")
    write("i-1", b"c\nd")
    write.close()
    assert out.getvalue() == "i-1 | a\ni-2 | x\ni-1 | bc\ni-1 | d\n"


# ---------------------------------------------------------------------------------------------------------------------
# The nodes ship their log: user_data rendered by terraform, run with bash, the real aws CLI against moto's S3
# ---------------------------------------------------------------------------------------------------------------------

AWS_WRAPPER = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/aws.log"
case "$1 $2" in
  "ec2 describe-instances") echo 10.0.0.5 ;;
  "autoscaling "*) exit 0 ;;
  *) exec {aws} "$@" ;;
esac
"""


def node_fakes(tmp_path: Path, real_aws: str, **more: str) -> dict[str, str]:
    """The commands a node's boot script meets, faked first on PATH: the metadata service (curl), the AWS CLI
    (moto's, through a wrapper that logs every call), shutdown (recorded), and ``more`` (name -> script)."""
    return {
        "curl": FAKE_CURL,
        "aws": AWS_WRAPPER.format(aws=real_aws),
        "shutdown": f'#!/bin/bash\necho "$*" >>{tmp_path / "shutdown.log"}\n',
        **more,
    }


TORCHRUN = """#!/bin/bash
echo "epoch 1 loss 0.5"
sleep 2.5
echo "epoch 2 loss 0.25"
"""


def test_user_data_ships_its_log_beside_the_checkpoints(tf_env, aws, tmp_path) -> None:
    real_aws = shutil.which("aws")
    if real_aws is None:
        pytest.skip("the harness needs the aws CLI on PATH")
    _, s3, endpoint = aws
    s3.create_bucket(Bucket="ops-ship")
    uri = "s3://ops-ship/ckpt/"
    values = template_values(
        name="shipper",
        setup_command="echo setting up",
        checkpoint_uri_b64=base64.b64encode(uri.encode()).decode(),
    )
    script = render(tf_env, tmp_path / "console", values)
    fakes = node_fakes(tmp_path, real_aws, torchrun=TORCHRUN)
    env = {"AWS_ENDPOINT_URL": endpoint, "SRIFTY_LOG_INTERVAL_S": "1"}
    run = run_user_data(tmp_path, script, fakes, extra_env=env)
    assert run.returncode == 0, read(tmp_path / "user-data.log")[-3000:]
    # the boot script's calls (the watchdog, in the background, reads and writes the fleet's life record too)
    calls = [c for c in read(tmp_path / "aws.log").splitlines() if "life/shipper.json" not in c]
    ships = [c for c in calls if c.startswith("s3 cp ") and c.split()[3] == f"{uri}logs/shipper/i-0abc.log"]
    assert any("/log.loop " in c for c in ships) and "/log.last " in ships[-1], calls  # the loop, then the last one
    assert calls[-1].startswith(f"s3 cp - {uri}status/shipper-i-0abc.json")  # the status record after the log
    body = s3.get_object(Bucket="ops-ship", Key="ckpt/logs/shipper/i-0abc.log")["Body"].read().decode()
    for line in ("setting up", "epoch 1 loss 0.5", "epoch 2 loss 0.25", "the training job exited with 0"):
        assert line in body, body
    assert body == read(tmp_path / "user-data.log")  # the whole log, tee drained before the last copy
    # what srifty logs prints of it, once the node has ended
    logs = FleetLogs(s3, uri, "shipper")
    chunks: list[bytes] = []
    assert follow(logs, lambda _, data: chunks.append(data), sleep=lambda s: pytest.fail("it has ended")) == {"i-0abc"}
    assert b"".join(chunks).decode() == body


PREEMPTED_TORCHRUN = """#!/bin/bash
# torchrun as a preempted job leaves it: SpotPreemption marks the node, the workers exit 75, torchrun itself 1
echo "s3://ops-pre/ckpt/preempt-step=40.ckpt" >"$SRIFTY_NODE_STATE/preempted"
exit 1
"""

STOPPED_TORCHRUN = """#!/bin/bash
# the watchdog's stop (its reason first), then the job's SIGTERM: SpotPreemption marks the node as on a notice
echo "the fleet's life cap has passed" >"$SRIFTY_NODE_STATE/watchdog.stop"
echo "s3://ops-pre/ckpt/preempt-step=40.ckpt" >"$SRIFTY_NODE_STATE/preempted"
exit 1
"""

# another node's watchdog stops the fleet while this node's job runs (its life cap: the end in the fleet's life record
# first, then its job's SIGTERM), and every rank leaves with a checkpoint as on a notice
FLEET_STOPPED_TORCHRUN = """#!/bin/bash
why="the fleet's life cap has passed"
printf '{"fleet": "preempt", "born_unix": 1, "ended_unix": %s, "ended_by": "i-0other", "why": "%s"}' "$(date +%s)" \
  "$why" | aws s3 cp - s3://ops-pre/ckpt/life/preempt.json --only-show-errors
echo "s3://ops-pre/ckpt/preempt-step=40.ckpt" >"$SRIFTY_NODE_STATE/preempted"
exit 1
"""


@pytest.mark.parametrize("stop", ["a notice", "the watchdog", "another node's watchdog"])
def test_a_preempted_jobs_status_record_says_75_and_preempted(tf_env, aws, tmp_path, stop) -> None:
    """Issue #35 L/item 10: a preemption's status record said exit 1 (torchrun's), not 75: nothing told a
    preemption from a crash. The job's marker turns the node's exit into 75 and the record says preempted. A review:
    the life cap's stop was read as a notice too (the job marks any SIGTERM), so the record said preempted and the
    watchdog kept the node in its group; a stop the watchdog made says its reason instead. A review again: only the
    node whose watchdog stopped the fleet said so; the others' jobs left as on a notice and their records said
    preempted (their groups replaced them): the stop is in the fleet's life record, which they read."""
    real_aws = shutil.which("aws")
    if real_aws is None:
        pytest.skip("the harness needs the aws CLI on PATH")
    _, s3, endpoint = aws
    s3.create_bucket(Bucket="ops-pre")
    # a folder of its own per case: the module's moto server keeps the fleet's life record, which "the watchdog"
    # ends (stop 77: the next case's node, booting in the same second, read it as a fleet ended before it joined)
    prefix = {"a notice": "ckpt", "the watchdog": "ckpt-wd", "another node's watchdog": "ckpt-other"}[stop]
    uri = f"s3://ops-pre/{prefix}/"
    values = template_values(name="preempt", checkpoint_uri_b64=base64.b64encode(uri.encode()).decode())
    script = render(tf_env, tmp_path / "console", values)
    torchrun = {"a notice": PREEMPTED_TORCHRUN, "the watchdog": STOPPED_TORCHRUN}.get(stop, FLEET_STOPPED_TORCHRUN)
    torchrun = torchrun.replace("s3://ops-pre/ckpt/", uri)
    fakes = node_fakes(tmp_path, real_aws, torchrun=torchrun)
    run = run_user_data(tmp_path, script, fakes, extra_env={"AWS_ENDPOINT_URL": endpoint})
    log = read(tmp_path / "user-data.log")
    record = json.loads(s3.get_object(Bucket="ops-pre", Key=f"{prefix}/status/preempt-i-0abc.json")["Body"].read())
    if stop == "a notice":
        assert run.returncode == 75, log[-3000:]
        assert record["exit_code"] == 75 and record["preempted"] is True and record["stopped_by_watchdog"] is None
        assert "exit 75, preempted" in log
    elif stop == "another node's watchdog":
        assert run.returncode == 1, log[-3000:]
        assert record["preempted"] is False, record
        assert record["stopped_by_watchdog"] == "the fleet was stopped: the fleet's life cap has passed (i-0other)"
        assert "the job left with its checkpoint because the fleet was stopped" in log
    else:
        assert run.returncode == 1, log[-3000:]
        assert record["exit_code"] == 1 and record["preempted"] is False
        assert record["stopped_by_watchdog"] == "the fleet's life cap has passed"
        assert "srifty: the watchdog stopped the job: the fleet's life cap has passed" in log


@pytest.mark.parametrize("life", ["none", "alive", "ended before the launch", "ended after the launch"])
def test_a_fleets_life_cap_counts_from_its_first_launch_not_each_replacements(tf_env, aws, tmp_path, life) -> None:
    """A review: the life cap counted from each instance's boot, so a fleet no launcher watches, whose spot nodes
    kept being replaced, ran past max_life_h for as long as the job had work (each replacement with a cap of its own).
    The nodes keep the fleet's life beside the checkpoints: the first starts it, a replacement's cap counts from its
    start, one launched before the fleet's end ends itself without training, one launched after it (a later apply
    resumed the group) starts a new life."""
    real_aws = shutil.which("aws")
    if real_aws is None:
        pytest.skip("the harness needs the aws CLI on PATH")
    _, s3, endpoint = aws
    bucket = f"ops-life-{life.split()[0]}-{len(life)}"
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/ckpt/"
    now = int(time.time())
    born = now - 3000
    record = {"fleet": "lifer", "born_unix": born, "born_by": "i-0first", "ended_unix": None}
    if life.startswith("ended"):
        ended = now - 600 if life == "ended before the launch" else now + 600
        record.update(ended_unix=ended, ended_by="i-0first", why="the fleet's life cap has passed")
    if life != "none":
        s3.put_object(Bucket=bucket, Key="ckpt/life/lifer.json", Body=json.dumps(record).encode())
    values = template_values(name="lifer", checkpoint_uri_b64=base64.b64encode(uri.encode()).decode())
    fakes = node_fakes(tmp_path, real_aws, torchrun=TORCHRUN)
    run = run_user_data(
        tmp_path, render(tf_env, tmp_path / "console", values), fakes, extra_env={"AWS_ENDPOINT_URL": endpoint}
    )
    log = read(tmp_path / "user-data.log")
    written = json.loads(s3.get_object(Bucket=bucket, Key="ckpt/life/lifer.json")["Body"].read())
    if life == "ended after the launch":  # launched before the fleet's end: it leaves without training
        assert run.returncode == 1, log[-3000:]
        assert "epoch 1" not in log and "the fleet had ended before this instance joined" in log
        status = json.loads(s3.get_object(Bucket=bucket, Key="ckpt/status/lifer-i-0abc.json")["Body"].read())
        assert status["stopped_by_watchdog"] == (
            "the fleet had ended before this instance joined: the fleet's life cap has passed"
        )
        assert written == record  # the first end is kept
        return
    assert run.returncode == 0, log[-3000:]
    assert "epoch 2 loss 0.25" in log and "the training job exited with 0" in log
    # the job's end (exit 0) ends the fleet's life, in the record (the watchdog, in the background: bounded wait)
    deadline = time.time() + 20
    while written.get("ended_unix") is None and time.time() < deadline:
        time.sleep(0.5)
        written = json.loads(s3.get_object(Bucket=bucket, Key="ckpt/life/lifer.json")["Body"].read())
    assert written["why"] == "the training job exited with 0" and written["ended_by"] == "i-0abc", written
    if life == "alive":  # a replacement: the cap counts from the fleet's birth, which the record keeps
        assert f"the fleet's life: born at {born} (alive), its cap at {born + 5400}" in log, log[-2000:]
        assert (written["born_unix"], written["born_by"]) == (born, "i-0first"), written
    else:  # the first node of a (new) life: born now, recorded
        assert "(new), its cap at" in log, log[-2000:]
        assert abs(written["born_unix"] - now) < 60 and written["born_by"] == "i-0abc", written


def test_a_rebooted_node_ends_itself_instead_of_idling_in_its_group(tf_env, tmp_path) -> None:
    """A review: user data runs at an instance's first boot only, so after a reboot (a maintenance event, a recovery)
    the node had no job, no watchdog and no life cap (scheduled in /run), and stayed in its group, billed, for ever.
    The boot script leaves cloud-init a per-boot script that shuts the instance down (it terminates; the group
    replaces it), which acts only where cloud-init's own instance id is this instance's: on any other machine (this
    one, running the test) it does nothing."""
    script = render(tf_env, tmp_path / "console", template_values(name="reboot"))
    (tmp_path / "per-boot").mkdir()
    fakes = {"curl": FAKE_CURL, "aws": "#!/bin/bash\nexit 0\n", "torchrun": "#!/bin/bash\nexit 0\n"}
    fakes["shutdown"] = f'#!/bin/bash\necho "$*" >>{tmp_path / "shutdown.log"}\n'
    run = run_user_data(tmp_path, script, fakes)
    assert run.returncode == 0, read(tmp_path / "user-data.log")[-3000:]
    guard = tmp_path / "per-boot" / "srifty-rebooted.sh"
    assert os.access(guard, os.X_OK), read(tmp_path / "user-data.log")[-2000:]
    # the guard at a later boot, with a shutdown of its own (the boot's watchdog may still call the first one)
    (tmp_path / "later-boot").mkdir()
    exe(tmp_path / "later-boot" / "shutdown", f'#!/bin/bash\necho "$*" >>{tmp_path / "later.log"}\n')
    env = {**os.environ, "PATH": f"{tmp_path / 'later-boot'}:{os.environ['PATH']}"}
    (tmp_path / "cloud-instance-id").write_text("i-0fffffffffffffff0\n")  # another instance (an image built from it)
    assert subprocess.run(["bash", str(guard)], env=env, timeout=30).returncode == 0
    assert read(tmp_path / "later.log") == ""
    (tmp_path / "cloud-instance-id").write_text("i-0abc\n")  # this instance, rebooted
    assert subprocess.run(["bash", str(guard)], env=env, timeout=30).returncode == 0
    assert read(tmp_path / "later.log") == "-h now srifty: rebooted\n"
    assert "srifty: rebooted: the job is gone" in read(tmp_path / "user-data.log")


FAILING_AWS = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/aws.log"
case "$1 $2" in
  "s3 cp") [ -n "${FAKE_BOOT_TEXT:-}" ] && { printf '%s' "$FAKE_BOOT_TEXT" >"$4"; exit 0; }
    echo "fatal error: An error occurred (403) when calling the HeadObject operation: Forbidden" >&2; exit 1 ;;
  "autoscaling describe-auto-scaling-instances") echo fleet-asg-20261201 ;;
esac
"""


@pytest.mark.parametrize("failure", ["denied", "changed"])
def test_a_boot_that_cannot_succeed_leaves_its_group_instead_of_relaunching_for_ever(tf_env, tmp_path, failure) -> None:
    """A review: the first stage (boot.sh.tftpl) shut down when it could not fetch its boot script (a bucket policy
    that denies the role, a missing object) or the script did not match its sha256, without leaving its group, which
    started another instance that failed the same way, for ever. After its attempts (here 2, none between) or at once
    on a changed script, it leaves the group (launches suspended, min 0, detached with the decrement) and shuts down."""
    import hashlib

    script = "echo booted\n"
    values = {
        "name": "bootfail",
        "max_life_min": 90,
        "boot_uri_b64": base64.b64encode(b"s3://b/checkpoints/boot/g5.xlarge-abc.sh").decode(),
        "boot_sha256": hashlib.sha256(script.encode()).hexdigest(),
    }
    text = render(tf_env, tmp_path / "console", values, template_name="boot.sh.tftpl")
    fakes = {
        "curl": FAKE_CURL,
        "aws": FAILING_AWS,
        "shutdown": f'#!/bin/bash\necho "$*" >>{tmp_path / "shutdown.log"}\n',
    }
    env = {"SRIFTY_BOOT_ATTEMPTS": "2", "SRIFTY_BOOT_RETRY_S": "0"}
    if failure == "changed":
        env["FAKE_BOOT_TEXT"] = "echo somebody else's script\n"
    run = run_user_data(tmp_path, text, fakes, extra_env=env)
    assert run.returncode == 1, run.stderr.decode()[-2000:]
    calls = read(tmp_path / "aws.log").splitlines()
    assert sum(c.startswith("s3 cp ") for c in calls) == (2 if failure == "denied" else 1), calls
    assert [c.split()[1] for c in calls if c.startswith("autoscaling")] == [
        "describe-auto-scaling-instances", "suspend-processes", "update-auto-scaling-group", "detach-instances",
    ]  # fmt: skip
    assert "--instance-ids i-0abc --should-decrement-desired-capacity" in calls[-1]
    assert read(tmp_path / "shutdown.log").splitlines()[-1].startswith("-h now")
    assert "left Auto Scaling group fleet-asg-20261201" in run.stderr.decode()


def _watchdog_fakes(tmp_path: Path) -> Path:
    """A fake aws (calls logged, the group fleet-asg) and shutdown (logged) in tmp_path/bin; the state folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe(bin_dir / "aws", '#!/bin/bash\necho "$*" >>"$FAKE_DIR/aws.log"\necho fleet-asg\n')
    exe(bin_dir / "shutdown", f'#!/bin/bash\necho "$*" >>{tmp_path / "shutdown.log"}\n')
    state = tmp_path / "state"
    state.mkdir()
    return state


def test_the_watchdog_keeps_a_preempted_node_in_its_group_without_a_launcher(tmp_path) -> None:
    """Issue #35 H4: the watchdog took every instance whose job had exited out of its Auto Scaling group with the
    desired capacity decremented, so after a spot notice nothing replaced it and the run stopped for good. A node
    whose job left with a checkpoint (the marker) on a fleet no launcher watches stays in the group: the group starts
    a replacement, which resumes (SRIFTY_RESUME=latest)."""
    state = _watchdog_fakes(tmp_path)
    (state / "preempted").write_text("s3://b/ckpt/preempt-step=40.ckpt\n")
    (state / "user_data.exited").write_text("75\n")
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "SRIFTY_WD_STATE_DIR": str(state),
        "SRIFTY_WD_INTERVAL_S": "1",
        "SRIFTY_WD_LIFE_UNTIL": str(int(time.time()) + 30),
        "SRIFTY_WD_ASG": "1",
        "SRIFTY_WD_INSTANCE_ID": "i-0123456789abcdef0",
        "SRIFTY_WD_HEARTBEAT_URI": "",
        "SRIFTY_WD_LIFE_URI": "s3://b/ckpt/life/f.json",
    }
    watchdog = MODULE / "templates" / "watchdog.sh"
    done = subprocess.run(["bash", str(watchdog)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert "staying in the Auto Scaling group, which starts a replacement" in done.stdout, done.stdout
    assert "autoscaling" not in read(tmp_path / "aws.log")  # no detach, no decrement
    assert "life/f.json" not in read(tmp_path / "aws.log")  # a notice does not end the fleet's life
    assert read(tmp_path / "shutdown.log") == "-h now\n"
    (state / "preempted").unlink()  # a job that ended (not preempted): it leaves the group, decremented, as before
    (tmp_path / "shutdown.log").unlink()
    done = subprocess.run(["bash", str(watchdog)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert "--should-decrement-desired-capacity" in read(tmp_path / "aws.log")


def test_the_life_cap_ends_a_fleet_without_a_launcher_though_the_job_marks_a_notice(tmp_path) -> None:
    """A review: the life cap's SIGTERM makes the job checkpoint and mark the node "preempted" as on a notice, and the
    watchdog then kept the node in its group: every node was replaced, each with a life cap of its own, for as long as
    the job had work (a runaway job billed until srifty down). A stop the watchdog makes leaves the group, and says
    why in the state folder, which the boot script's status record reports."""
    state = _watchdog_fakes(tmp_path)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "SRIFTY_WD_STATE_DIR": str(state),
        "SRIFTY_WD_INTERVAL_S": "1",
        "SRIFTY_WD_GRACE_S": "5",
        "SRIFTY_WD_LIFE_UNTIL": str(int(time.time()) + 2),
        "SRIFTY_WD_ASG": "1",
        "SRIFTY_WD_INSTANCE_ID": "i-0123456789abcdef0",
        "SRIFTY_WD_HEARTBEAT_URI": "",
        "SRIFTY_WD_LIFE_URI": "s3://b/ckpt/life/f.json",
        "SRIFTY_WD_BORN": "1764000000",
        "SRIFTY_WD_FLEET": "f",
    }
    # the job as SpotPreemption leaves on a SIGTERM: the checkpoint's marker, exit 75 (its SIGTERM in the call log)
    leave = f'echo SIGTERM >>"{tmp_path}/aws.log"; echo s3://b/ck/preempt-step=7.ckpt >"{state}/preempted"; exit 75'
    job = subprocess.Popen(["bash", "-c", f"trap '{leave}' TERM; while :; do sleep 0.1; done"])
    try:
        (state / "job.pid").write_text(f"{job.pid}\n")
        watchdog = MODULE / "templates" / "watchdog.sh"
        done = subprocess.run(["bash", str(watchdog)], env=env, capture_output=True, text=True, timeout=30, check=False)
    finally:
        job.kill()
        job.wait()
    assert "stopping: the fleet's life cap has passed" in done.stdout, done.stdout
    assert (state / "preempted").exists()  # the job did mark it
    assert "staying in the Auto Scaling group" not in done.stdout
    calls = read(tmp_path / "aws.log")
    assert "--scaling-processes Launch" in calls and "--should-decrement-desired-capacity" in calls, calls
    assert read(state / "watchdog.stop") == "the fleet's life cap has passed\n"
    assert read(tmp_path / "shutdown.log") == "-h now\n"
    # the fleet's end in its life record before the job's SIGTERM: the other nodes' jobs, which leave as on a notice,
    # find it when theirs exit (and leave their groups too)
    lines = calls.splitlines()
    life_put = " s3://b/ckpt/life/f.json --region us-east-1 --only-show-errors"
    written = [i for i, c in enumerate(lines) if c.startswith("s3 cp ") and c.endswith(life_put)]
    assert written and written[0] < lines.index("SIGTERM"), lines
    ended = json.loads(read(state / "life.ended"))
    assert ended["born_unix"] == 1764000000 and ended["why"] == "the fleet's life cap has passed", ended
    assert ended["ended_by"] == "i-0123456789abcdef0" and ended["ended_unix"] >= int(time.time()) - 60


# ---------------------------------------------------------------------------------------------------------------------
# srifty down
# ---------------------------------------------------------------------------------------------------------------------

FAKE_TERRAFORM = """#!{python}
import os, sys
with open(os.path.join(os.getcwd(), "calls.log"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
"""


def _root_with_a_fake_terraform(tmp_path: Path, monkeypatch, catalog, fake: str, name: str) -> Path:
    """The single-node example's root module named ``name``, with ``fake`` as terraform first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe(bin_dir / "terraform", fake.format(python=sys.executable))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    plan, choice, options = example("single-node-on-demand")
    options = dataclasses.replace(options, name=name)
    return generate(plan, tmp_path / "infra", choice=choice, options=options, catalog=catalog).out


def test_down_destroys_then_sums_what_the_fleet_cost(aws, tmp_path, monkeypatch, capfd, catalog) -> None:
    ec2, _, _ = aws
    root = _root_with_a_fake_terraform(tmp_path, monkeypatch, catalog, FAKE_TERRAFORM, "ops-down")
    instance = launch(ec2, "ops-down", "g5.xlarge")
    monkeypatch.setattr(fleets, "now", lambda: instance["LaunchTime"].timestamp() + 3 * 3600)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal to ask on: refused, naming what and the flag
    assert main(["down", "--dir", str(root)]) == 2
    err = capfd.readouterr().err
    assert "(Destroy every resource of ops-down?): nothing was changed. Give --yes to go ahead." in err
    assert "plan above" not in err  # down shows no plan
    assert main(["down", "--dir", str(root), "--yes"]) == 0  # terraform's output streams to the terminal (fd 1)
    out = capfd.readouterr().out.splitlines()
    assert [c.split()[0] for c in read(root / "calls.log").splitlines()] == ["init", "init", "state", "destroy"]
    usd = 3 * price(catalog, "g5.xlarge", "on-demand")
    assert out[-1] == (
        f"Fleet ops-down cost about ${usd:,.2f} at catalog prices: 1 x g5.xlarge (1 on-demand) in {REGION}, "
        "3.00 h of instance time in all (the first launched 3.00 h ago)."
    )


STATEFUL_TERRAFORM = """#!{python}
import json, os, sys
with open(os.path.join(os.getcwd(), "calls.log"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["state", "list"]:  # python-terraform writes: terraform state list -no-color
    print("module.fleet.aws_iam_role.node\\nmodule.fleet.aws_s3_bucket.checkpoints[0]\\n"
          "module.fleet.aws_s3_bucket_versioning.checkpoints[0]\\nmodule.fleet.data.aws_caller_identity.current")
elif sys.argv[1] == "output":
    print(json.dumps({{"fleet": {{"value": {{"checkpoint_bucket": "ops-kept"}}}}}}))
elif sys.argv[1] == "show":  # the state: the module's boot script, an object of its own
    boot = {{"type": "aws_s3_object", "mode": "managed", "values": {{"key": "{boot}", "bucket": "ops-kept"}}}}
    print(json.dumps({{"values": {{"root_module": {{"child_modules": [{{"resources": [boot]}}]}}}}}}))
"""
BOOT_KEY = "checkpoints/ops-kept/boot/ops-kept/g5.xlarge-0a1b.sh"


@pytest.mark.parametrize("delete", [False, True])
def test_down_keeps_a_bucket_of_checkpoints_unless_told_to_delete_it(aws, tmp_path, monkeypatch, catalog, delete):
    """A trial: srifty down of any fleet that ran failed on BucketNotEmpty (its nodes' logs, status records and
    checkpoints; no force_destroy) after terraform had removed the bucket's protections. The bucket and its settings
    leave the state before the destroy and stay as they are; --delete-checkpoints empties it (every version) and
    the destroy takes it. (tests/infra/test_terraform.py keeps one with the real terraform.)"""
    _, s3, _ = aws
    fake = STATEFUL_TERRAFORM.replace("{boot}", BOOT_KEY)
    root = _root_with_a_fake_terraform(tmp_path, monkeypatch, catalog, fake, "ops-kept")
    s3.create_bucket(Bucket="ops-kept")
    s3.put_bucket_versioning(Bucket="ops-kept", VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket="ops-kept", Key=BOOT_KEY, Body=b"#!/bin/bash")  # the module's own: not the run's
    for _ in range(2):  # two versions
        s3.put_object(Bucket="ops-kept", Key="checkpoints/ops-kept/logs/i-1.log", Body=b"log")
    args = ["down", "--dir", str(root), "--yes", *(["--delete-checkpoints"] if delete else [])]
    assert main(args) == 0
    calls = [c for c in read(root / "calls.log").splitlines() if not c.startswith("init")]
    rm = [
        f"state rm -no-color module.fleet.{kind}.checkpoints[0]"
        for kind in ("aws_s3_bucket", "aws_s3_bucket_versioning")
    ]
    held = s3.list_object_versions(Bucket="ops-kept").get("Versions", [])
    asked = ["state list -no-color", "output -no-color -json", "show -no-color -json"]
    if delete:
        assert calls == [*asked, "destroy -input=false -no-color -auto-approve"] and held == []
    else:
        assert calls == [*asked, *rm, "destroy -input=false -no-color -auto-approve"], calls
        assert len(held) == 3  # as it was


def test_down_destroys_a_bucket_that_holds_only_the_modules_own_objects(aws, tmp_path, monkeypatch, catalog):
    """An infra team's trial: srifty down of a fleet that never wrote a byte kept its bucket, out of the state, for the
    boot scripts and code archive the module itself uploads (which the destroy deletes, every version), and the next
    apply of the same name failed on BucketAlreadyExists. The destroy takes such a bucket."""
    _, s3, _ = aws
    fake = STATEFUL_TERRAFORM.replace("{boot}", BOOT_KEY)
    root = _root_with_a_fake_terraform(tmp_path, monkeypatch, catalog, fake, "ops-kept")
    s3.create_bucket(Bucket="ops-kept")
    s3.put_bucket_versioning(Bucket="ops-kept", VersioningConfiguration={"Status": "Enabled"})
    for _ in range(2):  # the module's boot script, uploaded twice
        s3.put_object(Bucket="ops-kept", Key=BOOT_KEY, Body=b"#!/bin/bash")
    assert main(["down", "--dir", str(root), "--yes"]) == 0
    calls = [c for c in read(root / "calls.log").splitlines() if not c.startswith("init")]
    asked = ["state list -no-color", "output -no-color -json", "show -no-color -json"]
    assert calls == [*asked, "destroy -input=false -no-color -auto-approve"], calls  # nothing taken out of the state


# ---------------------------------------------------------------------------------------------------------------------
# The pieces, without a cloud
# ---------------------------------------------------------------------------------------------------------------------


def test_a_terminated_instance_costs_until_it_ended_and_an_unknown_type_is_named(catalog) -> None:
    launched = datetime(2025, 1, 1, 10, 0, tzinfo=timezone.utc)
    ended = fleets.Instance.from_ec2(
        {
            "InstanceId": "i-1",
            "InstanceType": "g5.xlarge",
            "State": {"Name": "terminated"},
            "StateTransitionReason": "User initiated (2025-01-01 11:30:00 GMT)",
            "LaunchTime": launched,
            "InstanceLifecycle": "spot",
        }
    )
    assert ended.market == "spot" and not ended.live and ended.hours(launched.timestamp() + 5 * 3600) == 1.5
    moto = fleets.Instance.from_ec2(  # moto's reason reads UTC where EC2's reads GMT: the same end time
        {
            "InstanceId": "i-3",
            "InstanceType": "g5.xlarge",
            "State": {"Name": "terminated"},
            "StateTransitionReason": "User initiated (2025-01-01 11:30:00 UTC)",
            "LaunchTime": launched,
        }
    )
    assert moto.hours(launched.timestamp() + 5 * 3600) == 1.5
    odd = fleets.Instance("i-2", "x9.huge", "running", "on-demand", launched.timestamp())
    fleet = fleets.Fleet("f", REGION, (ended, odd))
    cost = fleet.cost(catalog, launched.timestamp() + 5 * 3600)
    assert cost.usd == pytest.approx(1.5 * price(catalog, "g5.xlarge", "spot"))
    assert cost.usd_per_hour == 0 and cost.unpriced == ("x9.huge (on-demand)",)
    # issue #37 L: a destroyed fleet's one-minute instance read "0.74 h from the first launch to now"
    minute = dataclasses.replace(ended, ended_unix=launched.timestamp() + 60)
    said = fleets.summary(fleets.Fleet("f", REGION, (minute,)), cost, launched.timestamp() + 0.74 * 3600)
    assert "1.0 min of instance time in all (the first launched 44.4 min ago)" in said, said


def test_a_life_cap_reads_in_hours_and_minutes() -> None:
    """The default cap is rounded up to a minute: 79 min read as 1.31667 h in the walk of a new user."""
    assert [fmt_life(h) for h in (79 / 60, 17.15, 11.0, 0.25, 16.7)] == [
        "1 h 19 min", "17 h 9 min", "11 h", "15 min", "16 h 42 min"]  # fmt: skip


def test_srifty_terraform_tags_the_life_cap_and_a_given_bucket(catalog) -> None:
    plan, choice, options = example("single-node-on-demand")
    values = tfvars(plan, choice, options, catalog)
    assert values["tags"]["srifty:max-life-h"] == f"{values['max_life_h']:g}"
    assert "srifty:checkpoints" not in values["tags"]  # the module names the bucket: the root's output says it
    values = tfvars(plan, choice, dataclasses.replace(options, bucket="my-runs", max_life_h=6.5), catalog)
    assert values["tags"]["srifty:checkpoints"] == "s3://my-runs/checkpoints/resnet-single/"
    assert values["tags"]["srifty:max-life-h"] == "6.5"


def test_the_commands_start_without_torch(subprocess_env) -> None:
    import subprocess

    code = (
        "import sys; from lightning_srifty.cli import main\n"
        "for c in ('status', 'logs', 'down'):\n"
        "    try: main([c, '--help'])\n"
        "    except SystemExit: pass\n"
        "assert 'torch' not in sys.modules and 'boto3' not in sys.modules"
    )
    run = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert Path(fleets.__file__).parent.name == "operations"


def test_a_job_leaving_on_a_notice_marks_its_node(tmp_path, monkeypatch) -> None:
    """SpotPreemption's leave (after the checkpoint) writes the marker user_data and the watchdog read."""
    from lightning_srifty.migrate.preemption import mark_preempted

    monkeypatch.setenv("SRIFTY_NODE_STATE", str(tmp_path))
    mark_preempted("s3://b/ckpt/preempt-step=40.ckpt")
    assert (tmp_path / "preempted").read_text() == "s3://b/ckpt/preempt-step=40.ckpt\n"
    monkeypatch.setenv("SRIFTY_NODE_STATE", str(tmp_path / "missing"))
    mark_preempted("s3://b/x.ckpt")  # never fatal: a warning
    monkeypatch.delenv("SRIFTY_NODE_STATE")
    mark_preempted("s3://b/x.ckpt")  # outside a srifty fleet: nothing


RENDEZVOUS_AWS = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/aws.log"
if [[ "$*" == *"/life/"* && -e "$FAKE_DIR/life.json" ]]; then  # the fleet's life record, when a test gives one
  case "$1 $2" in
    "s3 ls") echo "2026-12-03 00:00:00        80 $(basename "$3")"; exit 0 ;;
    "s3 cp") if [ "$4" = - ]; then cat "$FAKE_DIR/life.json"; exit 0; fi ;;
  esac
fi
case "$1 $2" in
  "ec2 describe-instances")  # $FAKE_DIR/live once the job has changed what EC2 lists
    if [ -e "$FAKE_DIR/live" ]; then cat "$FAKE_DIR/live"
    else printf "${FAKE_LIVE:-i-0abc\\t10.0.0.5\\ni-0def\\t10.0.0.6\\n}"; fi ;;
  "s3 cp")
    for kind in ready exited status; do
      if [[ "$*" == *"/$kind/"* && "$3" == - ]]; then
        mkdir -p "$FAKE_DIR/$kind" && cat >"$FAKE_DIR/$kind/$(basename "$4")"; exit 0
      elif [[ "$*" == *"/$kind/"* && "$*" == *--recursive* ]]; then
        cp "$FAKE_DIR/$kind"/*.json "$4" 2>/dev/null; exit 0
      fi
    done
    cat >/dev/null 2>&1 || true ;;
  *) exit 0 ;;
esac
"""


def _rendezvous(
    tmp_path: Path,
    tf_env,
    timeout_s: int,
    late_peer_s: float | None,
    *,
    live: str | None = None,
    peers: tuple[str, ...] = ("i-0def",),
    **values: object,
) -> tuple:
    """The rendered boot script's rendezvous as node i-0abc (10.0.0.5), ready at once; ``peers`` get ready
    ``late_peer_s`` later; ``live``: what describe-instances lists (id, IP, type per line)."""
    (tmp_path / "ready").mkdir()
    values = template_values(name="skew", nnodes=2, rendezvous_timeout_s=timeout_s, **values)
    script = render(tf_env, tmp_path / "console", values)
    writers = []
    if late_peer_s is not None:  # the other nodes finish installing their environments later
        for k, peer_id in enumerate(peers):
            peer = {"instance_id": peer_id, "ip": f"10.0.0.{6 + k}", "ready_unix": time.time() + late_peer_s}
            writer = f"sleep {late_peer_s}; echo '{json.dumps(peer)}' >{tmp_path / 'ready' / f'{peer_id}.json'}"
            writers.append(subprocess.Popen(["bash", "-c", writer]))
    fakes = {"curl": FAKE_CURL, "aws": RENDEZVOUS_AWS, "torchrun": FAKE_TORCHRUN_RECORD, "shutdown": "#!/bin/bash\n"}
    extra = {"FAKE_LIVE": live} if live is not None else None
    try:
        return run_user_data(tmp_path, script, fakes, extra_env=extra), read(tmp_path / "user-data.log")
    finally:
        for writer in writers:  # reaped, not left to the garbage collector
            writer.kill()
            writer.wait()


FAKE_TORCHRUN_RECORD = """#!/bin/bash
echo "$*" >"$FAKE_DIR/torchrun.args"
"""


@pytest.mark.slow  # the rendezvous polls every 10 s
def test_nodes_ready_minutes_apart_meet_and_the_first_ready_hosts(tf_env, tmp_path) -> None:
    """Issue #35 M1: a non-host ready first failed after c10d's 60 s read timeout; the host was the lowest IP, not the
    first ready. Each node now publishes its readiness and waits for the others; the first ready hosts."""
    run, log = _rendezvous(tmp_path, tf_env, timeout_s=60, late_peer_s=3)
    assert run.returncode == 0, log[-3000:]
    assert "waiting for the fleet's nodes: 1 of 2 ready (i-0abc); live, not ready: i-0def" in log
    assert "the c10d host is 10.0.0.5 (i-0abc, the first ready)" in log
    args = read(tmp_path / "torchrun.args")
    assert "--rdzv_endpoint=10.0.0.5:29400" in args and "--rdzv_conf=join_timeout=60,read_timeout=300" in args
    assert json.loads(read(tmp_path / "ready" / "i-0abc.json"))["instance_id"] == "i-0abc"


def test_a_node_that_never_comes_ends_the_wait_naming_it(tf_env, tmp_path) -> None:
    run, log = _rendezvous(tmp_path, tf_env, timeout_s=1, late_peer_s=None)
    assert run.returncode == 3, log[-3000:]
    assert "the rendezvous waited 1 s for the fleet's nodes: 1 of 2 ready (i-0abc); live, not ready: i-0def" in log
    assert not (tmp_path / "torchrun.args").exists()  # nothing trained, nothing waits on


# the job on node i-0abc fails as a survivor's does when a peer goes (the lost connection, the c10d host gone):
# FAKE_AFTER is what EC2 lists then, FAKE_PEER_EXIT a peer's recorded exit (its job ended too, its machine up);
# FAKE_GPUS_AFTER what nvidia-smi lists then ("fail": it fails), FAKE_DMESG what the kernel logged
FAILING_TORCHRUN = """#!/bin/bash
echo "$*" >"$FAKE_DIR/torchrun.args"
if [ -n "${FAKE_AFTER:-}" ]; then printf "$FAKE_AFTER" >"$FAKE_DIR/live"; fi
if [ -n "${FAKE_PEER_EXIT:-}" ]; then
  mkdir -p "$FAKE_DIR/exited" && echo "$FAKE_PEER_EXIT" >"$FAKE_DIR/exited/i-0def.json"
fi
if [ -n "${FAKE_GPUS_AFTER:-}" ]; then printf "$FAKE_GPUS_AFTER" >"$FAKE_DIR/gpus"; fi
if [ -n "${FAKE_DMESG:-}" ]; then echo "$FAKE_DMESG" >"$FAKE_DIR/dmesg"; fi
exit 1
"""

# a node of two GPUs (nvidia-smi's bus ids, as the DLAMI's driver lists them), and the kernel's log
GPU_FAKES = {
    "nvidia-smi": """#!/bin/bash
case "$(cat "$FAKE_DIR/gpus" 2>/dev/null)" in
  lost) echo "Unable to determine the device handle for GPU0000:00:1F.0: GPU is lost.  Reboot the system to recover \\
this GPU" >&2; exit 15 ;;
  mismatch) echo "Failed to initialize NVML: Driver/library version mismatch" >&2; exit 18 ;;
  none) echo "No devices were found"; exit 6 ;;
  hang) exec sleep 90 ;;
esac
if [ -e "$FAKE_DIR/gpus" ]; then cat "$FAKE_DIR/gpus"
else printf '00000000:00:1E.0\\n00000000:00:1F.0\\n'; fi
""",
    "dmesg": '#!/bin/bash\ncat "$FAKE_DIR/dmesg" 2>/dev/null\nexit 0\n',
}


def _job_fails(
    tmp_path: Path, tf_env, ready: dict[str, float], extra: dict[str, str], gpus: bool = False, **values: object
) -> tuple:
    """Node i-0abc of a 2-node fleet (the ``ready`` records already there, by instance id: seconds ago) meets at once
    and its job fails; ``extra``: the fakes' settings; ``gpus``: nvidia-smi and dmesg on PATH (:data:`GPU_FAKES`).
    The run, its log."""
    (tmp_path / "ready").mkdir()
    for k, (instance, ago) in enumerate(ready.items()):
        peer = {"instance_id": instance, "ip": f"10.0.0.{6 + k}", "ready_unix": time.time() - ago}
        (tmp_path / "ready" / f"{instance}.json").write_text(json.dumps(peer))
    script = render(tf_env, tmp_path / "console", template_values(name="lost", nnodes=2, **values))
    fakes = {"curl": FAKE_CURL, "aws": RENDEZVOUS_AWS, "torchrun": FAILING_TORCHRUN, "shutdown": "#!/bin/bash\n"}
    if gpus:
        fakes.update(GPU_FAKES)
    run = run_user_data(tmp_path, script, fakes, extra_env={"SRIFTY_PEER_WAIT_S": "3", **extra})
    return run, read(tmp_path / "user-data.log")


def test_a_node_lost_without_a_notice_sends_the_others_away_to_be_replaced(tf_env, tmp_path) -> None:
    """A peer's instance went away before its job ended (a reclaim without its notice, a failed host): the job here
    fails on the lost connection. Before, that exit ended the fleet's life, and the training with it; now the node
    sees the peer gone (EC2 no longer lists it, and it recorded no exit of its own) and leaves as on a notice, exit
    75 with the marker the watchdog reads (it stays in its group, which replaces it, and the replacements resume
    from the newest checkpoint). Its own exit is recorded first, for the others to read."""
    run, log = _job_fails(tmp_path, tf_env, {"i-0def": 5}, {"FAKE_AFTER": "i-0abc\\t10.0.0.5\\n"})
    assert run.returncode == 75, log[-3000:]
    assert "srifty: the fleet lost i-0def without a notice" in log
    assert read(tmp_path / "state" / "preempted").startswith("the fleet lost i-0def without a notice (an instance went")
    record = json.loads(read(tmp_path / "exited" / "i-0abc.json"))  # torchrun's exit, then the node's verdict
    assert (record["exit_code"], record["final"]) == (1, 75)
    assert "--rdzv_endpoint=10.0.0.6:29400" in read(tmp_path / "torchrun.args")  # the peer was ready first


def test_a_job_that_failed_on_every_node_still_ends_the_fleet(tf_env, tmp_path) -> None:
    """The peer recorded its own exit (its machine is up: the job failed everywhere, a bug in the script), so nothing
    was lost: the exit stands and the fleet's life ends as before (no replacement runs the bug again)."""
    peer = json.dumps({"instance_id": "i-0def", "exit_code": 1, "final": None, "unix": 1})  # its verdict to come
    run, log = _job_fails(tmp_path, tf_env, {"i-0def": 5}, {"FAKE_PEER_EXIT": peer})
    assert run.returncode == 1, log[-3000:]
    assert "without a notice" not in log and not (tmp_path / "state" / "preempted").exists()
    assert "could not tell" not in log  # the peer's machine is up and its job ended: known at once
    assert json.loads(read(tmp_path / "exited" / "i-0abc.json"))["final"] == 1


def test_a_node_whose_peers_all_left_to_be_replaced_leaves_too(tf_env, tmp_path) -> None:
    """A replacement that met at a host already gone (the old members were still listed when it booted) fails once
    they have left: every peer's verdict was 75 and their machines are gone, so it leaves to be replaced as they did,
    instead of ending the fleet's life."""
    peer = json.dumps({"instance_id": "i-0def", "exit_code": 1, "final": 75, "unix": 1})
    after = {"FAKE_PEER_EXIT": peer, "FAKE_AFTER": "i-0abc\\t10.0.0.5\\n"}
    run, log = _job_fails(tmp_path, tf_env, {"i-0def": 5}, after)
    assert run.returncode == 75, log[-3000:]
    assert "srifty: the fleet's other nodes left to be replaced" in log


def test_a_peer_that_neither_went_nor_said_leaves_the_exit_as_it_is(tf_env, tmp_path) -> None:
    """A peer still listed by EC2 that has recorded no exit within SRIFTY_PEER_WAIT_S: nothing is known, so the exit
    stands (a bounded wait), and the log says why."""
    run, log = _job_fails(tmp_path, tf_env, {"i-0def": 5}, {})
    assert run.returncode == 1, log[-3000:]
    assert "could not tell within 3 s whether a node of the fleet was lost" in log


XID_79 = "NVRM: Xid (PCI:0000:00:1f): 79, pid=1896, name=python, GPU has fallen off the bus."
# a GSP timeout the driver then says needs a GPU reset (an H100's kernel log in a public report of 2026-04-06, its bus
# id ours; NVIDIA's Xid catalog, Xid 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
XID_119_154 = (
    "[Mon Apr  6 07:25:23 2026] NVRM: Xid (PCI:0000:00:1f): 119, pid=5220, name=python, Timeout after 45s of waiting"
    " for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) sequence 3661611 (0x208f1105 0x8).\n"
    "[Mon Apr  6 07:25:24 2026] NVRM: Xid (PCI:0000:00:1f): 154, GPU recovery action changed from 0x0 (None) to 0x1"
    " (GPU Reset Required)"
)


@pytest.mark.parametrize(
    ("after", "says"),
    [
        ({"FAKE_GPUS_AFTER": "00000000:00:1E.0\\n"}, "GPUs no longer listed: 00000000:00:1F.0"),
        ({"FAKE_GPUS_AFTER": "lost"}, "nvidia-smi: GPU is lost.  Reboot the system to recover this GPU"),
        ({"FAKE_GPUS_AFTER": "none"}, "nvidia-smi: No devices were found"),
        ({"FAKE_DMESG": XID_79, "FAKE_GPUS_AFTER": "hang"}, "logged Xid (PCI:0000:00:1f): 79"),
        ({"FAKE_DMESG": XID_119_154}, "logged Xid (PCI:0000:00:1f): 154 0x1 (GPU Reset Required)"),
    ],
    ids=["one-gone", "gpu-is-lost", "no-device-left", "xid-79-and-a-stuck-nvidia-smi", "gsp-timeout-needs-a-reset"],
)
def test_a_node_whose_gpu_failed_under_the_job_leaves_to_be_replaced(tf_env, tmp_path, after, says) -> None:
    """A GPU that fell off the bus (nvidia-smi no longer lists it, or fails) or logged a fatal Xid while the job ran
    fails the job, and EC2 still lists the instance, so nothing saw a lost node: the fleet's life ended with the
    job's exit, though the periodic checkpoint was there to resume from. Now the node leaves as on a notice (exit 75,
    the marker the watchdog reads: it stays in its group, which replaces it) at once, without waiting for its peers,
    and its first exit record names the fault for them."""
    run, log = _job_fails(tmp_path, tf_env, {"i-0def": 5}, after, gpus=True)
    assert run.returncode == 75, log[-3000:]
    assert "srifty: 2 GPUs at the job's start" in log
    assert f"srifty: this node's GPUs failed while the job ran ({says}" in log
    assert "could not tell" not in log and "lost i-0def" not in log  # its own fault: no verdict of the peers waited for
    assert read(tmp_path / "state" / "preempted").startswith(f"this node's GPUs failed while the job ran: {says}")
    record = json.loads(read(tmp_path / "exited" / "i-0abc.json"))
    assert (record["exit_code"], record["final"]) == (1, 75) and record["gpu_fault"].startswith(says)


XID_13 = "NVRM: Xid (PCI:0000:00:1e): 13, pid=1896, Graphics Exception: ESR 0x505648=0x4000000"
# the driver's verdict taken back: a GPU reset asked for, then nothing needed (the last word of each GPU counts)
XID_154_BACK = (
    f"{XID_13}\nNVRM: Xid (PCI:0000:00:1e): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset"
    " Required)\nNVRM: Xid (PCI:0000:00:1e): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0"
    " (None)"
)


@pytest.mark.parametrize(
    ("dmesg", "gpus_after"),
    [(XID_13, None), (XID_13, "mismatch"), (XID_154_BACK, None)],
    ids=["listed", "nvidia-smi-mismatch", "recovery-action-back-to-none"],
)
def test_a_job_that_failed_on_healthy_gpus_still_ends_the_fleet(tf_env, tmp_path, dmesg, gpus_after) -> None:
    """Both GPUs still listed and only a non-fatal Xid logged (13, an illegal memory access: the script's own bug),
    the peer's job ended too: the exit stands, as with no GPU check, and no record names a fault. So it does when
    nvidia-smi fails for a reason of its own (the driver's libraries updated under the run): unknown is not lost; and
    when the driver's recovery action (Xid 154) went back to None: the GPU needs nothing now."""
    peer = json.dumps({"instance_id": "i-0def", "exit_code": 1, "final": None, "gpu_fault": None, "unix": 1})
    fakes = {"FAKE_PEER_EXIT": peer, "FAKE_DMESG": dmesg, **({"FAKE_GPUS_AFTER": gpus_after} if gpus_after else {})}
    run, log = _job_fails(tmp_path, tf_env, {"i-0def": 5}, fakes, gpus=True)
    assert run.returncode == 1, log[-3000:]
    assert "srifty: 2 GPUs at the job's start" in log and "GPUs failed" not in log
    assert json.loads(read(tmp_path / "exited" / "i-0abc.json"))["gpu_fault"] is None
    if gpus_after:
        assert "nvidia-smi did not list the GPUs after the job (Failed to initialize NVML" in log


def test_a_node_whose_peers_gpus_failed_leaves_to_be_replaced_too(tf_env, tmp_path) -> None:
    """The peer's first exit record names its GPUs' fault while its machine is up (it leaves to be replaced, its
    final verdict not yet written): this node's job failed on the lost connection, and it leaves too, at once."""
    peer = json.dumps({"instance_id": "i-0def", "exit_code": 1, "final": None, "gpu_fault": "logged Xid (x): 79"})
    run, log = _job_fails(tmp_path, tf_env, {"i-0def": 5}, {"FAKE_PEER_EXIT": peer})
    assert run.returncode == 75, log[-3000:]
    assert "srifty: the fleet lost i-0def without a notice (its GPUs failed while the job ran)" in log
    assert json.loads(read(tmp_path / "exited" / "i-0abc.json"))["final"] == 75


def test_a_one_node_fleet_whose_gpu_fell_off_the_bus_leaves_to_be_replaced(tf_env, tmp_path) -> None:
    script = render(tf_env, tmp_path / "console", template_values(name="one"))
    fakes = {"curl": FAKE_CURL, "aws": RENDEZVOUS_AWS, "torchrun": FAILING_TORCHRUN, "shutdown": "#!/bin/bash\n"}
    run = run_user_data(tmp_path, script, {**fakes, **GPU_FAKES}, extra_env={"FAKE_GPUS_AFTER": "lost"})
    log = read(tmp_path / "user-data.log")
    assert run.returncode == 75, log[-3000:]
    assert "srifty: this node's GPUs failed while the job ran (nvidia-smi: GPU is lost" in log
    # its exit record, for srifty launch (a one-node fleet's too: LostNodeWatch reads the 75 as a leave)
    record = json.loads(read(tmp_path / "exited" / "i-0abc.json"))
    assert (record["exit_code"], record["final"]) == (1, 75) and record["gpu_fault"].startswith("nvidia-smi: GPU is")
    # the watchdog waits for the verdict (its 60 s would otherwise end the fleet's life under a slow check)
    assert int(read(tmp_path / "state" / "verdict.until")) > time.time() - 60


# a peer's GPUs fail while this node's job hangs on the collective it never joins; the peer's machine stays up
FAULT_HANGING_TORCHRUN = """#!/bin/bash
echo "$*" >"$FAKE_DIR/torchrun.args"
mkdir -p "$FAKE_DIR/exited"
echo '{"instance_id": "i-0def", "exit_code": 1, "final": null, "gpu_fault": "logged Xid (x): 79"}' \\
  >"$FAKE_DIR/exited/i-0def.json"
exec sleep 50
"""


def test_a_job_hung_on_a_peer_whose_gpus_failed_is_stopped_and_leaves(tf_env, tmp_path) -> None:
    """NCCL waits on the peer for the process group's timeout; the peer's machine is up (EC2 lists it), so the watch
    for lost instances saw nothing: its exit record's fault stops the job here too."""
    run, log, took = _job_hangs(tmp_path, tf_env, {}, torchrun=FAULT_HANGING_TORCHRUN)
    assert run.returncode == 75, log[-3000:]
    assert "srifty: i-0def's GPUs failed while the job ran (its exit record): stopping the job" in log
    assert "the fleet lost i-0def without a notice (its GPUs failed while the job ran)" in log
    assert took < 40


# the job on node i-0abc hangs on the lost peer (NCCL waits for its process group's timeout), the peer's instance gone;
# with FAKE_DEAF it ignores SIGTERM too (torchrun's agent blocked on a store that does not answer)
HANGING_TORCHRUN = """#!/bin/bash
echo "$*" >"$FAKE_DIR/torchrun.args"
printf "i-0abc\\t10.0.0.5\\n" >"$FAKE_DIR/live"
if [ -z "${FAKE_DEAF:-}" ]; then exec sleep 50; fi
trap '' TERM
sleep 50 &
wait
wait
"""


def _job_hangs(
    tmp_path: Path, tf_env, extra: dict[str, str], torchrun: str = HANGING_TORCHRUN, **values: object
) -> tuple:
    (tmp_path / "ready").mkdir()
    peer = {"instance_id": "i-0def", "ip": "10.0.0.6", "ready_unix": time.time() - 5}
    (tmp_path / "ready" / "i-0def.json").write_text(json.dumps(peer))
    script = render(tf_env, tmp_path / "console", template_values(name="lost", nnodes=2, **values))
    fakes = {"curl": FAKE_CURL, "aws": RENDEZVOUS_AWS, "torchrun": torchrun, "shutdown": "#!/bin/bash\n", **GPU_FAKES}
    started = time.monotonic()
    run = run_user_data(tmp_path, script, fakes, extra_env={"SRIFTY_PEER_CHECK_S": "1", **extra})
    return run, read(tmp_path / "user-data.log"), time.monotonic() - started


def test_a_job_hung_on_a_lost_peer_is_stopped_and_leaves_to_be_replaced(tf_env, tmp_path) -> None:
    """NCCL may wait on a vanished peer for the process group's timeout (30 min under Lightning) instead of failing,
    and nothing ended the job: the node watches its rendezvous' peers while the job runs, and one gone without its
    job's end stops the job, which then leaves as on a notice."""
    run, log, took = _job_hangs(tmp_path, tf_env, {})
    assert run.returncode == 75, log[-3000:]
    assert "srifty: i-0def went away while the job ran (no exit of its job recorded): stopping the job" in log
    assert "srifty: the fleet lost i-0def without a notice" in log
    assert took < 40  # not the 50 s the job would have hung


@pytest.mark.slow  # the job's grace and 30 s pass before the kill
def test_a_hung_job_deaf_to_sigterm_is_killed_after_its_grace(tf_env, tmp_path) -> None:
    run, log, took = _job_hangs(tmp_path, tf_env, {"FAKE_DEAF": "1"}, watchdog_grace_s=0)
    assert run.returncode == 75, log[-3000:]
    assert "went away while the job ran" in log and "the fleet lost i-0def without a notice" in log
    assert 29 < took < 50


def test_a_node_whose_job_has_ended_is_neither_waited_for_nor_the_host(tf_env, tmp_path) -> None:
    """A replacement that boots while an old member is still leaving (listed by EC2, its ready record the oldest)
    met at the leaving node's address and failed; a member that recorded its job's exit is no longer counted."""
    (tmp_path / "exited").mkdir()
    (tmp_path / "exited" / "i-0old.json").write_text(json.dumps({"instance_id": "i-0old", "exit_code": 1}))
    live = "i-0abc\\t10.0.0.5\\ni-0old\\t10.0.0.6\\ni-0def\\t10.0.0.7\\n"
    _, log = _job_fails(
        tmp_path, tf_env, {"i-0old": 60, "i-0def": 5}, {"FAKE_LIVE": live, "FAKE_AFTER": "i-0abc\\t10.0.0.5\\n"}
    )
    assert "the c10d host is 10.0.0.7 (i-0def, the first ready)" in log, log[-3000:]
    assert "the fleet lost i-0def without a notice" in log  # the old member is not one of this rendezvous


MIXED = {"weights_json": json.dumps({"g4dn.xlarge": 100, "g5.xlarge": 167}), "units": 267}


@pytest.mark.slow  # the rendezvous polls every 10 s
def test_a_mixed_group_filled_with_another_mix_trains_on_every_live_node(tf_env, tmp_path) -> None:
    """A mixed Auto Scaling group's capacity is in units (each type's predicted throughput); AWS may fill the plan's
    1 x g4dn.xlarge + 1 x g5.xlarge (267 units) with 3 x g4dn.xlarge (300), as moto did in the rehearsal. torchrun
    took the plan's --nnodes=2: the third node waited at the rendezvous, billed, and a notice to it reached no job.
    The nodes now wait for the live members whose units cover the group's, and all of them train."""
    live = "i-0abc\t10.0.0.5\tg4dn.xlarge\ni-0def\t10.0.0.6\tg4dn.xlarge\ni-0fed\t10.0.0.7\tg4dn.xlarge\n"
    run, log = _rendezvous(tmp_path, tf_env, 60, 3, live=live, peers=("i-0def", "i-0fed"), **MIXED)
    assert run.returncode == 0, log[-3000:]
    assert (
        "waiting for the fleet's nodes: 300 of 267 units live, 1 of them ready (i-0abc); live, not ready: i-0def" in log
    )
    assert "the fleet's 3 nodes are ready; the c10d host is 10.0.0.5" in log
    assert "--nnodes=3 " in read(tmp_path / "torchrun.args")


def test_a_mixed_group_whose_live_units_do_not_cover_its_capacity_waits(tf_env, tmp_path) -> None:
    """Until the group has launched enough of its capacity, a ready node does not start a smaller job."""
    run, log = _rendezvous(tmp_path, tf_env, 1, None, live="i-0abc\t10.0.0.5\tg5.xlarge\n", **MIXED)
    assert run.returncode == 3, log[-3000:]
    assert "the rendezvous waited 1 s for the fleet's nodes: 167 of 267 units live, 1 of them ready (i-0abc)" in log
    assert not (tmp_path / "torchrun.args").exists()


EFA_TORCHRUN = """#!/bin/bash
# what NCCL says at init with NCCL_DEBUG=INFO when it did not load the OFI plugin (socket transport)
env | grep -E '^(FI_PROVIDER|LD_LIBRARY_PATH|NCCL_NET_PLUGIN|NCCL_DEBUG)=' | sort >"$FAKE_DIR/torchrun.env"
echo "ip-10-0-0-5:1234:1300 [0] NCCL INFO Using network ${FAKE_NCCL_NETWORK}"
sleep 1
"""


@pytest.mark.parametrize(
    ("plugin", "network", "in_use"),
    [("libnccl-net-aws-ofi.so", "AWS Libfabric", True), ("libnccl-net-aws-ofi.so", "Socket", False), (None, "", False)],
)
def test_an_efa_node_loads_the_images_ofi_plugin_and_says_which_network_nccl_chose(
    tf_env, aws, tmp_path, plugin, network, in_use
) -> None:
    """Issue #35 M5/item 8: torch from pip brings its own NCCL, which finds the image's aws-ofi-nccl only on the
    library path; without it NCCL falls back to sockets and nothing said so. An EFA group's node puts the plugin and
    libfabric on LD_LIBRARY_PATH with FI_PROVIDER=efa (and NCCL_NET_PLUGIN for the plugin's name), and writes which
    network NCCL chose beside the checkpoints; srifty status reads it ("EFA assumed by the prediction, not in use").
    The image's folders stand under SRIFTY_EFA_ROOT here (no EFA device on this machine)."""
    from lightning_srifty.provision.operations import fleets as ops

    real_aws = shutil.which("aws")
    if real_aws is None:
        pytest.skip("the harness needs the aws CLI on PATH")
    _, s3, endpoint = aws
    bucket = f"ops-efa-{'plugin' if plugin else 'none'}-{network.split(' ')[-1].lower() or 'none'}"  # one moto
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/ckpt/"
    image = tmp_path / "image"
    (image / "dev" / "infiniband").mkdir(parents=True)
    (image / "dev" / "infiniband" / "uverbs0").write_text("")
    if plugin:
        (image / "opt" / "amazon" / "aws-ofi-nccl" / "lib").mkdir(parents=True)
        (image / "opt" / "amazon" / "aws-ofi-nccl" / "lib" / plugin).write_text("")
    values = template_values(name="efa", efa=True, checkpoint_uri_b64=base64.b64encode(uri.encode()).decode())
    script = render(tf_env, tmp_path / "console", values)
    fakes = node_fakes(tmp_path, real_aws, torchrun=EFA_TORCHRUN)
    extra = {"AWS_ENDPOINT_URL": endpoint, "SRIFTY_EFA_ROOT": str(image), "FAKE_NCCL_NETWORK": network}
    run = run_user_data(tmp_path, script, fakes, extra_env=extra)
    assert run.returncode == 0, read(tmp_path / "user-data.log")[-3000:]
    env = dict(line.split("=", 1) for line in read(tmp_path / "torchrun.env").splitlines())
    if plugin:
        assert env["FI_PROVIDER"] == "efa" and env["NCCL_NET_PLUGIN"] == "aws-ofi"
        assert env["LD_LIBRARY_PATH"].startswith(f"{image}/opt/amazon/aws-ofi-nccl/lib:{image}/opt/amazon/efa/lib")
    else:
        assert "FI_PROVIDER" not in env and "the image has no aws-ofi-nccl plugin" in read(tmp_path / "user-data.log")
    deadline = time.monotonic() + 30
    records: list = []
    while time.monotonic() < deadline and not records:
        records = ops.read_network(s3, uri, "efa")
        time.sleep(0.5)
    assert len(records) == 1, read(tmp_path / "user-data.log")[-2000:]
    assert records[0]["efa_in_use"] is in_use and records[0]["instance_id"] == "i-0abc"
    note = ops.network_note(records)
    if in_use:
        assert note is None
    else:
        assert note.startswith("EFA assumed by the prediction, not in use on 1 of 1 node(s): ")
        assert ("NCCL chose Socket" if plugin else "no aws-ofi-nccl plugin") in note


FAKE_APT = """#!/bin/bash
echo "$*" >>"$FAKE_DIR/apt.log"
case "$*" in *" install "*) echo "E: Unable to locate package python3-venv" >&2; exit 100 ;; esac
"""
NO_ENSUREPIP_PYTHON = """#!/bin/bash
# an image whose python3 has no ensurepip (Ubuntu without python3-venv); anything else is this machine's python
if [ "$1" = -c ] && [ "$2" = "import ensurepip" ]; then exit 1; fi
exec {python} "$@"
"""


def test_apt_waits_for_the_lock_updates_and_fails_loudly(tf_env, aws, tmp_path) -> None:
    """Issue #35 row L/item 10: on an image without python3-venv the node ran `apt-get install` without `update`,
    without waiting for dpkg's lock (cloud-init and unattended-upgrades hold it at boot) and `|| true`. It now waits
    (DPkg::Lock::Timeout), updates first, and stops with a message when the install fails."""
    import hashlib
    import io
    import sys
    import tarfile

    real_aws = shutil.which("aws")
    if real_aws is None:
        pytest.skip("the harness needs the aws CLI on PATH")
    _, s3, endpoint = aws
    s3.create_bucket(Bucket="ops-apt")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"print('train')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive = buf.getvalue()
    sha = hashlib.sha256(archive).hexdigest()
    s3.put_object(Bucket="ops-apt", Key=f"ckpt/code/{sha}.tar.gz", Body=archive)
    uri = "s3://ops-apt/ckpt/"
    values = template_values(
        name="apt",
        checkpoint_uri_b64=base64.b64encode(uri.encode()).decode(),
        code_sha256=sha,
        code_uri_b64=base64.b64encode(f"{uri}code/{sha}.tar.gz".encode()).decode(),
    )
    script = render(tf_env, tmp_path / "console", values)
    fakes = node_fakes(
        tmp_path, real_aws, **{"apt-get": FAKE_APT, "python3": NO_ENSUREPIP_PYTHON.format(python=sys.executable)}
    )
    extra = {"AWS_ENDPOINT_URL": endpoint, "SRIFTY_HOME": str(tmp_path / "home")}
    run = run_user_data(tmp_path, script, fakes, extra_env=extra)
    log = read(tmp_path / "user-data.log")
    assert run.returncode == 1, log[-2000:]
    calls = read(tmp_path / "apt.log").splitlines()
    assert [c.split(" -q ")[-1] for c in calls] == ["update", "install -y python3-venv"]
    assert all("-o DPkg::Lock::Timeout=600" in c for c in calls)
    assert "python3-venv could not be installed (apt-get failed, above)" in log
    record = json.loads(s3.get_object(Bucket="ops-apt", Key="ckpt/status/apt-i-0abc.json")["Body"].read())
    assert record["exit_code"] == 1  # a failed boot says so beside the checkpoints


def test_a_vpc_left_outside_the_state_is_found_by_its_tag_and_named(aws) -> None:
    """Issue #36 L3: a launcher killed with SIGKILL during the first apply left the VPC it had created outside
    terraform's state (each one counts against the region's five), and srifty down said nothing. It finds the VPCs
    tagged with the fleet's name and names each with the commands that delete it."""
    ec2, _, _ = aws
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    ec2.create_tags(Resources=[vpc], Tags=[{"Key": "srifty:fleet", "Value": "killed-apply"}])
    ec2.create_vpc(CidrBlock="10.43.0.0/16")  # another, untagged: not the fleet's
    (line,) = fleets.leftover_networks(ec2, REGION, "killed-apply")
    assert line.startswith(f"VPC {vpc} of fleet killed-apply is still in {REGION}, outside terraform's state")
    assert f"aws ec2 delete-vpc --vpc-id {vpc} --region {REGION}" in line
    assert fleets.leftover_networks(ec2, REGION, "another-fleet") == []


def test_a_missing_folder_and_a_module_never_applied_are_said_as_such(tmp_path, monkeypatch) -> None:
    """A trial: `srifty status/logs/down --dir infra` of a folder that does not exist said it "is not a root module",
    and `srifty down` of a module written and never applied failed on terraform init's registry download without a
    word on what that means. Nothing is skipped: a state kept in a remote backend is read only after init."""
    from lightning_srifty.provision import apply
    from lightning_srifty.provision.terraform.generate import MARKER, TFVARS
    from predictor.exceptions import ProvisionError

    with pytest.raises(
        ProvisionError, match=r"does not exist: give the folder `srifty terraform --plan plan.json --out DIR` wrote"
    ):
        apply.check_folder(tmp_path / "infra")
    root = tmp_path / "written"
    root.mkdir()
    (root / TFVARS).write_text(json.dumps({"name": "n", "aws_endpoint": "http://127.0.0.1:9"}))
    (root / MARKER).write_text("")
    monkeypatch.setattr(apply, "_terraform", lambda folder: None)
    monkeypatch.setattr(apply, "_run", lambda *a, **k: (1, "", "Failed to query available provider packages"))
    with pytest.raises(ProvisionError, match=r"never initialised here: if it was never applied, nothing was created"):
        apply.destroy(root, yes=True)


def test_a_destroy_that_fails_once_runs_once_more(tmp_path, monkeypatch) -> None:
    """Two CI runs' flakes: a DeleteLaunchTemplate answer lost under load, the SDK's retry answered NotFound in moto's
    code, which the AWS provider's delete does not take as done (EC2's InvalidLaunchTemplateId.NotFound it does), and
    the destroy stopped with the fleet half gone. A failed pass runs once more (its refresh drops what is gone), and
    the clean-up of a failed apply does the same; two failures are still said."""
    from lightning_srifty.provision import apply
    from lightning_srifty.provision.terraform.generate import MARKER, TFVARS
    from predictor.exceptions import ProvisionError

    root = tmp_path / "written"
    root.mkdir()
    (root / TFVARS).write_text(json.dumps({"name": "n", "aws_endpoint": "http://127.0.0.1:9"}))
    (root / MARKER).write_text("")
    monkeypatch.setattr(apply, "_terraform", lambda folder: None)
    monkeypatch.setattr(apply, "_run", lambda *a, **k: (0, "", ""))  # init
    answers: list[int] = []
    monkeypatch.setattr(apply, "_run_shown", lambda *a, **k: (answers.pop(0), "DeleteLaunchTemplate: NotFound"))
    said: list[str] = []
    answers[:] = [1, 0]
    apply.destroy(root, yes=True, echo=said.append)
    assert not answers and any("terraform destroy failed: once more" in line for line in said)
    answers[:] = [1, 1]
    with pytest.raises(ProvisionError, match="terraform destroy failed in"):
        apply.destroy(root, yes=True, echo=said.append)
    # the clean-up of a failed apply: the first pass leaves the template, the second the state empty
    passes = iter([(1, "", "NotFound"), (0, "", "")])
    states = iter([["aws_launch_template.node"], ["aws_launch_template.node"], []])
    monkeypatch.setattr(apply, "_run", lambda *a, **k: next(passes))
    monkeypatch.setattr(apply, "_state_resources", lambda tf: next(states))
    assert apply._clean_up(None, root, {"name": "n"}, True, said.append).startswith("everything it had created")


# a job that trains, marks its node's alive file (lightning_srifty.migrate.alive) and then hangs: no fault, no exit;
# FAKE_ALIVE is what it writes, FAKE_KEEP_ALIVE that it goes on rewriting it (every FAKE_TICK_S, 1 s by default),
# FAKE_RUN_S how long it runs (then exit 0), FAKE_MARKS the local ranks that marked their script's end (exit_mark)
ALIVE_TORCHRUN = """#!/bin/bash
echo "$*" >"$FAKE_DIR/torchrun.args"
echo "${FAKE_ALIVE:-12 0.500 0}" >"$SRIFTY_NODE_STATE/alive"
for r in ${FAKE_MARKS:-}; do  # each held locked, as a rank's process holds its mark until it is gone
  echo "$r 12 $$" >"$SRIFTY_NODE_STATE/exit.$r"
  if [ -z "${FAKE_MARKS_GONE:-}" ]; then exec {fd}<"$SRIFTY_NODE_STATE/exit.$r" && flock -n "$fd"; fi
done
if [ -n "${FAKE_PEER_EXIT:-}" ]; then
  mkdir -p "$FAKE_DIR/exited" && echo "$FAKE_PEER_EXIT" >"$FAKE_DIR/exited/i-0def.json"
fi
end=$(($(date +%s) + ${FAKE_RUN_S:-50}))
while [ "$(date +%s)" -lt "$end" ]; do
  sleep "${FAKE_TICK_S:-1}"
  if [ -n "${FAKE_KEEP_ALIVE:-}" ]; then echo "${FAKE_ALIVE:-12 0.500 0}" >"$SRIFTY_NODE_STATE/alive"; fi
done
"""


LAUNCHED = {"stall_s": 0, "watch_s": 2}  # main.tf's watch under srifty launch: no training stall limit, the rest on


def _one_node_job(
    tmp_path: Path, tf_env, extra: dict[str, str], earlier: dict | None = None, **values: object
) -> tuple:
    """A one-node fleet (stall_s 2, looked at every second) whose job runs :data:`ALIVE_TORCHRUN`; ``earlier``: an
    exit record of an earlier node of the fleet. The run, its log, its time."""
    if earlier is not None:
        (tmp_path / "exited").mkdir()
        (tmp_path / "exited" / f"{earlier['instance_id']}.json").write_text(json.dumps(earlier))
        # the fleet's life, born an hour ago (the earlier node's), for this node to read
        life = {"fleet": "one", "born_unix": int(time.time()) - 3600, "born_by": "i-0first", "ended_unix": None}
        (tmp_path / "life.json").write_text(json.dumps(life))
    script = render(tf_env, tmp_path / "console", template_values(**{"name": "one", "stall_s": 2, **values}))
    fakes = {"curl": FAKE_CURL, "aws": RENDEZVOUS_AWS, "torchrun": ALIVE_TORCHRUN, "shutdown": "#!/bin/bash\n"}
    started = time.monotonic()
    run = run_user_data(tmp_path, script, fakes, extra_env={"SRIFTY_STALL_CHECK_S": "1", **extra})
    return run, read(tmp_path / "user-data.log"), time.monotonic() - started


def test_a_job_that_trained_and_then_hung_is_killed_and_its_node_replaced(tf_env, tmp_path) -> None:
    """A job that stopped moving after step 12 with no fault its node can see (a GPU that stopped answering, a read
    that never returns) neither failed nor ended: on a fleet without a launcher it billed until the life cap. The
    node's stall watch finds it (no sign of life for its limit), kills it, and the node leaves as on a notice (exit
    75, the marker the watchdog reads: its group replaces it, and the replacement resumes from the newest checkpoint);
    its exit record names the step, for its peers and for a later hang."""
    run, log, took = _one_node_job(tmp_path, tf_env, {})
    assert run.returncode == 75, log[-3000:]
    assert "srifty: the job has shown no sign of life for " in log
    assert "s after step 12 (its last recorded; its limit 2 s): it hangs" in log
    assert read(tmp_path / "state" / "preempted").startswith("the job showed no sign of life for ")
    record = json.loads(read(tmp_path / "exited" / "i-0abc.json"))
    assert (record["exit_code"], record["final"], record["hung_step"]) == (137, 75, 12)
    assert took < 30  # not the 50 s the job would have hung


@pytest.mark.parametrize(
    ("earlier_step", "alive", "again", "record"),
    [
        (15, "12 0.500 0", True, {}),  # resumed before 15, hung at 12: 3 steps apart, within the file's lag (11)
        (9, "12 0.500 0", True, {}),  # 3 steps past 9: the same
        (9, "400 0.500 0", False, {}),  # far past the earlier hang: a machine's again
        (400, "12 0.500 0", False, {}),  # far before it (a review: once any hang before it ended the fleet)
        (12, "12 - 0", True, {}),  # one step measured: no lag, the same step
        (9, "12 - 0", False, {}),  # one step measured, another step
        (12, "12 0.500 0", False, {"gpu_fault": "logged Xid (x): 79"}),  # that hang was its GPUs' (a review)
        (12, "12 0.500 0", False, {"unix": 1}),  # of an earlier life of the fleet (a review)
    ],
    ids=["before-it", "within-the-files-lag", "past-it", "far-before-it", "no-step-time-same", "no-step-time-other",
         "its-gpus-fault", "an-earlier-life"],
)  # fmt: skip
def test_a_job_that_hangs_again_where_it_hung_before_ends_the_fleet(
    tf_env, tmp_path, earlier_step, alive, again, record
) -> None:
    """An earlier node's job hung; the replacement resumed from a checkpoint before that and hangs again at the same
    step (within the 5 s of steps the alive file may lag by): the hang follows the job, not a machine (a deadlock, a
    data loader that never returns), and replacing machines would loop until the life cap. Its exit stands and the
    fleet ends. A hang elsewhere, one its GPUs' fault explained, or one of an earlier life of the fleet is a
    machine's, and the node is replaced."""
    earlier = {"instance_id": "i-0old", "exit_code": 137, "final": 75, "gpu_fault": None, "hung_step": earlier_step}
    earlier.update({"unix": int(time.time()) - 60, **record})
    run, log, _ = _one_node_job(tmp_path, tf_env, {"FAKE_ALIVE": alive}, earlier=earlier)
    step = alive.split()[0]
    assert f"s after step {step} (its last recorded; its limit 2 s): it hangs" in log, log[-3000:]
    if again:
        assert run.returncode == 137, log[-3000:]
        assert (
            f"srifty: the job hung again at step {step}, where it had hung before (i-0old's job, at step "
            f"{earlier_step})" in log
        )
        assert not (tmp_path / "state" / "preempted").exists()
        assert json.loads(read(tmp_path / "exited" / "i-0abc.json"))["final"] == 137
    else:
        assert run.returncode == 75 and "hung again" not in log, log[-3000:]


@pytest.mark.parametrize(
    "extra",
    [
        # alive throughout: a step or a validation batch five times a second. Once a second failed once in CI: the
        # watch reads the file's age in whole seconds, so a rewrite a second apart, late under load, read as 2 s
        {"FAKE_KEEP_ALIVE": "1", "FAKE_TICK_S": "0.2", "FAKE_RUN_S": "6"},
        {"FAKE_ALIVE": "12 0.500 1", "FAKE_RUN_S": "6"},  # training over: an export or an upload after the last step
        {"FAKE_ALIVE": "12 2.000 0", "FAKE_RUN_S": "6"},  # steps of 2 s: four of them (8 s) before a hang
        # one of the node's two ranks at its script's end: the other may still be exporting
        {"FAKE_ALIVE": "12 0.500 1", "FAKE_RUN_S": "6", "FAKE_MARKS": "0"},
        # both at their end and their processes gone: torchrun waits at its exit barrier for the other nodes (a review);
        # past the limit after training too: the script has ended
        {"FAKE_ALIVE": "12 0.500 1", "FAKE_RUN_S": "6", "FAKE_MARKS": "0 1", "FAKE_MARKS_GONE": "1",
         "SRIFTY_AFTER_FIT_S": "2"},
        # training over, and signs of life since (a test's batches, a validation) within the limit after training
        {"FAKE_ALIVE": "12 0.500 1", "FAKE_KEEP_ALIVE": "1", "FAKE_TICK_S": "0.2", "FAKE_RUN_S": "6",
         "SRIFTY_AFTER_FIT_S": "2"},
        # a training silent past the limit under srifty launch: the launcher watches it (and moves the job), not the
        # node (its SRIFTY_STALL_S is the teardown's limit there)
        {"FAKE_ALIVE": "12 0.500 0", "FAKE_RUN_S": "6", "launched": "1"},
    ],
    ids=["signs-of-life", "training-over", "long-steps", "one-rank-of-two-ended", "at-torchruns-exit-barrier",
         "alive-after-training", "silent-training-under-srifty-launch"],
)  # fmt: skip
def test_a_job_that_shows_life_or_has_finished_training_is_not_a_hang(tf_env, tmp_path, extra) -> None:
    launched = extra.pop("launched", None)
    run, log, _ = _one_node_job(tmp_path, tf_env, extra, nproc_per_node=2, **(LAUNCHED if launched else {}))
    assert run.returncode == 0, log[-3000:]
    assert "no sign of life" not in log and not (tmp_path / "state" / "hung").exists()
    # nothing of the watch's files said when there is no hang (a first version's log: "hung.step: No such file")
    assert "No such file" not in log and "No such file" not in read(tmp_path / "watchdog.log"), log[-3000:]
    assert json.loads(read(tmp_path / "exited" / "i-0abc.json"))["hung_step"] is None


@pytest.mark.parametrize(
    ("marks", "launched"),
    [("", False), ("0", False), ("", True)],
    ids=["no-rank-ended", "one-rank-of-two-ended", "under-srifty-launch"],
)
def test_a_script_silent_past_its_limit_after_training_is_killed_and_the_fleet_ends(
    tf_env, tmp_path, marks, launched
) -> None:
    """Training over (its fit ended, FINISHED.json written), and the script neither ends nor shows a sign of life (a
    test, an export, an upload that never returns): the stall watch took the job as alive while its process ran, and
    a fleet without a launcher billed until its life cap. Past the module's watchdog.after_fit_s (here 2 s) the job is
    killed and the fleet ends: not a hang to replace (its training is done; a replacement would train again to the
    same end), and not a finished job (its script did not end): torchrun's exit stands, the exit record has no hang
    step, and no notice marker makes the watchdog keep the node in its group. Under srifty launch too: the launcher
    cannot see the script's silence, and waited for the nodes' status records (a review) until its own limit, the
    fleet billed meanwhile, and then failed the launch."""
    extra = {"FAKE_ALIVE": "12 0.500 1", "FAKE_MARKS": marks, "SRIFTY_AFTER_FIT_S": "2"}
    run, log, took = _one_node_job(tmp_path, tf_env, extra, nproc_per_node=2, **(LAUNCHED if launched else {}))
    assert run.returncode == 137, log[-3000:]
    assert "srifty: the job's training finished at step 12, and its script has shown no sign of life for " in log
    assert "(its limit after training 2 s: the module's watchdog.after_fit_s): it hangs after its training" in log
    assert "what the script does after fit() did not end: exit 137 stands, and the fleet ends" in log
    record = json.loads(read(tmp_path / "exited" / "i-0abc.json"))
    assert (record["exit_code"], record["final"], record["hung_step"]) == (137, 137, None), record
    # and its status record says why, for a launcher waiting for it (the launch fails as at its own limit)
    status = json.loads(read(tmp_path / "status" / "one-i-0abc.json"))
    assert (status["exit_code"], status["after_fit_hung"], status["preempted"]) == (137, True, False), status
    assert not (tmp_path / "state" / "preempted").exists() and not (tmp_path / "state" / "hung").exists()
    assert took < 30  # not the 50 s the script would have run


@pytest.mark.parametrize("launched", [False, True], ids=["without-a-launcher", "under-srifty-launch"])
def test_a_job_whose_ranks_all_ended_but_whose_processes_hang_in_teardown_is_killed_as_finished(
    tf_env, tmp_path, launched
) -> None:
    """Training over, and every local rank at its script's end (its exit mark), but the processes do not exit: torch's
    process-group teardown can hang there, and the node billed until the life cap (the stall watch took the job as
    alive while its process ran, for an export). The limit after the last mark, the job is killed and taken as
    finished: exit 0, the fleet ends (torchrun's kill in the exit record's exit_code). Under srifty launch too, which
    had no node watch at all: it destroyed the fleet at FINISHED.json, and once it waited for the nodes' status
    records (a review) it waited for this job until its after-fit limit and failed the launch."""
    extra = {"FAKE_ALIVE": "12 0.500 1", "FAKE_MARKS": "0 1"}
    run, log, took = _one_node_job(tmp_path, tf_env, extra, nproc_per_node=2, **(LAUNCHED if launched else {}))
    assert run.returncode == 0, log[-3000:]
    assert "srifty: every rank of the job on this node reached its script's end " in log
    assert "(their teardown hangs; the limit 2 s): killed, the job finished, exit 0" in log
    record = json.loads(read(tmp_path / "exited" / "i-0abc.json"))
    assert (record["exit_code"], record["final"], record["hung_step"]) == (137, 0, None), record
    status = json.loads(read(tmp_path / "status" / "one-i-0abc.json"))
    assert (status["exit_code"], status["after_fit_hung"]) == (0, False), status
    assert not (tmp_path / "state" / "preempted").exists()
    assert took < 30  # not the 50 s the processes would have hung


@pytest.mark.parametrize(
    ("final", "code", "says"),
    [
        (75, 75, "the fleet's job hung on i-0def (no sign of life for its stall limit): this node leaves too"),
        (137, 143, "the training job exited with 143"),  # the peer found the hang the job's: the fleet ends
        (None, 75, "the fleet's job hung on i-0def (no sign of life"),  # not said in time: a machine's (a review)
    ],
    ids=["peer-replaced", "the-jobs-own-hang", "peer-undecided"],
)
def test_a_job_stuck_on_a_peer_whose_job_hung_follows_the_peers_verdict(tf_env, tmp_path, final, code, says) -> None:
    """The peer's stall watch found its job hung and recorded it (its machine is up): this node's job is stuck on the
    same collective, so the peer watch stops it at once, and the node does what the peer's verdict says: leaves to be
    replaced with it, or ends with it when the hang was the job's own."""
    peer = {"instance_id": "i-0def", "exit_code": 137, "final": final, "gpu_fault": None, "hung_step": 12, "unix": 1}
    extra = {"FAKE_ALIVE": "", "FAKE_PEER_EXIT": json.dumps(peer), "SRIFTY_PEER_WAIT_S": "3"}
    run, log, took = _job_hangs(tmp_path, tf_env, extra, torchrun=ALIVE_TORCHRUN)
    assert run.returncode == code, log[-3000:]
    assert "srifty: i-0def's job hung (its exit record): stopping the job" in log and says in log
    assert took < 40


@pytest.mark.parametrize(
    ("flag", "stall_s", "says"),
    [
        ([], 1200, "hang watch   a job silent 20 min after its first step"),  # as srifty launch's
        (["--stall-timeout-min", "45"], 2700, "hang watch   a job silent 45 min after its first step"),
        (["--stall-timeout-min", "0"], 0, "hang watch   off (--stall-timeout-min 0): a hung job bills until the life"),
    ],
    ids=["default", "45-min", "off"],
)
def test_srifty_terraform_sets_the_nodes_hang_watch_and_says_it(tmp_path, monkeypatch, capsys, flag, stall_s, says):
    from _support import ROOT
    from lightning_srifty.cli import main

    plan = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import lightning as L\n\ntrainer = L.Trainer(max_steps=5)\n")
    assert main(["terraform", "--plan", str(plan), "--out", str(tmp_path / "infra"), *flag]) == 0
    assert says in capsys.readouterr().out
    assert json.loads(read(tmp_path / "infra" / "srifty.auto.tfvars.json"))["watchdog"]["stall_s"] == stall_s


def test_a_hang_watch_outside_the_modules_bounds_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys) -> None:
    from _support import ROOT
    from lightning_srifty.cli import main

    plan = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"
    monkeypatch.chdir(tmp_path)
    for minutes in ("0.5", "2000", "-1"):
        with pytest.raises(SystemExit) as refused:
            main(["terraform", "--plan", str(plan), "--out", str(tmp_path / "infra"), f"--stall-timeout-min={minutes}"])
        said = capsys.readouterr().err
        assert refused.value.code == 2 and "argument --stall-timeout-min" in said, said
    assert not (tmp_path / "infra").exists()


# the node's torchrun starts a real Lightning job (tests/scripts/migrate_run.py: SpotPreemption, DDP's sampler) whose
# rank 0 never returns from its step 6, SIGTERM included (a GPU that stopped answering); outside a launch and with no
# bucket, so its SpotPreemption is the script's own and its checkpoints stay in FAKE_DIR
REAL_HANGING_TORCHRUN = f"""#!/bin/bash
echo "$*" >"$FAKE_DIR/torchrun.args"
exec env -u SRIFTY_CHECKPOINT_URI -u SRIFTY_RESUME {sys.executable} -m torch.distributed.run --standalone \\
  --nproc_per_node=1 {Path(__file__).resolve().parents[1] / "scripts" / "migrate_run.py"} "$FAKE_DIR/out" \\
  --hang-at 6 --step-sleep 0.3 --max-steps 40
"""


@pytest.mark.slow  # a real Lightning job: torch and lightning imported twice (torchrun, its worker)
def test_a_real_lightning_job_that_hangs_is_found_by_its_node_and_killed(tf_env, tmp_path) -> None:
    """The contract end to end: the real job's SpotPreemption marks the node alive from its first step; rank 0 then
    stops in step 6 for good; the boot script's stall watch sees the file go stale, kills torchrun and its worker, and
    the node leaves to be replaced (exit 75), its exit record naming the last recorded step."""
    script = render(tf_env, tmp_path / "console", template_values(name="one", stall_s=3))
    fakes = {"curl": FAKE_CURL, "aws": RENDEZVOUS_AWS, "torchrun": REAL_HANGING_TORCHRUN, "shutdown": "#!/bin/bash\n"}
    started = time.monotonic()
    run = run_user_data(tmp_path, script, fakes, extra_env={"SRIFTY_STALL_CHECK_S": "1"})
    took = time.monotonic() - started
    log = read(tmp_path / "user-data.log")
    assert run.returncode == 75, log[-3000:]
    trained = [line.split()[1] for line in read(tmp_path / "out" / "seen-rank0.txt").splitlines()]
    assert trained == ["0", "1", "2", "3", "4", "5"]  # step 6 never ran
    record = json.loads(read(tmp_path / "exited" / "i-0abc.json"))
    assert record["final"] == 75 and 1 <= record["hung_step"] <= 6, record  # the file's last step (every 5 s)
    assert "srifty: the job has shown no sign of life for " in log and "it hangs; killing it" in log
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "out")], capture_output=True, text=True).stdout.split()
    assert not left, left  # torchrun and its worker, killed
    assert took < 55, took


HANGING_AFTER_STEP_12 = """#!/bin/bash
echo "12 0.500 0" >"$SRIFTY_NODE_STATE/alive"
exec sleep 60
"""


@pytest.mark.parametrize("earlier", [None, 15], ids=["a-machines-hang", "the-jobs-hang-again"])
def test_the_hang_watch_reads_and_writes_the_fleets_records_under_the_roles_policy(
    tf_env, moto_endpoint, tmp_path, catalog, earlier
) -> None:
    """The planned boot script of a one-node root, under the instance role's policy (moto's IAM enforced, S3's
    listing rule by the AWS-rules proxy): its job hangs after step 12; the node reads the fleet's exit records (a
    one-node fleet had never read them before) and writes its own with the step. With an earlier node's hang at step
    15 the hang is the job's, and the node ends the fleet."""
    from _fleet import boot_as_node, dlami_parameters, enforce_iam, node_credentials, planned, use_test_parameters
    from _support import ROOT
    from lightning_srifty.provision.rehearsal.aws_rules import AwsRulesProxy
    from lightning_srifty.provision.terraform.generate import Options
    from predictor.documents.plan import load_plan

    dlami_parameters(moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION)
    bucket = f"hang-ckpt-{earlier or 0}"  # the module's moto server: each case its own bucket and principal
    s3.create_bucket(Bucket=bucket)
    options = Options(
        name="h-run", aws_endpoint=moto_endpoint, bucket=bucket, train_command="train.py", setup_command="true"
    )
    plan = load_plan(ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json")
    infra = use_test_parameters(generate(plan, tmp_path / "infra", options=options, catalog=catalog).out)
    (policy,) = planned(tf_env, infra, "aws_iam_role_policy").values()
    (script,) = [v["content"] for k, v in planned(tf_env, infra, "aws_s3_object").items() if ".boot[" in k]
    exited = "checkpoints/h-run/exited/h-run/"
    if earlier is not None:
        record = {"instance_id": "i-0old", "exit_code": 137, "final": 75, "gpu_fault": None, "hung_step": earlier}
        record["unix"] = int(time.time()) - 60  # this life of the fleet, born an hour ago
        life = {"fleet": "h-run", "born_unix": int(time.time()) - 3600, "born_by": "i-0first", "ended_unix": None}
        s3.put_object(Bucket=bucket, Key="checkpoints/h-run/life/h-run.json", Body=json.dumps(life).encode())
        s3.put_object(Bucket=bucket, Key=f"{exited}i-0old.json", Body=json.dumps(record).encode())
    node = node_credentials(moto_endpoint, policy["policy"], f"hang-node-{earlier or 0}")
    listing = ("checkpoints/h-run/",)
    proxy = AwsRulesProxy(moto_endpoint, s3_list_prefixes=listing, s3_principal=node["AWS_ACCESS_KEY_ID"])
    with proxy as url:
        enforce_iam(moto_endpoint, True)
        try:
            stall = {"SRIFTY_STALL_S": "2", "SRIFTY_STALL_CHECK_S": "1"}
            run = boot_as_node(script, url, tmp_path / "node", node, HANGING_AFTER_STEP_12, **stall)
        finally:
            enforce_iam(moto_endpoint, False)
    log = read(tmp_path / "node" / "user-data.log")
    mine = json.loads(s3.get_object(Bucket=bucket, Key=f"{exited}i-0d47a0000000001.json")["Body"].read())
    assert "s after step 12 (its last recorded; its limit 2 s): it hangs; killing it" in log, log[-3000:]
    assert "exit records could not be read" not in log and "could not record this node's exit" not in log
    if earlier is None:
        assert run.returncode == 75, log[-3000:]
        assert (mine["final"], mine["hung_step"]) == (75, 12)
    else:
        assert run.returncode == 137, log[-3000:]
        assert "where it had hung before (i-0old's job, at step 15)" in log
        assert (mine["final"], mine["hung_step"]) == (137, 12)


# a peer goes while this node's job runs: the peer watch stops the job (SIGTERM: it takes 6 s to leave), and the
# stall watch, whose limit passes meanwhile, leaves it to the peer watch. The job is alive until that SIGTERM (however
# long the peer watch's two looks take on a loaded machine: the forty-fifth session's first CI had the stall watch's
# 3 s run out first, a verdict of its own), then silent for an hour through its grace: the stall watch, checking every
# second, would take it for hung unless it defers to the peer watch's stop
SILENT_ON_A_LOST_PEER = """#!/bin/bash
echo "$*" >"$FAKE_DIR/torchrun.args"
echo "12 0.500 0" >"$SRIFTY_NODE_STATE/alive"
printf "i-0abc\\t10.0.0.5\\n" >"$FAKE_DIR/live"
( while :; do touch "$SRIFTY_NODE_STATE/alive"; sleep 0.5; done ) &
fresh=$!
trap 'kill $fresh $nap; wait $fresh; touch -d "-1 hour" "$SRIFTY_NODE_STATE/alive"; sleep 6; exit 143' TERM
sleep 50 &
nap=$!
wait
"""


def test_a_silent_job_stopped_for_a_lost_peer_is_the_peers_loss_not_a_hang(tf_env, tmp_path) -> None:
    """A review: the stall watch could kill a job the peer watch was already stopping for a lost peer (its SIGTERM
    grace), and the node then said "hung" (and might end the fleet on an earlier hang) where a peer was lost."""
    run, log, _ = _job_hangs(tmp_path, tf_env, {"SRIFTY_STALL_S": "3", "SRIFTY_STALL_CHECK_S": "1"},
                             torchrun=SILENT_ON_A_LOST_PEER)  # fmt: skip
    assert run.returncode == 75, log[-3000:]
    assert "srifty: i-0def went away while the job ran" in log and "the fleet lost i-0def without a notice" in log
    assert "no sign of life" not in log
    assert json.loads(read(tmp_path / "exited" / "i-0abc.json"))["hung_step"] is None


# the real torchrun (one node, two ranks: --standalone, the boot script's rendezvous options left out) over a worker
# that ends as FAKE_HOW says: "abort": both ranks reach their script's end after a fit, and rank 0 then dies of SIGABRT
# in its teardown (torch's gloo exit, stop 77); "exit3": rank 0's script ends with sys.exit(3) after its fit; "killed":
# rank 1 is killed (SIGKILL) before its fit ends, rank 0 aborts at exit as in "abort"; "abort_slow_peer": rank 0
# aborts while rank 1 is in a 3 s exit handler; "abort_peer_leaving": rank 0 aborts once rank 1 has marked, while
# rank 1's own teardown (after its mark) takes 20 s; "abort_before_peer": rank 0 aborts while rank 1 is still at its
# work
MARKED_WORKER = """import atexit, os, pathlib, signal, sys, time
rank, how = int(os.environ["RANK"]), os.environ["FAKE_HOW"]
state = pathlib.Path(os.environ["SRIFTY_NODE_STATE"])
def abort_after_peer(sign):
    # the ranks of a DDP job leave the fit together (its last collective); rank 0's teardown dies once its peer has
    # reached its own end (its mark; in abort_slow_peer, its exit handlers). Without this wait the peer could still be
    # importing when rank 0 died (stop 79's CI: torchrun then SIGTERMs it before its mark, and the node rightly records
    # a failure: the abort_before_peer case)
    deadline = time.monotonic() + 120
    while not (state / sign).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.abort()
def slow_upload():  # a logger's final upload, registered before the fit ended: torchrun's SIGTERM comes meanwhile
    (state / "in-exit.1").touch()
    time.sleep(3)
    print("rank 1 upload done", flush=True)
if how in ("abort", "abort_peer_leaving") and rank == 0:
    atexit.register(abort_after_peer, "exit.1")  # before lightning_srifty's import: run after the mark's (LIFO)
if how == "abort_peer_leaving" and rank == 1:
    atexit.register(time.sleep, 20)  # its teardown after its mark (stop 80's CI: an interpreter's own, under load)
if how == "abort_slow_peer" and rank == 0:
    atexit.register(abort_after_peer, "in-exit.1")
if how in ("killed", "abort_before_peer") and rank == 0:
    atexit.register(os.abort)
from lightning_srifty.migrate import exit_mark
print(f"rank {rank} epoch 1 loss 0.5", flush=True)
if how == "killed" and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
if how == "abort_before_peer" and rank == 1:
    time.sleep(300)  # a rank still at its script's work when its peer died: torchrun's SIGTERM ends it unmarked
if how == "abort_slow_peer" and rank == 1:
    atexit.register(slow_upload)
exit_mark.arm(rank, 40)  # what SpotPreemption.on_fit_end does
if how == "exit3" and rank == 0:
    sys.exit(3)
"""
MARKED_TORCHRUN = """#!/bin/bash
exec {python} -m torch.distributed.run --standalone --nproc_per_node=2 "$FAKE_DIR/worker.py"
"""


@pytest.mark.parametrize(
    "how", ["abort", "abort_slow_peer", "abort_peer_leaving", "exit3", "killed", "abort_before_peer"]
)
def test_a_job_that_finished_and_then_died_in_its_teardown_is_recorded_finished(tf_env, aws, tmp_path, how) -> None:
    """Noticed in stops 77 and 78: torch's teardown can abort a process after its work is done (gloo's joinable
    threads, pytorch/pytorch#190489), torchrun reports any worker's death as its own 1, and the node recorded a failed
    job whose training had finished (the fleet ended, as a failure). The job's ranks mark their script's end; where
    every local rank did and torchrun's failure table lists deaths by a signal only, the node's exit is 0 (torchrun's
    1 kept in its exit record's exit_code). A rank SIGTERMed by torchrun in its exit handlers holds it until they
    finish and it has marked (abort_slow_peer: stop 79's race, lost after the script's end), then dies of it; one
    SIGTERMed in its teardown after its mark dies of it at once (abort_peer_leaving: stop 80's race). An exit status
    after the fit, or a rank without its mark (killed, or SIGTERMed before it reached its end: abort_before_peer),
    stands."""
    real_aws = shutil.which("aws")
    if real_aws is None:
        pytest.skip("the harness needs the aws CLI on PATH")
    _, s3, endpoint = aws
    bucket = f"ops-teardown-{how}"
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/ckpt/"
    values = template_values(name="ender", nproc_per_node=2, checkpoint_uri_b64=base64.b64encode(uri.encode()).decode())
    (tmp_path / "worker.py").write_text(MARKED_WORKER)
    fakes = node_fakes(tmp_path, real_aws, torchrun=MARKED_TORCHRUN.format(python=sys.executable))
    env = {"AWS_ENDPOINT_URL": endpoint, "FAKE_HOW": how}
    run = run_user_data(tmp_path, render(tf_env, tmp_path / "console", values), fakes, extra_env=env)
    log = read(tmp_path / "user-data.log")
    status = json.loads(s3.get_object(Bucket=bucket, Key="ckpt/status/ender-i-0abc.json")["Body"].read())
    exited = json.loads(s3.get_object(Bucket=bucket, Key="ckpt/exited/ender/i-0abc.json")["Body"].read())
    assert "ChildFailedError" in log, log[-3000:]  # the real torchrun's failure table, which the verdict reads
    assert exited["exit_code"] == 1, exited  # torchrun's own exit, whatever the verdict
    if how in ("abort", "abort_slow_peer", "abort_peer_leaving"):
        assert run.returncode == 0, log[-3000:]
        assert status["exit_code"] == 0 and exited["final"] == 0, (status, exited)
        # rank 1 marked before rank 0 aborted, but may still be leaving (its interpreter's teardown) when torchrun's
        # SIGTERM comes: its -15 row is then listed beside rank 0's, and the job is still finished (stop 80's CI)
        died = r"and then rank 0 \(SIGABRT\)(, rank 1 \(SIGTERM\))? died in the process's teardown"
        assert re.search(died, log), log[-3000:]
        assert "the training job exited with 0" in log
    else:
        assert run.returncode == 1, log[-3000:]
        assert status["exit_code"] == 1 and exited["final"] == 1, (status, exited)
        assert "died in the process's teardown" not in log
    if how in ("abort_slow_peer", "abort_peer_leaving"):  # rank 1 died of torchrun's SIGTERM after its mark
        assert re.search(r"local_rank: 1\)\s*\n\s*exitcode\s*:\s*-15 ", log), log[-3000:]
        assert "and then rank 0 (SIGABRT), rank 1 (SIGTERM) died in the process's teardown" in log, log[-3000:]
    if how == "abort_slow_peer":  # ... held through its upload, which finished
        assert "srifty: SIGTERM after the script's end" in log and "rank 1 upload done" in log, log[-3000:]
    if how == "abort_peer_leaving":  # ... at once (-15, not torchrun's -9 after its 30 s), nothing held
        assert "srifty: SIGTERM after the script's end" not in log, log[-3000:]
    if how == "abort_before_peer":  # the lost race itself: rank 0's abort, then torchrun's SIGTERM to unmarked rank 1
        assert re.search(r"local_rank: 1\)\s*\n\s*exitcode\s*:\s*-15 ", log), log[-3000:]
        assert re.search(r"local_rank: 0\)\s*\n\s*exitcode\s*:\s*-6 ", log), log[-3000:]
