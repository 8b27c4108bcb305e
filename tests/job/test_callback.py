"""SriftyCallback on real (small, CPU) Lightning runs."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from helpers import DictDataset, DictModel, TinyModel, TwoOptimizerModel, loader, trainer
from imds_server import FakeIMDS
from lightning_srifty import Constraints, ServiceClient, SriftyCallback
from lightning_srifty.profiling.model_info import parameter_counts
from predictor.documents.plan import load_plan
from predictor.documents.profile import PHASES, load_profile
from predictor.exceptions import ConfigError


def fit(
    callback: SriftyCallback, max_steps: int, model: pl.LightningModule | None = None, val=None, **kwargs
) -> pl.Trainer:
    t = trainer([callback], max_steps=max_steps, **kwargs)
    t.fit(model or TinyModel(), train_dataloaders=loader(), val_dataloaders=val)
    return t


def test_profile_of_a_real_run(tmp_path) -> None:
    out = tmp_path / "profile.json"
    model = TinyModel()
    cb = SriftyCallback(recommend=False, warmup_steps=5, profile_steps=30, output=out, verbose=False)
    fit(cb, max_steps=45, model=model)
    profile = load_profile(out)
    assert profile == cb.profile
    window = profile.timing.window
    assert (window.first_step, window.steps, window.requested_steps, window.truncated) == (5, 30, 30, False)
    assert window.clock == "perf_counter"
    assert profile.timing.step_time_s.count == 30
    assert len(profile.timing.series_s) == 30
    # phases add up to the step, step by step, so their means add up to the mean step
    phase_mean = sum(profile.timing.phases_s[p].mean for p in PHASES)
    assert phase_mean == pytest.approx(profile.timing.step_time_s.mean, rel=1e-9)
    assert sum(profile.timing.phase_share.values()) == pytest.approx(1.0)
    assert profile.batch.per_device == 8 and profile.batch.all_devices == 8
    assert profile.batch.loader_workers == 0  # the loader's processes: what more vCPUs can speed (a review)
    assert profile.timing.samples_per_s.p50 > 0
    assert profile.model.parameters == parameter_counts(model)[0] == 16 * 32 + 32 + 32 + 1
    assert profile.model.gradient_bytes == profile.model.parameters * 4
    assert profile.model.optimizer == "SGD"
    assert profile.model.optimizer_state_bytes == profile.model.parameters * 4  # one momentum buffer
    # Linear(16->32) and Linear(32->1): 2*(16*32 + 32*1) FLOPs forward per sample; backward twice that but the
    # first layer's input gradient is not needed
    assert profile.model.flops.forward_per_sample == pytest.approx(2 * (16 * 32 + 32))
    assert profile.model.flops.backward_per_sample == pytest.approx(2 * (16 * 32) + 4 * 32)
    assert profile.hardware.accelerator == "cpu" and profile.hardware.world_size == 1
    assert profile.hardware.gpu is None and profile.hardware.instance_type is None
    assert profile.memory.peak_rss_bytes > 10 * 2**20
    assert "single process" in profile.communication.reason
    assert profile.software.torch and profile.software.lightning
    assert not profile.notes


def test_it_detaches_after_the_window(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=10, output=tmp_path / "p.json", verbose=False)
    fit(cb, max_steps=40)
    assert cb._window.recorder.steps == 10, "no step may be recorded after the window"
    assert cb.profiled


def test_stop_after_profile(tmp_path) -> None:
    cb = SriftyCallback(
        warmup_steps=3, profile_steps=7, output=tmp_path / "p.json", stop_after_profile=True, verbose=False
    )
    t = fit(cb, max_steps=1000)
    assert t.global_step == 10
    assert load_profile(tmp_path / "p.json").timing.window.steps == 7


def test_window_longer_than_the_run_profiles_what_ran(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=4, profile_steps=200, output=tmp_path / "p.json", verbose=False)
    fit(cb, max_steps=30)
    profile = load_profile(tmp_path / "p.json")
    assert profile.timing.window.truncated
    assert profile.timing.window.steps == 26
    assert any("26 of 200 requested steps ran" in n for n in profile.notes)


def test_run_ending_during_warmup_profiles_the_warmup(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=20, profile_steps=50, output=tmp_path / "p.json", verbose=False)
    fit(cb, max_steps=8)
    profile = load_profile(tmp_path / "p.json")
    assert profile.timing.window.truncated
    assert profile.timing.window.steps == 7  # steps 1..7: step 0 only anchors the timing
    assert any("ended during warm-up" in n for n in profile.notes)


def test_too_short_a_run_writes_nothing_and_says_why(tmp_path, caplog) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=5, profile_steps=10, output=tmp_path / "p.json", verbose=False)
    with caplog.at_level(logging.ERROR, logger="lightning_srifty"):
        fit(cb, max_steps=1)
    assert not (tmp_path / "p.json").exists()
    assert cb.profile is None
    assert "no profile written: 1 training step(s) ran" in caplog.text


def test_unwritable_output_never_stops_training(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=blocker / "p.json", verbose=False)
    with caplog.at_level(logging.ERROR, logger="lightning_srifty"):
        t = fit(cb, max_steps=12)
    assert t.global_step == 12
    assert "cannot write the profile" in caplog.text and "output=" in caplog.text
    assert cb.profile is not None and cb.profile.timing.window.steps == 5


class CountValidations(pl.Callback):
    def __init__(self) -> None:
        self.runs = 0

    def on_validation_start(self, trainer, pl_module) -> None:
        self.runs += not trainer.sanity_checking


def test_validation_as_a_share_of_an_epoch_is_counted_in_the_planned_epoch(tmp_path) -> None:
    """A trial: ``val_check_interval=0.5`` on a profiling run of 128 batches an epoch was recorded as "every 64
    batches", and 3 epochs of 250,000 batches were said to validate 11,718 times, not 6. The profile keeps the share
    and the epoch's length; the plan counts in the planned epoch (``steps_per_epoch``), else in one as long as the
    profiled run's, and says so. The count is Lightning's own: a real run of 3 epochs of 64 batches, validating at
    each 0.3 of every second epoch, validates as many times as the rule says."""
    from predictor.ranking import Constraints, rank
    from predictor.ranking.validation import epoch_validations

    counted = CountValidations()
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=10, output=tmp_path / "p.json", verbose=False)
    cadence = dict(limit_val_batches=1, val_check_interval=0.3, check_val_every_n_epoch=2, num_sanity_val_steps=1)
    fit(cb, max_steps=3 * 64, val=loader(16), **cadence)  # the window ends in the first epoch, before validating
    t = trainer([counted], max_steps=3 * 64, **cadence)
    t.fit(TinyModel(), train_dataloaders=loader(), val_dataloaders=loader(16))
    v = load_profile(tmp_path / "p.json").validation
    assert (v.every_epoch_fraction, v.epoch_batches, v.every_batches, v.every_epochs, v.every_s) == (
        0.3,
        64,
        19,
        2,
        None,
    )
    assert counted.runs == epoch_validations(3 * 64, 64, 19, 2) == 3  # the second epoch's batches 19, 38 and 57

    def said(**work) -> str:
        plan = rank(load_profile(tmp_path / "p.json"), Constraints(allow=("g5.xlarge",), **work))
        (note,) = [n for n in plan.notes if n.startswith("the profiled run validates")]
        return note

    # 4 epochs of 1,000 batches: every 300th batch of the second and the fourth, 3 each
    assert said(epochs=4, steps_per_epoch=1000).startswith(
        "the profiled run validates every 0.3 of an epoch (each 300 of the planned epoch's 1,000 training batches): 6 "
    )
    # the work in steps: epochs as long as the profiled run's (1,000 batches: 15 epochs and 40 batches; the 16th
    # validates twice in its 40)
    note = said(steps=1000)
    assert "(each 19 of the 64 training batches of an epoch as long as the profiled run's; for another length give " \
        "the work as epochs with steps_per_epoch): 23 validation(s)" in note, note  # fmt: skip
    assert epoch_validations(1000, 64, 19, 2) == 7 * 3 + 2


def test_a_time_based_validation_is_said_without_a_count(tmp_path) -> None:
    import datetime as dt

    from predictor.ranking import Constraints, rank

    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False)
    every = dt.timedelta(minutes=30)  # the sanity check sets the validation loop up: no validation in the run
    fit(cb, max_steps=12, limit_val_batches=1, val_check_interval=every, num_sanity_val_steps=1, val=loader(16))
    v = load_profile(tmp_path / "p.json").validation
    assert (v.every_s, v.every_epoch_fraction, v.every_batches) == (1800.0, None, None)
    plan = rank(load_profile(tmp_path / "p.json"), Constraints(steps=1000, allow=("g5.xlarge",)))
    (note,) = [n for n in plan.notes if n.startswith("the profiled run validates")]
    assert note.startswith("the profiled run validates every 1,800 s of training (how many times follows each fleet")
    assert "validation(s) in the planned work" not in note


def test_a_short_run_never_replaces_a_complete_profile(tmp_path, caplog) -> None:
    """A trial: a one-step smoke run (two micro-batches) replaced a 40-step profile with one cut short in its warm-up,
    which srifty recommend refused. A truncated profile goes beside a complete one; it replaces a truncated one."""
    out = tmp_path / "p.json"
    fit(SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=out, verbose=False), max_steps=10)
    complete = out.read_text()
    assert json.loads(complete)["timing"]["window"]["truncated"] is False
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"):
        fit(SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=out, verbose=False), max_steps=4)
    beside = tmp_path / "p.truncated.json"
    assert out.read_text() == complete and json.loads(beside.read_text())["timing"]["window"]["truncated"] is True
    assert f"{out} holds a complete profile, which is kept: this one is written to {beside}" in caplog.text
    out.write_text(beside.read_text())  # a truncated one is replaced
    fit(SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=out, verbose=False), max_steps=3)
    assert json.loads(out.read_text())["timing"]["window"]["steps"] == 1


def test_validation_inside_the_window_is_excluded(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=20, output=tmp_path / "p.json", verbose=False)
    fit(cb, max_steps=30, limit_val_batches=2, val_check_interval=5, check_val_every_n_epoch=None, val=loader(32))
    profile = load_profile(tmp_path / "p.json")
    window = profile.timing.window
    assert window.excluded_steps["validation"] == 4  # validation after steps 5, 10, 15, 20 (window: steps 2-21)
    assert window.steps == 16
    # issue #37 L: the plan said nothing of validation though the run validated every N steps
    v = profile.validation
    assert (v.every_batches, v.batches) == (5, 2) and v.batch_s.count >= 8 and v.batch_s.p50 > 0
    from predictor.ranking import Constraints, rank

    plan = rank(profile, Constraints(steps=1000, allow=("g5.xlarge",)))
    (note,) = [n for n in plan.notes if n.startswith("the profiled run validates")]
    assert note.startswith("the profiled run validates every 5 training batches: 200 validation(s) in the planned")
    assert "validation is not in them" in note


def test_batch_size_fn_for_batches_without_a_leading_tensor(tmp_path) -> None:
    data = DataLoader(
        DictDataset(),
        batch_size=4,
        collate_fn=lambda items: {
            "meta": [i["meta"] for i in items],
            "x": __import__("torch").stack([i["x"] for i in items]),
            "y": __import__("torch").stack([i["y"] for i in items]),
        },
    )
    cb = SriftyCallback(
        warmup_steps=2,
        profile_steps=5,
        output=tmp_path / "p.json",
        verbose=False,
        batch_size_fn=lambda b: len(b["meta"]),
    )
    t = trainer([cb], max_steps=10)
    t.fit(DictModel(), train_dataloaders=data)
    profile = load_profile(tmp_path / "p.json")
    assert profile.batch.per_device == 4 and profile.batch.source == "batch_size_fn"


def test_resumed_run_does_not_profile_again(tmp_path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    first = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False)
    t = trainer(
        [first, pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, save_last=True)], max_steps=10, enable_checkpointing=True
    )
    t.fit(TinyModel(), train_dataloaders=loader())
    assert first.profiled
    (tmp_path / "p.json").unlink()

    again = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False)
    t2 = trainer([again], max_steps=20)
    t2.fit(TinyModel(), train_dataloaders=loader(), ckpt_path=ckpt_dir / "last.ckpt")
    assert again.profiled and again.profile is None
    assert not (tmp_path / "p.json").exists()

    forced = SriftyCallback(
        recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False, reprofile=True
    )
    t3 = trainer([forced], max_steps=20)
    t3.fit(TinyModel(), train_dataloaders=loader(), ckpt_path=ckpt_dir / "last.ckpt")
    assert load_profile(tmp_path / "p.json").timing.window.steps == 5


def test_a_resumed_launch_does_not_profile_again(tmp_path, monkeypatch) -> None:
    """Issue #37 M4: under srifty launch the profile goes to srifty/launch-<launch id>/, and the callback's state was
    kept under that path: a resumed launch (a new id) found no state and profiled the run again."""
    monkeypatch.chdir(tmp_path)
    ckpt_dir = tmp_path / "ckpt"
    for name in [v for v in os.environ if v.startswith("SRIFTY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(tmp_path / "launch"))
    monkeypatch.setenv("SRIFTY_LAUNCH_ID", "first")
    first = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, verbose=False)
    assert str(first.output) == "srifty/launch-first/profile.json"
    t = trainer(
        [first, pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, save_last=True)], max_steps=10, enable_checkpointing=True
    )
    t.fit(TinyModel(), train_dataloaders=loader())
    assert first.profiled
    monkeypatch.setenv("SRIFTY_LAUNCH_ID", "second")  # srifty launch --resume: a new launch
    again = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, verbose=False)
    t2 = trainer([again], max_steps=20)
    t2.fit(TinyModel(), train_dataloaders=loader(), ckpt_path=ckpt_dir / "last.ckpt")
    assert again.profiled and again.profile is None
    assert not (tmp_path / "srifty" / "launch-second" / "profile.json").exists()


def test_instance_metadata_from_imdsv2(tmp_path, monkeypatch) -> None:
    meta = {
        "meta-data/instance-type": "g5.xlarge",
        "meta-data/placement/availability-zone": "us-east-1b",
        "meta-data/instance-life-cycle": "spot",
    }
    with FakeIMDS(meta) as imds:
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False)
        fit(cb, max_steps=10)
    hw = load_profile(tmp_path / "p.json").hardware
    assert (hw.instance_type, hw.availability_zone, hw.lifecycle) == ("g5.xlarge", "us-east-1b", "spot")
    assert ("PUT", "/latest/api/token") in imds.requests


def test_a_local_launchs_profile_does_not_claim_the_plans_instance(tmp_path, monkeypatch) -> None:
    """Issue #37 L: a local launch's stand-in metadata service named the plan's instance type, and the profile of a
    run on this machine said g4dn.xlarge. It answers a spot life cycle (for the notice) and no type."""
    from lightning_srifty.provision.aws import LocalIMDS
    from lightning_srifty.provision.launcher.local import SIMULATED_METADATA

    with LocalIMDS(dict(SIMULATED_METADATA)) as imds:
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False)
        fit(cb, max_steps=10)
    hw = load_profile(tmp_path / "p.json").hardware
    assert hw.instance_type is None and hw.lifecycle == "spot"


def test_summary_is_printed(tmp_path, capsys) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json")
    fit(cb, max_steps=8)
    out = capsys.readouterr().out
    for words in (
        "Srifty profile: TinyModel",
        "Step time",
        "Throughput",
        "Phases",
        "FLOPs/sample",
        "Peak memory",
        "profile written to",
    ):
        assert words in out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warmup_steps": 0}, "The 'warmup_steps' parameter of SriftyCallback() must be an int >= 1. Got 0."),
        ({"profile_steps": -5}, "The 'profile_steps' parameter of SriftyCallback() must be an int >= 1. Got -5."),
        ({"profile_steps": "200"}, "must be an int >= 1. Got '200'."),
        ({"profile_steps": True}, "must be an int >= 1. Got True."),
        ({"output": 42}, "The 'output' parameter of SriftyCallback() must be a path or None. Got 42."),
        ({"batch_size_fn": 3}, "must be callable"),
        ({"constraints": "cheap"}, "The 'constraints' parameter of SriftyCallback() must be a"),
        ({"service": "localhost:8000"}, "The 'service' parameter of SriftyCallback() must be an http(s) URL"),
        ({"budget": 500}, "SriftyCallback() has no parameter 'budget'. Did you mean 'budget_usd'?"),
    ],
)
def test_bad_parameters_are_refused_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        SriftyCallback(**kwargs)
    assert message in str(info.value)
    assert info.value.parameter == next(iter(kwargs))


@pytest.mark.parametrize(
    ("constraints", "parameter", "message"),
    [
        (Constraints(objective="cost", deadline_h=-1), "deadline_h", "must be a number > 0"),
        ({"market": "spto"}, "market", "Did you mean 'spot'"),
        ({"objectiv": "time"}, None, "objectiv"),
    ],
)
def test_bad_constraints_fail_at_construction_not_after_the_window(constraints, parameter, message) -> None:
    with pytest.raises(ConfigError) as info:
        SriftyCallback(constraints=constraints)
    assert message in str(info.value)
    if parameter:
        assert info.value.parameter == parameter


def test_the_0_1_recommendation_arguments_still_work_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="constraints=Constraints"):
        cb = SriftyCallback(total_steps=1000, deadline_h=12, market="spot", predictor_url="http://127.0.0.1:9")
    assert cb.constraints == Constraints(steps=1000, deadline_h=12, market="spot")
    assert cb.service.url == "http://127.0.0.1:9"
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="must be an http"):
        SriftyCallback(predictor_url="localhost:8000")


def test_profile_file_is_plain_json(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False)
    fit(cb, max_steps=8)
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["schema"] == "srifty.profile/v1"
    assert "null" not in (tmp_path / "p.json").read_text()


def test_recommendation_after_profiling(tmp_path, capsys) -> None:
    cb = SriftyCallback(warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", constraints={"deadline_h": 48})
    fit(cb, max_steps=10)
    plan = load_plan(tmp_path / "plan.json")
    assert plan == cb.plan and plan.constraints.deadline_h == 48
    assert plan.constraints.work_samples == 10 * 8  # max_steps x the profiled global batch
    assert (tmp_path / "report.html").exists() and (tmp_path / "report.png").exists()
    out = capsys.readouterr().out
    assert "Fleets for TinyModel" in out
    # a user's own run says what the demo says: where everything went, and that CPU timings were extrapolated
    assert f"plan written to {tmp_path / 'plan.json'}" in out
    assert f"report written to {tmp_path / 'report.html'} (open it in a browser)" in out
    assert "note: this profile ran on the CPU" in out
    assert " ".join(out.replace("│", " ").split()).count("profile written to") == 1  # said once (a trial read it twice)


def test_lightnings_default_length_is_named_when_it_is_the_work() -> None:
    from types import SimpleNamespace

    from lightning_srifty.profiling.callback import lightning_default_length

    assert lightning_default_length(SimpleNamespace(max_epochs=1000, max_steps=-1))
    assert not lightning_default_length(SimpleNamespace(max_epochs=1000, max_steps=500))
    assert not lightning_default_length(SimpleNamespace(max_epochs=3, max_steps=-1))


def test_a_run_shorter_than_the_warm_up_is_told_why_it_has_no_operator_table(tmp_path, caplog) -> None:
    """Issue #37 L: a run that ended during warm-up got "no operator table" with no reason, and the prediction's
    fix was to keep capture_ops=True and count_flops=True, already the defaults."""
    cb = SriftyCallback(warmup_steps=6, profile_steps=5, output=tmp_path / "p.json", verbose=False)
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"), pytest.warns(UserWarning) as warned:
        fit(cb, max_steps=4)
    notes = " ".join(cb.profile.notes)
    assert "no operator table: the run ended during warm-up (4 steps), before step 6" in notes, notes
    said = caplog.text + " ".join(str(w.message) for w in warned)
    assert "never reached the step they are captured on" in said and "keep SriftyCallback(capture_ops" not in said


def test_recommendation_failure_never_stops_training(tmp_path, caplog) -> None:
    cb = SriftyCallback(
        warmup_steps=2,
        profile_steps=5,
        output=tmp_path / "p.json",
        count_flops=False,
        capture_ops=False,
        verbose=False,
    )
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"), pytest.warns(UserWarning) as warned:
        t = fit(cb, max_steps=10)
    assert t.global_step == 10 and cb.profile is not None and cb.plan is None
    said = caplog.text + " ".join(str(w.message) for w in warned)  # rank-zero warnings go through warnings
    assert "no fleet recommendation" in said and "neither an operator table nor FLOPs" in said
    assert not (tmp_path / "plan.json").exists()


CB_TOKEN = "cb-token-" + "y" * 30  # the service wants at least 32 bytes


def test_recommendation_through_the_service_posts_an_observation(tmp_path, monkeypatch, catalog) -> None:
    """On 'EC2' (a local IMDS says g5.xlarge), with a service: the plan comes from `srifty serve` and the run's
    measured throughput lands in the service's observations as g5.xlarge:1."""
    from predictor.service.app import ServiceSettings, background_server, create_app
    from predictor.service.observations import ObservationStore

    store = ObservationStore(tmp_path / "obs.sqlite")
    meta = {"meta-data/instance-type": "g5.xlarge", "meta-data/placement/availability-zone": "us-east-1b"}
    app = create_app(catalog=catalog, observations=store, settings=ServiceSettings(token=CB_TOKEN))
    with FakeIMDS(meta) as imds, background_server(app) as url:
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
        cb = SriftyCallback(
            warmup_steps=2,
            profile_steps=5,
            output=tmp_path / "p.json",
            verbose=False,
            service=ServiceClient(url, token=CB_TOKEN),  # writes need the service's token
            constraints=Constraints(market="spot:0.5"),
        )
        fit(cb, max_steps=10)
    plan = load_plan(tmp_path / "plan.json")
    assert plan == cb.plan and plan.constraints.market == "mixed" and plan.constraints.spot_share == 0.5
    (obs,) = store.list()
    profile = load_profile(tmp_path / "p.json")
    assert obs.fleet == "g5.xlarge:1" and obs.model == "TinyModel"
    assert obs.run_id and obs.run_id.startswith("r-")  # the client had the service issue this process a run
    assert obs.throughput_samples_s == pytest.approx(profile.timing.samples_per_s.p50)


