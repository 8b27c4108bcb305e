"""No traceback for bad input, anywhere on the command line: exit 2 and one line naming the file or field, the value
and the fix (issue #13, reliability item 4)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import ROOT
from lightning_srifty.cli import main

PROFILE = ROOT / "examples" / "profiles" / "resnet50-v100.json"


def _changed(tmp_path, source, change) -> str:
    """A copy of the JSON document ``source``, changed by ``change``, in ``tmp_path`` (same file name)."""
    data = json.loads(source.read_text())
    change(data)
    path = tmp_path / source.name
    path.write_text(json.dumps(data))
    return str(path)


def _profile(tmp_path, change) -> str:
    return _changed(tmp_path, PROFILE, change)


def _run(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("srifty: error: "), err
    return lines[0]


def test_a_flag_of_another_command_after_launch_is_named_not_a_traceback(capsys) -> None:
    """The hardening probe: `srifty launch --plan p --max-hourly inf train.py` (a terraform flag) was `TypeError:
    unhashable type: 'list'`: launch's own positional `command` replaced the sub-command's name."""
    with pytest.raises(SystemExit) as ended:  # argparse's own exit, as for any flag it does not know
        main(["launch", "--plan", "p.json", "--max-hourly", "inf", "train.py"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "Traceback" not in err and "unrecognized arguments: --max-hourly" in err


def test_a_symlink_loop_is_named_not_a_traceback(tmp_path, capsys) -> None:
    """The hardening probe: a plan or trace that is a symbolic link to itself was `RuntimeError: Symlink loop`."""
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    line = _run(capsys, ["replay", "--plan", str(loop), "--trace", str(loop), "--plot", str(tmp_path / "p.png")])
    assert "too many levels of symbolic links" in line


@pytest.mark.parametrize(
    ("argv", "data", "said"),
    [
        (
            ["replay", "--plan", "PLAN", "--trace", "FILE"],
            b'{"metadata": {"gap_seconds": 60}, "data": [' + b"9" * 5000 + b"]}",
            "is not JSON (Exceeds the limit",
        ),
        (["--catalog-extra", "FILE", "catalog", "show"], b"gpus:\n  - name: " + b"9" * 5000 + b"\n", "cannot be read"),
        (["eval", "--data", "FILE"], bytes(range(256)) * 4, "cannot be read as a measurements CSV (UnicodeDecodeError"),
        (
            ["eval", "--data", "FILE"],
            b"source_repo,model,precision,gpu,gpus_per_node,nodes,per_gpu_batch,throughput,"
            b"throughput_unit\n" + b"a" * 200_000 + b"\n",
            "field larger than field limit",
        ),
    ],
)
def test_the_probes_documents_are_named_not_tracebacks(tmp_path, capsys, catalog, argv, data, said) -> None:
    """The hardening probe (bench/hardening_probe.py): an integer of 5,000 digits in a trace or a catalog extra file
    (Python refuses over 4,300), binary bytes or a 200 KB field in a measurements CSV were tracebacks."""
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    bad = tmp_path / "bad"
    bad.write_bytes(data)
    plan = tmp_path / "plan.json"
    if "PLAN" in argv:
        constraints = Constraints(steps=1000, deadline_h=30, market="spot", allow=("p3.2xlarge",), max_instances=1)
        rank(load_profile(PROFILE), constraints, catalog=catalog).save(plan)
    line = _run(capsys, [str(bad) if a == "FILE" else str(plan) if a == "PLAN" else a for a in argv])
    assert said in line and str(bad) in line, line


def test_json_nested_100000_deep(tmp_path, capsys) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for argv in (["profile", "show", str(deep)], ["recommend", "--profile", str(deep), "--steps", "10"]):
        line = _run(capsys, argv)
        assert "deep.json" in line and "100,000 deep" in line and "not a profile" in line


def test_a_profile_that_is_not_utf8(tmp_path, capsys) -> None:
    bad = tmp_path / "latin1.json"
    bad.write_bytes('{"schema": "srifty.profile/v1", "model": {"name": "caf\u00e9"}}'.encode("latin-1"))
    assert "latin1.json" in _run(capsys, ["profile", "show", str(bad)])


def test_a_parameter_count_of_1e300(tmp_path, capsys) -> None:
    path = _profile(tmp_path, lambda d: d["model"].update(parameters=10**300))
    line = _run(capsys, ["predict", "--profile", path, "--fleet", "p3.2xlarge:1"])
    assert "model.parameters" in line


def test_a_spread_that_would_overflow_the_interval_gives_finite_bounds(tmp_path, capsys) -> None:
    huge = _profile(tmp_path, lambda d: d["timing"]["step_time_s"].update(cv=1e300))
    line = _run(capsys, ["predict", "--profile", huge, "--fleet", "p3.2xlarge:1"])
    assert "timing.step_time_s.cv" in line and "<= 100" in line
    # the largest spread allowed: exp(1.28 x 100) would be a bound of 1e55 x the time; the interval is capped instead
    path = _profile(tmp_path, lambda d: d["timing"]["step_time_s"].update(cv=100))
    assert main(["predict", "--profile", path, "--fleet", "p3.2xlarge:1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    low, high = out["interval"]["iteration_time_s"]
    assert 0 < low < out["iteration_time_s"] < high < 100 * out["iteration_time_s"]


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("gpus: 5\n", "gpus: expected a list of entries"),
        ("instance_types: {a: 1}\n", "instance_types: expected a list of entries"),
        ("gpus:\n  - name: X\n    memory_gb: .nan\n", "NaN or infinite"),
        ("a: &x [*x]\n", "alias"),
    ],
)
def test_bad_catalog_yaml(tmp_path, capsys, yaml_text: str, expected: str) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml_text)
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", "--catalog-extra", str(extra)])
    assert expected in line and "extra.yaml" in line


def test_a_yaml_number_with_an_exponent_says_how_yaml_reads_it(tmp_path, capsys) -> None:
    """Issue #36 L7: memory_gb: 1e300 was refused as "expected a number, got '1e300'" with no word on why (YAML 1.1
    reads an exponent without a dot and a sign as text)."""
    extra = tmp_path / "extra.yaml"
    extra.write_text("gpus:\n  - name: X\n    memory_gb: 1e3\n")
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", "--catalog-extra", str(extra)])
    assert "memory_gb: expected a number, got '1e3'. YAML reads 1e3 as text" in line and "write 1.0e+3" in line


def test_a_folder_given_as_the_yaml(tmp_path, capsys) -> None:
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", "--catalog-extra", str(tmp_path)])
    assert str(tmp_path) in line


@pytest.mark.parametrize("flag", ["--out", "--report"])
def test_an_unwritable_output_names_the_path_not_the_temporary_file(tmp_path, capsys, flag: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / ("plan.json" if flag == "--out" else "report.html")
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", flag, str(target)])
    assert f"cannot write {blocker}/" in line and ".tmp" not in line and "folder you can write" in line
    assert blocker.read_text() == "not a folder"  # nothing half-written


def test_every_output_is_checked_before_any_is_written(tmp_path, capsys) -> None:
    """--report X wrote X.png beside a target it then refused (issue #23 item 8): a FIFO as the report (as root,
    /dev/full would have made /dev/full.png) leaves no PNG and no plan behind."""
    fifo = tmp_path / "report.html"
    os.mkfifo(fifo)
    plan = tmp_path / "plan.json"
    line = _run(
        capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", "--out", str(plan), "--report", str(fifo)]
    )
    assert "is a FIFO, not a regular file" in line and str(fifo) in line
    assert not (tmp_path / "report.png").exists() and not plan.exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--deny", "p4d.24xlarg"], "The --deny constraint names 'p4d.24xlarg'"),
        (["--allow", "g5.xlarg"], "Did you mean 'g5.xlarge'"),
        (["--allow", "g5,g6x"], "The --allow constraint names 'g6x'"),  # a comma list: each name checked on its own
        (["--regions", "us-east1"], "Did you mean 'us-east-1'"),
        (["--regions", "eu-west-3"], "no prices in region 'eu-west-3' (--regions). Regions with prices: us-east-1"),
    ],
)
def test_a_typo_in_allow_deny_or_regions_is_named_not_silently_ignored(capsys, flags, expected) -> None:
    line = _run(capsys, ["recommend", "--profile", str(PROFILE), "--steps", "10", *flags])
    assert expected in line


# --- issue #23 item 12: accepted silently before, each refused with the field, the value and the fix ----------------

EXAMPLE_PLAN = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"


@pytest.mark.parametrize(
    ("flags", "field", "shown", "fix"),
    [
        (["--key-name", "k;rm -rf /"], "--key-name", "'k;rm -rf /'", "key pair"),
        (["--ami", "ami-1$(id)", "--setup-command", "true"], "--ami", "'ami-1$(id)'", "ami-0123456789abcdef0"),
        (["--resume-from", "not-s3://x"], "--resume-from", "'not-s3://x'", "s3://bucket/"),
        (["--resume-from", "s3://Bad_Bucket/ckpt"], "--resume-from", "'s3://Bad_Bucket/ckpt'", "valid bucket name"),
        (["--resume-from", "s3://ckpts/a\nb"], "--resume-from", "'s3://ckpts/a\\nb'", "printable"),
        (["--root-volume-gb", "-5"], "--root-volume-gb", "-5", ">= 30 and <= 16384"),
        (["--root-volume-gb", "100000"], "--root-volume-gb", "100000", ">= 30 and <= 16384"),
        # a trial: both read "the plan is stale or was edited"
        (["--region", "us-east-9"], "--region", "'us-east-9'", "Regions with prices: "),
        (["--region", "us-west-2"], "--region", "'us-west-2'", "again with us-west-2 among its regions"),
    ],
)
def test_terraform_options_that_reach_the_instances(tmp_path, capsys, monkeypatch, flags, field, shown, fix) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('train')\n")
    line = _run(capsys, ["terraform", "--plan", str(EXAMPLE_PLAN), "--out", str(tmp_path / "infra"), *flags])
    assert field in line and shown in line and fix in line, line
    assert not (tmp_path / "infra").exists()


def _plan(tmp_path, change) -> str:
    return _changed(tmp_path, EXAMPLE_PLAN, change)


def test_a_plan_choosing_an_entry_it_does_not_have(tmp_path, capsys) -> None:
    plan = _plan(tmp_path, lambda d: d.update(chosen=99))
    line = _run(capsys, ["terraform", "--plan", plan, "--out", str(tmp_path / "infra")])
    assert "chosen" in line and "99" in line and "entries" in line


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("accumulate_grad_batches", 10**12, "groups[0].accumulate_grad_batches: expected a whole number from 1 to"),
        ("micro_batches", [10**9] * 32, "global_batch: the entry's batches make 32,000,000,000 samples per"),
        ("micro_batches", [0] * 32, "groups[0].micro_batches: expected whole numbers of samples from 1 to"),
    ],
)
def test_a_plan_whose_batches_no_dataset_holds(tmp_path, capsys, field, value, expected) -> None:
    """Issue #36 L7: accumulate_grad_batches 1e12 and micro_batches [1e9] were read, and the launch "finished" having
    trained nothing."""
    plan = _plan(tmp_path, lambda d: d["entries"][0]["groups"][0].update({field: value}))
    line = _run(capsys, ["terraform", "--plan", plan, "--out", str(tmp_path / "infra")])
    assert expected in line


def test_a_plan_layout_with_an_arbitrary_lightning_strategy(tmp_path, capsys) -> None:
    def change(d):
        d["entries"][0]["layout"] = {"name": "ddp", "strategy": "ddp", "lightning_strategy": "os.system('id')"}

    line = _run(capsys, ["terraform", "--plan", _plan(tmp_path, change), "--out", str(tmp_path / "infra")])
    assert "entries[0].layout.lightning_strategy" in line and "os.system" in line and "'ddp'" in line


def test_a_step_time_of_1e300(tmp_path, capsys) -> None:
    path = _profile(tmp_path, lambda d: d["timing"]["step_time_s"].update(p50=1e300))
    line = _run(capsys, ["predict", "--profile", path, "--fleet", "p3.2xlarge:1"])
    assert "timing.step_time_s.p50" in line and "1e+300" in line and "86400" in line


def test_a_step_time_of_1e_minus_300(tmp_path, capsys) -> None:
    """Issue #36 L7: a step time of 1e-300 s was accepted and every fleet predicted as instant."""
    path = _profile(tmp_path, lambda d: d["timing"]["step_time_s"].update(p50=1e-300))
    line = _run(capsys, ["predict", "--profile", path, "--fleet", "p3.2xlarge:1"])
    assert "timing.step_time_s.p50: expected a step time >= 1e-06 s (a microsecond), or 0 for a profile" in line
    assert "got 1e-300" in line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["launch", "--plan", "p.json", "--max-migrations", "-1"], "--max-migrations: expected a whole number >= 0"),
        (["launch", "--plan", "p.json", "--simulate-notice-after", "-5"], "--simulate-notice-after: expected a finite"),
        (["launch", "--plan", "p.json", "--heartbeat-s", "nan"], "--heartbeat-s: expected a finite number > 0"),
        (["launch", "--plan", "p.json", "--max-life-h", "inf"], "--max-life-h: expected a finite number > 0"),
        (["terraform", "--plan", "p.json", "--max-hourly", "0"], "--max-hourly: expected a finite number > 0"),
        (["catalog", "show", "--max-price", "-1"], "--max-price: expected a finite number >= 0, got '-1'"),
        (["serve", "--max-connections", "0"], "--max-connections: expected a number >= 1, got 0"),
        (["logs", "--interval", "0"], "--interval: expected a finite number > 0"),
    ],
)
def test_a_number_option_outside_its_meaning_is_refused(capsys, argv, expected) -> None:
    """Issue #36 L7: --max-migrations -1, --simulate-notice-after -5 and the like were accepted silently."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and expected in err, err


def test_catalog_show_of_a_region_without_prices_says_so(capsys) -> None:
    """Issue #36 L7: catalog show --region ../../x listed "0 of 73 instance types", as if none were offered."""
    line = _run(capsys, ["catalog", "show", "--region", "../../x"])
    assert "--region '../../x': the catalog has no prices there. Regions with prices: us-east-1" in line


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ("p3.2xlarge:\u0662", "Cannot read fleet group 'p3.2xlarge:\u0662'"),  # ARABIC-INDIC DIGIT TWO: int() read 2
        ("p3.2xlarge:\uff12", "Cannot read fleet group 'p3.2xlarge:\uff12'"),  # FULLWIDTH DIGIT TWO
        ("p3.2xlarge:100000000", "must be a whole number from 1 to 10,000. Got 100000000"),
    ],
    ids=["arabic-indic", "fullwidth", "absurd-count"],
)
def test_unicode_digits_and_absurd_counts_in_a_fleet(capsys, fleet, expected) -> None:
    line = _run(capsys, ["predict", "--profile", str(PROFILE), "--fleet", fleet, "--scaling", "weak"])
    assert expected in line


