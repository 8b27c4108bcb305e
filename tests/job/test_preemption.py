"""Spot notices and SIGTERM: the watcher against a local IMDSv2 server, a real Lightning run that checkpoints at the
next step and exits 75, resume from that checkpoint to the exact step, and a corrupted newest checkpoint skipped."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from helpers import TinyModel, loader, regression_data, trainer
from imds_server import FakeIMDS
from lightning_srifty.migrate.preemption import PREEMPTED_EXIT_CODE, SpotPreemption, earliest_notice, find_checkpoint
from lightning_srifty.migrate.spot_watcher import SpotWatcher

ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"


def wait_for(condition, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_watcher_sees_the_notice_and_the_rebalance_once(monkeypatch) -> None:
    seen = []
    with FakeIMDS({}) as imds:
        watcher = SpotWatcher(seen.append, endpoint=imds.endpoint, interval_s=0.02)
        assert watcher.start()
        assert wait_for(lambda: watcher.polls >= 3)
        assert not seen  # 404 until AWS decides
        imds.metadata[REBALANCE] = json.dumps({"noticeTime": "2026-11-22T14:00:00Z"})
        imds.metadata[ACTION] = json.dumps({"action": "terminate", "time": "2026-11-22T14:02:00Z"})
        assert wait_for(lambda: len(seen) == 2)
        polls = watcher.polls
        assert wait_for(lambda: watcher.polls >= polls + 3)  # three more polls that still find both notices...
        watcher.stop()
    assert {n.kind for n in seen} == {"interruption", "rebalance"} and len(seen) == 2  # ...and report neither again
    notice = next(n for n in seen if n.kind == "interruption")
    assert notice.action == "terminate" and "terminate at 2026-11-22 14:02:00 UTC" in notice.describe()
    assert ("PUT", "/latest/api/token") in imds.requests  # IMDSv2


def test_the_local_metadata_service_keeps_a_tokens_life_as_ec2_does() -> None:
    """EC2's IMDSv2 tokens last the seconds asked for, 1 to 21,600, and a read with an expired one is refused
    ("How Instance Metadata Service Version 2 works", Amazon EC2 User Guide); the local service (the rehearsal's and
    the tests') keeps that, and the watcher, which keeps its token for the whole run, takes a new one on the 401 and
    still sees a notice posted after its first token died."""
    with FakeIMDS({"meta-data/instance-id": "i-1"}, token_life_s=0.3) as imds:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def call(method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
            request = urllib.request.Request(imds.endpoint + path, method=method, headers=headers)
            try:
                with opener.open(request, timeout=5) as answer:
                    return answer.status, answer.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, ""

        for ttl in ("0", "21601", "x"):
            assert call("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": ttl})[0] == 400, ttl
        status, token = call("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
        assert status == 200 and call("GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": token}) == (
            200,
            "i-1",
        )
        seen = []
        watcher = SpotWatcher(seen.append, endpoint=imds.endpoint, interval_s=0.05)
        assert watcher.start()
        time.sleep(0.5)  # both tokens have expired
        assert call("GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": token})[0] == 401
        imds.notify()
        assert wait_for(lambda: len(seen) == 1)
        watcher.stop()
    assert len(imds.tokens) >= 3  # issued: the test's, the watcher's first, and the watcher's new one after the 401


def test_watcher_does_not_start_off_ec2(monkeypatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert SpotWatcher(lambda n: None).start() is False


class _NoticeAt(pl.Callback):
    """Sets the spot notice on the local IMDS at a given step; slows steps so that the watcher polls in between."""

    def __init__(self, imds: FakeIMDS, step: int) -> None:
        self.imds, self.step = imds, step

    def on_train_batch_end(self, trainer, *args) -> None:
        time.sleep(0.03)
        if trainer.global_step == self.step:
            self.imds.metadata[ACTION] = json.dumps({"action": "terminate", "time": "soon"})


def test_notice_checkpoints_at_the_next_step_exits_75_and_resume_is_exact(tmp_path) -> None:
    ckpts = str(tmp_path / "ckpt")
    with FakeIMDS({}) as imds:
        handler = SpotPreemption(ckpts, endpoint=imds.endpoint, interval_s=0.01)
        t = trainer([_NoticeAt(imds, 5), handler], max_steps=40)
        with pytest.raises(SystemExit) as info:
            t.fit(TinyModel(), train_dataloaders=loader())
    assert info.value.code == PREEMPTED_EXIT_CODE and handler.preempted
    (path,) = handler.checkpoints
    stopped_at = t.global_step
    assert 5 < stopped_at < 40, stopped_at  # within a few steps of the notice, well before the end
    assert path.endswith(f"preempt-step={stopped_at}.ckpt") and not os.path.exists(path + ".partial")
    assert handler.timings["notice_to_durable_s"] < 5
    assert signal.getsignal(signal.SIGTERM) is not handler._sigterm  # restored
    assert find_checkpoint(ckpts) == path
    # resume on a fresh Trainer: it continues from the saved step to the exact end
    model = TinyModel()
    t2 = trainer([], max_steps=40)
    t2.fit(model, train_dataloaders=loader(), ckpt_path=find_checkpoint(ckpts), weights_only=True)
    assert t2.global_step == 40


def test_sigterm_is_a_notice_too(tmp_path) -> None:
    class Term(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    handler = SpotPreemption(str(tmp_path), endpoint=None, exit_process=False)
    t = trainer([Term(), handler], max_steps=30)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert handler.preempted and t.global_step == 3  # checkpointed at the step the signal arrived in, then stopped
    assert find_checkpoint(str(tmp_path)).endswith("preempt-step=3.ckpt")


@pytest.mark.parametrize("end", ["finished", "preempted"])
def test_after_the_fit_sigterm_is_the_handler_the_script_had_not_lightnings_stale_one(tmp_path, end) -> None:
    """A review (forty-fourth session): Lightning's teardown puts the original SIGTERM handler back before on_fit_end,
    and SpotPreemption then put back the handler it had replaced at on_train_start, Lightning's own: a SIGTERM after
    the fit (the watchdog's stop during an export, torchrun ending a rank) ran Lightning's stale notifier (a
    broadcast) and never ended the process. After the fit, and after a leave on a notice, the handler is the one the
    script had."""

    class Term(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if end == "preempted" and trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    def mine(signum, frame) -> None:  # the script's own
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        handler = SpotPreemption(str(tmp_path), endpoint=None, exit_process=False)
        trainer([Term(), handler], max_steps=5).fit(TinyModel(), train_dataloaders=loader())
        assert handler.preempted == (end == "preempted")
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_notice_between_micro_batches_checkpoints_at_the_steps_end(tmp_path) -> None:
    """A review: with gradient accumulation the notice was acted on between the micro-batches of a step; Lightning
    keeps no accumulated gradient in a checkpoint while the data position counts those micro-batches as consumed, so
    the resumed step took the rest only. Where the notice's window allows, the step's remaining micro-batches run
    first and the checkpoint is at its end (4 micro-batches a step, the spot notice during step 3); a SIGTERM, whose
    sender's grace is not known (the watchdog's may be 40 s), is left at once, its checkpoint set back to the step's
    start; a periodic checkpoint always waits for the step's end."""
    from lightning.pytorch.callbacks import Callback

    class NoticeAtBatch(Callback):
        def __init__(self, imds: FakeIMDS | None, batch: int) -> None:
            self.imds, self.batch = imds, batch

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            time.sleep(0.03)  # the watcher polls in between
            if batch_idx == self.batch and self.imds is not None:
                self.imds.metadata[ACTION] = json.dumps({"action": "terminate", "time": "soon"})
            elif batch_idx == self.batch:
                os.kill(os.getpid(), signal.SIGTERM)

    def progress(path: str) -> tuple[int, int]:
        saved = torch.load(path, weights_only=False)
        return saved["global_step"], saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"]

    with FakeIMDS({}) as imds:
        handler = SpotPreemption(str(tmp_path / "leave"), endpoint=imds.endpoint, interval_s=0.01, exit_process=False)
        t = trainer([NoticeAtBatch(imds, 9), handler], max_steps=30, accumulate_grad_batches=4)
        t.fit(TinyModel(), train_dataloaders=loader())
    step, processed = progress(find_checkpoint(str(tmp_path / "leave")))
    assert handler.preempted and 3 <= step <= 4 and processed == 4 * step, (step, processed)  # at a step's end
    handler = SpotPreemption(str(tmp_path / "term"), endpoint=None, exit_process=False)
    t = trainer([NoticeAtBatch(None, 9), handler], max_steps=30, accumulate_grad_batches=4)
    t.fit(TinyModel(), train_dataloaders=loader())
    # at once, at the step's start (test_a_sigterm_between_micro_batches_resumes_at_the_steps_start_exactly)
    assert handler.preempted and progress(find_checkpoint(str(tmp_path / "term"))) == (2, 8)
    # a periodic checkpoint: every 0 s is due at every batch, and is made at the steps' ends only
    periodic = SpotPreemption(str(tmp_path / "periodic"), endpoint=None, exit_process=False, every_s=1e-9, keep=10)
    t = trainer([periodic], max_steps=3, accumulate_grad_batches=4)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert [os.path.basename(p) for p in periodic.checkpoints] == [f"periodic-step={k}.ckpt" for k in (1, 2, 3)]


@pytest.mark.parametrize("term_at", [9, 2, 25])  # in step 3; in the first epoch's first step; the second's (24 batches)
def test_a_sigterm_between_micro_batches_resumes_at_the_steps_start_exactly(tmp_path, term_at) -> None:
    """A trial: a SIGTERM (the launcher's Ctrl-C) between the micro-batches of a step was saved at once, and its data
    position counted them as consumed while Lightning keeps no accumulated gradient: the resumed step took the rest
    of its micro-batches only (weights 0.08 off an uninterrupted run's at step 300). The leaving checkpoint now
    holds the position of the step's start (Lightning's loop progress and ExactResume's samples), where its
    weights are, so the resumed run trains that step's micro-batches again: the uninterrupted run's weights."""
    from lightning.pytorch.callbacks import Callback

    from lightning_srifty.strategies.hetero import ExactResume, GlobalBatchSampler

    class TermAtBatch(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.fit_loop.epoch_loop.batch_progress.total.ready == term_at + 1:
                os.kill(os.getpid(), signal.SIGTERM)

    def run(callbacks: list, ckpt_path: str | None = None) -> TinyModel:
        torch.manual_seed(0)
        model = TinyModel()
        sampler = GlobalBatchSampler(200, [8], seed=1, accumulate_grad_batches=4)  # 6 steps of 4 x 8 an epoch
        data = DataLoader(regression_data(200), batch_sampler=sampler)
        t = trainer([ExactResume(), *callbacks], max_steps=12, accumulate_grad_batches=4, use_distributed_sampler=False)
        t.fit(model, train_dataloaders=data, ckpt_path=ckpt_path)
        assert t.global_step == 12 or ckpt_path is None
        return model

    whole = run([])
    handler = SpotPreemption(str(tmp_path / "term"), endpoint=None, exit_process=False)
    run([TermAtBatch(), handler])
    left = find_checkpoint(str(tmp_path / "term"))
    saved = torch.load(left, weights_only=False)
    progress = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert handler.preempted and progress["total"]["processed"] == 4 * saved["global_step"], progress
    assert saved["callbacks"]["ExactResume"]["consumed"] == 8 * progress["current"]["processed"]
    resumed = run([SpotPreemption(str(tmp_path / "again"), endpoint=None, exit_process=False)], left)
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()


def test_a_truncated_newest_checkpoint_is_skipped_with_a_warning(tmp_path, caplog) -> None:
    handler = SpotPreemption(str(tmp_path), exit_process=False)
    t = trainer([], max_steps=4)
    t.fit(TinyModel(), train_dataloaders=loader())
    older = handler.save(t, reason="periodic")
    newer = str(tmp_path / "periodic-step=9.ckpt")
    with open(older, "rb") as f:
        data = f.read()
    with open(newer, "wb") as f:
        f.write(data[: len(data) // 2])  # a crash mid-write of a plain (non-atomic) save
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        assert find_checkpoint(str(tmp_path)) == older
    assert "skipping checkpoint" in caplog.text and "step=9" in caplog.text
    assert torch.load(older, weights_only=True)["global_step"] == 4
    assert find_checkpoint(str(tmp_path / "missing")) is None


def test_the_quick_starts_script_leaves_on_a_notice_under_a_launch(tmp_path, monkeypatch) -> None:
    """Issue #37 H3: a script with only SriftyCallback() under srifty launch trained through a spot notice to the end
    ("finished ... after 0 migration(s)"); on EC2 that job loses its progress. Under a launch (a checkpoint location
    in the environment) the package adds SpotPreemption to every Trainer (Lightning's callbacks_factory entry point):
    the notice (here SIGTERM) checkpoints and exits 75."""
    from lightning_srifty import SriftyCallback

    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(tmp_path / "ckpt"))

    class Term(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    callback = SriftyCallback(warmup_steps=1, profile_steps=2, output=str(tmp_path / "profile.json"))
    t = trainer([callback, Term()], max_steps=40)  # Lightning adds what the package's callbacks_factory returns
    auto = [c for c in t.callbacks if isinstance(c, SpotPreemption)]
    assert len(auto) == 1 and auto[0]._auto
    with pytest.raises(SystemExit) as info:
        t.fit(TinyModel(), train_dataloaders=loader())
    assert info.value.code == PREEMPTED_EXIT_CODE and t.global_step < 40
    assert find_checkpoint(str(tmp_path / "ckpt")).endswith(f"preempt-step={t.global_step}.ckpt")
    # the script's own SpotPreemption wins: the automatic one stands aside (one checkpoint, the script's folder)
    own = SpotPreemption(str(tmp_path / "own"), exit_process=False)
    t = trainer([own, Term()], max_steps=40)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert own.preempted and [c._inactive for c in t.callbacks if isinstance(c, SpotPreemption) and c._auto] == [True]
    # outside a launch nothing is added
    monkeypatch.delenv("SRIFTY_CHECKPOINT_URI")
    plain = trainer([SriftyCallback(warmup_steps=1, profile_steps=2, output=str(tmp_path / "p2.json"))], max_steps=2)
    assert not any(isinstance(c, SpotPreemption) for c in plain.callbacks)


def test_resume_takes_the_checkpoint_written_last_not_the_highest_step(tmp_path, caplog) -> None:
    """Issue #37 H2: `srifty launch --resume latest` resumed another launch's checkpoint. A finished launch left step
    8 in the default folder; a later launch, stopped at step 3, left step 3: the newest by the step in the name went
    back to the finished run and skipped what the stopped one had trained. The one written last is resumed, and the
    other is named."""
    first = SpotPreemption(str(tmp_path), exit_process=False)
    t = trainer([], max_steps=8)
    t.fit(TinyModel(), train_dataloaders=loader())
    finished = first.save(t, reason="periodic")  # step 8, an hour ago
    for path in (finished, finished + ".sha256"):
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    second = SpotPreemption(str(tmp_path), exit_process=False)
    t = trainer([], max_steps=3)
    t.fit(TinyModel(), train_dataloaders=loader())
    stopped = second.save(t, reason="preempt")  # step 3, now
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        assert find_checkpoint(str(tmp_path)) == stopped
    assert "periodic-step=8.ckpt (step 8), written before the newest checkpoint preempt-step=3.ckpt" in caplog.text


class _Payload:
    """Pickles as a call of os.system: what a planted checkpoint would run on load."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_and_nothing_runs(tmp_path, caplog) -> None:
    handler = SpotPreemption(str(tmp_path), exit_process=False)
    t = trainer([], max_steps=4)
    t.fit(TinyModel(), train_dataloaders=loader())
    older = handler.save(t, reason="periodic")
    assert os.path.exists(older + ".sha256")
    marker = tmp_path / "pwned"
    planted = torch.load(older, weights_only=True) | {"global_step": 99, "evil": _Payload(str(marker))}
    torch.save(planted, str(tmp_path / "periodic-step=99.ckpt"))  # no digest: not one of ours
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        assert find_checkpoint(str(tmp_path)) == older
    assert not marker.exists(), "the planted checkpoint's code ran"
    assert "posix.system" in caplog.text or "os.system" in caplog.text


def test_a_checkpoint_that_differs_from_its_recorded_digest_is_skipped(tmp_path, caplog) -> None:
    handler = SpotPreemption(str(tmp_path), exit_process=False)
    t = trainer([], max_steps=4)
    t.fit(TinyModel(), train_dataloaders=loader())
    older = handler.save(t, reason="periodic")
    newer = older.replace("step=4", "step=8")
    with open(older, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 3] ^= 0xFF  # one flipped byte: still a loadable zip more often than not
    with open(newer, "wb") as f:
        f.write(data)
    with open(older + ".sha256") as f, open(newer + ".sha256", "w") as g:
        g.write(f.read())
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        assert find_checkpoint(str(tmp_path)) == older
    assert "sha256 differs" in caplog.text


def test_a_missing_bucket_is_refused_before_the_first_step(tmp_path, moto_endpoint, monkeypatch) -> None:
    """Issue #36 L8: outside `srifty launch`, a checkpoint folder in a bucket that does not exist was found at the
    first save (after that much training). Now SpotPreemption refuses it at fit start, naming the bucket; an empty
    folder in a bucket that exists is a first start."""
    pytest.importorskip("s3fs")
    import boto3

    from predictor.exceptions import ConfigError

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="there")
    steps = []

    class Count(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            steps.append(trainer.global_step)

    with pytest.raises(ConfigError, match=r"bucket that does not exist \('not-there'\).*Create the bucket"):
        trainer([Count(), SpotPreemption("s3://not-there/run-1", exit_process=False)], max_steps=3).fit(
            TinyModel(), train_dataloaders=loader()
        )
    assert steps == []  # refused before any step
    t = trainer([Count(), SpotPreemption("s3://there/run-1", exit_process=False)], max_steps=3)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert t.global_step == 3


def test_checkpoints_on_s3_through_moto(tmp_path, moto_endpoint, monkeypatch) -> None:
    """s3:// checkpoints (fsspec + s3fs) against moto's S3 API on 127.0.0.1: saved whole, found, resumed from."""
    pytest.importorskip("s3fs")
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
    url = "s3://ckpts/run-1"

    class Term(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 6:
                os.kill(os.getpid(), signal.SIGTERM)

    handler = SpotPreemption(url, exit_process=False)
    t = trainer([Term(), handler], max_steps=20)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert handler.preempted and handler.checkpoints == [f"{url}/preempt-step=6.ckpt"]
    keys = [
        o["Key"] for o in boto3.client("s3", endpoint_url=moto_endpoint).list_objects_v2(Bucket="ckpts")["Contents"]
    ]
    # the .partials were renamed, nothing half-written is left; the marker tells `srifty launch` why the job left
    assert keys == ["run-1/PREEMPTED.json", "run-1/preempt-step=6.ckpt", "run-1/preempt-step=6.ckpt.sha256"]
    marker = json.loads(
        boto3.client("s3", endpoint_url=moto_endpoint).get_object(Bucket="ckpts", Key=keys[0])["Body"].read()
    )
    assert marker["step"] == 6 and marker["checkpoint"] == f"{url}/preempt-step=6.ckpt" and marker["why"] == "SIGTERM"
    found = find_checkpoint(url)
    assert found == f"{url}/preempt-step=6.ckpt"
    t2 = trainer([], max_steps=20)
    t2.fit(TinyModel(), train_dataloaders=loader(), ckpt_path=found, weights_only=True)
    assert t2.global_step == 20


def test_periodic_checkpoints_at_the_plans_interval_keep_the_newest(tmp_path, catalog) -> None:
    import copy

    from _support import MINIMAL
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    plan = rank(load_profile(copy.deepcopy(MINIMAL)), Constraints(steps=5_000_000, market="spot"), catalog=catalog)
    from_plan = SpotPreemption.from_plan(plan, 0, str(tmp_path))
    assert from_plan.every_s == plan.entries[0].checkpoint_interval_s > 0
    # a run shorter than the Young-Daly interval takes no periodic checkpoint
    short = rank(load_profile(copy.deepcopy(MINIMAL)), Constraints(steps=1_000, market="spot"), catalog=catalog)
    assert short.entries[0].checkpoint_interval_s is None and SpotPreemption.from_plan(short).every_s is None

    class Slow(pl.Callback):
        def on_train_batch_end(self, *args) -> None:
            time.sleep(0.02)

    handler = SpotPreemption(str(tmp_path), every_s=0.05, keep=2, exit_process=False)
    t = trainer([Slow(), handler], max_steps=20)
    t.fit(TinyModel(), train_dataloaders=loader())
    files = sorted(p.name for p in tmp_path.glob("*.ckpt"))
    assert len(files) == 2 and all(f.startswith("periodic-step=") for f in files)
    assert find_checkpoint(str(tmp_path)) == max(
        (str(p) for p in tmp_path.glob("*.ckpt")), key=lambda p: int(p.split("=")[1].split(".")[0])
    )
    assert not handler.preempted


def test_on_a_fleet_the_plans_checkpoint_interval_is_every_spotpreemptions_default(tmp_path, monkeypatch) -> None:
    """A trial: the SpotPreemption every Trainer gets on a fleet (and srifty_auto's) saved only on a notice, though
    the plan computes a checkpoint interval for the fleet: a node lost without a notice (a hardware fault, a crash)
    lost everything since the start. The launch's variables carry the plan's interval, which a SpotPreemption
    without an every_s of its own takes; one the script gives wins, and outside a launch there is none."""
    from lightning_srifty import protocol as markers
    from lightning_srifty.migrate.preemption import launch_callbacks

    assert SpotPreemption(str(tmp_path)).every_s is None  # no launch
    monkeypatch.setenv(markers.VARIABLES["checkpoint_uri"], str(tmp_path / "ckpt"))
    assert SpotPreemption().every_s is None  # a launch without the interval (an on-demand fleet)
    monkeypatch.setenv(markers.VARIABLES["checkpoint_every_s"], "204")
    (auto,) = launch_callbacks()
    assert auto.every_s == 204.0 and SpotPreemption().every_s == 204.0
    assert SpotPreemption(every_s=30).every_s == 30
    # it saves: a fleet's run of 20 steps at 20 ms takes periodic checkpoints at the variable's interval
    monkeypatch.setenv(markers.VARIABLES["checkpoint_every_s"], "0.05")
    handler = SpotPreemption(keep=2, exit_process=False)
    trainer([_Slow(), handler], max_steps=12).fit(TinyModel(), train_dataloaders=loader())
    assert [p.name.split("-")[0] for p in (tmp_path / "ckpt").glob("*.ckpt")] == ["periodic"] * 2


def test_a_run_that_raises_leaves_a_failed_marker_for_the_launcher(tmp_path) -> None:
    from lightning_srifty import protocol as markers
    from lightning_srifty import store

    class Boom(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                raise RuntimeError("the loss is NaN")

    with pytest.raises(RuntimeError, match="NaN"):
        trainer([Boom(), SpotPreemption(str(tmp_path), exit_process=False)], max_steps=10).fit(
            TinyModel(), train_dataloaders=loader()
        )
    failed = markers.read_record(str(tmp_path), markers.Failed)
    assert (failed.step, failed.error, failed.launch_id) == (3, "RuntimeError: the loss is NaN", "")
    assert store.read(str(tmp_path), markers.FINISHED) is None


class _Slow(pl.Callback):
    def on_train_batch_end(self, *args) -> None:
        time.sleep(0.05)


def _under_launch(monkeypatch, tmp_path, **fields) -> None:
    from lightning_srifty.protocol import LaunchEnv

    for name in list(os.environ):
        if name.startswith("SRIFTY_"):
            monkeypatch.delenv(name)
    env = LaunchEnv(launch_id="L1", checkpoint_uri=str(tmp_path), fleet="g4dn.xlarge:1", **fields)
    for name, value in env.to_env().items():
        monkeypatch.setenv(name, value)


def test_a_lost_launcher_heartbeat_is_a_notice_checkpoint_and_leave(tmp_path, monkeypatch) -> None:
    from lightning_srifty.protocol import Heartbeat, Preempted, Started, read_record, write_record

    _under_launch(monkeypatch, tmp_path, heartbeat_max_age_s=0.5, resume="")
    write_record(str(tmp_path), Heartbeat(launch_id="L1", written_unix=time.time(), max_age_s=0.5))  # then silence
    cb = SpotPreemption(exit_process=False, handle_sigterm=False, interval_s=0.05)
    assert cb.dirpath == str(tmp_path)  # the launcher's checkpoint folder by default
    t = trainer([_Slow(), cb], max_steps=400)
    t0 = time.monotonic()
    t.fit(TinyModel(), train_dataloaders=loader())
    assert cb.preempted and t.global_step < 400 and time.monotonic() - t0 < 10
    left = read_record(str(tmp_path), Preempted, "L1")
    assert left.trigger == "heartbeat" and left.why.startswith("launcher heartbeat lost: HEARTBEAT.json last written")
    assert left.checkpoint.endswith(f"preempt-step={left.step}.ckpt") and os.path.exists(left.checkpoint)
    assert left.last_step_unix <= left.durable_unix and left.save_s is not None
    started = read_record(str(tmp_path), Started, "L1")
    assert (started.step, started.fleet, started.resumed_from) == (1, "g4dn.xlarge:1", "")
    assert (started.world_size, started.strategy, tuple(started.mismatches)) == (1, "SingleDeviceStrategy", ())


def test_the_first_step_record_says_what_the_job_trains_otherwise_than_the_plan(tmp_path, monkeypatch) -> None:
    """A trial: a DDP script on a sharded plan passed every check of the rehearsal, which saw only that it stepped and
    left. STARTED.json now says how the job trains (its ranks, its strategy) and what it does otherwise than the
    plan, which the rehearsal checks."""
    from lightning_srifty.protocol import Started, read_record

    _under_launch(monkeypatch, tmp_path, resume="", batch_sizes=(5,), accumulate_grad_batches=3)
    cb = SpotPreemption(exit_process=False, handle_sigterm=False)
    trainer([cb], max_steps=2).fit(TinyModel(), train_dataloaders=loader(batch_size=8))
    started = read_record(str(tmp_path), Started, "L1")
    assert started.world_size == 1 and len(started.mismatches) == 2
    assert "accumulates 3 micro-steps per optimizer step, the Trainer 1" in started.mismatches[0]
    assert "gives rank 0 batches of 5 samples (global batch 15), its DataLoader gives 8" in started.mismatches[1]


def test_the_first_step_record_is_an_optimizer_steps_end_under_accumulation(tmp_path, monkeypatch) -> None:
    """A trial: with gradients accumulated, STARTED.json was written at the first micro-batch's end, whose global step
    is still the checkpoint's: the rehearsal said "the job took its first step: step 0" and "first step 11 after the
    checkpoint of step 11". It is written at the first optimizer step's end (step 1 here); the micro-batches before
    it are signs of life for the launcher's stall watch, not steps."""
    from lightning_srifty.protocol import Started, read_record

    _under_launch(monkeypatch, tmp_path, resume="")
    cb = SpotPreemption(exit_process=False, handle_sigterm=False)
    trainer([cb], max_steps=2, accumulate_grad_batches=3).fit(TinyModel(), train_dataloaders=loader())
    started = read_record(str(tmp_path), Started, "L1")
    assert started.step == 1 and cb.watch is not None and cb.watch._leg_first is not None
    assert cb.watch._leg_first[0] == 1  # the measured step time counts from an optimizer step's end too


def test_a_fresh_heartbeat_keeps_the_job_training(tmp_path, monkeypatch) -> None:
    import itertools
    import threading

    from lightning_srifty.protocol import Heartbeat, write_record

    # a beat every 0.1 s against a 1 s age: 10 beats of margin. The claim is that a job whose heartbeat is never older
    # than its max age is never stopped for it; on a loaded 2-core CI machine the beating thread itself has stalled
    # past 1 s (twice: at 0.5 s beside two benches, at 1 s in a full run), and stopping then is right, so the beats'
    # own gaps are measured and a stop is a failure only when none of them reached the max age
    _under_launch(monkeypatch, tmp_path, heartbeat_max_age_s=1.0)
    done = threading.Event()
    written = [time.time()]  # the job's start counts as a sighting (as the watcher's does)

    def beat() -> None:
        while not done.wait(0.1):
            write_record(str(tmp_path), Heartbeat(launch_id="L1", written_unix=time.time(), max_age_s=1.0))
            written.append(time.time())

    beat_thread = threading.Thread(target=beat, daemon=True)
    beat_thread.start()
    cb = SpotPreemption(exit_process=False, handle_sigterm=False, interval_s=0.05)
    try:
        trainer([_Slow(), cb], max_steps=70).fit(TinyModel(), train_dataloaders=loader())  # 3.5 s > 3 max ages
    finally:
        done.set()
        beat_thread.join()
    gaps = [b - a for a, b in itertools.pairwise(written)]
    stale = max(gaps, default=0.0) > 1.0
    assert not cb.preempted or stale, f"stopped although no beat was older than 1 s (longest gap {max(gaps):.2f} s)"
    assert len(written) > 20  # the beats ran through the 3.5 s of training


class _SlowValidation(TinyModel):
    def validation_step(self, batch, batch_idx):
        time.sleep(0.05)
        return super().validation_step(batch, batch_idx)


def _fit_with_a_slow_validation(cb: SpotPreemption, sample, every_s: float) -> None:
    """Four steps with 30 validation batches of 0.05 s after steps 2 and 4, ``sample()`` called every ``every_s`` on a
    thread of its own meanwhile."""
    import threading

    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s):
            sample()

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    t = trainer([cb], max_steps=4, limit_val_batches=30, val_check_interval=2)
    try:
        t.fit(_SlowValidation(), train_dataloaders=loader(), val_dataloaders=loader(n=240))
    finally:
        done.set()
        sampler.join()


def test_the_progress_record_shows_a_long_validation_as_life_not_a_hang(tmp_path, monkeypatch) -> None:
    """The launcher's stall watch takes a job whose PROGRESS.json shows neither a new step nor any other sign of life
    for --stall-timeout-min for hung. A validation holds the step where it is for as long as it runs: the record now
    carries the loop's last sign of life (its validation batches) and how often it is written."""

    from lightning_srifty.protocol import Progress, read_record

    _under_launch(monkeypatch, tmp_path, resume="")
    seen: list[Progress] = []

    def sample() -> None:
        record = read_record(str(tmp_path), Progress, "L1")
        if record is not None:
            seen.append(record)

    cb = SpotPreemption(exit_process=False, handle_sigterm=False, interval_s=0.05, progress_s=0.1)
    _fit_with_a_slow_validation(cb, sample, every_s=0.05)
    during = [r for r in seen if r.step == 2 and r.active_unix is not None and r.unix is not None]
    assert during and max(r.active_unix - r.unix for r in during) > 0.8, [(r.step, r.unix, r.active_unix) for r in seen]
    assert {r.every_s for r in seen} == {0.1}


def test_the_progress_record_keeps_coming_after_a_leave_is_asked_and_past_the_last_step(tmp_path) -> None:
    """A review: the watch thread stopped once it asked the job to leave (the launcher's LEAVE, the life cap), so
    PROGRESS.json froze while the job finished its step and saved, and a long save read as a hang. It now goes on
    reporting; and once training is over (what runs until fit() ends: an export), the job is alive while it runs."""
    from lightning_srifty.migrate.launch_watch import LaunchWatch
    from lightning_srifty.protocol import LaunchEnv, Progress, read_record

    asked: list[str] = []
    launch = LaunchEnv(launch_id="L1", checkpoint_uri=str(tmp_path), max_life_until_unix=time.time() - 1)
    watch = LaunchWatch(
        str(tmp_path), launch, interval_s=0.02, progress_s=0.02, leave=lambda why, *_: asked.append(why),
        leaving=lambda: bool(asked),
    )  # fmt: skip
    t0 = time.time()
    watch.note_progress(7, t0)
    watch.start(rank_zero=True)
    try:
        deadline = time.monotonic() + 5
        while not asked and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asked and "life cap" in asked[0]
        time.sleep(0.1)
        os.remove(tmp_path / "PROGRESS.json")  # written again after the leave was asked
        deadline = time.monotonic() + 5
        while not (tmp_path / "PROGRESS.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_record(str(tmp_path), Progress, "L1").active_unix == t0  # no new sign: the loop did nothing
        watch.training_over = True
        record = None
        while time.monotonic() < deadline and not (record and record.active_unix > t0):
            time.sleep(0.01)
            record = read_record(str(tmp_path), Progress, "L1")
    finally:
        watch.stop()
    assert record is not None and record.step == 7 and record.active_unix > t0 and len(asked) == 1


def test_the_fleets_life_cap_is_a_notice_too(tmp_path, monkeypatch) -> None:
    from lightning_srifty.protocol import Preempted, read_record

    _under_launch(monkeypatch, tmp_path, max_life_until_unix=time.time() + 0.5)
    cb = SpotPreemption(exit_process=False, handle_sigterm=False, interval_s=0.05)
    trainer([_Slow(), cb], max_steps=400).fit(TinyModel(), train_dataloaders=loader())
    left = read_record(str(tmp_path), Preempted, "L1")
    assert cb.preempted and left.trigger == "max-life" and "life cap was reached" in left.why


def _stuck_store(release, hang_records: bool = False):
    """An fsspec store that takes small writes but never finishes an upload (an S3 outage in the middle of a save);
    with ``hang_records`` it takes no write at all."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Stuck(MemoryFileSystem):
        protocol = "stuckmem"
        root_marker = "/"
        store: dict = {}  # noqa: RUF012 - fsspec's own class-level store
        pseudo_dirs = [""]  # noqa: RUF012

        def put_file(self, *args, **kwargs):
            release.wait(60)
            raise OSError("the store never answered")

        def _open(self, path, mode="rb", **kwargs):
            if "w" in mode and (hang_records or ".ckpt" in path):  # checkpoint bytes never go through
                release.wait(60)
                raise OSError("the store never answered")
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("stuckmem", Stuck, clobber=True)
    Stuck.store.clear()
    return Stuck


@pytest.mark.parametrize("hang_records", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_store_outage_during_the_leaving_save_keeps_the_notice_deadline(tmp_path, hang_records) -> None:
    """#14 item 5: the save is local first and the upload gets what is left of the deadline; past it the checkpoint
    stays on local disk, the record says so (or is written locally when the store takes nothing), and the job leaves
    in time instead of blocking for minutes."""
    import threading

    from lightning_srifty.protocol import Preempted, read_record

    release = threading.Event()
    _stuck_store(release, hang_records)

    class Term(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    local = tmp_path / "local"
    handler = SpotPreemption(
        "stuckmem://run/ckpt", endpoint=None, exit_process=False, leave_deadline_s=2.0, local_fallback=str(local)
    )
    t = trainer([Term(), handler], max_steps=30)
    t0 = time.monotonic()
    try:
        t.fit(TinyModel(), train_dataloaders=loader())
        took = time.monotonic() - t0
    finally:
        release.set()
    assert handler.preempted and t.global_step == 3
    assert took < 12, took  # the deadline (2 s) twice over and the run's own time, never the store's minutes
    (path,) = handler.checkpoints
    assert path == str(local / "preempt-step=3.ckpt") and os.path.exists(path)
    assert handler.stored.startswith("local ") and handler.stored.endswith(path)
    assert find_checkpoint(str(local)) == path  # complete, with its digest
    where = str(local) if hang_records else "stuckmem://run/ckpt"
    record = read_record(where, Preempted, "")
    assert record.stored == handler.stored and record.checkpoint == path


def test_the_leaving_save_is_budgeted_from_the_time_the_notice_names(tmp_path) -> None:
    """Issue #23 item 10: in an S3 outage the upload got leave_deadline_s (100 s) from the notice's sighting and the
    record 5 s more, ending at 119.9 s of a 120 s notice on a disk about to vanish. A notice that says when AWS acts
    budgets back from that time: the upload gets what is left before the record's margin, and the job has written its
    record and left EXIT_MARGIN_S before AWS acts."""
    import datetime as dt
    import threading

    from lightning_srifty.migrate.preemption import EXIT_MARGIN_S, RECORD_MARGIN_S
    from lightning_srifty.protocol import Preempted, read_record

    release = threading.Event()
    _stuck_store(release)  # records go through, the checkpoint's upload never finishes
    notice_s = EXIT_MARGIN_S + RECORD_MARGIN_S + 2.0  # AWS acts 17 s after the notice: 2 s for the upload
    noticed: list[float] = []

    class Notice(pl.Callback):
        def __init__(self, imds: FakeIMDS) -> None:
            self.imds = imds

        def on_train_batch_end(self, trainer, *args) -> None:
            time.sleep(0.03)
            if trainer.global_step == 3:
                acts = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=notice_s)
                self.imds.metadata[ACTION] = json.dumps({"action": "terminate", "time": f"{acts:%Y-%m-%dT%H:%M:%SZ}"})
                noticed.append(time.monotonic())

    local = tmp_path / "local"
    with FakeIMDS({}) as imds:  # leave_deadline_s stays 100 s: the notice's own time binds
        handler = SpotPreemption("stuckmem://run/ckpt", endpoint=imds.endpoint, interval_s=0.01, exit_process=False,
                                 local_fallback=str(local))  # fmt: skip
        t = trainer([Notice(imds), handler], max_steps=400)
        try:
            t.fit(TinyModel(), train_dataloaders=loader())
            left_after = time.monotonic() - noticed[0]
        finally:
            release.set()
    assert handler.preempted
    # the stamp has whole seconds: AWS acts between notice_s - 1 and notice_s after the notice
    assert left_after < notice_s - EXIT_MARGIN_S, left_after
    (path,) = handler.checkpoints
    assert handler.stored.startswith("local ") and path.startswith(str(local))
    record = read_record("stuckmem://run/ckpt", Preempted, "")
    assert record.stored == handler.stored and record.notice_to_durable_s < notice_s - EXIT_MARGIN_S - 1


def test_a_periodic_upload_to_a_store_that_never_answers_is_bounded_and_training_goes_on(tmp_path, caplog) -> None:
    """Issue #36 M2: periodic checkpoint uploads had no deadline: a store that accepts connections and never answers
    held the training ~400 s per checkpoint. Each is now bounded (by default a notice's budget, here 1 s); the
    checkpoint stays on local disk, said with how long it was given, and the training goes on."""
    import threading

    release = threading.Event()
    _stuck_store(release)
    local = tmp_path / "local"
    handler = SpotPreemption("stuckmem://run/periodic", every_s=0, keep=2, exit_process=False,
                             periodic_deadline_s=1.0, local_fallback=str(local))  # fmt: skip
    assert SpotPreemption("x", leave_deadline_s=60).periodic_deadline_s == 55.0  # the notice window's budget
    t = trainer([handler], max_steps=3)
    started = time.monotonic()
    try:
        t.fit(TinyModel(), train_dataloaders=loader())
    finally:
        release.set()
    assert t.global_step == 3 and time.monotonic() - started < 30
    assert handler.stored.startswith("local ") and all(c.startswith(str(local)) for c in handler.checkpoints)
    assert "did not reach stuckmem://run/periodic/periodic-step=2.ckpt (no answer within 1.0 s)" in caplog.text


@pytest.mark.timeout(120)
def test_a_notice_during_a_hanging_periodic_upload_wins(tmp_path, caplog) -> None:
    """Issue #36 M2: a SIGTERM during a periodic upload to a hanging store waited for the upload (the job left 392 s
    after SIGTERM, past a 2-minute notice). The wait ends at the notice; the leave is budgeted from it, the leaving
    checkpoint stays local when the store does not take it, and that is what the log says (not "durable")."""
    import threading

    from lightning_srifty.protocol import Preempted, read_record

    release = threading.Event()
    _stuck_store(release)  # records go through; checkpoint uploads never finish
    local = tmp_path / "local"
    handler = SpotPreemption("stuckmem://run/notice", every_s=0, exit_process=False, periodic_deadline_s=300,
                             leave_deadline_s=8, local_fallback=str(local))  # fmt: skip
    sent: list[float] = []

    def sigterm_soon() -> None:  # SIGTERM 1 s into the first periodic upload
        time.sleep(1.0)
        sent.append(time.monotonic())
        handler._sigterm(signal.SIGTERM, None)

    class FirstStep(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:  # before the handler's periodic save of step 1
            if trainer.global_step == 1:
                threading.Thread(target=sigterm_soon, daemon=True).start()

    t = trainer([FirstStep(), handler], max_steps=50)
    try:
        t.fit(TinyModel(), train_dataloaders=loader())
        left_after = time.monotonic() - sent[0]
    finally:
        release.set()
    assert handler.preempted and t.global_step == 1  # it left at the step it was uploading, not at the next
    assert left_after < 8, left_after  # within the leave's window from the SIGTERM, not after the 300 s bound
    assert re.search(r"periodic-step=1\.ckpt \(a notice came first, 1\.\d s into it\)", caplog.text), caplog.text
    assert "kept on this machine's disk only (the store did not take it in time: not durable)" in caplog.text
    record = read_record("stuckmem://run/notice", Preempted, "")
    assert record.stored.startswith("local ") and record.trigger == "sigterm"


def test_torchruns_grace_follows_the_measured_save() -> None:
    from predictor.runs.spot import shutdown_grace_s

    assert shutdown_grace_s(40.0) == 110  # torchrun's 30 s default killed a worker in a 40 s save
    assert shutdown_grace_s(None) == 90  # the assumed 30 s save
    assert shutdown_grace_s(0.1) == 60 and shutdown_grace_s(3600) == 900


def test_periodic_checkpoints_on_s3_are_saved_locally_then_digest_then_one_upload(tmp_path, moto_endpoint, monkeypatch):
    """A file checkpoint for an object store is saved and hashed on local disk, then its digest and then the checkpoint
    go up, each one upload of its final key: no `.partial` object, no server-side copy (s3fs's rename, which raced with
    a concurrent listing's cache), no download to hash it; and a store that refuses the upload costs the periodic
    checkpoint its durability (kept on local disk, said), never the training."""
    pytest.importorskip("s3fs")
    import boto3

    from lightning_srifty.store import filesystem

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="periodic")
    url = "s3://periodic/run-1"
    fs = filesystem(url)  # fsspec's cached instance: the one the callback gets
    calls: list[tuple[str, str]] = []  # (method, the key it writes or reads)
    TWO = {"put_file", "mv", "copy"}  # (source, destination)
    for method in ("open", "mv", "copy", "pipe_file", "put_file", "cat_file"):
        original = getattr(fs, method)
        monkeypatch.setattr(
            fs, method, lambda *a, _m=method, _o=original, **k: (calls.append((_m, str(a[_m in TWO]))), _o(*a, **k))[1]
        )
    local = tmp_path / "local"
    handler = SpotPreemption(url, every_s=0, keep=2, exit_process=False, local_fallback=str(local))
    t = trainer([handler], max_steps=3)
    t.fit(TinyModel(), train_dataloaders=loader())
    writes = [(m, k.rsplit("/", 1)[-1]) for m, k in calls if m != "cat_file" and ".ckpt" in k]
    assert writes == [
        (m, f"periodic-step={step}.ckpt{suffix}")
        for step in (1, 2, 3)
        for m, suffix in (("pipe_file", ".sha256"), ("put_file", ""))
    ], writes
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="periodic")["Contents"])
    assert keys == ["run-1/FINISHED.json"] + [
        f"run-1/periodic-step={s}.ckpt{x}" for s in (2, 3) for x in ("", ".sha256")
    ]
    assert not list(local.iterdir())  # the local copies went once the store had them
    assert find_checkpoint(url) == f"{url}/periodic-step=3.ckpt"

    # an outage from step 3 on (every upload of a file refused): each save stays on local disk, said, the training
    # goes on; the store keeps its newest 2 durable ones (an outage never prunes them for local copies), the local
    # copies are pruned apart, and no digest is left without its checkpoint
    put_file = fs.put_file

    class Outage(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:  # before the handler's save of the same step
            if trainer.global_step == 3:
                monkeypatch.setattr(fs, "put_file", refuse)

    def refuse(*args, **kwargs):
        raise PermissionError("Access Denied")

    monkeypatch.setattr(fs, "put_file", put_file)
    again = url + "-outage"
    handler = SpotPreemption(again, every_s=0, keep=2, exit_process=False, local_fallback=str(local))
    t = trainer([Outage(), handler], max_steps=5)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert t.global_step == 5 and handler.stored.startswith("local ")
    assert handler.checkpoints == [f"{again}/periodic-step={s}.ckpt" for s in (1, 2)] + [
        str(local / f"periodic-step={s}.ckpt") for s in (4, 5)
    ]
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="periodic", Prefix="run-1-outage/")["Contents"])
    assert keys == ["run-1-outage/FINISHED.json"] + [
        f"run-1-outage/periodic-step={s}.ckpt{x}" for s in (1, 2) for x in ("", ".sha256")
    ], keys
    assert sorted(p.name for p in local.iterdir()) == [
        f"periodic-step={s}.ckpt{x}" for s in (4, 5) for x in ("", ".sha256")
    ]
    assert find_checkpoint(str(local)) == str(local / "periodic-step=5.ckpt")
    assert find_checkpoint(again) == f"{again}/periodic-step=2.ckpt"

    # no room on local disk for the checkpoint: Lightning writes it into the store directly, its digest after it
    import collections

    from lightning_srifty.migrate import writer

    monkeypatch.setattr(fs, "put_file", put_file)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda folder: usage(10**9, 10**9, 0))
    full = url + "-full-disk"
    handler = SpotPreemption(full, every_s=0, keep=2, exit_process=False, local_fallback=str(tmp_path / "full"))
    t = trainer([handler], max_steps=3)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert handler.checkpoints == [f"{full}/periodic-step={s}.ckpt" for s in (2, 3)] and handler.stored == "durable"
    assert not list((tmp_path / "full").iterdir())
    assert find_checkpoint(full) == f"{full}/periodic-step=3.ckpt"  # whole, and its digest matches
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="periodic", Prefix="run-1-full-disk/")["Contents"])
    assert keys == ["run-1-full-disk/FINISHED.json"] + [
        f"run-1-full-disk/periodic-step={s}.ckpt{x}" for s in (2, 3) for x in ("", ".sha256")
    ], keys


@pytest.mark.parametrize(
    "content", ["", "\n\n", "deadbeef\n", "not-a-digest  step=7.ckpt\n"], ids=["empty", "blank", "one-token", "bad-hex"]
)
def test_an_emptied_or_malformed_digest_is_no_record(tmp_path, content) -> None:
    """Issue #36 M1/L9: an emptied digest file read as "no digest recorded", so a flipped tensor was then accepted by
    the fallback load check (and an empty sharded manifest passed the "manifest required" rule); a one-token one was
    a traceback in resume_checkpoint(). Now both are refused by name, and the older sound checkpoint is taken."""
    import torch

    from lightning_srifty.migrate.checkpoints import (
        DIGEST_SUFFIX,
        find_checkpoint,
        local_checkpoint,
        sha256_of,
        write_digest,
    )
    from lightning_srifty.store import filesystem
    from predictor.exceptions import MigrationError

    folder = tmp_path / "ckpts"
    folder.mkdir()
    for step in (5, 7):
        path = folder / f"step={step}.ckpt"
        torch.save({"state_dict": {"w": torch.ones(2) * step}, "global_step": step}, path)
        write_digest(filesystem(str(folder)), str(path), sha256_of(filesystem(str(folder)), str(path)))
    newest = folder / "step=7.ckpt"
    torch.save({"state_dict": {"w": torch.full((2,), float("nan"))}, "global_step": 7}, newest)  # flipped
    (folder / f"step=7.ckpt{DIGEST_SUFFIX}").write_text(content)
    assert find_checkpoint(str(folder)) == str(folder / "step=5.ckpt")
    shard = folder / "step=9.ckpt"
    shard.mkdir()
    (shard / "__0_0.distcp").write_bytes(b"x")
    (folder / f"step=9.ckpt{DIGEST_SUFFIX}").write_text(content)
    with pytest.raises(MigrationError, match=r"(empty|malformed)"):
        local_checkpoint(str(shard), str(tmp_path / "cache"), require_manifest=True)


def _share_notice_rank(rank: int, port: int, out: str) -> None:
    import types

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        handler = SpotPreemption("unused", exit_process=False)
        if rank == 1:  # only this node got the notice, 30 s ago, and its instance goes in 40 s
            handler._notice_at, handler._acts_at = time.monotonic() - 30.0, time.monotonic() + 40.0
        fake = types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device("cpu")))
        handler._notice_at, handler._acts_at = earliest_notice(fake, handler._notice_at, handler._acts_at)
        with open(f"{out}/rank{rank}", "w") as f:
            f.write(f"{time.monotonic() - handler._notice_at} {handler._acts_at - time.monotonic()}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes importing Lightning
def test_the_leave_window_counts_from_the_first_notice_of_any_rank(tmp_path) -> None:
    """Issue #36 M2: only the noticed node's rank knew when its notice came; rank 0, which uploads the leaving
    checkpoint, budgeted the upload from its own step (a full window more than AWS gives). The ranks now take the
    earliest notice, all-reduced (two gloo processes; rank 1 was noticed 30 s ago), and the earliest time AWS acts
    on a node (rank 1's, in 40 s), which only the noticed node knew."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_share_notice_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    seen = [tuple(map(float, (tmp_path / f"rank{r}").read_text().split())) for r in (0, 1)]
    assert all(29.0 < age < 40.0 for age, _ in seen), seen
    # and when AWS acts on the noticed node (a review: rank 0 wrote the record after it, to a peer already gone)
    assert all(30.0 < acts_in < 40.5 for _, acts_in in seen), seen


def test_a_node_that_replaces_a_lost_one_resumes_where_the_fleet_was(tmp_path, moto_endpoint, monkeypatch) -> None:
    """A one-node fleet under srifty launch whose instance went away without a word: its Auto Scaling group's
    replacement re-reads the leg's handover, which names the checkpoint the leg began from ("" on a first leg). Before,
    it resumed from there (a first leg: from step 0, while the fleet had trained on and saved). Now a checkpoint
    written since the handover (S3's own clock, one listing) is the leg's own and the newest of them wins; one written
    before it (another run's, left in the folder) never does. Against moto's S3."""
    pytest.importorskip("s3fs")
    import boto3

    from lightning_srifty import protocol, resume_checkpoint, store
    from lightning_srifty.migrate import checkpoints
    from lightning_srifty.protocol import LaunchEnv

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
    url = "s3://ckpts/run-1"
    for name in [v for v in os.environ if v.startswith("SRIFTY_")]:
        monkeypatch.delenv(name)

    def save(steps: int) -> str:  # a run of that many steps from scratch, outside the launch, and its checkpoint
        launch = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SRIFTY_")}
        try:
            handler = SpotPreemption(url, exit_process=False)
            t = trainer([], max_steps=steps)
            t.fit(TinyModel(), train_dataloaders=loader())
            return handler.save(t, reason="periodic")
        finally:
            os.environ.update(launch)

    earlier = save(8)  # another run's, in the same folder, before this leg
    time.sleep(1.1)  # S3 lists times to the second
    protocol.write_record(url, protocol.Handover(launch_id="L1", fleet="f-1", env={}))
    handover = protocol.handover("f-1")

    def under(resume: str) -> None:
        env = LaunchEnv(launch_id="L1", checkpoint_uri=url, resume=resume, resume_after=handover).to_env()
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    class FirstStep(pl.Callback):
        def on_train_start(self, trainer, *args) -> None:
            self.step = trainer.global_step

    # the leg's first node, a first leg: nothing written since the handover, a fresh start (not the other run's 8)
    under("")
    assert resume_checkpoint(cache_dir=str(tmp_path / "c0")) is None
    first = FirstStep()
    t = trainer([first], max_steps=2)  # the package's SpotPreemption under the launch: install_resume
    t.fit(TinyModel(), train_dataloaders=loader())
    assert first.step == 0
    time.sleep(1.1)
    own = save(5)  # the leg's own periodic checkpoint, then the node goes
    # a second fit() of the same process (a second stage) starts as the script says, not from the first's checkpoints
    stage = FirstStep()
    trainer([stage], max_steps=3).fit(TinyModel(), train_dataloaders=loader())
    assert stage.step == 0
    # its replacement (a new process), same handover: from the leg's own step 5, in a fit() without ckpt_path too
    checkpoints._RESUMED.clear()
    found = resume_checkpoint(cache_dir=str(tmp_path / "c1"))
    assert found is not None and os.path.basename(found) == os.path.basename(own) == "periodic-step=5.ckpt"
    again = FirstStep()
    t = trainer([again], max_steps=7)
    t.fit(TinyModel(), train_dataloaders=loader())
    assert again.step == 5 and t.global_step == 7
    # a later leg told to resume from a given checkpoint: that one while the leg has written none of its own ...
    time.sleep(1.1)
    protocol.write_record(url, protocol.Handover(launch_id="L1", fleet="f-2", env={}))
    handover = protocol.handover("f-2")
    under(earlier)
    assert os.path.basename(resume_checkpoint(cache_dir=str(tmp_path / "c4"))) == "periodic-step=8.ckpt"
    # ... and the leg's own once it has
    time.sleep(1.1)
    save(6)
    assert os.path.basename(resume_checkpoint(cache_dir=str(tmp_path / "c2"))) == "periodic-step=6.ckpt"
    store.clear(url, handover)  # no handover record to date the leg: the launcher's checkpoint, as before
    assert os.path.basename(resume_checkpoint(cache_dir=str(tmp_path / "c3"))) == "periodic-step=8.ckpt"


def test_the_nodes_alive_file_shows_steps_and_validation_as_life_and_the_end_of_training(tmp_path, monkeypatch):
    """On a srifty fleet node (SRIFTY_NODE_STATE) each node's local rank 0 rewrites its alive file on every sign of
    life from the first step on, for the boot script's stall watch: a validation holds the step where it is and the
    file's time moves on; at the end of training it says so (what runs until the process ends is not a hang)."""

    from lightning_srifty import protocol

    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("SRIFTY_NODE_STATE", str(state))
    monkeypatch.setattr(protocol, "ALIVE_EVERY_S", 0.05)
    alive = state / "alive"
    seen: list[tuple[str, float]] = []

    def sample() -> None:
        with contextlib.suppress(OSError):
            seen.append((alive.read_text(), alive.stat().st_mtime))

    cb = SpotPreemption(exit_process=False, handle_sigterm=False, dirpath=str(tmp_path / "ckpt"))
    _fit_with_a_slow_validation(cb, sample, every_s=0.02)
    steps = [line.split() for line, _ in seen]
    assert all(len(s) == 3 for s in steps) and steps[0][0] in {"1", "2"}, steps[:3]  # from the first step on
    during = [mtime for line, mtime in seen if line.split()[0] == "2" and line.split()[2] == "0"]
    assert during and max(during) - min(during) > 0.8, seen[:40]  # the validation after step 2: life
    assert alive.read_text().split()[0::2] == ["4", "1"]  # the last step, and training is over
    assert float(alive.read_text().split()[1]) > 0  # the measured seconds a step


class _SlowTest(TinyModel):
    def test_step(self, batch, batch_idx):
        time.sleep(0.05)
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))


def test_a_test_after_the_fit_shows_life_after_training(tmp_path, monkeypatch) -> None:
    """After the fit the node's alive file says training is over (1), and what the script does next has its node's
    limit after training (the module's watchdog.after_fit_s) rather than a step's. A trainer.test() after the fit
    shows life as its batches run (the file's time moves on) and keeps saying 1; so does a validate()."""
    from lightning_srifty import protocol

    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("SRIFTY_NODE_STATE", str(state))
    monkeypatch.setattr(protocol, "ALIVE_EVERY_S", 0.05)
    alive = state / "alive"
    cb = SpotPreemption(exit_process=False, handle_sigterm=False, dirpath=str(tmp_path / "ckpt"))
    t = trainer([cb], max_steps=3, limit_test_batches=20, limit_val_batches=20)
    model = _SlowTest()
    t.fit(model, train_dataloaders=loader())
    assert alive.read_text().split()[0::2] == ["3", "1"]
    seen: list[tuple[str, float]] = []
    runs = (lambda: t.test(model, dataloaders=loader(n=160), verbose=False), lambda: t.validate(model, loader(160)))
    for run in runs:
        before = alive.stat().st_mtime
        time.sleep(0.05)
        run()
        seen.append((alive.read_text(), alive.stat().st_mtime - before))
    assert [line.split()[0::2] for line, _ in seen] == [["3", "1"], ["3", "1"]], seen
    assert seen[0][1] > 0.5, seen  # the test's batches (20 of 0.05 s): life, written as they ran


def test_a_leg_resumed_at_its_runs_end_says_training_is_over(tmp_path, monkeypatch) -> None:
    """A leg that resumes from the run's last checkpoint (its node lost during the script's work after the fit) takes
    no step: Lightning skips the fit loop, and on_train_end with it. Its node's alive file was never written, so the
    node's watch never watched what the script did next, and a test that hung there billed until the life cap (a
    review). The fit's end says training is over at the checkpoint's step, and the test's batches are life after it."""
    from lightning_srifty import protocol

    monkeypatch.setattr(protocol, "ALIVE_EVERY_S", 0.05)
    model = _SlowTest()
    first = trainer([], max_steps=3)
    first.fit(model, train_dataloaders=loader())
    first.save_checkpoint(tmp_path / "last.ckpt")
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("SRIFTY_NODE_STATE", str(state))
    cb = SpotPreemption(exit_process=False, handle_sigterm=False, dirpath=str(tmp_path / "ckpt"))
    t = trainer([cb], max_steps=3, limit_test_batches=20)
    t.fit(model, train_dataloaders=loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    alive = state / "alive"
    assert alive.read_text() == "3 - 1\n"  # no step taken: no step time
    before = alive.stat().st_mtime
    time.sleep(0.05)
    t.test(model, dataloaders=loader(n=160), verbose=False)
    assert alive.read_text() == "3 - 1\n" and alive.stat().st_mtime - before > 0.5


def test_the_alive_file_waits_for_the_first_step_is_throttled_and_never_fatal(tmp_path, caplog) -> None:
    from lightning_srifty.migrate.alive import NodeAlive

    node = NodeAlive(tmp_path, every_s=10.0)
    node.sign(now=1.0)  # an epoch's start before any step: not yet
    node.over()  # (no step known: a fit that never started its loop's hooks)
    assert not (tmp_path / "alive").exists()
    node.step(5, now=2.0)
    assert (tmp_path / "alive").read_text() == "5 - 0\n"
    node.step(6, now=3.0)  # within every_s: not written
    assert (tmp_path / "alive").read_text() == "5 - 0\n"
    node.step(9, now=14.0)  # 4 steps in 12 s
    assert (tmp_path / "alive").read_text() == "9 3.000 0\n"
    node.step(10, now=15.0)  # within every_s again: not written
    assert (tmp_path / "alive").read_text() == "9 3.000 0\n"
    node.sign(now=15.5, force=True)  # a save's start: written whatever the last write's time (a review: dropped)
    assert (tmp_path / "alive").read_text().startswith("10 ")
    node.over()  # always written
    assert (tmp_path / "alive").read_text().endswith(" 1\n")
    # a test's or a validation's batch after the fit: the script's work after training, still said over (its node's
    # limit after training, not a step's: a review found a validate() after the fit wrote 0)
    node.sign(now=1e9, force=True)
    assert (tmp_path / "alive").read_text().endswith(" 1\n")
    node.step(11, now=1e9 + 1)  # a later fit's step, within every_s: training again, said at once
    assert (tmp_path / "alive").read_text().startswith("11 ") and (tmp_path / "alive").read_text().endswith(" 0\n")
    NodeAlive(None).step(1)  # off a fleet: nothing, no error
    broken = NodeAlive(tmp_path / "missing")
    broken.step(1, now=0.0)
    broken.step(2, now=100.0)
    said = [r.message for r in caplog.records if "could not mark the node's job alive" in r.message]
    assert len(said) == 1 and str(tmp_path / "missing" / "alive") in said[0]  # once, not at every step


@pytest.mark.slow
@pytest.mark.parametrize("how", ["abort", "raise", "exit3"])
def test_a_rank_marks_its_scripts_end_after_a_finished_fit_and_nothing_else(tmp_path, how) -> None:
    """On a srifty fleet node each rank marks that its script reached its end after a fit that ended (exit.<local
    rank>, "<global rank> <step> <pid>", when the interpreter exits): the boot script takes a job whose ranks all did,
    and that torchrun saw die only by a signal of those processes, for finished (torch's teardown can abort a process
    after its work: stop 77 met it). A process that dies of SIGABRT after its script's end has its mark; an exception
    after the fit that reaches the top (through a replaced excepthook), or a failing sys.exit, leaves none."""
    import subprocess
    import sys
    from pathlib import Path

    state = tmp_path / "state"
    state.mkdir()
    script = Path(__file__).resolve().parents[1] / "scripts" / "exit_mark_job.py"
    env = {**os.environ, "SRIFTY_NODE_STATE": str(state), "LOCAL_RANK": "0"}
    cmd = [sys.executable, str(script), str(tmp_path / "ckpt"), how]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out, err = proc.communicate(timeout=120)
    marks = sorted(p.name for p in state.glob("exit.*"))
    assert "fit ended" in out, err[-2000:]
    if how == "abort":
        assert proc.returncode == -signal.SIGABRT, err[-2000:]
        assert marks == ["exit.0"] and (state / "exit.0").read_text() == f"0 4 {proc.pid}\n"
    else:
        assert proc.returncode == {"raise": 1, "exit3": 3}[how], err[-2000:]
        assert marks == [], marks


# a script on a fleet node whose fit ended (exit_mark.arm, as SpotPreemption.on_fit_end does) and whose exit handler
# (a logger's final upload, registered before the fit ended) is SIGTERMed: torchrun's, when a peer died in its teardown
SIGTERMED_IN_EXIT_HANDLER = """import atexit, os, signal, sys, time
how = sys.argv[1]
def hung_teardown():  # registered before exit_mark's import: run after the mark's (atexit is last in, first out)
    print("teardown began", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
if how in ("hung-after-mark", "quiet-then-hung", "disarmed-in-exit"):
    atexit.register(hung_teardown)
from lightning_srifty.migrate import exit_mark
def upload():
    if how != "quiet-then-hung":
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one while held: told once, still held
    time.sleep(0.2)
    print("upload done", flush=True)
if how == "late-upload":
    exit_mark.arm(0, 5)  # an earlier fit's end; the upload registered after it (a later fit's logger)
atexit.register(upload)
if how == "disarmed-in-exit":
    atexit.register(lambda: sys.exit(1))  # an exit handler's failing status, after the mark's SIGTERM handler
if how == "own-handler":
    signal.signal(signal.SIGTERM, lambda *a: print("the script's own handler", flush=True))
exit_mark.arm(0, 12)
if how == "exit3":
    sys.exit(3)
"""


@pytest.mark.parametrize(
    "how",
    [
        "end",
        "late-upload",
        "stderr-gone",
        "exit3",
        "own-handler",
        "hung-after-mark",
        "quiet-then-hung",
        "disarmed-in-exit",
    ],
)
def test_a_sigterm_in_an_armed_ranks_exit_handlers_is_held_until_they_finish_and_mark(tmp_path, how) -> None:
    """Stop 79's CI: rank 0 died in its teardown, torchrun SIGTERMed rank 1 before its mark, and the node recorded a
    failed job whose training had finished. Once an armed rank's script has ended, a SIGTERM is told on stderr (once)
    and held: its exit handlers finish, the mark is written, and the SIGTERM then ends the process (-15, marked),
    before the handlers registered ahead of the mark's (torch's teardown, which may hang). A script that failed after
    the fit dies of it as before, unmarked; a SIGTERM handler the script installed is left to the script. Once marked,
    a SIGTERM that comes then ends the process at once (quiet-then-hung); one held while a later exit handler disarmed
    the mark ends it unmarked. The handler is registered at every arm: an exit handler registered after an earlier fit
    is covered (a review). A stderr that is gone (its reader closed) does not cut the handler the SIGTERM came in."""
    import subprocess
    import sys

    env = {**os.environ, "SRIFTY_NODE_STATE": str(tmp_path), "LOCAL_RANK": "0"}
    cmd = [sys.executable, "-c", SIGTERMED_IN_EXIT_HANDLER, how]
    if how == "stderr-gone":  # its reader gone before the script's end: telling the SIGTERM meets a broken pipe
        with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            proc.stderr.close()  # type: ignore[union-attr]
            out, _ = proc.communicate(timeout=60)
        run = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    else:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    told = run.stderr.count("srifty: SIGTERM after the script's end") + (how == "stderr-gone")
    if how == "exit3":
        assert run.returncode == -signal.SIGTERM and "upload done" not in run.stdout and not told, run.stderr[-2000:]
        assert not (tmp_path / "exit.0").exists()
    elif how == "own-handler":
        assert run.returncode == 0 and "the script's own handler" in run.stdout and not told, run.stderr[-2000:]
        assert (tmp_path / "exit.0").exists()
    elif how == "quiet-then-hung":  # no SIGTERM in its handlers: marked, then the hung teardown's ends it at once
        assert run.returncode == -signal.SIGTERM and "teardown began" in run.stdout and not told, run.stderr[-2000:]
        assert (tmp_path / "exit.0").read_text().split()[:2] == ["0", "12"]
    else:  # the upload's SIGTERM held through it, then raised again: the handlers before the mark's never run
        assert run.returncode == -signal.SIGTERM and "upload done" in run.stdout and told == 1, run.stderr[-2000:]
        assert "teardown began" not in run.stdout, run.stdout
        marked = (tmp_path / "exit.0").exists()
        assert marked == (how != "disarmed-in-exit")
        if marked:
            assert (tmp_path / "exit.0").read_text().split()[:2] == ["0", "12"]


def test_the_exit_mark_is_disarmed_by_a_later_failure_and_off_a_fleet(tmp_path, monkeypatch) -> None:
    """In one process: a fit that ends arms the mark; a later fit's exception (SpotPreemption.on_exception, whichever
    instance), a failing sys.exit, or an exception that reached the top (sys.last_value, set before any excepthook)
    keeps it from being written; off a fleet node (no SRIFTY_NODE_STATE) nothing is armed; the mark is held locked
    while its process runs; a folder that cannot be written is logged, never raised."""
    import fcntl
    import sys

    from lightning_srifty.migrate import exit_mark

    monkeypatch.setattr(sys, "exit", sys.exit)  # arm() wraps it: restored after the test
    monkeypatch.delenv("SRIFTY_NODE_STATE", raising=False)
    exit_mark.arm(0, 5)
    assert exit_mark._armed is None  # off a fleet
    monkeypatch.setenv("SRIFTY_NODE_STATE", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "1")
    mark = tmp_path / "exit.1"
    exit_mark.arm(3, 7)
    cb = SpotPreemption(exit_process=False, handle_sigterm=False, dirpath=str(tmp_path / "ckpt"))
    cb._inactive = True  # an automatic one that stood aside still disarms: the process did not end well
    cb.on_exception(None, None, RuntimeError("a later fit"))  # type: ignore[arg-type]
    exit_mark._at_exit()
    assert not mark.exists()
    exit_mark.arm(3, 8)
    with pytest.raises(SystemExit):
        sys.exit(0)  # a zero status is an end
    assert exit_mark._armed == "3 8"
    with pytest.raises(SystemExit):
        sys.exit("failed")  # a message is status 1
    exit_mark._at_exit()
    assert not mark.exists()
    exit_mark.arm(3, 9)
    monkeypatch.setattr(sys, "last_value", RuntimeError("reached the top"), raising=False)
    exit_mark._at_exit()
    assert not mark.exists()
    monkeypatch.delattr(sys, "last_value")
    exit_mark.arm(3, 9)
    armed_by = exit_mark._armed_pid
    exit_mark._armed_pid = armed_by + 1  # as a child forked after the fit sees it: not the process that armed it
    exit_mark._at_exit()
    assert not mark.exists()
    exit_mark._armed_pid = armed_by
    exit_mark._at_exit()
    assert mark.read_text() == f"3 9 {os.getpid()}\n"
    with open(mark) as other, pytest.raises(BlockingIOError):  # held: another process (the boot script) sees it run
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    for fd in exit_mark._held:
        os.close(fd)
    exit_mark._held.clear()
    exit_mark.write(tmp_path / "missing", "3 9")  # logged once, not raised


def test_a_notice_during_a_periodic_save_resumes_the_notices_checkpoint_of_that_step(tmp_path) -> None:
    """A notice that comes while a periodic checkpoint saves leaves two of one step: the periodic one, then the
    notice's. An object store lists whole seconds, so both can read as written at once; the replacements resumed the
    periodic one (the same state) while PREEMPTED.json named the notice's, and a CI run's rehearsal failed its check.
    At one time and one step the notice's comes first, whatever the listing's order."""
    from pathlib import Path

    from lightning_srifty.migrate.checkpoints import _newest_first

    stamp = time.time()
    listing = [
        {"name": f"{tmp_path}/{name}", "mtime": stamp}
        for name in ("periodic-step=192.ckpt", "periodic-step=192.ckpt.sha256", "preempt-step=192.ckpt",
                     "preempt-step=192.ckpt.sha256", "periodic-step=150.ckpt")
    ]  # fmt: skip
    for order in (listing, listing[::-1]):
        assert Path(_newest_first(str(tmp_path), order, None)[0]["name"]).name == "preempt-step=192.ckpt"


def test_a_resume_whose_model_checkpoint_names_files_left_on_another_machine_says_so(tmp_path, caplog) -> None:
    """A trial: on a fleet, ModelCheckpoint's best came back with the checkpoint two legs later, naming a file on a
    node that was gone, where trainer.test(ckpt_path="best") would fail without a word until then. The resumed run
    says which files, where they are, and the dirpath that keeps them."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def run(max_steps: int, resume: str | None = None) -> pl.Trainer:
        best = ModelCheckpoint(dirpath=str(tmp_path / "top"), monitor="val_loss", save_top_k=2, every_n_train_steps=2)
        handler = SpotPreemption(str(tmp_path / "ckpt"), endpoint=None, exit_process=False)
        t = trainer([best, handler], max_steps=max_steps, enable_checkpointing=True, limit_val_batches=2,
                    val_check_interval=2)  # fmt: skip
        t.fit(TinyModel(), train_dataloaders=loader(), val_dataloaders=loader(32), ckpt_path=resume)
        return t

    first = run(6)
    saved = SpotPreemption(str(tmp_path / "ckpt"), exit_process=False).save(first, reason="preempt")
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        run(8, saved)  # every file of the first leg still here: nothing to say
    assert "ModelCheckpoint" not in caplog.text
    for f in (tmp_path / "top").iterdir():  # another machine: the first leg's disk is gone
        f.unlink()
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        run(8, saved)
    said = " ".join(caplog.text.split())
    assert f"ModelCheckpoint(dirpath='{tmp_path / 'top'}') names 2 file(s) saved before the resume" in said, said
    assert "os.path.join(os.environ['SRIFTY_CHECKPOINT_URI'], 'best')" in said