def test_unreachable_service_never_stops_training(tmp_path, caplog) -> None:
    cb = SriftyCallback(
        warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False, service="http://127.0.0.1:9"
    )
    with caplog.at_level(logging.WARNING, logger="lightning_srifty"), pytest.warns(UserWarning) as warned:
        t = fit(cb, max_steps=10)
    assert t.global_step == 10 and cb.plan is None
    said = caplog.text + " ".join(str(w.message) for w in warned)
    assert "Cannot reach the predictor at http://127.0.0.1:9" in said


def test_checkpoint_cost_is_measured_and_used_by_the_ranking(tmp_path) -> None:
    cb = SriftyCallback(
        warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False, constraints={"steps": 1000}
    )
    fit(cb, max_steps=10)
    ckpt = load_profile(tmp_path / "p.json").checkpoint
    assert ckpt is not None and ckpt.save_s > 0 and ckpt.load_s > 0 and ckpt.where == "local disk"
    assert ckpt.bytes > sum(p.numel() * 4 for p in TinyModel().parameters())  # weights + optimizer state + more
    assert not list(tmp_path.glob("*.ckpt"))  # measured in a temporary folder, removed
    assert any("checkpoint (measured by the profile" in n for n in cb.plan.notes)
    off = SriftyCallback(
        warmup_steps=2,
        profile_steps=5,
        output=tmp_path / "q.json",
        verbose=False,
        recommend=False,
        measure_checkpoint=False,
    )
    fit(off, max_steps=10)
    assert load_profile(tmp_path / "q.json").checkpoint is None


