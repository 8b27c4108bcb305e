"""The job <-> launcher protocol (torch-free): versioned records, launch ids, LaunchEnv as the one home of the
SRIFTY_* settings, and the words the launcher uses for a move and a spot notice."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from lightning_srifty import protocol, store
from lightning_srifty.protocol import (
    PROTOCOL,
    Handover,
    Heartbeat,
    LaunchEnv,
    MoveRequest,
    Preempted,
    read_record,
    write_record,
)
from predictor.exceptions import ConfigError, MigrationError

ROOT = Path(__file__).resolve().parents[2]


def test_every_record_is_written_with_the_protocol_and_its_launch_and_reads_back(tmp_path) -> None:
    for cls in protocol.RECORDS:
        record = cls(launch_id="L1", **({"fleet": "srifty-2"} if cls is Handover else {}))
        where = write_record(str(tmp_path), record)
        data = json.loads(Path(where).read_text())
        assert data["protocol"] == PROTOCOL == "srifty.launch/1" and data["launch_id"] == "L1"
        assert read_record(str(tmp_path), cls, "L1", name=record.file) == record
    assert (tmp_path / "HANDOVER-srifty-2.json").exists() and not list(tmp_path.glob("*.partial"))
    request = MoveRequest(launch_id="L1", why="price", step=7, plan={"schema": "srifty.plan/v1"})
    write_record(str(tmp_path), request)
    assert read_record(str(tmp_path), MoveRequest).plan == {"schema": "srifty.plan/v1"}


def test_the_heartbeat_has_exactly_the_fields_the_instances_watchdog_reads(tmp_path) -> None:
    write_record(str(tmp_path), Heartbeat(launch_id="L1", written_unix=100.0, max_age_s=60, max_life_until_unix=None))
    data = json.loads((tmp_path / "HEARTBEAT.json").read_text())
    assert set(data) == {"protocol", "launch_id", "written_unix", "max_age_s", "max_life_until_unix"}
    beat = read_record(str(tmp_path), Heartbeat)
    assert not beat.stale(now=160.0) and beat.stale(now=160.5)
    doc = protocol.__doc__
    assert '{"protocol", "launch_id", "written_unix", "max_age_s", "max_life_until_unix"}' in doc


@pytest.mark.parametrize(
    ("written", "named"),
    [("srifty.launch/2", "'srifty.launch/2'"), (None, "no protocol field (lightning-srifty 0.1)"), ("x/1", "'x/1'")],
)
def test_a_record_of_another_major_version_is_refused_naming_both_and_the_fix(tmp_path, written, named) -> None:
    data = {"launch_id": "L1", "step": 3, **({"protocol": written} if written else {})}
    (tmp_path / "PREEMPTED.json").write_text(json.dumps(data))
    with pytest.raises(MigrationError) as caught:
        read_record(str(tmp_path), Preempted, "L1")
    message = str(caught.value)
    assert named in message and "'srifty.launch/1'" in message
    assert "use the same lightning-srifty on the launcher and in the training image" in message


def test_unknown_fields_of_the_same_major_version_are_accepted_with_a_warning(tmp_path) -> None:
    data = {"protocol": "srifty.launch/1.4", "launch_id": "L1", "step": 9, "checkpoint": "c9", "gpu_temp_c": 71}
    (tmp_path / "PREEMPTED.json").write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="gpu_temp_c"):
        record = read_record(str(tmp_path), Preempted, "L1")
    assert (record.step, record.checkpoint) == (9, "c9")


def test_a_record_of_another_launch_is_ignored_with_a_warning(tmp_path) -> None:
    write_record(str(tmp_path), Handover(launch_id="OLD", fleet="srifty-1", env={"SRIFTY_RESUME": "old.ckpt"}))
    with pytest.warns(UserWarning, match="belongs to launch OLD, not to this one \\(NEW\\)"):
        assert read_record(str(tmp_path), Handover, "NEW", name=protocol.handover("srifty-1")) is None
    assert read_record(str(tmp_path), Handover, "OLD", name=protocol.handover("srifty-1")).env["SRIFTY_RESUME"]


def test_launch_env_round_trips_through_the_environment() -> None:
    env = LaunchEnv(
        launch_id="L1",
        checkpoint_uri="s3://b/run",
        resume="s3://b/run/preempt-step=7.ckpt",
        fleet="g4dn.xlarge:2",
        plan="s3://b/run/plans/plan-1.json",
        choice=1,
        batch_sizes=(5, 3),
        accumulate_grad_batches=2,
        plan_started_unix=1700000000.25,
        heartbeat_max_age_s=600.0,
        max_life_until_unix=1700007200.5,
    )
    variables = env.to_env()
    assert variables["SRIFTY_CHECKPOINT_URI"] == "s3://b/run" and variables["SRIFTY_BATCH_SIZES"] == "5,3"
    assert variables["SRIFTY_PROTOCOL"] == PROTOCOL and set(variables) <= set(protocol.VARIABLES.values())
    assert LaunchEnv.from_env(variables) == env
    first = LaunchEnv(launch_id="L1", checkpoint_uri="/c").to_env()
    assert first["SRIFTY_RESUME"] == "" and LaunchEnv.from_env(first).resume == ""  # the first start says so
    assert LaunchEnv.from_env({"PATH": "/bin"}) is None  # not under srifty launch


def test_the_old_checkpoint_variable_is_read_for_one_release_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"\$SRIFTY_CHECKPOINT_DIR is deprecated.*SRIFTY_CHECKPOINT_URI"):
        env = LaunchEnv.from_env({"SRIFTY_CHECKPOINT_DIR": "/ck", "SRIFTY_RESUME": "/ck/a.ckpt"})
    assert (env.checkpoint_uri, env.resume, env.launch_id) == ("/ck", "/ck/a.ckpt", "")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name alone: no warning
        assert LaunchEnv.from_env({"SRIFTY_CHECKPOINT_URI": "/ck"}).checkpoint_uri == "/ck"


def test_a_launcher_of_another_major_version_and_bad_values_are_refused_clearly() -> None:
    with pytest.raises(MigrationError, match=r"'srifty\.launch/2'.*'srifty\.launch/1'.*same lightning-srifty"):
        LaunchEnv.from_env({"SRIFTY_CHECKPOINT_URI": "/c", "SRIFTY_PROTOCOL": "srifty.launch/2"})
    with pytest.raises(ConfigError, match=r"\$SRIFTY_CHOICE must be .*int.*Got 'two'") as caught:
        LaunchEnv.from_env({"SRIFTY_CHECKPOINT_URI": "/c", "SRIFTY_CHOICE": "two"})
    assert (caught.value.parameter, caught.value.value) == ("SRIFTY_CHOICE", "two")
    with pytest.raises(ConfigError, match="comma-separated whole numbers"):
        LaunchEnv.from_env({"SRIFTY_CHECKPOINT_URI": "/c", "SRIFTY_BATCH_SIZES": "4;4"})


def test_only_the_protocol_module_names_the_launchers_variables() -> None:
    names = set(protocol.VARIABLES.values()) | set(protocol.DEPRECATED)
    offenders = []
    for path in (ROOT / "lightning_srifty").rglob("*.py"):
        if path.name == "protocol.py":
            continue
        offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if re.search(rf"\b{n}\b", path.read_text())]
    assert not offenders


def test_the_terraform_module_exports_the_same_checkpoint_variable() -> None:
    template = (ROOT / "terraform/modules/training_fleet/templates/user_data.sh.tftpl").read_text()
    exported = set(re.findall(r"export (SRIFTY_\w+)=", template))
    # where checkpoints go, and what to resume from (a replacement node: the newest sound checkpoint there)
    # and (a mix whose ranks take different batches) the node's plan group, gathered by the strategies at set-up
    assert exported == {
        protocol.VARIABLES["checkpoint_uri"],
        protocol.VARIABLES["resume"],
        protocol.VARIABLES["node_group"],
        protocol.NODE_STATE,
    }
    assert '["env"]' in template  # the handover's LaunchEnv is exported as it is


def test_a_move_is_reported_in_words_with_its_measured_times() -> None:
    from lightning_srifty.provision.launcher.launch import Migration

    move = Migration(
        "2026-11-23T09:00:00+00:00", "spot interruption notice", "spot", False, "g5.xlarge:1", "g5.2xlarge:1", 120,
        2.9, 6.44, 0.0, checkpoint_s=3.21, up_s=1.08,
    )  # fmt: skip
    assert move.describe() == (
        "moved from g5.xlarge:1 to g5.2xlarge:1 after a spot notice at step 120: checkpoint 3.2 s, new fleet up "
        "1.1 s, downtime 6.4 s"
    )
    move.downtime_s, move.voluntary, move.trigger = None, True, "drift"
    assert "after a drift from the prediction" in move.describe() and "(while training)" in move.describe()
    assert "downtime not measured (the new leg took no step)" in move.describe()
    # the same fleet bought another way (a trial read "moved from g4dn.xlarge:1 to g4dn.xlarge:1")
    twin = Migration(
        "2026-11-23T09:00:00+00:00", "deadline", "deadline", True, "g4dn.xlarge:1", "g4dn.xlarge:1", 44, None, None,
        0.0, from_market="spot", to_market="on-demand",
    )  # fmt: skip
    assert twin.describe().startswith("moved from g4dn.xlarge:1 (spot) to g4dn.xlarge:1 (on-demand) after a deadline")


def test_a_spot_notice_is_described_with_its_time_or_says_there_was_none() -> None:
    import calendar

    from lightning_srifty.migrate.spot_watcher import Notice

    now = calendar.timegm((2026, 11, 22, 14, 0, 2, 0, 0, 0))
    notice = Notice("interruption", "terminate", "2026-11-22T14:02:00Z", 0.0)
    assert notice.describe(now) == "spot interruption notice: terminate at 2026-11-22 14:02:00 UTC (in 118 s)"
    assert Notice("interruption", "stop", "", 0.0).describe() == "spot interruption notice: stop (no time given)"
    assert "(time given as 'in 2 minutes')" in Notice("interruption", "terminate", "in 2 minutes", 0.0).describe()


@pytest.mark.slow  # two moto servers, one after the other: 10 s
def test_the_s3_filesystem_follows_the_endpoint_of_the_moment(monkeypatch, tmp_path) -> None:
    """fsspec caches filesystems by their options: one made for an earlier endpoint (an earlier moto server, a
    checkpoint store moved) must never be handed out again. The full suite once read a dead server's port this way."""
    pytest.importorskip("s3fs")
    import boto3

    from conftest import moto_server
    from lightning_srifty.migrate.checkpoints import local_checkpoint

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    seen = []
    for run in ("first", "second"):
        with moto_server() as endpoint:
            monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
            store.filesystem("s3://ckpts/run").pipe_file(f"ckpts/run/{run}.txt", run.encode())
            seen.append(sorted(p.rsplit("/", 1)[-1] for p in store.filesystem("s3://ckpts/run").ls("ckpts/run")))
            # the checkpoint code asks the server of the moment too (a file, not a directory: nothing to download)
            assert local_checkpoint(f"s3://ckpts/run/{run}.txt", str(tmp_path)) == f"s3://ckpts/run/{run}.txt"
    assert seen == [["first.txt"], ["second.txt"]]  # each server's own bucket, never the dead one's port