@pytest.mark.parametrize(
    "flags",
    [
        ["--steps", "\u0661\u0660"],
        ["--steps", "10", "--deadline", "\u0661\u0662h"],
        ["--steps", "10", "--budget", "\uff15"],
    ],
    ids=["steps", "deadline", "budget"],
)
def test_unicode_digits_in_a_number_option(capsys, flags) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["recommend", "--profile", str(PROFILE), *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[0].endswith(f"in ASCII digits 0-9, got {flags[-1]!r}"), err  # then where --help is


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "gpus:\n  - name: X1\n    memory_gb: 10\n    memory_gb: 20\n",
            "not valid YAML at line 4, column 5: the key 'memory_gb' is given twice (lines 3 and 4)",
        ),
        ("gpus:\n  - {name: X1, memory_gb: 10}\n  - {name: X1, memory_gb: 20}\n", "gpus[1].name: 'X1' is also gpus[0]"),
        (
            "instance_types:\n"
            "  - {name: i1, gpu: A100, gpus: 1, vcpus: 8, memory_gib: 64, network_gbps: 10}\n"
            "  - {name: i1, gpu: A100, gpus: 2, vcpus: 8, memory_gib: 64, network_gbps: 10}\n",
            "instance_types[1].name: 'i1' is also instance_types[0]",
        ),
        (
            "instance_types:\n  - {name: i1, gpu: A100, gpus: 1, vcpus: 8, memory_gib: 64, network_gbps: 0}\n",
            "network_gbps: must be more than 0, got 0",
        ),
        ("gpus:\n  - {name: X1, memory_gb: 1.0e+12}\n", "memory_gb: must be at most"),
        (
            "instance_types:\n  - {name: i1, gpu: A100, gpus: 1000000000, vcpus: 8, memory_gib: 64, network_gbps: 1}\n",
            "gpus: must be at most",
        ),
        ("gpus:\n  - {name: X1, memory_gb: 80, bf16_tflops: 0}\n", "bf16_tflops: must be more than 0"),
        ('gpus:\n  - {name: "\\uD800", memory_gb: 4}\n', "gpus[0].name holds a lone surrogate"),  # found by fuzzing
    ],
    ids=[
        "duplicate-key",
        "duplicate-gpu",
        "duplicate-instance",
        "network-0",
        "memory-1e12",
        "gpus-1e9",
        "tflops-0",
        "surrogate",
    ],
)
def test_catalog_yaml_duplicates_zeros_and_magnitudes(tmp_path, capsys, yaml_text: str, expected: str) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml_text)
    line = _run(capsys, ["--catalog-extra", str(extra), "catalog", "gpus"])
    assert expected in line and "extra.yaml" in line, line