def test_the_checkpoint_measurement_never_fills_the_disk_or_the_host_memory(tmp_path, monkeypatch) -> None:
    from lightning_srifty.profiling import checkpoint_cost
    from lightning_srifty.profiling.checkpoint_cost import checkpoint_budget

    gib = 2**30
    assert checkpoint_budget(84 * gib, 1000 * gib, 16 * gib)["load"] is False  # 7B + Adam on a 16 GiB host
    assert "TMPDIR" in checkpoint_budget(84 * gib, 100 * gib, 512 * gib)["skip"]
    assert checkpoint_budget(1 * gib, 100 * gib, None) == {"skip": None, "load": True}
    # a real run on a host said to have 1 KiB available: the save is measured, the read-back is skipped and said
    monkeypatch.setattr(checkpoint_cost, "available_memory_bytes", lambda: 1024)
    cb = SriftyCallback(warmup_steps=2, profile_steps=5, output=tmp_path / "p.json", verbose=False, recommend=False)
    fit(cb, max_steps=10)
    profile = load_profile(tmp_path / "p.json")
    assert profile.checkpoint.save_s > 0 and profile.checkpoint.load_s is None
    assert any("read-back not measured" in n for n in profile.notes)


def test_the_profile_carries_the_operator_table_of_a_warm_up_step(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=3, profile_steps=5, output=tmp_path / "p.json", verbose=False)
    fit(cb, max_steps=10)
    profile = load_profile(tmp_path / "p.json")
    ops = profile.ops
    assert ops is not None and ops.device == "cpu" and ops.samples == 8 and ops.precision == "32-true"
    phases = {(o.phase, o.op) for o in ops.ops}
    assert {("forward", "aten.addmm.default"), ("backward", "aten.mm.default")} <= phases
    assert ("optimizer", "aten._foreach_add_.List") in phases, "SGD momentum, foreach as on CUDA"
    # one mode gives the FLOPs too: the same figures the flop counter gives (see test_profile_of_a_real_run)
    assert profile.model.flops.forward_per_sample == pytest.approx(2 * (16 * 32 + 32))
    assert ops.total_flops == pytest.approx(profile.model.flops.per_sample * 8)
    assert profile.timing.window.steps == 5, "the captured step is a warm-up step, outside the window"