def test_records_and_digests_on_s3_are_one_put_of_their_final_key(monkeypatch) -> None:
    """On S3 a record is written with one PUT of its final key (atomic there), no temporary object and no copy: the
    copy of s3fs's rename looked the temporary key up in a listing cache another thread had refilled without it."""
    pytest.importorskip("s3fs")
    import boto3

    from conftest import moto_server

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto_server() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="runs")
        fs = store.filesystem("s3://runs/job")
        calls: list[str] = []
        for method in ("open", "mv", "copy", "pipe_file"):
            original = getattr(fs, method)
            monkeypatch.setattr(fs, method, lambda *a, _m=method, _o=original, **k: (calls.append(_m), _o(*a, **k))[1])
        record = protocol.Preempted(launch_id="L1", step=3, why="spot")
        where = protocol.write_record("s3://runs/job", record)
        assert calls == ["pipe_file"], calls
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="runs")["Contents"]]
        assert keys == [f"job/{record.file}"] and where == f"s3://runs/job/{record.file}"
        assert protocol.read_record("s3://runs/job", type(record)).step == 3
        # a checkpoint's digest manifest the same way (ranks may write it at once: each PUT is whole)
        from lightning_srifty.migrate.checkpoints import read_manifest, write_digest

        calls.clear()
        write_digest(fs, "runs/job/last.ckpt", "ab" * 32)
        assert calls == ["pipe_file"], calls
        assert read_manifest(fs, "runs/job/last.ckpt") == {"": "ab" * 32}
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="runs")["Contents"])
        assert keys == [f"job/{record.file}", "job/last.ckpt.sha256"], keys


