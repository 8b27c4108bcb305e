"""The srifty command line: torch-free start, profile show, schema, and the demo (the main job)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _support import MINIMAL
from lightning_srifty.cli import build_parser, main
from predictor.documents.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]


def test_cli_and_predictor_start_without_torch(subprocess_env) -> None:
    code = (
        "import sys, lightning_srifty, lightning_srifty.cli as cli, lightning_srifty.console, "
        "predictor.documents.profile, predictor.catalog, predictor.model.stats; cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_profile_show_prints_the_summary(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(MINIMAL))
    assert main(["profile", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "V100-SXM2-16GB" in out and "310.00 ms" in out


def test_profile_show_prints_the_accumulation_an_optimizer_step_takes(tmp_path, capsys) -> None:
    """A profile of --batch-size 4 --global-batch 16 carries its training's batch in accumulate_grad_batches: the
    summary says so (it read "4/device" alone, a new user's trial)."""
    raw = copy.deepcopy(MINIMAL)
    raw["batch"] = {"per_device": 4, "all_devices": 4, "accumulate_grad_batches": 4}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    assert main(["profile", "show", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "4 batches accumulated: 16 samples an optimizer step" in out
    raw["batch"] = {"per_device": 4, "accumulate_grad_batches": 4}  # two ranks, all_devices not recorded
    raw["hardware"]["devices"] = 2
    path.write_text(json.dumps(raw))
    assert main(["profile", "show", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "8 all devices" in out and "4 batches accumulated: 32 samples an optimizer step" in out
    path.write_text(json.dumps(MINIMAL))
    assert main(["profile", "show", str(path)]) == 0
    assert "accumulated" not in capsys.readouterr().out


def test_profile_show_says_the_convolutions_layout(tmp_path, capsys) -> None:
    """channels_last is recorded per call and priced (cuDNN's layout conversions): the summary says which layout the
    convolutions ran in (a trial could not tell from it whether its channels_last was recorded)."""
    raw = copy.deepcopy(MINIMAL)
    shapes = {"shapes": [[8, 3, 32, 32], [16, 3, 3, 3]], "dtypes": ["float16", "float16"], "phase": "forward"}
    conv = {"op": "aten.convolution.default", "count": 3, "flops": 1e9, "bytes_read": 1e6, "bytes_written": 1e6,
            **shapes}  # fmt: skip
    relu = {"op": "aten.relu.default", "count": 3, "flops": 0, "bytes_read": 1e6, "bytes_written": 1e6, **shapes}
    raw["ops"] = {"device": "meta", "samples": 256, "precision": "16-mixed", "ops": [conv, relu]}
    path = tmp_path / "p.json"
    for params, words in (({"channels_last": [1]}, "convolutions: 3 calls, channels-last"),
                          ({}, "convolutions: 3 calls, NCHW")):  # fmt: skip
        conv["params"] = params
        path.write_text(json.dumps(raw))
        assert main(["profile", "show", str(path)]) == 0
        assert words in " ".join(capsys.readouterr().out.replace("│", " ").split())


def test_profile_show_gives_a_sharded_runs_collectives_not_an_all_reduce_of_none(tmp_path, capsys) -> None:
    """An FSDP run has no all-reduce: its all-gathers and reduce-scatters are the profile's; the summary said
    "All-reduce  not measured: None" (srifty demo --strategy srifty_fsdp)."""
    stats = {"p50": 0.0016, "mean": 0.002, "p90": 0.003, "p99": 0.004, "min": 0.001, "max": 0.005, "std": 0.001,
             "cv": 0.5, "count": 10}  # fmt: skip
    raw = copy.deepcopy(MINIMAL)
    raw["communication"] = {"backend": "gloo", "world_size": 2, "allgather_s": stats, "reduce_scatter_s": stats,
                            "allgather_bytes_per_step": 2 * 2**20, "reduce_scatter_bytes_per_step": 2**20}  # fmt: skip
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    assert main(["profile", "show", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "Collectives all-gather 2.0 MiB/step, 1.60 ms a step · reduce-scatter 1.0 MiB/step" in out, out
    assert "None" not in out and "All-reduce" not in out
    raw["communication"] = {"backend": "gloo", "world_size": 2}  # neither, and no reason given
    path.write_text(json.dumps(raw))
    assert main(["profile", "show", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "All-reduce not measured: no timing was recorded" in out and "None" not in out


def test_profile_show_json_is_the_validated_profile(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(MINIMAL))
    assert main(["profile", "show", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == MINIMAL


def test_bad_profile_exits_2_naming_the_field(tmp_path, capsys) -> None:
    bad = copy.deepcopy(MINIMAL)
    bad["batch"]["per_device"] = -3
    path = tmp_path / "p.json"
    path.write_text(json.dumps(bad))
    assert main(["profile", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("srifty: error: batch.per_device: expected a number >= 1, got -3.")


def test_schema_command_prints_the_json_schema(capsys) -> None:
    assert main(["schema", "profile"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "srifty.profile/v1" and "timing" in schema["required"]


def test_demo_trains_profiles_and_writes(tmp_path, capsys) -> None:
    out = tmp_path / "demo.json"
    code = main(
        [
            "demo",
            "--max-steps",
            "40",
            "--warmup-steps",
            "3",
            "--profile-steps",
            "25",
            "--output",
            str(out),
            "--no-progress",
            "--accelerator",
            "cpu",
        ]
    )
    assert code == 0
    profile = load_profile(out)
    assert profile.model.name == "DigitsCNN" and profile.batch.per_device == 64
    assert profile.timing.window.first_step == 3
    assert profile.model.flops.per_sample > 1e6
    assert profile.ops is not None and profile.ops.samples == 64
    assert any(o.op == "aten.convolution.default" and o.params for o in profile.ops.ops)
    assert profile.ops.total_flops == profile.model.flops.per_sample * 64
    printed = capsys.readouterr().out
    assert "Srifty profile: DigitsCNN" in printed and "ATen signatures" in printed
    # where everything went, and that GPU figures from a CPU profile are extrapolated
    assert f"plan written to {tmp_path / 'plan.json'}" in printed and (tmp_path / "plan.json").is_file()
    assert f"report written to {tmp_path / 'report.html'} (open it in a browser)" in printed
    assert "note: this profile ran on the CPU: every GPU figure above" in printed.replace("\n", " ")


def test_demo_language_model(tmp_path) -> None:
    out = tmp_path / "lm.json"
    assert (
        main(
            [
                "demo",
                "--model",
                "lm",
                "--max-steps",
                "12",
                "--warmup-steps",
                "2",
                "--profile-steps",
                "8",
                "--output",
                str(out),
                "--no-progress",
                "--accelerator",
                "cpu",
            ]
        )
        == 0
    )
    profile = load_profile(out)
    assert profile.model.name == "TinyLM" and profile.batch.per_device == 32
    assert profile.model.flops.forward_per_sample > 0
    assert {o.phase for o in profile.ops.ops} == {"forward", "backward", "optimizer"}


def test_bad_cli_numbers_are_refused(capsys) -> None:
    try:
        main(["demo", "--profile-steps", "0"])
    except SystemExit as exc:
        assert exc.code == 2
    assert "expected a number >= 1, got 0" in capsys.readouterr().err


def test_capture_writes_a_profile_with_the_operator_table(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    argv = ["capture", "capture_models:TinyLM", "--init-args", '{"dim": 16}', "--batch", "capture_models:make_batch"]
    # Lightning's short name: bf16 is bf16-mixed (the parser's hint offered bf16-true, another training: a trial)
    assert main([*argv, "--batch-size", "4", "--precision", "bf16", "--out", str(out)]) == 0
    assert "operator records" in capsys.readouterr().err
    profile = load_profile(out)
    assert profile.hardware.accelerator == "meta" and profile.hardware.gpu is None
    assert profile.timing.step_time_s.p50 == 0 and any("not measured" in n for n in profile.notes)
    assert profile.batch.per_device == 4 and profile.model.name == "TinyLM" and profile.model.precision == "bf16-mixed"
    assert (
        profile.model.optimizer == "AdamW" and profile.model.optimizer_state_bytes >= 2 * 4 * profile.model.parameters
    )
    ops = profile.ops
    assert ops.device == "meta" and ops.samples == 4 and ops.precision == "bf16-mixed"
    assert {o.phase for o in ops.ops} == {"forward", "backward", "optimizer"}
    assert any(o.op == "aten.addmm.default" and o.out_dtype == "bfloat16" for o in ops.ops)
    assert profile.model.flops.per_sample * 4 == ops.total_flops


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nowhere.pkg:Model"], "module 'nowhere.pkg' cannot be imported"),
        (["capture_models:TinyLN"], "Did you mean 'TinyLM'"),
        (["capture_models"], "expected an import path"),
        (["capture_models:NotAModule"], "not a LightningModule class"),
        (["capture_models:TinyLM", "--init-args", "[1]"], "expected a JSON object"),
        (["capture_models:TinyLM", "--init-args", '{"depth": 2}'], "could not be built"),
        (["capture_models:TinyLM", "--batch", "capture_models:broken_batch"], "no data here"),
        (["capture_models:TinyLM", "--batch", "capture_models:empty_batch"], "zero-size shape [4, 0]"),
        (["capture_models:TinyLM", "--batch", "capture_models:complex_batch"], "dtype torch.complex64"),
        (["capture_models:TinyLM", "--batch", "capture_models:huge_batch"], "TiB"),
    ],
)
def test_capture_bad_input_exits_2_naming_it(args, expected, tmp_path, capsys) -> None:
    argv = ["capture", *args, "--batch-size", "4", "--out", str(tmp_path / "p.json")]
    if "--batch" not in args:
        argv += ["--batch", "capture_models:make_batch"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("srifty: error: ") and expected in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


def test_the_demo_counts_its_epochs_instead_of_lightnings_minus_one() -> None:
    """The progress bar showed ``Epoch 11/-2``: the demo set only max_steps. Now max_epochs is what the steps take."""
    from lightning_srifty.demo.run import epochs_for

    assert epochs_for(270, 1527, 64, 1) == 12  # 23 full batches of 64 per epoch
    assert epochs_for(23, 1527, 64, 1) == 1 and epochs_for(24, 1527, 64, 1) == 2
    assert epochs_for(40, 1527, 64, 2) == 4  # 764 samples, 11 full batches per rank and epoch
    assert epochs_for(5, 10, 64, 4) == 5  # fewer samples than a batch: one step per epoch, never 0


def test_a_duration_without_a_unit_is_refused_naming_the_units(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["recommend", "--profile", "p.json", "--steps", "10", "--deadline", "90"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--deadline" in err and "'90' has no unit: write 90h (hours), 90m (minutes), 90d (days) or 90s" in err
    # the error and where the options are listed, not the usage of every option first (20 lines, a new user's walk)
    assert err.splitlines() == [
        "srifty recommend: error: argument --deadline: '90' has no unit: write 90h (hours), 90m (minutes), 90d (days) "
        "or 90s (seconds)",
        "  (srifty recommend --help lists every option)",
    ], err


def test_a_mistyped_subcommand_or_flag_gets_did_you_mean(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["recomend"])
    assert "did you mean 'recommend'?" in capsys.readouterr().err
    # the typo, not the required flag it hides, is what is said
    with pytest.raises(SystemExit):
        main(["recommend", "--profile", "p.json", "--stpes", "1000"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --stpes; --stpes: did you mean --steps?" in err and "is required" not in err
    with pytest.raises(SystemExit):
        main(["replay", "--plan", "p.json", "--trace", "t.json", "--polcy", "srifty"])
    assert "--polcy: did you mean --policy?" in capsys.readouterr().err


def test_ranking_errors_name_the_commands_flags(tmp_path, capsys) -> None:
    import dataclasses

    from lightning_srifty.cli.recommend import flag_of
    from predictor.ranking import Constraints
    from predictor.ranking.words import FLAGS, PYTHON, doc

    # every constraint has a flag of srifty recommend (the table cannot drift from the parser), and the ranking's
    # words for the command (predictor.ranking.words.FLAGS) are its flags
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["recommend"]
    flags = {o for a in sub._actions for o in a.option_strings}
    assert {flag_of(f.name) for f in dataclasses.fields(Constraints)} <= flags
    assert all(FLAGS.name(f.name) == flag_of(f.name) for f in dataclasses.fields(Constraints))
    said = [FLAGS.setting("deadline_h", 60.0), FLAGS.setting("market", "any"), FLAGS.setting("max_types", 2)]
    assert said == ["--deadline 60h", "--market any", "--max-types 2"]
    assert [PYTHON.setting("market", "any"), PYTHON.setting("regions", ("us-east-1",))] == [
        "market='any'",
        "regions=('us-east-1',)",
    ]
    assert [FLAGS.setting("regions", ("us-east-1", "us-west-2")), FLAGS.setting("allow_arm64", True)] == [
        "--regions us-east-1,us-west-2",
        "--allow-arm64",
    ]
    # a duration reads as the user writes it (srifty recommend --deadline 10m said "--deadline 0.166667h")
    assert FLAGS.setting("deadline_h", 1 / 6) == "--deadline 10m"
    assert FLAGS.setting("deadline_h", 36.5) == "--deadline 36.5h"
    assert FLAGS.setting("deadline_h", 12000.0) == "--deadline 12000h"  # not 1.2e+04h, which does not parse
    # never in exponent form, which the flags refuse; numpy numbers and enums as numbers and values (a review's finds)
    assert FLAGS.setting("deadline_h", 1e6) == "--deadline 1000000h"
    assert FLAGS.setting("budget_usd", 1234567.0) == "--budget 1234567"
    assert [FLAGS.setting("budget_usd", None), FLAGS.setting("allow_arm64", False)] == [
        "no --budget",
        "no --allow-arm64",
    ]
    import numpy as np

    from predictor.ranking.constraints import Market

    assert PYTHON.setting("max_instances", np.int64(16)) == "max_instances=16"
    assert PYTHON.setting("confidence", np.float32(0.95)) == "confidence=0.95"
    assert (
        PYTHON.setting("market", Market.ANY) == "market='any'" and FLAGS.setting("market", Market.ANY) == "--market any"
    )
    assert (
        doc("epochs", FLAGS) == "epochs (with --steps-per-epoch)"
        and doc("epochs", PYTHON) == "epochs (with steps_per_epoch)"
    )
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(MINIMAL))
    args = ["recommend", "--profile", str(profile), "--steps", "2000000", "--market", "spot", "--allow", "p3.2xlarge",
            "--max-instances", "1", "--deadline", "60h"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--deadline 60h binds" in err and "(--max-instances)" in err and "deadline_h" not in err


def test_profile_show_says_a_captured_profiles_step_was_not_measured(tmp_path, capsys) -> None:
    """A capture's step time is 0 (nothing ran): the summary says "not measured", not "0 us" (a new user's trial)."""
    raw = copy.deepcopy(MINIMAL)
    raw["timing"] = {"step_time_s": {"p50": 0.0}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    assert main(["profile", "show", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "Step time not measured (0: a captured profile)" in out and "0 µs" not in out


def test_a_negative_value_is_refused_by_its_own_check(capsys) -> None:
    """A new user's --deadline -3h got argparse's "expected one argument" (a value with a dash read as an option); the
    value's own check says what is wrong. The script's arguments after -- are left alone."""
    from lightning_srifty.cli import _negative_values_joined, build_parser

    with pytest.raises(SystemExit):
        main(["recommend", "--profile", "p.json", "--steps", "100", "--deadline", "-3h"])
    assert "expected a positive duration like 12h, 90m or 2d, got '-3h'" in capsys.readouterr().err
    parser = build_parser()
    argv = ["launch", "--plan", "p.json", "--", "python", "train.py", "--lr", "-3e-4"]
    assert _negative_values_joined(argv, parser) == argv
    # the script's own words without -- (a review: --shift -5m became --shift=-5m), even one named like ours
    argv = ["launch", "--plan", "p.json", "train.py", "--shift", "-5m", "--choice", "-1"]
    assert _negative_values_joined(argv, parser) == argv
    joined = _negative_values_joined(["recommend", "--budget", "-5", "--steps", "10"], parser)
    assert joined == ["recommend", "--budget=-5", "--steps", "10"]
    assert _negative_values_joined(["recommend", "--launchable", "-5"], parser)[1:] == ["--launchable", "-5"]


def test_launch_names_its_move_log_only_when_a_move_wrote_it(tmp_path) -> None:
    """A trial was sent to "log: wd1/migrations.jsonl" after a launch with no move, a file never written."""
    from lightning_srifty.cli.launch import _move_log

    assert _move_log(str(tmp_path)) == ""
    (tmp_path / "migrations.jsonl").write_text("{}\n")
    assert _move_log(str(tmp_path)) == f"; log: {tmp_path / 'migrations.jsonl'}"


def test_a_run_token_longer_than_the_service_takes_is_refused_in_days(monkeypatch, capsys) -> None:
    """A trial's `srifty run-token --days 400` got the service's "less than or equal to 31536000; got 34560000"."""
    from predictor.service.client import TOKEN_ENV

    monkeypatch.setenv(TOKEN_ENV, "s" * 48)  # the service's own token (not a run token)
    assert main(["run-token", "--service", "http://127.0.0.1:9", "--days", "400"]) == 2
    err = capsys.readouterr().err
    assert "--days 400 is longer than the 365 days a run token is accepted at most: give --days 365 or fewer" in err


def test_predicts_way_out_of_a_fleet_that_cannot_hold_the_model_is_a_layout_not_yet_asked_for() -> None:
    """A trial asked for --layout fsdp:full_shard and was told to use --layout fsdp:full_shard; on one GPU sharding
    divides nothing. And a 13B model's throughput read "4 samples/s (4-4)": three significant digits."""
    from lightning_srifty.cli.predict import _layouts_left, _rate

    assert "--layout fsdp:full_shard, +ac" in _layouts_left("ddp", 8)
    assert _layouts_left("fsdp:full_shard", 8) == ", or checkpoint activations (--layout fsdp:full_shard+ac)"
    assert "--layout fsdp:full_shard+ac" in _layouts_left("fsdp:hybrid_shard+ac", 16)
    assert "this layout holds the least" in _layouts_left("fsdp:full_shard+ac", 8)
    assert (
        _layouts_left("ddp", 1) == ", or checkpoint activations (--layout ddp+ac)" and _layouts_left("ddp+ac", 1) == ""
    )
    assert (_rate(4.2), _rate(0.512), _rate(1234.5)) == ("4.2", "0.512", "1,234")
    from lightning_srifty.cli.predict import _collectives

    assert _collectives("fsdp:full_shard+ac") == "all-gather + reduce-scatter" and _collectives("ddp") == "all-reduce"


@pytest.mark.skipif(not hasattr(__import__("fcntl") if sys.platform != "win32" else None, "F_SETPIPE_SZ"),
                    reason="sets a pipe's depth with Linux's F_SETPIPE_SZ")  # fmt: skip
def test_output_piped_into_a_reader_that_leaves_ends_quietly_as_sigpipe_ends_a_tool(subprocess_env) -> None:
    """A trial: ``srifty recommend ... | head -1`` printed "srifty: error: Broken pipe" (exit 2) once the plan's
    table outgrew the pipe's buffer. The reader leaving is not an error of ours: nothing on stderr, and the exit
    status a tool SIGPIPE ends has (141: ``set -o pipefail`` still sees it). A BrokenPipeError that is not our
    stdout's is still an error (the second half)."""
    profile = str(ROOT / "examples" / "profiles" / "resnet50-v100.json")
    srifty = [sys.executable, "-m", "lightning_srifty.cli", "recommend", "--profile", profile, "--steps", "100000"]
    # The pipe is made a page deep before the tool starts: the table (about 48 KB) cannot all fit in it, so the
    # tool is still writing when the reader leaves, however slowly the reader is scheduled. With Linux's default
    # 64 KiB pipe the whole table could land before the reader closed, and the tool rightly exited 0.
    import fcntl

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    with subprocess.Popen([*srifty, "--top", "200", "--wide"], stdout=write_end, stderr=subprocess.PIPE,
                          env=subprocess_env) as proc:  # fmt: skip
        os.close(write_end)
        assert proc.stderr is not None
        first = b""
        while b"\n" not in first:  # as head -1 does: read until its line, then leave
            chunk = os.read(read_end, 4096)
            assert chunk, "the tool printed nothing"
            first += chunk
        os.close(read_end)
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141 and err == "", err


def test_a_broken_pipe_that_is_not_stdouts_is_still_an_error(monkeypatch, capsys) -> None:
    import lightning_srifty.cli as cli

    parser = cli.build_parser()
    args = parser.parse_args(["schema", "plan"])

    def broken(_):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(args, "func", broken, raising=False)
    monkeypatch.setattr(parser, "parse_known_args", lambda argv: (args, []))
    assert main(["schema", "plan"]) == 2  # stdout is pytest's capture, whose reader is here
    assert capsys.readouterr().err == "srifty: error: Broken pipe\n"