def test_mixed_precision_on_cpu_captures_cuda_autocast(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=3, output=None, verbose=False)
    fit(cb, max_steps=6, precision="bf16-mixed")
    ops = cb.profile.ops
    addmm = [o for o in ops.ops if o.op == "aten.addmm.default"]
    assert addmm and all(o.out_dtype == "bfloat16" for o in addmm)
    assert list(next(o for o in ops.ops if o.op == "aten.mse_loss.default").dtypes) == ["float32", "float32"]
    assert ops.precision == "bf16-mixed"


def test_a_failing_capture_is_noted_and_training_goes_on(tmp_path, monkeypatch) -> None:
    from lightning_srifty.profiling import ops_capture

    def broken(self, phase="forward"):
        raise RuntimeError("boom")

    monkeypatch.setattr(ops_capture.OpRecorder, "__init__", broken)
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=4, output=None, verbose=False)
    t = fit(cb, max_steps=8)
    assert t.global_step == 8 and cb.profile.ops is None
    assert any("no operator table" in n and "boom" in n for n in cb.profile.notes)
    assert "boom" in cb.profile.model.flops.reason


def test_capture_ops_false_keeps_the_flop_counter(tmp_path) -> None:
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=3, output=None, verbose=False, capture_ops=False)
    fit(cb, max_steps=6)
    assert cb.profile.ops is None and "FlopCounterMode" in cb.profile.model.flops.method