# --- issue #23 item 9: each was a traceback or an unbounded wait ------------------------------------------------------


def test_rich_markup_in_a_model_name_is_printed_as_written(tmp_path, capsys) -> None:
    """ "[/oops]" in model.name was rich's MarkupError in three commands (and at the end of a profiled training)."""
    path = _profile(tmp_path, lambda d: d["model"].update(name="[bold red]x[/] [/oops]"))
    for argv in (
        ["profile", "show", path],
        ["predict", "--profile", path, "--fleet", "p3.2xlarge:1"],
        ["recommend", "--profile", path, "--steps", "100"],
    ):
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert "[bold red]x[/] [/oops]" in out, argv


def test_serve_refuses_a_port_or_an_observations_store_it_cannot_use(tmp_path, capsys) -> None:
    fifo, folder = tmp_path / "fifo", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    (tmp_path / "text.sqlite").write_text("not a database\n")
    assert "--port must be a TCP port from 0 to 65535. Got 99999." in _run(capsys, ["serve", "--port", "99999"])
    for store, kind in ((fifo, "is a FIFO"), (folder, "is a folder"), (tmp_path / "text.sqlite", "not a database")):
        line = _run(capsys, ["serve", "--port", "0", "--observations", str(store)])
        assert str(store) in line and kind in line and "--observations" in line