def test_node_verdicts_read_each_nodes_final_word_and_an_earlier_fleets_are_cleared(tmp_path) -> None:
    """exited/<fleet>/<id>.json as the boot script writes them: null while the node decides, its exit code after; the
    launcher clears an earlier launch's fleet of the same name before it brings one up (a review: a stale 75 moved a
    healthy new launch on)."""
    import json

    from lightning_srifty.protocol import clear_node_verdicts, node_verdicts

    folder = tmp_path / "exited" / "srifty-1"
    folder.mkdir(parents=True)
    (folder / "i-a.json").write_text(json.dumps({"instance_id": "i-a", "exit_code": 1, "final": None, "unix": 500}))
    (folder / "i-b.json").write_text(json.dumps({"instance_id": "i-b", "exit_code": 1, "final": 75, "unix": 501}))
    (folder / "i-c.json").write_text("{not json")
    assert sorted(node_verdicts(str(tmp_path), "srifty-1"), key=str) == sorted([75, None, None], key=str)
    assert node_verdicts(str(tmp_path), "srifty-2") == []
    clear_node_verdicts(str(tmp_path), "srifty-1")
    clear_node_verdicts(str(tmp_path), "srifty-2")  # none there: nothing to do
    assert node_verdicts(str(tmp_path), "srifty-1") == [] and (tmp_path / "exited").exists()