def test_tf32_enabled_through_allow_tf32_is_recorded_as_high() -> None:
    import torch

    from lightning_srifty.profiling.callback import matmul_precision

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        assert matmul_precision() == "highest"
        torch.backends.cuda.matmul.allow_tf32 = True  # NGC containers do this through TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
        assert matmul_precision() == "high"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
        torch.set_float32_matmul_precision("highest")


@pytest.mark.slow
def test_a_profile_on_a_busy_machine_predicts_what_an_idle_one_does(tmp_path, catalog) -> None:
    """Issue #37 H1: the same run profiled on this machine as it is and beside one busy process per core gives the
    same predictions on every GPU. bench/host_load.py measures it on a quiet machine (1.4 % at most, the issue's 10 %
    target); here the "idle" run shares the machine with the suite's other workers, so the bound is 20 %: the defect
    it guards against (the framework time taken from medians: 0.3 to 71.5 ms on the same run) moved predictions by
    multiples. A CI run of 6acc913 measured 10.8 % on g4dn.xlarge beside two busy workers."""
    import subprocess

    from predictor.model.predict import predict

    profiles = {}
    for name in ("idle", "loaded"):
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(os.cpu_count() or 2)]
        if name == "idle":
            for hog in hogs:
                hog.kill()
        try:
            cb = SriftyCallback(recommend=False, warmup_steps=5, profile_steps=30, output=None, verbose=False)
            fit(cb, max_steps=40)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        profiles[name] = cb.profile
    assert profiles["loaded"].timing.step_time_s.p50 > 0 and profiles["idle"].timing.step_time_s.p50 > 0
    for fleet in ("g4dn.xlarge:1", "g5.xlarge:1", "p3.2xlarge:1", "p4d.24xlarge:1"):
        idle, loaded = (predict(profiles[k], fleet, catalog=catalog).iteration_time_s for k in ("idle", "loaded"))
        assert abs(loaded / idle - 1) <= 0.20, (fleet, idle, loaded)