def test_serve_refuses_a_port_another_process_holds_and_a_short_token_where_it_came_from(tmp_path, capsys) -> None:
    """uvicorn's "[Errno 98] error while attempting to bind" (exit 3) and "The 'token' parameter of
    ServiceSettings()" were what a trial read: both are said in the command line's words, before anything starts."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = _run(capsys, ["serve", "--port", str(port)])
    assert f"cannot listen on 127.0.0.1 port {port}" in line and "another process listens there" in line
    token = tmp_path / "token"
    token.write_text("short\n")
    token.chmod(0o600)
    line = _run(capsys, ["serve", "--port", "0", "--token-file", str(token)])
    assert f"The token in --token-file {token} must be at least 32 bytes" in line and "ServiceSettings" not in line


def test_a_plan_group_with_throughput_0(tmp_path, capsys) -> None:
    """A ZeroDivisionError in the Auto Scaling weights."""
    plan = _plan(tmp_path, lambda d: d["entries"][0]["groups"][0].update(throughput_samples_s=0))
    line = _run(capsys, ["terraform", "--plan", plan, "--out", str(tmp_path / "infra")])
    assert "entries[0].groups[0].throughput_samples_s: expected a number > 0, got 0" in line


def _llama(**change) -> str:
    config = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
    return json.dumps({**config, "num_key_value_heads": 4, "vocab_size": 100, **change})


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["./rel/mymod.py:X"], "'./rel/mymod.py' is not a module name: give the dotted import path"),
        ([".mymod:X"], "e.g. mymod:X for ./mymod.py"),
        (["transformers:LlamaForCausalLM", "--seq-len", "8", "--config", "deep.json"], "nested 100,000 deep"),
        (
            ["transformers:LlamaForCausalLM", "--seq-len", "8", "--config", _llama(num_hidden_layers=100_000)],
            "is over 512",
        ),
        (
            ["transformers:LlamaForCausalLM", "--seq-len", str(10**11), "--config", _llama()],
            "--seq-len 100,000,000,000",
        ),
    ],
    ids=["file-path", "relative-import", "deep-config", "100000-layers", "seq-len-1e11"],
)
def test_capture_refuses_in_one_line_and_at_once(tmp_path, capsys, monkeypatch, argv, expected) -> None:
    """TypeError (a relative module), RecursionError (a 100,000-deep config), > 60 s (100,000 layers), and a profile
    of 10^11 tokens per sample: each one line, in seconds."""
    import time

    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deep.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    started = time.monotonic()
    line = _run(capsys, ["capture", *argv, "--batch-size", "1", "--out", str(tmp_path / "p.json")])
    assert expected in line and time.monotonic() - started < 30, line


def test_launch_without_aws_credentials(tmp_path, capsys, monkeypatch) -> None:
    """botocore's NoCredentialsError from the launcher's first S3 record read was a traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('train')\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    argv = ["launch", "--plan", str(EXAMPLE_PLAN), "--provisioner", "terraform", "--checkpoint-uri"]
    s3fs = pytest.importorskip("s3fs")
    try:
        assert main([*argv, "s3://srifty-no-such-bucket/run", "--", "train.py"]) == 2
    finally:  # fsspec keeps the credential-less S3 filesystem for later s3:// paths of this process otherwise
        s3fs.S3FileSystem.clear_instance_cache()
    err = capsys.readouterr().err  # after the snapshot's warnings on the example plan's environment
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("srifty: error: No AWS credentials found while srifty launch was keeping")