def test_the_runs_plan_never_goes_over_the_plan_the_launch_runs(tmp_path, monkeypatch) -> None:
    """A new user's trial: a script giving output="srifty/digits-profile.json" wrote its run's plan over
    srifty/plan.json, the plan `srifty launch --plan srifty/plan.json` ran (a resume or a replay then read another
    plan). The launcher runs a copy of it, so the job cannot tell the user's file: under a launch the run's plan goes
    to the launch's own folder; outside a launch, as given."""
    from lightning_srifty.profiling.callback import _not_the_launchs_plan

    monkeypatch.chdir(tmp_path)
    for name in [v for v in os.environ if v.startswith("SRIFTY_")]:
        monkeypatch.delenv(name)
    beside = Path("srifty/plan.json")
    assert _not_the_launchs_plan(beside) == beside  # outside a launch
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(tmp_path / "launch"))
    monkeypatch.setenv("SRIFTY_LAUNCH_ID", "l1")
    monkeypatch.setenv("SRIFTY_PLAN", str(tmp_path / "ckpt" / "plans" / "plan-1.json"))  # the launcher's copy
    assert _not_the_launchs_plan(beside) == Path("srifty/launch-l1/plan.json")
    assert _not_the_launchs_plan(Path("elsewhere/plan.json")) == Path("srifty/launch-l1/plan.json")


@pytest.mark.parametrize(("epochs", "max_steps", "accumulate"), [(2, -1, 3), (3, -1, 1), (2, 7, 3), (2, 100, 4)])
def test_the_planned_steps_are_the_steps_lightning_runs(epochs: int, max_steps: int, accumulate: int) -> None:
    """An audit: 10 batches an epoch, accumulated 3, for 2 epochs read 6 optimizer steps (the batches over the
    accumulation, rounded down), where Lightning steps at each epoch's last batch too: 8. The work the callback
    prices and the steps MigrationTriggers counts as left are Lightning's own."""
    from lightning_srifty.profiling.recommendation import planned_steps

    seen: list[int | None] = []

    class Planned(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            seen.append(planned_steps(trainer))

    t = trainer([Planned()], max_steps, max_epochs=epochs, accumulate_grad_batches=accumulate)
    t.fit(TinyModel(), loader(n=80, batch_size=8))  # 10 batches an epoch
    assert seen == [t.global_step], (seen, t.global_step)


def test_a_manual_loop_of_two_optimizers_is_planned_in_batches_not_in_its_optimizers_steps(tmp_path) -> None:
    """A trial's GAN (automatic_optimization=False, generator and discriminator stepped every batch): Lightning's
    global_step and max_steps count both, so max_steps 600 ran 300 batches, and the callback priced 600 steps of the
    global batch, twice the work. A step is a batch of the global batch: the work is what the run trains, and the
    profile records the loop (no accumulation can be planned for it) and its optimizer steps a batch."""
    from lightning_srifty.profiling.recommendation import planned_steps, with_work
    from lightning_srifty.profiling.steps import batches_stepped

    seen: dict[str, object] = {}

    class Planned(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args) -> None:
            if trainer.global_step == 4:
                seen["planned"], seen["work"] = planned_steps(trainer), with_work(Constraints(), trainer)

    out = tmp_path / "profile.json"
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=out, verbose=False)
    t = trainer([cb, Planned()], max_steps=40)
    t.fit(TwoOptimizerModel(), train_dataloaders=loader())
    assert t.global_step == 40 and batches_stepped(t) == 20  # 20 batches of 8
    assert seen["planned"] == 20 and seen["work"].steps == 20
    profile = load_profile(out)
    assert profile.batch.manual_optimization is True and profile.batch.optimizer_steps_per_batch == 2
    assert seen["work"].work(profile).samples == 20 * 8  # what the run trains (it read 40 x 8)
    # the second optimizer's forward is forward work (it was read as the first optimizer's step): two passes of
    # Linear(16->8) and Linear(8->1) a sample, 2 x 2 x (16 x 8 + 8) FLOPs
    assert profile.model.flops.forward_per_sample == pytest.approx(2 * 2 * (16 * 8 + 8))
    assert any("a manual optimization loop" in n for n in profile.ops.notes)
    assert not profile.timing.phases_s and any("not split into data, forward, backward" in n for n in profile.notes)

    # a WGAN's loop (its generator every other batch): 1.5 global steps a batch, not rounded to 1 or 2
    class AtFour(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, module, outputs, batch, batch_idx: int) -> None:
            if batch_idx == 3:  # four batches, six global steps
                seen["wgan"] = planned_steps(trainer)

    out = tmp_path / "wgan.json"
    cb = SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=out, verbose=False)
    t = trainer([cb, AtFour()], max_steps=30)
    t.fit(TwoOptimizerModel(second_every=2), train_dataloaders=loader())
    assert t.global_step == 30 and batches_stepped(t) == 20 and seen["wgan"] == 20
    assert load_profile(out).batch.optimizer_steps_per_batch == pytest.approx(1.5, rel=0.1)  # the window's own mean
    fit(SriftyCallback(recommend=False, warmup_steps=2, profile_steps=5, output=tmp_path / "a.json", verbose=False), 10)
    automatic = load_profile(tmp_path / "a.json")  # an automatic loop's profile is as before
    assert automatic.batch.manual_optimization is None and automatic.batch.optimizer_steps_per_batch is None