def test_terraform_out_as_the_code_folder_says_so(tmp_path, capsys, monkeypatch) -> None:
    """Issue #37 M3: `srifty terraform --out .` in the project blamed a tracked requirements.txt ("not among the code's
    files"): the module's folder is left out of the code it packs, which was all of it."""
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "requirements.txt").write_text("pyyaml\n")
    monkeypatch.chdir(tmp_path)
    argv = ["terraform", "--plan", str(EXAMPLE_PLAN), "--train-command", "train.py", "--any-model", "--out"]
    line = _run(capsys, [*argv, "."])
    assert f"--out . is the code folder {tmp_path.resolve()}: the root module gets a folder of its own" in line
    assert "e.g. --out infra" in line and "requirements" not in line
    line = _run(capsys, [*argv, str(tmp_path.parent)])
    assert f"holds the code folder {tmp_path.resolve()}" in line


def test_ctrl_c_ends_a_command_with_a_line_and_130_not_a_traceback(capsys, monkeypatch) -> None:
    """Issue #37 M5: Ctrl-C during `srifty apply` said "nothing is left billing", then printed a 19-line
    KeyboardInterrupt traceback and ended by signal 2. The command's own clean-up has run by then: one line, 130."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("lightning_srifty.provision.apply.apply", interrupted)
    code = main(["apply", "--dir", "infra", "--yes"])
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "srifty apply: interrupted (Ctrl-C)" and "Traceback" not in err


def test_a_whole_number_in_exponent_form_is_taken_and_a_fraction_is_not() -> None:
    """An audit: ``--steps 1e6`` was refused where ``--samples 5e6`` and the service's ``"steps": 1e6`` were taken."""
    import argparse

    from lightning_srifty.cli._common import whole

    assert (whole("1e6"), whole("250"), whole("2.0E3")) == (1_000_000, 250, 2000)
    for text in ("1.5", "1e-3", "inf", "nan", "1e400", "\u0662"):
        with pytest.raises(argparse.ArgumentTypeError):
            whole(text)