def test_the_runs_own_length_under_weak_scaling_is_its_epochs() -> None:
    """Under weak scaling a step is each fleet's own global batch: the callback's default work is the run's epochs
    (its batches over the accumulation a step each), the same samples as its steps at the profiled batch; a run
    stopped at max_steps is refused by the constraints' check, naming samples and epochs."""
    from lightning_srifty.profiling.recommendation import with_work

    seen: dict[str, Constraints | None] = {}

    class Work(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            seen["weak"] = with_work(Constraints(scaling="weak"), trainer)
            seen["strong"] = with_work(Constraints(), trainer)

    trainer([Work()], -1, max_epochs=2, accumulate_grad_batches=3).fit(TinyModel(), loader(n=80, batch_size=8))
    weak, strong = seen["weak"], seen["strong"]
    assert weak is not None and strong is not None
    weak.validate()
    assert (weak.epochs, weak.steps_per_epoch, weak.steps) == (2, 4, None)
    assert strong.steps == 8 and weak.epochs * weak.steps_per_epoch == strong.steps
    trainer([Work()], 10**9, max_epochs=2).fit(TinyModel(), loader(n=80, batch_size=8))  # the epochs end it
    assert (seen["weak"].epochs, seen["weak"].steps_per_epoch, seen["weak"].steps) == (2, 10, None)
    trainer([Work()], 5, accumulate_grad_batches=3).fit(TinyModel(), loader(n=80, batch_size=8))
    stopped = seen["weak"]
    assert stopped is not None and stopped.steps == 5
    with pytest.raises(ConfigError, match="give the work as samples or epochs"):
        stopped.validate()
    # and the callback that asks for weak scaling without a work is built (a review: its check stood in 1 step)
    for asked in (Constraints(scaling="weak"), {"scaling": "weak"}):
        assert SriftyCallback(constraints=asked, recommend=True).constraints.scaling == "weak"
