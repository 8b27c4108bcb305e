"""srifty launch's state machine with a provisioner that records what it is asked (no processes, no cloud): the
order of up / start / down on a spot move, a voluntary move, a failure and a declined request. The test plays the
job by writing its markers, as a job on a remote fleet would."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import types
from pathlib import Path

import pytest

from _support import LosingNodes, Recorder
from lightning_srifty import protocol as markers
from lightning_srifty import store
from lightning_srifty.protocol import (
    Failed,
    Finished,
    Heartbeat,
    Leave,
    MoveDeclined,
    MoveRequest,
    Preempted,
    Started,
    write_record,
)
from lightning_srifty.provision.base import LaunchedFleet
from lightning_srifty.provision.launcher.launch import launch
from predictor.exceptions import ConfigError, LaunchInterrupted, MigrationError
from predictor.ranking import Constraints, rank

LID = "L1"  # the launch id of every launch here: the test plays the job, which writes its records with it


@pytest.fixture
def plan(catalog, tmp_path_factory):
    from _support import drift_plan as _plan

    return _plan(catalog, tmp_path_factory.mktemp("plan"))


def _run(plan, tmp_path: Path, job, recorder: Recorder | None = None, **kwargs):
    recorder = recorder or Recorder()
    result: dict = {"echo": []}
    ckpt = str(tmp_path / "ckpt")
    kwargs = {"launch_id": LID, "echo": result["echo"].append, **kwargs}

    def go() -> None:
        try:
            result["moves"] = launch(
                plan, provisioner=recorder, workdir=tmp_path, checkpoint_dir=ckpt, poll_s=0.02, name="f", **kwargs
            )
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    job(ckpt, recorder)
    thread.join(30)
    assert not thread.is_alive()
    return recorder, result


def _until(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def _warned(caught, text: str) -> bool:
    """Whether ``pytest.warns``'s record holds a warning with ``text``: the launcher, in its thread, read a record and
    ignored it (the positive signal a test waits for before checking that the record changed nothing)."""
    return any(text in str(w.message) for w in caught)


def test_a_spot_notice_moves_to_the_next_fleet_of_the_plan(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, Preempted(launch_id=LID, step=7, checkpoint="c7", why="spot interruption notice"))
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job)
    (move,) = result["moves"]
    assert (move.trigger, move.voluntary, move.step) == ("spot", False, 7)
    assert (move.from_fleet, move.to_fleet) == (plan.entries[0].fleet, plan.entries[1].fleet)
    assert rec.calls == [("up", "f-1"), ("start", "f-1"), ("up", "f-2"), ("start", "f-2"), ("down", "f-1"),
                         ("stop", "f-2"), ("down", "f-2")]  # fmt: skip
    assert rec.envs["f-2"]["SRIFTY_RESUME"] == "c7" and rec.envs["f-2"]["SRIFTY_CHOICE"] == "1"
    assert sum(map(int, rec.envs["f-2"]["SRIFTY_BATCH_SIZES"].split(","))) == 8  # the global batch is kept
    # a spot move keeps the plan, and the deadline keeps counting from when the run began on it
    assert rec.envs["f-2"]["SRIFTY_PLAN_STARTED_UNIX"] == rec.envs["f-1"]["SRIFTY_PLAN_STARTED_UNIX"]


class _ScriptRunsOn(Recorder):
    """A cloud fleet whose script may still run after the job's training finished: ``wait_after_fit`` (the terraform
    provisioner's: every node's status record) answers ``answer``, as the nodes' records would."""

    def __init__(self, answer: int | None, hung: bool = False) -> None:
        super().__init__()
        self.answer, self.hung = answer, hung
        self.timeouts: list[float] = []

    def wait_after_fit(self, fleet, timeout):
        self.calls.append(("wait_after_fit", fleet.name))
        self.timeouts.append(timeout)
        if self.hung:  # a node's watch killed the script, silent after its training (its status record says so)
            fleet.data["hung_after_fit"] = ["i-0abc"]
        return self.answer


@pytest.mark.parametrize("answer", [0, 3, None], ids=["ended", "ended-with-an-error", "still-running"])
def test_a_finished_job_is_waited_for_until_its_script_ends_and_no_longer(plan, tmp_path, answer) -> None:
    """FINISHED.json is written as the job's fit ends; the script may still test, export or upload. The launch
    destroyed the fleet at once and cut that work (a review): it now waits for the fleet (``wait_after_fit``)
    for after_fit_timeout_s (30 min by default), and only then releases it. A script that had not ended by then is cut
    by the release, and the launch fails, saying so with the step, the time and the setting; the fleet is still
    released. A script that ended with an error after its training is said (a review: the launch said "finished" and
    nothing else), and the launch still finishes: the training is done and in its checkpoints."""

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(
        plan, tmp_path, job, _ScriptRunsOn(answer), **({} if answer is not None else {"after_fit_timeout_s": 90})
    )
    assert rec.calls[:3] == [("up", "f-1"), ("start", "f-1"), ("wait_after_fit", "f-1")]
    assert rec.calls[-1] == ("down", "f-1")  # released either way, once the wait is over
    if answer is not None:
        assert rec.timeouts == [markers.AFTER_FIT_TIMEOUT_S] == [1800.0] and result["moves"] == []
        assert any("srifty launch: finished on" in line for line in result["echo"])
        warned = [line for line in result["echo"] if "WARNING" in line]
        assert warned == ([] if answer == 0 else [
            "srifty launch: WARNING: the job's training finished, but its script then exited 3 on f-1: what it does "
            "after fit() (a test, an export, an upload) may not have completed; see its log (srifty logs)"
        ])  # fmt: skip
        return
    assert rec.timeouts == [90]
    error = result["error"]
    assert isinstance(error, MigrationError), error
    said = str(error)
    assert "FINISHED.json at step 20" in said and "had not ended 90 s later on f-1" in said, said
    assert "after_fit_timeout_s" in said and "--after-fit-timeout-min" in said, said
    assert not any("srifty launch: finished on" in line for line in result["echo"])


def test_a_script_its_node_killed_silent_after_training_fails_the_launch_as_at_the_launchers_limit(
    plan, tmp_path
) -> None:
    """The same hang after the fit, found first by a node's own watch (its status record's after_fit_hung) rather than
    at the launcher's limit: the launch said "finished" with a warning, and failed when the launcher's limit came first
    (a review). Either way it fails now, naming the node; the fleet is released."""

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, _ScriptRunsOn(137, hung=True))
    assert rec.calls[-1] == ("down", "f-1")
    said = str(result["error"])
    assert isinstance(result["error"], MigrationError) and "FINISHED.json at step 20" in said, said
    assert "showed no sign of life for 1800 s on i-0abc, whose watch killed it" in said, said
    assert not any("srifty launch: finished on" in line or "WARNING" in line for line in result["echo"])


def _g5_plan(catalog):
    """A re-ranked plan for one on-demand g5.xlarge: where a voluntary move goes."""
    return rank(
        plan_profile(),
        Constraints(steps=1000, market="on-demand", allow=("g5.xlarge",), max_instances=1),
        catalog=catalog,
    )


def _ask_to_move(ckpt: str, other) -> None:
    """The job asks to move to ``other``'s fleet (a price move, as MigrationTriggers writes it) and waits until the
    launcher, its new fleet up, tells it to leave."""
    request = MoveRequest(
        launch_id=LID, why="price", reason="cheaper", to_fleet=other.entries[0].fleet, plan=other.to_dict()
    )
    write_record(ckpt, request)
    _until(lambda: store.exists(ckpt, markers.LEAVE))


@pytest.mark.parametrize("why", ["price", "spot"])
def test_a_fleet_the_job_left_is_not_waited_for_before_the_next_leg(plan, tmp_path, catalog, why) -> None:
    """The terraform provisioner's wait for every node's status record is for a finished job's script only. Once it
    had one, the launch waited for it after every leave too: the voluntary move's new fleet, up and billed, idled 120
    s for the old fleet's records (the terraform launch test: 278-305 s instead of 168-184), and a spot notice's
    next fleet was applied that much later, the launch saying "the job's training finished" meanwhile. The fleet the
    job left stands until the next one has the job, and nothing waits for it."""
    other = _g5_plan(catalog)

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        if why == "price":
            _ask_to_move(ckpt, other)
        write_record(ckpt, Preempted(launch_id=LID, step=11, checkpoint="c11", why=why, move=why == "price"))
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, _ScriptRunsOn(0))
    assert "error" not in result, result["error"]
    assert rec.calls[:5] == [("up", "f-1"), ("start", "f-1"), ("up", "f-2"), ("start", "f-2"), ("down", "f-1")]
    assert [c for c in rec.calls if c[0] == "wait_after_fit"] == [("wait_after_fit", "f-2")]  # the finished one only


def test_a_job_that_finishes_before_its_move_has_the_moves_fleet_released_before_the_wait(
    plan, tmp_path, catalog
) -> None:
    """A move's new fleet is up and the job told to leave, but its training finishes first (its last steps before the
    next checkpoint). The launch waited for the script's end (up to 30 min) with that unused fleet up and billed, and
    released it only at the end (a review); it is released first now, and said."""
    other = _g5_plan(catalog)

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        _ask_to_move(ckpt, other)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, _ScriptRunsOn(0))
    assert "error" not in result, result["error"]
    assert rec.calls == [("up", "f-1"), ("start", "f-1"), ("up", "f-2"), ("down", "f-2"), ("wait_after_fit", "f-1"),
                         ("stop", "f-1"), ("down", "f-1")]  # fmt: skip
    assert "srifty launch: the job finished before its move: f-2 is released" in result["echo"]


def test_a_voluntary_move_has_the_new_fleet_up_before_the_job_is_told_to_leave(plan, tmp_path, catalog) -> None:
    other = _g5_plan(catalog)

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        _ask_to_move(ckpt, other)
        assert markers.read_record(ckpt, Leave, LID).to_fleet == other.entries[0].fleet
        assert rec.calls[-1] == ("up", "f-2")  # up, and nothing released or started yet
        write_record(ckpt, Preempted(launch_id=LID, step=11, checkpoint="c11", why="price", move=True))
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job)
    (move,) = result["moves"]
    assert (move.trigger, move.voluntary, move.to_fleet) == ("price", True, other.entries[0].fleet)
    assert rec.calls[:5] == [("up", "f-1"), ("start", "f-1"), ("up", "f-2"), ("start", "f-2"), ("down", "f-1")]
    assert rec.envs["f-2"]["SRIFTY_PLAN"].endswith("plans/plan-2.json") and rec.envs["f-2"]["SRIFTY_RESUME"] == "c11"
    # the re-ranked plan's deadline is what was left at the move: it counts from then
    assert float(rec.envs["f-2"]["SRIFTY_PLAN_STARTED_UNIX"]) > float(rec.envs["f-1"]["SRIFTY_PLAN_STARTED_UNIX"])


def test_a_failed_job_stops_the_launch_and_releases_every_fleet(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, Failed(launch_id=LID, step=3, error="RuntimeError: CUDA out of memory"))

    rec, result = _run(plan, tmp_path, job)
    assert isinstance(result["error"], MigrationError) and "step 3: RuntimeError: CUDA out of memory" in str(
        result["error"]
    )
    assert rec.calls[-2:] == [("stop", "f-1"), ("down", "f-1")]
    # said at the start: what happens to the fleets if the launcher dies, and the flag that sets the window
    assert any(
        "if this launcher dies without releasing its fleets" in line and "600 s old (--heartbeat-max-age)" in line
        for line in result["echo"]
    ), result["echo"]


def test_a_job_failed_by_a_node_lost_without_a_notice_moves_on_from_the_newest_checkpoint(plan, tmp_path) -> None:
    """Rank 0 wrote FAILED.json (its collective lost the node); the launcher stopped the launch. The fleet's nodes
    now say, once they have decided, that they left to be replaced (75): the launch moves on, the next leg resuming
    from the newest checkpoint; while they decide, nothing is concluded. The move is a lost node's ("node", not a
    spot notice's: a review), and its next leg is the same entry again (one machine failed, not the market's
    capacity), not the plan's next one."""
    rec = LosingNodes()

    def job(ckpt, _) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        rec.verdicts["f-1"] = [None]  # the survivor decides
        write_record(ckpt, Failed(launch_id=LID, step=9, error="RuntimeError: Connection reset by peer"))
        time.sleep(0.3)  # polls while it decides: the launch goes on
        assert ("up", "f-2") not in rec.calls
        rec.verdicts["f-1"] = [75]
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    move = _moved_to_the_newest(plan, tmp_path, job, rec)
    assert (move.trigger, move.voluntary, move.step) == ("node", False, 9)
    assert move.from_fleet == move.to_fleet == plan.entries[0].fleet
    assert "after a node lost without a notice (its host or its GPU) at step 9" in move.describe()


def test_a_node_whose_gpu_failed_moves_at_once_and_again_without_progress_takes_the_next_entry(
    plan, tmp_path, monkeypatch
) -> None:
    """A node's exit record names its GPUs' fault: no notice is on its way, so the launcher moves at once (not after
    SILENT_LEAVE_S), to the same entry. That fleet's node fails the same way before the job got past the step: a
    fault that follows the entry (its type's driver, its image) takes the plan's next entry, not the same one again
    until --max-migrations (a review)."""
    from lightning_srifty.provision.launcher import launch as launch_module

    monkeypatch.setattr(launch_module, "VERDICT_READ_S", 0.0)  # the records are listed at every poll here
    rec = LosingNodes()

    def job(ckpt, _) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        rec.faults["f-1"], rec.verdicts["f-1"] = ["logged Xid (PCI:0000:00:1e): 79"], [75]
        _until(lambda: ("start", "f-2") in rec.calls)
        rec.faults["f-2"], rec.verdicts["f-2"] = ["nvidia-smi: GPU is lost."], [75]
        _until(lambda: ("start", "f-3") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, rec)
    assert "error" not in result, result.get("error")
    first, second = result["moves"]
    assert (first.trigger, first.from_fleet, first.to_fleet) == ("node", plan.entries[0].fleet, plan.entries[0].fleet)
    assert "a node's GPUs failed under the job (logged Xid (PCI:0000:00:1e): 79)" in first.why
    assert (second.trigger, second.to_fleet) == ("node", plan.entries[1].fleet)


def _moved_to_the_newest(plan, tmp_path: Path, job, rec: Recorder):
    """The launch's one move, whose next leg resumed from the newest checkpoint (the job left none of its own)."""
    rec, result = _run(plan, tmp_path, job, rec)
    assert "error" not in result, result.get("error")
    (move,) = result["moves"]
    assert rec.envs["f-2"]["SRIFTY_RESUME"] == "latest"
    return move


def test_a_checkpoint_the_store_did_not_take_resumes_the_newest_not_a_fresh_start(plan, tmp_path) -> None:
    """The leave's checkpoint stayed on the old fleet's disk: the launcher said it resumed from the newest checkpoint
    and handed the next leg an empty resume, which the job reads as a first start (step 0, every step lost)."""

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        left = Preempted(launch_id=LID, step=7, checkpoint="c7", why="spot", stored="local host-1:/tmp/c7")
        write_record(ckpt, left)
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job)
    assert "error" not in result, result.get("error")
    assert rec.envs["f-2"]["SRIFTY_RESUME"] == "latest"
    assert any("resuming from the newest checkpoint there" in line for line in result["echo"])


def test_a_fleet_that_lost_rank_0s_node_writes_no_record_and_still_moves_on(plan, tmp_path, monkeypatch) -> None:
    """Rank 0 was on the lost node: no FAILED.json, no PREEMPTED.json, and the other nodes left (their verdict 75)
    while the launcher waited for a record that never came. A verdict 75 with no record for SILENT_LEAVE_S (a notice's
    PREEMPTED.json comes well before its nodes' verdicts) is a leave."""
    from lightning_srifty.provision.launcher import launch as launch_module

    monkeypatch.setattr(launch_module, "SILENT_LEAVE_S", 0.2)
    monkeypatch.setattr(launch_module, "VERDICT_READ_S", 0.0)
    rec = LosingNodes()

    def job(ckpt, _) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        rec.verdicts["f-1"] = [75]
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    move = _moved_to_the_newest(plan, tmp_path, job, rec)
    assert (move.trigger, move.step) == ("node", None)


def test_a_fleet_whose_nodes_all_went_away_without_a_word_moves_on(plan, tmp_path, monkeypatch) -> None:
    """A review: a one-node fleet whose instance went away without a word (no notice, no record: a host that failed,
    a reclaim whose notice did not come) left srifty launch waiting with no end, since no peer was there to say it
    (the same when every node of a fleet goes at once). EC2 no longer listing an instance that recorded no end is
    now a leave like a lost node's, resumed from the newest checkpoint; a GPU fault's record, when there is one,
    names the move instead."""
    from lightning_srifty.provision.launcher import launch as launch_module

    monkeypatch.setattr(launch_module, "VERDICT_READ_S", 0.0)
    rec = LosingNodes()

    def job(ckpt, _) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        time.sleep(0.2)  # the job trains: nothing is concluded
        assert ("up", "f-2") not in rec.calls
        rec.gone["f-1"] = ["i-0123456789abcdef0"]
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    move = _moved_to_the_newest(plan, tmp_path, job, rec)
    assert plan.entries[0].market == "on-demand" and (move.trigger, move.step) == ("node", None)
    assert "went away without a word (i-0123456789abcdef0: EC2 no longer lists them" in move.why
    assert move.from_fleet == move.to_fleet  # one machine failed, not the market: the same entry again
    # the old fleet's handover was withdrawn as the job left it, before the next fleet came up: a node its group
    # starts in place of the lost one waits, and never trains beside the next leg
    assert rec.retired[0] == ("f-1", rec.calls.index(("up", "f-2")))


def test_a_node_gone_without_a_word_again_after_progress_restarts_the_same_entry(plan, tmp_path, monkeypatch) -> None:
    """A leave without a record has no step of its own, and a second lost node on the same entry read as a repeat
    without progress (the plan's next entry) even hours of training later. It now carries the job's last progress:
    past the last move's step, the same entry again; not past it, the next."""
    from lightning_srifty.protocol import Progress
    from lightning_srifty.provision.launcher import launch as launch_module

    monkeypatch.setattr(launch_module, "VERDICT_READ_S", 0.0)
    rec = LosingNodes()

    def job(ckpt, _) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, Progress(launch_id=LID, fleet="x", step=40, unix=time.time()))
        rec.gone["f-1"] = ["i-1"]
        _until(lambda: ("start", "f-2") in rec.calls)
        write_record(ckpt, Progress(launch_id=LID, fleet="x", step=90, unix=time.time()))
        rec.gone["f-2"] = ["i-2"]  # trained on from 40 to 90: the machine, again
        _until(lambda: ("start", "f-3") in rec.calls)
        rec.gone["f-3"] = ["i-3"]  # no step past 90: the entry's
        _until(lambda: ("start", "f-4") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=200))

    rec, result = _run(plan, tmp_path, job, rec)
    assert "error" not in result, result.get("error")
    moves = result["moves"]
    assert [m.step for m in moves] == [40, 90, 90]
    first = plan.entries[0].fleet
    assert [(m.from_fleet, m.to_fleet) for m in moves] == [
        (first, first),
        (first, first),
        (first, plan.entries[1].fleet),
    ]


def test_a_fleet_whose_nodes_all_ended_without_a_record_stops_the_launch(plan, tmp_path, monkeypatch) -> None:
    """Every node said its job ended (none to be replaced) and rank 0 wrote nothing: the launcher waited for a record
    until its heartbeat's life cap, with no instance left; it now says so once SILENT_LEAVE_S has passed."""
    from lightning_srifty.provision.launcher import launch as launch_module

    monkeypatch.setattr(launch_module, "SILENT_LEAVE_S", 0.2)
    monkeypatch.setattr(launch_module, "VERDICT_READ_S", 0.0)
    rec = LosingNodes()

    def job(ckpt, _) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        rec.verdicts["f-1"] = [143]

    rec, result = _run(plan, tmp_path, job, rec)
    assert isinstance(result["error"], MigrationError) and "without a record of its own" in str(result["error"])
    assert "[143]" in str(result["error"]) and ("up", "f-2") not in rec.calls


def test_a_job_that_failed_on_every_node_still_stops_the_launch(plan, tmp_path) -> None:
    rec = LosingNodes()

    def job(ckpt, _) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        rec.verdicts["f-1"] = [1, 1]
        write_record(ckpt, Failed(launch_id=LID, step=3, error="ValueError: a bug"))

    rec, result = _run(plan, tmp_path, job, rec)
    assert isinstance(result["error"], MigrationError) and "step 3: ValueError: a bug" in str(result["error"])
    assert ("up", "f-2") not in rec.calls


def test_a_request_beyond_max_migrations_is_declined_and_the_job_trains_on(plan, tmp_path, catalog) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, MoveRequest(launch_id=LID, why="drift", to_fleet="x", plan=plan.to_dict()))
        _until(lambda: not store.exists(ckpt, markers.MOVE_REQUEST))
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, max_migrations=0)
    assert result["moves"] == [] and ("up", "f-2") not in rec.calls
    assert not store.exists(str(tmp_path / "ckpt"), markers.LEAVE)
    # the job is told, so that its triggers stop waiting for a LEAVE that will not come (and stop asking)
    answer = markers.read_record(str(tmp_path / "ckpt"), MoveDeclined, LID)
    assert answer is not None and answer.to_fleet == "x" and answer.again is False


def test_a_move_whose_fleet_cannot_be_brought_up_is_declined_and_the_job_trains_on(plan, tmp_path) -> None:
    """A failed apply of the new fleet (what it made already released) ends the move, not the launch: the job's
    fleet is healthy. (In CI, a transient error in the new fleet's apply used to end the launch and release both.)"""

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, MoveRequest(launch_id=LID, why="drift", reason="slower", to_fleet="x", plan=plan.to_dict()))
        _until(lambda: ("failed", "f-2") in rec.calls and not store.exists(ckpt, markers.MOVE_REQUEST))
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, recorder=Recorder(fail_up=frozenset({"f-2"})))
    assert "error" not in result, result.get("error")
    assert result["moves"] == [] and not store.exists(str(tmp_path / "ckpt"), markers.LEAVE)
    answer = markers.read_record(str(tmp_path / "ckpt"), MoveDeclined, LID)
    assert answer is not None and answer.again is True and "terraform apply failed" in answer.reason
    assert rec.calls == [("up", "f-1"), ("start", "f-1"), ("failed", "f-2"), ("stop", "f-1"), ("down", "f-1")]
    assert any(
        "move to x declined: its fleet could not be brought up (terraform apply failed" in line
        and f"the job trains on {plan.entries[0].fleet}" in line
        for line in result["echo"]
    ), result["echo"]


def plan_profile():
    import copy

    from _support import MINIMAL
    from predictor.documents.profile import load_profile

    return load_profile({**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}})


def test_the_terraform_provisioner_needs_an_s3_prefix_and_says_so(plan, tmp_path, capsys, monkeypatch) -> None:
    from lightning_srifty.cli import main
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from predictor.exceptions import ConfigError

    plan.save(tmp_path / "plan.json")
    monkeypatch.chdir(tmp_path)
    base = ["launch", "--plan", str(tmp_path / "plan.json"), "--provisioner", "terraform"]
    assert main([*base, "--", "python", "train.py"]) == 2  # before anything starts: no such script here
    assert f"The training script train.py does not exist (looked in {tmp_path})" in capsys.readouterr().err
    (tmp_path / "train.py").write_text("")
    assert main([*base, "--", "train.py"]) == 2
    assert "needs --checkpoint-uri s3://bucket/prefix" in capsys.readouterr().err
    assert main([*base, "--checkpoint-uri", "/local/dir", "--", "train.py"]) == 2
    assert "keeps checkpoints in S3" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="a prefix inside the bucket"):
        TerraformProvisioner(tmp_path, "s3://bucket")
    with pytest.raises(ConfigError, match=r"'Bad_Bucket' is not a valid S3 bucket name") as bad:
        TerraformProvisioner(tmp_path, "s3://Bad_Bucket/runs/a/")  # before the launcher writes a record there
    assert bad.value.parameter == "checkpoint_uri"

    provisioner = TerraformProvisioner(tmp_path, "s3://bucket/runs/a/")
    assert provisioner.checkpoint_uri == "s3://bucket/runs/a"
    assert (provisioner.options.bucket, provisioner.options.checkpoint_prefix) == ("bucket", "runs/a/")
    assert provisioner.options.handover


def test_the_aws_endpoint_reaches_every_client_of_the_launcher(plan, tmp_path, monkeypatch) -> None:
    """--aws-endpoint reached Terraform only: the launcher's own S3 records and heartbeat went to real AWS (issue #23
    item 4). Now the whole process uses it: boto3 clients and the records' filesystem."""
    import os

    import boto3

    from lightning_srifty.cli import main

    seen: dict = {}

    def fake_launch(plan, script, **kwargs):
        seen["records"] = store.filesystem("s3://bucket/runs/a").storage_options.get("endpoint_url")
        seen["boto3"] = boto3.client("ec2", region_name="us-east-1").meta.endpoint_url
        return []

    monkeypatch.setattr("lightning_srifty.provision.launcher.launch.launch", fake_launch)
    # the command sets AWS_ENDPOINT_URL for its process; the autouse guard in conftest.py restores it after the test
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    plan.save(tmp_path / "plan.json")
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--plan", "plan.json", "--provisioner", "terraform", "--checkpoint-uri", "s3://bucket/runs/a/"]
    assert main([*args, "--aws-endpoint", "http://127.0.0.1:9", "--", "train.py"]) == 0
    assert seen == {"records": "http://127.0.0.1:9", "boto3": "http://127.0.0.1:9"}
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("flags", "limits"),
    [
        ([], (1200.0, 1800.0)),
        (["--stall-timeout-min", "45", "--after-fit-timeout-min", "90"], (2700.0, 5400.0)),
        (["--stall-timeout-min", "0.5", "--after-fit-timeout-min", "0.5"], (60.0, 60.0)),  # the module's least
        (["--stall-timeout-min", "0"], (None, 1800.0)),  # no watch: the nodes' none either (the module: 0)
    ],
    ids=["default", "set", "under-the-modules-least", "stall-watch-off"],
)
def test_the_launchs_limits_reach_its_fleets_nodes(plan, tmp_path, monkeypatch, flags, limits) -> None:
    """The launcher cannot see a node's hung teardown nor a script silent after its training: each fleet's nodes end
    them with the launch's own limits (the module's watchdog.stall_s and after_fit_s), not the module's defaults."""
    from lightning_srifty.cli import main

    seen: dict = {}

    def fake_launch(plan, script, **kwargs):
        seen["options"] = kwargs["provisioner"].options
        return []

    monkeypatch.setattr("lightning_srifty.provision.launcher.launch.launch", fake_launch)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    plan.save(tmp_path / "plan.json")
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    args = ["launch", "--plan", "plan.json", "--provisioner", "terraform", "--checkpoint-uri", "s3://bucket/runs/a/"]
    assert main([*args, *flags, "--", "train.py"]) == 0
    assert (seen["options"].stall_timeout_s, seen["options"].after_fit_timeout_s) == limits


class NoCapacity(Recorder):
    """EC2 answers for the first ``fails`` fleets brought up as it does when there is no capacity now."""

    def __init__(self, fails: int, code: str = "InsufficientInstanceCapacity") -> None:
        super().__init__()
        self.fails, self.code = fails, code

    def up(self, plan, index, name) -> LaunchedFleet:
        from predictor.exceptions import CapacityError

        if self.fails > 0:
            self.fails -= 1
            self.calls.append(("refused", f"{name}:{index}"))
            raise CapacityError(f"EC2 could not start {plan.entries[index].fleet}: {self.code}", code=self.code)
        return super().up(plan, index, name)


def test_a_capacity_error_moves_to_the_next_entry_and_says_what_it_costs(plan, tmp_path) -> None:
    from lightning_srifty.provision.launcher.legs import up_or_next

    rec, echo = NoCapacity(2), []
    names = iter(["f-1", "f-2", "f-3", "f-4"])
    fleet, _ = up_or_next(rec, plan, 0, names, echo.append)
    assert rec.calls == [("refused", "f-1:0"), ("refused", "f-2:1"), ("up", "f-3")] and fleet.index == 2
    first, chosen = plan.entries[0], plan.entries[2]
    assert echo[0] == f"srifty launch: {first.fleet} ({first.market}) could not start: InsufficientInstanceCapacity"
    pct = (chosen.cost_usd / first.cost_usd - 1) * 100
    assert echo[-1].startswith(f"srifty launch: started entry 2 of the plan, {chosen.fleet} ({chosen.market})")
    assert f"{pct:+.0f}% cost against the first choice" in echo[-1] and "tried: " in echo[-1]


def test_failover_is_bounded_and_names_every_fleet_it_tried(plan, tmp_path) -> None:
    from lightning_srifty.provision.launcher.legs import up_or_next
    from predictor.exceptions import CapacityError

    rec = NoCapacity(99, "VcpuLimitExceeded")
    with pytest.raises(CapacityError, match=r"No fleet of the plan could start \(3 tried") as exc:
        up_or_next(rec, plan, 0, (f"f-{n}" for n in range(9)), lambda line: None, max_attempts=3)
    assert exc.value.code == "exhausted" and str(exc.value).count("VcpuLimitExceeded") == 3
    assert "srifty recommend --launchable" in str(exc.value)


class ZonalNoCapacity(Recorder):
    """EC2 has no capacity for entry 0 in its default zone nor in use1-az2; use1-az4 has some."""

    def __init__(self, code: str = "InsufficientInstanceCapacity", full: tuple = ((0, None), (0, "use1-az2"))) -> None:
        super().__init__()
        self.code, self.full, self.asked = code, set(full), []

    def zones_after(self, plan, index, code, tried):
        from lightning_srifty.provision.base import ZoneChoice

        self.asked.append((index, code, list(tried)))
        if code != "InsufficientInstanceCapacity":
            return []  # a quota is the region's
        return [ZoneChoice("use1-az2", "spot $0.41/h there"), ZoneChoice("use1-az4", "spot $0.45/h there")]

    def up(self, plan, index, name, zone=None) -> LaunchedFleet:
        from predictor.exceptions import CapacityError

        if (index, zone) in self.full or (zone is None and self.code != "InsufficientInstanceCapacity"):
            self.calls.append(("refused", f"{name}:{index}:{zone}"))
            raise CapacityError(f"EC2 could not start {plan.entries[index].fleet}: {self.code}", code=self.code)
        self.calls.append(("up", f"{name}:{index}:{zone}"))
        return LaunchedFleet(plan, index, name)


def test_no_capacity_in_a_zone_tries_the_same_fleet_in_other_zones_first(plan, tmp_path) -> None:
    from lightning_srifty.provision.launcher.legs import up_or_next

    rec, echo = ZonalNoCapacity(), []
    fleet, _ = up_or_next(rec, plan, 0, (f"f-{n}" for n in range(1, 9)), echo.append)
    assert rec.calls == [("refused", "f-1:0:None"), ("refused", "f-2:0:use1-az2"), ("up", "f-3:0:use1-az4")]
    assert fleet.index == 0 and rec.asked == [(0, "InsufficientInstanceCapacity", [None])]  # asked once per entry
    first = plan.entries[0]
    assert echo[1] == (
        f"srifty launch: trying {first.fleet} ({first.market}) in use1-az2 (spot $0.41/h there); use1-az4 (spot "
        "$0.45/h there) before the plan's next entry"
    )
    assert f"srifty launch: {first.fleet} ({first.market}) could not start in use1-az2: Insuff" in echo[2]
    assert echo[-1].startswith(
        f"srifty launch: started entry 0 of the plan, {first.fleet} ({first.market}) in use1-az4 (spot $0.45/h "
        "there), instead of the plan's zone"
    )
    # every zone full: the next entry, after at most the two other zones
    rec = ZonalNoCapacity(full=((0, None), (0, "use1-az2"), (0, "use1-az4")))
    fleet, _ = up_or_next(rec, plan, 0, (f"g-{n}" for n in range(1, 9)), lambda line: None)
    assert fleet.index == 1 and [c[1] for c in rec.calls] == ["g-1:0:None", "g-2:0:use1-az2", "g-3:0:use1-az4",
                                                               "g-4:1:None"]  # fmt: skip
    # a regional refusal (a quota) goes to the next entry at once
    rec = ZonalNoCapacity(code="VcpuLimitExceeded", full=())
    with pytest.raises(Exception, match="No fleet of the plan could start"):
        up_or_next(rec, plan, 0, (f"h-{n}" for n in range(1, 9)), lambda line: None, max_attempts=2)
    assert [c[1] for c in rec.calls] == ["h-1:0:None", "h-2:1:None"]


def test_a_launch_whose_first_fleet_has_no_capacity_trains_on_the_next(plan, tmp_path, monkeypatch) -> None:
    import lightning_srifty.provision.launcher.legs as legs_module

    class Flaky(NoCapacity):
        pass

    flaky = Flaky(1)

    def timed_up(p, pl, i, n, z=None, up=None):  # no start-up time recorded; the fleet kept as _timed_up does
        fleet = p.up(pl, i, n)
        if up is not None:
            up.append(fleet)
        return fleet, 0.0

    monkeypatch.setattr(legs_module, "_timed_up", timed_up)

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-2") in flaky.calls)
        write_record(ckpt, Finished(launch_id=LID, step=5))

    result: dict = {"echo": []}
    thread = threading.Thread(
        target=lambda: result.update(
            moves=launch(
                plan, provisioner=flaky, workdir=tmp_path, checkpoint_dir=str(tmp_path / "ckpt"), poll_s=0.02,
                name="f", launch_id=LID, echo=result["echo"].append,
            )
        ),
        daemon=True,
    )  # fmt: skip
    thread.start()
    job(str(tmp_path / "ckpt"), flaky)
    thread.join(30)
    assert result.get("moves") == [] and flaky.calls[0] == ("refused", "f-1:0")
    assert flaky.envs["f-2"]["SRIFTY_CHOICE"] == "1"  # the job is told which entry it runs on


def test_fleet_names_stay_unique_across_several_moves(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        for n in (1, 2):
            _until(lambda n=n: ("start", f"f-{n}") in rec.calls)
            write_record(ckpt, Preempted(launch_id=LID, step=n, checkpoint=f"c{n}", why="notice"))
        _until(lambda: ("start", "f-3") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job)
    assert len(result["moves"]) == 2
    assert [name for call, name in rec.calls if call == "up"] == ["f-1", "f-2", "f-3"]


def test_a_move_is_reported_when_the_new_leg_steps_with_the_downtime_measured_between_the_legs(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        left = Preempted(
            launch_id=LID, step=120, checkpoint="c120", why="spot interruption notice", save_s=3.21,
            last_step_unix=1000.0, durable_unix=1003.3,
        )  # fmt: skip
        write_record(ckpt, left)
        _until(lambda: ("start", "f-2") in rec.calls)
        # an earlier leg's or launch's STARTED must not end this move's downtime
        with pytest.warns(UserWarning, match="belongs to launch OLD") as caught:
            write_record(ckpt, Started(launch_id="OLD", resumed_from="c120", first_step_unix=1001.0))
            _until(lambda: _warned(caught, "belongs to launch OLD"))  # the launcher read it (and ignored it)
        write_record(ckpt, Started(launch_id=LID, fleet="x", step=121, first_step_unix=1006.4, resumed_from="c120"))
        _until(lambda: (tmp_path / "migrations.jsonl").exists())
        write_record(ckpt, Finished(launch_id=LID, step=200))

    _, result = _run(plan, tmp_path, job)
    (move,) = result["moves"]
    assert move.downtime_s == pytest.approx(6.4) and move.checkpoint_s == 3.21 and move.up_s is not None
    (line,) = [e for e in result["echo"] if "moved from" in e]
    assert line.startswith(
        f"srifty launch: moved from {plan.entries[0].fleet} to {plan.entries[1].fleet} after a spot notice at step "
        "120: checkpoint 3.2 s, new fleet up "
    )
    assert line.endswith(", downtime 6.4 s")
    logged = json.loads((tmp_path / "migrations.jsonl").read_text())
    assert logged["downtime_s"] == pytest.approx(6.4) and logged["first_step_unix"] == 1006.4


def test_records_of_another_launch_are_ignored_and_an_earlier_launchs_handovers_are_cleared(plan, tmp_path) -> None:
    ckpt = str(tmp_path / "ckpt")
    write_record(ckpt, markers.Handover(launch_id="OLD", fleet="f-1", env={"SRIFTY_RESUME": "old.ckpt"}))
    write_record(ckpt, Heartbeat(launch_id="OLD", written_unix=time.time() - 3600, max_age_s=600))  # long dead

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        assert not store.exists(ckpt, markers.handover("f-1"))  # never boot a fleet from another launch's
        write_record(ckpt, Finished(launch_id="OLD", step=99))  # e.g. an old job still ending
        _until(lambda: _warned(caught, "FINISHED.json belongs to launch OLD"))  # the launcher read it...
        assert ("down", "f-1") not in rec.calls  # ...and did not take it for this launch's end
        write_record(ckpt, Finished(launch_id=LID, step=20))

    # job() runs inside this block and waits on what it records (``caught`` is bound before job is called)
    with pytest.warns(UserWarning, match="FINISHED.json belongs to launch OLD, not to this one \\(L1\\)") as caught:
        rec, result = _run(plan, tmp_path, job)
    assert result["moves"] == [] and rec.calls[-1] == ("down", "f-1")


def test_a_live_launch_in_the_same_folder_is_refused_with_the_fix(plan, tmp_path) -> None:
    ckpt = str(tmp_path / "ckpt")
    write_record(ckpt, Heartbeat(launch_id="OTHER", written_unix=time.time(), max_age_s=600))
    with pytest.raises(MigrationError, match=r"Another srifty launch \(OTHER\) is live in .*another checkpoint folder"):
        launch(plan, provisioner=Recorder(), workdir=tmp_path, checkpoint_dir=ckpt, launch_id=LID)


def test_the_heartbeat_is_refreshed_with_the_fleets_life_cap_and_removed_at_the_end(plan, tmp_path) -> None:
    beats: list[Heartbeat] = []

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        for _ in range(2):
            first = markers.read_record(ckpt, Heartbeat, LID)
            _until(lambda first=first: markers.read_record(ckpt, Heartbeat, LID).written_unix > first.written_unix)
            beats.append(markers.read_record(ckpt, Heartbeat, LID))
        write_record(ckpt, Finished(launch_id=LID, step=20))

    t0 = time.time()
    rec, result = _run(plan, tmp_path, job, heartbeat_s=0.1, heartbeat_max_age_s=0.5)
    assert "moves" in result, result
    assert beats[1].written_unix > beats[0].written_unix and beats[0].max_age_s == 0.5
    predicted = plan.entries[0].life_cap_h()  # hours: the default cap
    assert beats[0].max_life_until_unix == pytest.approx(t0 + predicted * 3600, abs=5)
    env = rec.envs["f-1"]
    assert float(env["SRIFTY_MAX_LIFE_UNTIL_UNIX"]) == pytest.approx(beats[0].max_life_until_unix, abs=0.01)
    assert env["SRIFTY_HEARTBEAT_MAX_AGE_S"] == "0.500" and env["SRIFTY_LAUNCH_ID"] == LID
    assert not store.exists(str(tmp_path / "ckpt"), markers.HEARTBEAT)  # this launch is over


def test_max_life_h_overrides_the_cap_and_a_job_that_left_on_it_ends_the_launch_clearly(plan, tmp_path) -> None:
    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(
            ckpt, Preempted(launch_id=LID, step=5, checkpoint="c5", why="the fleet's life cap", trigger="max-life")
        )

    t0 = time.time()
    rec, result = _run(plan, tmp_path, job, max_life_h=0.5)
    assert float(rec.envs["f-1"]["SRIFTY_MAX_LIFE_UNTIL_UNIX"]) == pytest.approx(t0 + 1800, abs=5)
    assert isinstance(result["error"], MigrationError) and "its checkpoint is c5" in str(result["error"])
    assert "raise max_life_h" in str(result["error"]) and ("up", "f-2") not in rec.calls
    # srifty launch says its flags: the error is a template (the launch's parser renders it)
    from lightning_srifty.cli import build_parser, error_words

    parser = build_parser()
    words = error_words(result["error"], parser, parser.parse_args(["launch", "--plan", "p", "--", "x.py"]))
    assert "raise --max-life-h (the cap" in words, words
    assert rec.calls[-1] == ("down", "f-1")


def test_heartbeat_settings_that_cannot_work_are_refused(plan, tmp_path, capsys) -> None:
    """The library names its parameters, srifty launch its flags, from one refusal (issue #39: no flag is written in
    the library; the CLI reads each setting's flag off its own parser)."""
    with pytest.raises(ConfigError, match=r"^heartbeat_max_age_s \(1 s\) must be at least twice heartbeat_s") as bad:
        launch(plan, provisioner=Recorder(), workdir=tmp_path, heartbeat_s=1, heartbeat_max_age_s=1)
    assert "--" not in str(bad.value) and bad.value.parameter == "heartbeat_max_age_s"
    with pytest.raises(ConfigError, match=r"The 'max_life_h' parameter of launch\(\) must be a number > 0. Got 0."):
        launch(plan, provisioner=Recorder(), workdir=tmp_path, max_life_h=0)

    from lightning_srifty.cli import main

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    (tmp_path / "train.py").write_text("print('never run')\n")
    argv = ["launch", "--plan", str(path), "--workdir", str(tmp_path / "w"), "--heartbeat-s", "5"]
    assert main([*argv, "--heartbeat-max-age", "6", "--", str(tmp_path / "train.py")]) == 2
    said = capsys.readouterr().err
    assert said.startswith("srifty: error: --heartbeat-max-age (6.0 s) must be at least twice --heartbeat-s (5.0 s)")
    assert "Raise --heartbeat-max-age or lower --heartbeat-s." in said and "_s" not in said


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_releases_every_fleet_brought_up_and_ends_with_its_exit_code(plan, tmp_path, signum) -> None:
    """launch() in the main thread (signal handlers live there); the job asks to move, so two fleets are up when
    the signal comes."""
    rec = Recorder()
    ckpt = str(tmp_path / "ckpt")
    other = plan.to_dict()

    def job() -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, MoveRequest(launch_id=LID, why="drift", to_fleet="x", plan={**other, "chosen": 1}))
        _until(lambda: store.exists(ckpt, markers.LEAVE))
        os.kill(os.getpid(), signum)

    previous = signal.getsignal(signum)
    threading.Thread(target=job, daemon=True).start()
    with pytest.raises(LaunchInterrupted) as caught:
        launch(plan, provisioner=rec, workdir=tmp_path, checkpoint_dir=ckpt, poll_s=0.02, name="f", launch_id=LID,
               echo=lambda *a: None)  # fmt: skip
    assert caught.value.exit_code == 128 + signum and caught.value.released == ["f-1", "f-2"]
    assert {("down", "f-1"), ("down", "f-2")} <= set(rec.calls)
    assert signal.getsignal(signum) is previous  # the handlers are put back


def test_the_torchrun_wrapper_says_a_planned_leave_in_one_line_and_keeps_real_failures(tmp_path) -> None:
    import subprocess
    import sys

    outputs = {}
    for code in (75, 3):
        script = tmp_path / f"exit{code}.py"
        script.write_text(f"import sys\nsys.exit({code})\n")
        cmd = [sys.executable, "-m", "lightning_srifty.migrate.torchrun", "--standalone", "--nproc_per_node=1"]
        outputs[code] = subprocess.run([*cmd, str(script)], capture_output=True, text=True, timeout=180)
    leave = outputs[75]
    assert leave.returncode == 75, leave.stderr
    assert "Traceback" not in leave.stderr and "FAILED" not in leave.stderr and "exitcode" not in leave.stderr
    assert "a planned preemption, not a failure" in leave.stderr
    failed = outputs[3]
    assert failed.returncode == 1 and "exit3.py FAILED" in failed.stderr and "exitcode  : 3" in failed.stderr


def test_a_planned_leave_of_several_ranks_hides_torchruns_stop_of_the_others_and_real_failures_show(tmp_path) -> None:
    """A trial of srifty launch --provider local: on a planned leave, the first rank out exited 75 and torchrun
    stopped the others (SIGTERM), which it counts as failures: the wrapper raised, and torchrun's ChildFailedError
    traceback and FAILED report reached the terminal though the move worked. A rank torchrun stopped that ended by
    its signal is part of the leave; one that crashed, or ended otherwise when stopped, is a failure, shown whole."""
    import subprocess
    import sys

    head = "import os, signal, sys, time\nrank = int(os.environ['RANK'])\n"
    scripts = {
        # rank 0 leaves with its checkpoint; rank 1 is still at work when torchrun stops it
        "leave": "if rank == 0:\n    time.sleep(1)\n    sys.exit(75)\ntime.sleep(60)\n",
        # rank 1 crashes; torchrun stops rank 0
        "crash": "if rank == 1:\n    time.sleep(1)\n    sys.exit(3)\ntime.sleep(60)\n",
        # rank 0 leaves; rank 1, stopped by torchrun, fails on the way out
        "stopped_badly": "signal.signal(signal.SIGTERM, lambda *a: os._exit(3))\n"
        "if rank == 0:\n    time.sleep(1)\n    sys.exit(75)\ntime.sleep(60)\n",
    }
    out = {}
    for name, body in scripts.items():
        (tmp_path / f"{name}.py").write_text(head + body)
        cmd = [sys.executable, "-m", "lightning_srifty.migrate.torchrun", "--standalone", "--nproc_per_node=2"]
        out[name] = subprocess.run([*cmd, str(tmp_path / f"{name}.py")], capture_output=True, text=True, timeout=180)
    leave = out["leave"]
    assert leave.returncode == 75, leave.stderr
    for shown in ("Traceback", "FAILED", "exitcode", "closing signal", "ChildFailedError"):
        assert shown not in leave.stderr, leave.stderr
    assert "(exit 75 on 1 rank(s), after its checkpoint; torchrun stopped the other 1): a planned preemption" in (
        leave.stderr
    )
    for name in ("crash", "stopped_badly"):
        failed = out[name]
        assert failed.returncode == 1 and f"{name}.py FAILED" in failed.stderr, failed.stderr
        assert "exitcode  : 3" in failed.stderr and "closing signal SIGTERM" in failed.stderr, failed.stderr
        assert "Traceback" in failed.stderr and "planned preemption" not in failed.stderr


def test_a_fleet_that_never_reports_is_detected_reported_and_released(plan, tmp_path) -> None:
    """#14 item 3: a failed boot or setup writes nothing; the launcher gives up after the timeout and releases."""
    recorder, result = _run(plan, tmp_path, lambda ckpt, rec: None, start_timeout_s=1.0)
    error = result["error"]
    assert isinstance(error, MigrationError) and "has not reported in" in str(error)
    assert "console output" in str(error) and "--start-timeout-min" in str(error)
    assert recorder.calls[-2:] == [("stop", "f-1"), ("down", "f-1")]  # released


def test_a_silent_terraform_fleet_points_at_its_logs(plan) -> None:
    """The nodes of a released root module are gone, their logs are not: the error names srifty logs for it."""
    from lightning_srifty.provision.base import LaunchedFleet
    from lightning_srifty.provision.launcher.watches import Silence

    silence = Silence(0.0, print)
    fleet = LaunchedFleet(plan, 0, "walk-1", {"folder": Path("srifty/launch/fleets/walk-1")})
    silence.started(fleet)
    with pytest.raises(MigrationError, match=r"released; what its nodes logged .*: srifty logs --dir srifty/launch/"):
        silence.check(fleet, None)


def test_progress_while_a_fleet_has_not_reported_and_none_once_it_has(plan, tmp_path, monkeypatch) -> None:
    from lightning_srifty.provision.launcher import watches

    clock = {"t": 0.0}
    monkeypatch.setattr(watches.time, "monotonic", lambda: clock["t"])
    notes: list[str] = []
    silence = watches.Silence(600, notes.append)
    fleet = LaunchedFleet(plan, 0, "f-1")
    silence.started(fleet)
    for t in (30, 61, 90, 125):
        clock["t"] = t
        silence.check(fleet, None)
    assert len(notes) == 2 and "waiting for the job on" in notes[0] and "of at most 10 min" in notes[0]
    silence.check(fleet, Started(launch_id=LID, fleet="x", step=1, first_step_unix=time.time()))
    clock["t"] = 10_000
    silence.check(fleet, None)  # heard from: never times out afterwards
    assert len(notes) == 2


def test_an_auto_scaling_group_without_capacity_is_caught_and_named(monkeypatch) -> None:
    """An Auto Scaling group's apply ends before EC2 launches anything: srifty waits for its instances and turns a
    failed scaling activity (no capacity, a quota) into the CapacityError that moves the launch on (botocore's
    Stubber: moto's groups always launch)."""
    import boto3
    from botocore.stub import Stubber

    from lightning_srifty.provision.launcher.terraform_fleet import wait_for_capacity
    from predictor.exceptions import CapacityError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = boto3.client("autoscaling", region_name="us-east-1")
    group = {
        "AutoScalingGroupName": "g",
        "MinSize": 2,
        "MaxSize": 2,
        "DesiredCapacity": 2,
        "DefaultCooldown": 0,
        "AvailabilityZones": ["us-east-1a"],
        "HealthCheckType": "EC2",
        "CreatedTime": "2026-11-25T00:00:00Z",
    }
    one = {"InstanceId": "i-1", "AvailabilityZone": "us-east-1a", "LifecycleState": "InService",
           "HealthStatus": "Healthy", "ProtectedFromScaleIn": False}  # fmt: skip
    failed = {
        "ActivityId": "a", "AutoScalingGroupName": "g", "Cause": "c", "StartTime": "2026-11-25T00:00:00Z",
        "StatusCode": "Failed", "StatusMessage": "We currently do not have sufficient p4d.24xlarge capacity in the "
        "Availability Zone you requested (us-east-1a). InsufficientInstanceCapacity. Launching EC2 instance failed.",
    }  # fmt: skip
    with Stubber(client) as stub:
        stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [{**group, "Instances": [one]}]})
        stub.add_response("describe_scaling_activities", {"Activities": []})
        stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [{**group, "Instances": [one]}]})
        stub.add_response("describe_scaling_activities", {"Activities": [failed]})
        lines: list[str] = []
        with pytest.raises(CapacityError, match="could not launch: We currently do not have") as exc:
            wait_for_capacity(client, "g", 2, timeout_s=60, poll_s=0, echo=lines.append)
        assert exc.value.code == "InsufficientInstanceCapacity" and lines == [
            "srifty launch: g: 1 of 2 instances launched, waiting"
        ]
    with Stubber(client) as stub:
        two = [one, {**one, "InstanceId": "i-2", "LifecycleState": "Pending"}]
        stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [{**group, "Instances": two}]})
        wait_for_capacity(client, "g", 2, timeout_s=60, poll_s=0)  # both launched: returns
    with Stubber(client) as stub:
        stub.add_response("describe_auto_scaling_groups", {"AutoScalingGroups": [{**group, "Instances": []}]})
        stub.add_response("describe_scaling_activities", {"Activities": []})
        with pytest.raises(CapacityError, match="launched 0 of 2 instances in 0 s") as exc:
            wait_for_capacity(client, "g", 2, timeout_s=0, poll_s=0)
        assert exc.value.code == "capacity-timeout"


def test_the_launcher_is_named_steps_not_one_long_function() -> None:
    """Issue #24 item 3: the launch loop was one function of 300 lines with closures over mutable lists; it is now
    :class:`Launcher`, whose state is attributes and whose steps are methods. No function of the module may grow past
    100 lines again."""
    import ast

    from lightning_srifty.provision.launcher import launch as launch_module

    long = {}
    for path in Path(launch_module.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
            function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if (function and size > 60) or (isinstance(node, ast.ClassDef) and size > 300):
                long[f"{path.name}:{node.name}"] = size
    assert long == {}, f"split these into named steps: {long}"


def test_a_half_made_fleet_that_could_not_be_destroyed_is_destroyed_when_the_launch_ends(plan, tmp_path, monkeypatch):
    """An apply fails (a declined move's new fleet, say) and the destroy of what it made fails too: the fleet is kept
    in the provisioner's leftovers, and the launcher's release at its end destroys it once more; if that fails too,
    the line names the command that releases it. Before, the first failure was only echoed and nothing came back."""
    from lightning_srifty.provision.launcher import launch as launch_module
    from lightning_srifty.provision.launcher import terraform_fleet
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from predictor.exceptions import ProvisionError

    lines: list[str] = []
    provisioner = TerraformProvisioner(tmp_path, "s3://bucket/runs/a/", echo=lines.append)
    monkeypatch.setattr(terraform_fleet, "generate", lambda *a, **k: None)

    def failed_apply(folder, **kwargs):
        raise ProvisionError("terraform apply failed: InvalidParameterValue")

    destroyed: list[str] = []
    answers = iter([ProvisionError("the API went away"), None, ProvisionError("still away")])

    def destroy(folder, **kwargs):
        answer = next(answers)
        if answer is not None:
            raise answer
        destroyed.append(str(folder))

    monkeypatch.setattr(terraform_fleet, "apply", failed_apply)
    monkeypatch.setattr(terraform_fleet, "destroy", destroy)
    with pytest.raises(ProvisionError):
        provisioner.up(plan, 0, "mig-2")
    (left,) = provisioner.leftovers
    assert left.name == "mig-2" and any("srifty down --dir" in line and "mig-2" in line for line in lines)
    launch_module._release(provisioner, [], lines.append)  # the launch ends: destroyed this time
    assert destroyed == [str(tmp_path / "fleets" / "mig-2")] and provisioner.leftovers == []
    with pytest.raises(ProvisionError):
        provisioner.up(plan, 0, "mig-3")  # its destroy fails, and fails again at the end
    monkeypatch.setattr(terraform_fleet, "destroy", lambda *a, **k: (_ for _ in ()).throw(ProvisionError("gone")))
    launch_module._release(provisioner, [], lines.append)
    assert "could not be destroyed" in lines[-1] and f"srifty down --dir {tmp_path / 'fleets' / 'mig-3'}" in lines[-1]


def test_a_signal_during_the_clean_up_destroy_keeps_the_half_made_fleet(plan, tmp_path, monkeypatch) -> None:
    """The user's first signal arrives while a failed apply's leftovers are destroyed: the fleet is still kept for
    the release at the launch's end, and the interruption goes on up (it is not swallowed as a failed destroy)."""
    from lightning_srifty.provision.launcher import terraform_fleet
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from predictor.exceptions import ProvisionError

    class Interrupted(BaseException):
        pass

    provisioner = TerraformProvisioner(tmp_path, "s3://bucket/runs/a/", echo=lambda line: None)
    monkeypatch.setattr(terraform_fleet, "generate", lambda *a, **k: None)
    monkeypatch.setattr(terraform_fleet, "apply", lambda *a, **k: (_ for _ in ()).throw(ProvisionError("failed")))
    monkeypatch.setattr(terraform_fleet, "destroy", lambda *a, **k: (_ for _ in ()).throw(Interrupted()))
    with pytest.raises(Interrupted):
        provisioner.up(plan, 0, "mig-2")
    assert [f.name for f in provisioner.leftovers] == ["mig-2"]


def test_a_launch_resumes_from_the_newest_checkpoint_an_interrupted_one_left(plan, tmp_path, monkeypatch, capsys):
    """A launch stopped with Ctrl-C left a checkpoint; `srifty launch --resume` (latest) starts the first fleet's job
    from the newest sound one in the folder (a new user's walk found only a fresh start), or a given one; with none
    there it refuses before any fleet is up."""
    import torch

    from lightning_srifty.protocol import VARIABLES

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for step in (3, 9):
        torch.save({"state_dict": {}, "global_step": step}, ckpt / f"preempt-step={step}.ckpt")

    def job(folder, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(folder, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, resume=str(ckpt / "preempt-step=9.ckpt"))
    assert "error" not in result, result.get("error")
    assert rec.envs["f-1"][VARIABLES["resume"]] == str(ckpt / "preempt-step=9.ckpt")
    assert f"srifty launch: the job resumes from {ckpt / 'preempt-step=9.ckpt'}" in result["echo"]

    # `srifty launch --resume` (latest): the newest sound checkpoint of the launch's folder; none there: refused
    from lightning_srifty.cli import main
    from lightning_srifty.provision.launcher import launch as launch_module

    asked: dict = {}
    monkeypatch.setattr(
        launch_module, "launch", lambda plan, script, settings, **kw: asked.update(vars(settings)) or []
    )
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "checkpoints").symlink_to(ckpt)
    assert main(["launch", "--resume", "--plan", "plan.json", "--workdir", "wd", "--", "train.py"]) == 0
    assert asked["resume"] == str((tmp_path / "wd" / "checkpoints").resolve() / "preempt-step=9.ckpt")
    assert main(["launch", "--resume", "--plan", "plan.json", "--workdir", "empty", "--", "train.py"]) == 2
    assert "holds no sound checkpoint to resume from" in capsys.readouterr().err


def test_srifty_launch_says_how_to_continue_and_refuses_a_choice_or_workdir_that_cannot_work(
    plan, tmp_path, monkeypatch, capsys
) -> None:
    import sys as _sys

    import torch

    from lightning_srifty.cli import launch as cli_launch
    from lightning_srifty.cli import main

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan.to_dict()))
    (tmp_path / "train.py").write_text("print('train')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["launch", "--plan", str(plan_file), "--choice", "40", "--", "train.py"]) == 2
    assert f"--choice must be between 0 and {len(plan.entries) - 1}. Got 40." in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert main(["launch", "--plan", str(plan_file), "--workdir", "afile/x", "--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "--workdir afile/x cannot be used" in err and "give a folder srifty launch may create" in err

    # after an interrupt: the newest checkpoint and the command that continues from it (the script's arguments kept)
    ckpt = tmp_path / "wd" / "checkpoints"
    ckpt.mkdir(parents=True)
    torch.save({"state_dict": {}, "global_step": 4}, ckpt / "preempt-step=4.ckpt")
    argv = ["launch", "--plan", "plan.json", "--resume", "old.ckpt", "--workdir", "wd", "--", "train.py", "--lr", "1"]
    monkeypatch.setattr(_sys, "argv", ["srifty", *argv])
    args = types.SimpleNamespace(checkpoint_uri=None, workdir="wd")
    said = cli_launch._how_to_continue(args)
    assert said == (
        f"srifty launch: the newest checkpoint is {ckpt.resolve() / 'preempt-step=4.ckpt'}; to continue from it: "
        "srifty launch --resume latest --plan plan.json --workdir wd -- train.py --lr 1"
    ), said


def test_a_cloud_fleets_boot_to_first_step_is_measured_for_the_ranking(plan) -> None:
    """Issue #35 item 9: the nodes' boot, the environment's install and the warm-up were counted nowhere but as
    defaults. The first step of a cloud fleet's first leg, less the time its provisioning took, is recorded for its
    instance types (predictor.runs.startup.record_ready); a resumed leg or a local fleet records nothing."""
    from lightning_srifty.provision.launcher.watches import Silence
    from predictor.runs import startup

    silence = Silence(600, lambda line: None)
    now = time.time()
    fleet = LaunchedFleet(plan, 0, "cloud-1", {"up_unix": now - 400.0, "provision_s": 100.0})
    silence.started(fleet)
    silence.check(fleet, Started(launch_id=LID, fleet="x", step=1, first_step_unix=now))
    types = {g.instance_type for g in plan.entries[0].groups}
    assert {t: startup.measured_ready()[t] for t in types} == {t: pytest.approx(300.0, abs=1) for t in types}
    again = LaunchedFleet(plan, 0, "cloud-2", {"up_unix": now - 50.0, "provision_s": 10.0})
    silence.started(again)
    silence.check(again, Started(launch_id=LID, fleet="x", step=9, first_step_unix=now, resumed_from="s3://b/c.ckpt"))
    local = LaunchedFleet(plan, 0, "local-1")
    silence.started(local)
    silence.check(local, Started(launch_id=LID, fleet="x", step=1, first_step_unix=now))
    assert {t: startup.measured_ready()[t] for t in types} == {t: pytest.approx(300.0, abs=1) for t in types}


def test_an_explicit_resume_checkpoint_is_vetted_before_any_fleet_is_up(plan, tmp_path, monkeypatch, capsys) -> None:
    """Issue #36 M3: `srifty launch --resume PATH` took any file: a checkpoint with a flipped byte (its recorded sha256
    no longer matching) resumed with a NaN weight and rc 0. It is checked as --resume latest checks what it finds:
    the digest, the pickle, and for a file of no digest that it loads and its weights are finite."""
    import hashlib

    import torch

    from lightning_srifty.cli import main
    from lightning_srifty.provision.launcher import launch as launch_module

    asked: dict = {}
    monkeypatch.setattr(
        launch_module, "launch", lambda plan, script, settings, **kw: asked.update(vars(settings)) or []
    )
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.ones(4)}, "global_step": 5}, good)
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    (tmp_path / "good.ckpt.sha256").write_text(f"{digest}  good.ckpt\n")
    args = ["launch", "--plan", "plan.json", "--workdir", "wd", "--resume"]
    assert main([*args, str(good), "--", "train.py"]) == 0 and asked["resume"] == str(good)
    data = bytearray(good.read_bytes())
    data[-40] ^= 0xFF  # a flipped byte after the digest was recorded
    good.write_bytes(bytes(data))
    assert main([*args, str(good), "--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert f"--resume {good}: not a sound checkpoint: its sha256 differs from the one recorded" in err
    nan = tmp_path / "nan.ckpt"  # no digest (not one of ours): it must load, with finite weights
    torch.save({"state_dict": {"w": torch.tensor([1.0, float("nan")])}, "global_step": 5}, nan)
    assert main([*args, str(nan), "--", "train.py"]) == 2
    assert "its weights are not all finite (NaN or inf in w)" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "missing.ckpt"), "--", "train.py"]) == 2
    assert "there is no such file or folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"process": object()}, "its output is above: the local processes write to this terminal"),
        ({"folder": "/x/infra"}, "srifty logs --dir /x/infra"),
        ({}, "/var/log/srifty-user-data.log on them"),
    ],
)
def test_a_silent_fleet_points_to_the_log_it_has(plan, data, said) -> None:
    """Issue #37 L: a local launch's silent job was said to have "its console output and
    /var/log/srifty-user-data.log", which a local process never writes."""
    from lightning_srifty.provision.launcher.watches import Silence

    silence = Silence(0.01, print)
    fleet = LaunchedFleet(plan, 0, "f-1", dict(data))
    silence.started(fleet)
    time.sleep(0.05)
    with pytest.raises(MigrationError) as error:
        silence.check(fleet, None)
    assert said in str(error.value)


def test_the_launcher_settings_are_one_public_object_checked_when_made() -> None:
    """launch() takes a LauncherSettings (issue #39): a bad value is refused when the settings are made, before any
    fleet, naming the setting; a keyword that is not a setting names the ones there are."""
    from lightning_srifty.provision.launcher.launch import LauncherSettings, launch

    with pytest.raises(ConfigError, match="heartbeat_max_age_s"):
        LauncherSettings(heartbeat_s=30, heartbeat_max_age_s=40)
    settings = LauncherSettings(max_migrations=1)
    assert settings.but(poll_s=0.1).poll_s == 0.1 and settings.but(poll_s=0.1).max_migrations == 1
    with pytest.raises(ConfigError, match="'spot_check_s' parameter of launch"):
        settings.but(spot_check_s=0)
    with pytest.raises(TypeError, match=r"'poll'.*poll_s"):
        launch(object(), ["train.py"], poll=1)  # refused before the plan is read


def test_a_command_written_as_one_runs_it_by_hand_is_what_torchrun_starts(plan, tmp_path, capsys, monkeypatch) -> None:
    """`srifty launch -- python train.py` ran torchrun on a script named "python" ("can't open file .../python") on
    the local provisioner, where the Terraform provisioner already read it as the nodes do (train_argv)."""
    from lightning_srifty.cli import main
    from lightning_srifty.cli.launch import check_script
    from lightning_srifty.provision.launcher.local import LocalProvisioner, local_argv
    from predictor.exceptions import ConfigError

    assert local_argv(["python", "train.py", "--epochs", "3"]) == ["train.py", "--epochs", "3"]
    assert local_argv(["/usr/bin/python3", "-u", "-m", "pkg.train"]) == ["-m", "pkg.train"]
    assert local_argv(["train.py", "a b"]) == ["train.py", "a b"]  # a word with a space stays one word
    assert LocalProvisioner(["python3.11", "train.py"], echo=lambda line: None).script == ["train.py"]
    for bad, why in [(["python", "-c", "x"], "Python option '-c'"), (["torchrun", "t.py"], "starts a launcher"),
                     (["python"], "no script")]:  # fmt: skip
        with pytest.raises(ConfigError, match=why) as refused:
            local_argv(bad)
        assert refused.value.parameter == "script"
        with pytest.raises(ConfigError, match=f"after --.*{why}|{why}.*after --"):
            check_script(bad)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    check_script(["python", "train.py"])  # there: nothing to say
    with pytest.raises(ConfigError, match=r"The training script nothere\.py does not exist"):
        check_script(["python", "nothere.py"])
    plan.save(tmp_path / "plan.json")
    assert main(["launch", "--plan", str(tmp_path / "plan.json"), "--", "python", "-c", "print(1)"]) == 2
    said = capsys.readouterr().err
    assert "The training command \"python -c 'print(1)'\" passes the Python option '-c'" in said, said


def test_a_scripts_own_options_never_reach_torchruns_parser() -> None:
    """A trial: `srifty launch -- train.py --log steps.jsonl` failed in torchrun ("ambiguous option: --log could match
    --log-dir, --log_dir, --logs-specs, --logs_specs"): argparse reads every word of the line for its options'
    abbreviations. The command ends torchrun's options with "--" (after -m for a module), as the module's user data
    does (test_user_data_quotes_every_word_of_the_training_command); torch's own parser takes it so."""
    from torch.distributed.run import get_args_parser

    from lightning_srifty.provision.terraform.command import torchrun_script

    parser = get_args_parser()
    with pytest.raises(SystemExit):  # the rule, as torch has it: without the "--" the whole line is refused
        parser.parse_args(["--standalone", "--nproc_per_node=1", "train.py", "--log", "x"])
    for argv, module, script, rest in (
        (["train.py", "--log", "x", "--max", "3", "--", "y"], False, "train.py", 1),
        (["-m", "pkg.train", "--log", "x", "-m"], True, "pkg.train", 2),
    ):
        args = parser.parse_args(["--standalone", "--nproc_per_node=1", *torchrun_script(argv)])
        assert (args.module, args.training_script, args.training_script_args) == (module, script, argv[rest:])


def test_srifty_launch_refuses_a_plan_for_another_model_before_any_process(tmp_path, monkeypatch, catalog, capsys):
    """A new user's trial: a 7B plan given to srifty launch with the digits example started eight FSDP processes; the
    mismatch showed only as job-side warnings. The example writes srifty/digits-profile.json, not the default
    srifty/profile.json: the profiles a script wrote there are compared too (the plan must be for one of them)."""
    from _support import MINIMAL
    from lightning_srifty.cli import main
    from predictor.documents.profile import load_profile

    monkeypatch.chdir(tmp_path)
    (tmp_path / "srifty").mkdir()
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "srifty" / "digits-profile.json").write_text(
        json.dumps({**MINIMAL, "model": {**MINIMAL["model"], "name": "DigitsNet"}})
    )
    (tmp_path / "srifty" / "notes.json").write_text('{"not": "a profile"}')
    plan = rank(load_profile(MINIMAL), Constraints(steps=1000), catalog=catalog)
    assert plan.model == "resnet50"
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    assert main(["launch", "--plan", "plan.json", "--", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "made for the model 'resnet50', but this project's profile (srifty/digits-profile.json) measured " in err
    assert "'DigitsNet'" in err and "--any-model" in err
    assert not (tmp_path / "srifty" / "launch").exists()  # nothing started, no work folder


def test_a_plan_for_any_of_the_projects_profiled_models_is_launched(tmp_path) -> None:
    """A review: after `srifty demo` (its CNN's profile at srifty/profile.json) a plan for the user's own model, from
    srifty/mynet.json, was refused. The plan must be for one of the project's profiled models, any of them."""
    from _support import MINIMAL
    from lightning_srifty.provision.terraform.generate import check_plan_model

    (tmp_path / "srifty").mkdir()
    for file, name in (("profile.json", "DigitsCNN"), ("mynet.json", "MyNet")):
        (tmp_path / "srifty" / file).write_text(json.dumps({**MINIMAL, "model": {**MINIMAL["model"], "name": name}}))
    mine = types.SimpleNamespace(model="MyNet")
    check_plan_model(mine, tmp_path)  # the user's own model: launched
    with pytest.raises(ConfigError, match=r"measured 'DigitsCNN', 'MyNet' \(.*mynet.json\): rank"):
        check_plan_model(types.SimpleNamespace(model="resnet50"), tmp_path)


def test_a_mixed_fleets_handover_gives_each_gpu_type_its_batch_whatever_order_the_nodes_join(plan, tmp_path) -> None:
    """A review: srifty launch handed a fleet of two GPU types whose ranks take different batches the per-rank list in
    the plan's group order; torchrun numbers ranks in the order the nodes join, so a slower GPU could take the faster
    one's larger batch (the step follows the slowest rank; a batch sized for the larger GPU's memory). A fleet's
    handover now carries the plan's groups, which the job matches to each node's group at set-up (as srifty
    terraform's values do); local processes, numbered in the plan's order, keep the list."""
    import dataclasses

    entry = plan.entries[0]
    first = dataclasses.replace(entry.groups[0], instance_type="g4dn.xlarge", gpu="T4", count=1, micro_batches=(3,))
    second = dataclasses.replace(entry.groups[0], instance_type="g5.xlarge", gpu="A10G", count=1, micro_batches=(5,))
    mixed = dataclasses.replace(entry, groups=(first, second))  # the global batch (8) kept
    assert mixed.heterogeneous and mixed.rank_batches() == [3, 5]
    mixed_plan = dataclasses.replace(plan, entries=(mixed, *plan.entries[1:]))

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        write_record(ckpt, Finished(launch_id=LID, step=20))

    for in_join_order, expected in ((True, ("SRIFTY_BATCH_GROUPS", "g4dn.xlarge=3;g5.xlarge=5")),
                                    (False, ("SRIFTY_BATCH_SIZES", "3,5"))):  # fmt: skip
        recorder = Recorder()
        recorder.ranks_in_join_order = in_join_order
        rec, result = _run(mixed_plan, tmp_path / str(in_join_order), job, recorder=recorder)
        assert "error" not in result, result.get("error")
        env = rec.envs["f-1"]
        name, value = expected
        assert env[name] == value and {"SRIFTY_BATCH_GROUPS", "SRIFTY_BATCH_SIZES"} & set(env) == {name}


def test_a_running_jobs_node_records_are_listed_every_verdict_read_s_not_at_every_poll(plan) -> None:
    """Every Terraform fleet's nodes write exit records now (one-node fleets too), and the launcher listed them in S3
    at every poll of a running job: a CI run's launch through terraform grew past its timeout. While the job runs
    they are listed every VERDICT_READ_S; once it failed, at every poll."""
    from lightning_srifty.provision.base import LaunchedFleet
    from lightning_srifty.provision.launcher.launch import VERDICT_READ_S, LostNodeWatch

    class Counting(LosingNodes):
        reads = 0

        def node_verdicts(self, fleet):
            self.reads += 1
            return super().node_verdicts(fleet)

    rec, watch, fleet = Counting(), LostNodeWatch(), LaunchedFleet(plan, 0, "f-1")
    assert VERDICT_READ_S >= 10
    for _ in range(5):
        assert watch.check(rec, fleet, None, LID) is None
    assert rec.reads == 1
    rec.verdicts["f-1"] = [None]  # deciding
    failed = Failed(launch_id=LID, step=3, error="RuntimeError: NCCL error")
    for _ in range(3):
        assert watch.check(rec, fleet, failed, LID) is None
    assert rec.reads == 4


def test_a_spot_fleets_node_gone_without_a_word_is_the_markets_and_a_gpu_fault_names_the_move(plan, catalog) -> None:
    """An instance of a spot fleet gone without a word is most likely a reclaim whose notice did not come: a spot
    move (the guard then decides with spot gone), as for a peer's verdict `lost`. A node that recorded its GPUs'
    fault while another vanished: the fault's record names the move."""
    from lightning_srifty.provision.base import LaunchedFleet
    from lightning_srifty.provision.launcher.launch import LostNodeWatch

    spot = rank(plan_profile(), Constraints(steps=1000, market="spot", max_instances=1), catalog=catalog)
    rec, fleet = LosingNodes(), LaunchedFleet(spot, 0, "f-1")
    assert fleet.entry.market == "spot" and LostNodeWatch().check(rec, fleet, None, LID) is None
    rec.gone["f-1"] = ["i-1", "i-2", "i-3", "i-4"]
    left = LostNodeWatch().check(rec, fleet, None, LID)
    assert left is not None and left.trigger == "spot" and "4 node(s)" in left.why and "i-4" not in left.why
    rec.verdicts["f-1"], rec.faults["f-1"] = [75], ["nvidia-smi: GPU is lost."]
    left = LostNodeWatch().check(rec, fleet, None, LID)
    assert left is not None and left.trigger == "node" and "GPU is lost" in left.why


def test_what_is_up_of_a_fleet_that_lost_a_node_carries_the_job_only_if_it_trains(plan, monkeypatch) -> None:
    """A node gone without a word while others of its fleet are up without a record: a survivor deciding its verdict,
    or a replacement its group started, which resumes from the newest checkpoint since the handover. A review: one
    whose boot or setup hangs held the launch until the fleet's life cap. Now what is up gets replace_s (the start-up
    timeout) to move the job's progress; once it has, it carries the job; once nothing is up, the leave is at once."""
    from lightning_srifty.protocol import Progress
    from lightning_srifty.provision.launcher import launch as launch_module
    from lightning_srifty.provision.launcher.launch import LostNodeWatch

    monkeypatch.setattr(launch_module, "VERDICT_READ_S", 0.0)
    rec, fleet = LosingNodes(), LaunchedFleet(plan, 0, "f-1")
    rec.gone["f-1"], rec.still_up["f-1"] = ["i-1"], ["i-2"]
    progress = [Progress(launch_id=LID, fleet="x", step=40, unix=100.0)]
    watch = LostNodeWatch(replace_s=0.3)
    assert watch.check(rec, fleet, None, LID, lambda: progress[-1]) is None  # its replacement boots
    time.sleep(0.4)
    left = watch.check(rec, fleet, None, LID, lambda: progress[-1])
    assert left is not None and "what is up of it has not trained in" in left.why and left.step == 40
    # the same, and the job trains on the replacement (from its checkpoint at 30: a step below the last progress)
    watch = LostNodeWatch(replace_s=0.3)
    assert watch.check(rec, fleet, None, LID, lambda: progress[-1]) is None
    progress.append(Progress(launch_id=LID, fleet="x", step=31, unix=400.0))
    time.sleep(0.4)
    assert watch.check(rec, fleet, None, LID, lambda: progress[-1]) is None  # it carries the job, for good
    rec.gone["f-1"], rec.still_up["f-1"] = ["i-1", "i-2"], []  # and then it goes too: nothing up, at once
    left = watch.check(rec, fleet, None, LID, lambda: progress[-1])
    assert left is not None and "i-2" in left.why and "has not trained" not in left.why


# ---------------------------------------------------------------------------------------------------------------------
# A job that trained and then stopped moving: the stall watch
# ---------------------------------------------------------------------------------------------------------------------


def _stalls(monkeypatch) -> None:
    from lightning_srifty.provision.launcher import watches

    monkeypatch.setattr(watches, "STALL_READ_S", 0.0)


def _training(ckpt: str, fleet: str, steps: range, *, active_for_s: float = 0.0) -> None:
    """The job's records on one leg: its first step, a progress record per step (every 0.05 s), then, for
    ``active_for_s``, records whose step stays while the loop shows life (a validation)."""
    from lightning_srifty.protocol import Progress

    write_record(ckpt, Started(launch_id=LID, fleet=fleet, step=steps[0], first_step_unix=time.time()))
    for step in steps:
        now = time.time()
        write_record(ckpt, Progress(launch_id=LID, fleet=fleet, step=step, unix=now, active_unix=now, every_s=0.05))
        time.sleep(0.05)
    end = time.monotonic() + active_for_s
    last = time.time()
    while time.monotonic() < end:
        progress = Progress(
            launch_id=LID, fleet=fleet, step=steps[-1], unix=last, active_unix=time.time(), every_s=0.05
        )
        write_record(ckpt, progress)
        time.sleep(0.05)


def test_a_job_that_stops_moving_is_released_and_restarted_on_new_machines_of_the_same_entry(
    plan, tmp_path, monkeypatch
) -> None:
    """A job that trained, then hung (its progress record keeps coming from its thread, or stops, and shows neither
    a step nor a validation batch) waited until the fleet's life cap: a one-GPU job hung in the driver has no NCCL
    timeout. Past --stall-timeout-min its fleet is released first (nothing to wait for; a job that woke up must not
    train beside the next leg), and new machines of the same entry resume from the newest checkpoint. A validation
    longer than the limit (the step stays, the loop shows life) is not a hang."""
    _stalls(monkeypatch)
    first = plan.entries[0].fleet

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        _training(ckpt, first, range(1, 13), active_for_s=1.2)  # a validation of twice the limit, then the hang
        assert ("down", "f-1") not in rec.calls
        _until(lambda: ("start", "f-2") in rec.calls)
        _training(ckpt, first, range(10, 20))
        write_record(ckpt, Finished(launch_id=LID, step=20))

    rec, result = _run(plan, tmp_path, job, stall_timeout_s=0.6)
    assert "error" not in result, result.get("error")
    (move,) = result["moves"]
    assert (move.trigger, move.voluntary, move.step) == ("stall", False, 12)
    assert (move.from_fleet, move.to_fleet) == (first, first)
    assert "shown no progress past step 12" in move.why and "--stall-timeout-min" in move.why
    # released before the new machines are asked for; the next leg resumes the newest checkpoint there
    assert rec.calls[:4] == [("up", "f-1"), ("start", "f-1"), ("down", "f-1"), ("up", "f-2")]
    assert rec.envs["f-2"]["SRIFTY_RESUME"] == markers.RESUME_LATEST
    assert any("releasing f-1" in line for line in result["echo"])


class Killing(Recorder):
    """A provisioner with the local one's kill(): a hung job stopped at once."""

    def kill(self, fleet) -> None:
        self.calls.append(("kill", fleet.name))


def _hangs_past_12_then_the_next_leg_starts(ckpt: str, rec: Recorder, fleet: str) -> None:
    _until(lambda: ("start", "f-1") in rec.calls)
    _training(ckpt, fleet, range(1, 13))
    _until(lambda: ("start", "f-2") in rec.calls)


def test_a_job_that_hangs_past_the_same_step_again_is_the_jobs_and_ends_the_launch(plan, tmp_path, monkeypatch):
    """The same hang past the same step on the next leg is the job's (a deadlock, a read that never returns), not a
    machine's: the launch ends with what to do, every fleet released, rather than going round the plan."""
    _stalls(monkeypatch)
    first = plan.entries[0].fleet

    def job(ckpt, rec) -> None:
        _hangs_past_12_then_the_next_leg_starts(ckpt, rec, first)
        _training(ckpt, first, range(10, 13))

    rec, result = _run(plan, tmp_path, job, Killing(), stall_timeout_s=0.4)
    error = result["error"]
    assert isinstance(error, MigrationError) and "hung past step 12 again" in str(error)
    assert "raise stall_timeout_s (`srifty launch --stall-timeout-min`)" in str(error)
    # killed at once both times (a review: the repeat went to the launch's end, whose stop gives a SIGTERM grace)
    assert rec.calls[-2:] == [("kill", "f-2"), ("down", "f-2")] and ("kill", "f-1") in rec.calls
    assert ("up", "f-3") not in rec.calls


def test_a_new_leg_is_not_judged_on_the_last_legs_records(plan, tmp_path, monkeypatch) -> None:
    """A review: the next leg on the same entry found the last leg's STARTED and PROGRESS (the same fleet in them,
    written minutes before) and took them for its own: a new leg whose start-up outlasted the limit was "hung past
    step 12 again", and the launch ended. The first-step record is cleared as a leg starts (and a progress record
    older than the leg's first step is not its own): a leg that has not stepped is the start-up's to watch."""
    _stalls(monkeypatch)
    first = plan.entries[0].fleet

    def job(ckpt, rec) -> None:
        _hangs_past_12_then_the_next_leg_starts(ckpt, rec, first)
        time.sleep(1.5)  # the next leg's start-up: almost four limits
        assert ("up", "f-3") not in rec.calls and not store.exists(ckpt, markers.STARTED)
        _training(ckpt, first, range(13, 16))
        write_record(ckpt, Finished(launch_id=LID, step=16))

    _, result = _run(plan, tmp_path, job, stall_timeout_s=0.4)
    assert "error" not in result, result.get("error")
    (move,) = result["moves"]
    assert move.trigger == "stall" and move.downtime_s is not None  # the new leg's own first step measured it


def test_a_job_that_hangs_past_its_fleets_life_cap_is_not_restarted(plan, tmp_path, monkeypatch) -> None:
    """The life cap asks the job to leave; one that hangs on its way out is not moved to new machines (a review: a
    hang's leave restarted the job past the cap it was leaving for): the launch ends as at the cap."""
    _stalls(monkeypatch)
    first = plan.entries[0].fleet

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        _training(ckpt, first, range(1, 20))  # about 1 s: past the 0.72 s cap

    rec, result = _run(plan, tmp_path, job, stall_timeout_s=0.4, max_life_h=0.0002)
    error = result["error"]
    assert isinstance(error, MigrationError) and "life cap was reached, and then" in str(error), error
    assert ("up", "f-2") not in rec.calls and rec.calls[-1] == ("down", "f-1")


def test_no_stall_watch_without_a_limit_or_before_the_legs_first_step(plan, tmp_path, monkeypatch) -> None:
    """stall_timeout_s=None watches nothing; and a leg whose job has not stepped is the start-up timeout's."""
    _stalls(monkeypatch)
    first = plan.entries[0].fleet

    def job(ckpt, rec) -> None:
        _until(lambda: ("start", "f-1") in rec.calls)
        _training(ckpt, first, range(1, 5))
        time.sleep(1.0)  # five times the limit below, had it one
        write_record(ckpt, Finished(launch_id=LID, step=5))

    _, result = _run(plan, tmp_path, job, stall_timeout_s=None)
    assert "error" not in result and result["moves"] == []


def _fleet_of(plan, name: str = "f-1") -> LaunchedFleet:
    return LaunchedFleet(plan, 0, name)


def test_the_stall_limit_follows_the_jobs_own_period_and_step_time(plan) -> None:
    """The limit is the setting, or three of the job's record periods, or four of its measured steps, the longest: a
    job that writes its progress every 10 min, or whose step takes 20 min, is not hung at 30 min. Only the launcher's
    clock measures the silence; a leg's first step older than its start (an earlier leg's record) arms nothing, and a
    progress record from before this leg's first step is not this leg's."""
    from lightning_srifty.protocol import Progress
    from lightning_srifty.provision.launcher.watches import StallWatch

    fleet = _fleet_of(plan)
    records: dict = {}
    watch = StallWatch(1800.0, read_s=0.0)
    watch.started(fleet)
    t = time.time()

    def look(now: float):
        return watch.check(fleet, records.get, now=now)

    records[Started] = Started(launch_id=LID, first_step_unix=t - 3600)  # an earlier leg's
    records[Progress] = Progress(launch_id=LID, step=3, unix=t - 3500, every_s=60.0)
    assert look(0.0) is None and look(10_000.0) is None  # not armed
    records[Started] = Started(launch_id=LID, first_step_unix=t + 1)
    assert look(20_000.0) is None and look(30_000.0) is None  # its progress is from before this leg's first step
    records[Progress] = Progress(launch_id=LID, step=4, unix=t + 2, every_s=700.0, step_time_s=5.0)
    assert look(40_000.0) is None  # the mark is taken now
    assert look(40_000.0 + 1801) is None and look(40_000.0 + 2099) is None  # 3 x 700 s = 2,100 s
    assert "past step 4 for 35 min" in look(40_000.0 + 2101.0)
    records[Progress] = Progress(launch_id=LID, step=4, unix=t + 2, active_unix=t + 900, every_s=700.0)
    assert look(50_000.0) is None and look(50_000.0 + 2000.0) is None  # a sign of life: counted from here

    slow = StallWatch(1800.0, read_s=0.0)
    slow.started(fleet)
    records[Progress] = Progress(launch_id=LID, step=4, unix=t + 2, every_s=60.0, step_time_s=1200.0)
    assert slow.check(fleet, records.get, now=0.0) is None
    assert slow.check(fleet, records.get, now=4799.0) is None  # 4 x 20 min
    assert "limit: 80 min" in slow.check(fleet, records.get, now=4801.0)
    assert StallWatch(None, read_s=0.0).check(fleet, records.get, now=1e9) is None
    slow.hung_at.append(4)  # a second hang past the same step: the job's
    with pytest.raises(MigrationError, match="hung past step 4 again"):
        slow.leave(fleet, records.get, LID, now=9000.0)
    other = _fleet_of(plan, "f-2")
    assert watch.check(other, records.get, now=1e9) is None  # another leg's fleet: not the one watched


def test_what_is_up_of_a_fleet_that_lost_a_node_is_not_taken_for_a_hang_while_it_has_its_time(monkeypatch) -> None:
    """A review: while a node its group started in place of a lost one boots (LostNodeWatch gives it the start-up
    timeout), the job does not move, and a stall limit under that timeout destroyed the fleet as hung."""
    from lightning_srifty.provision.launcher.launch import LostNodeWatch

    lost = LostNodeWatch(replace_s=100.0)
    assert not lost.replacing()
    assert lost._carried(["i-2"], lambda: None, time.monotonic())
    assert lost.replacing()
    lost.lost_at = (time.monotonic() - 101.0, None)
    assert not lost.replacing()
    lost.lost_at, lost.carried_on = (time.monotonic(), None), True  # it trained: watched again
    assert not lost.replacing()


def test_the_stall_watch_measures_afresh_once_a_lost_nodes_replacement_had_its_time(plan) -> None:
    """A second review: while a lost node's replacement has its time (the start-up timeout, longer than the stall
    limit), the stall watch stood aside but kept its clock, so at the window's end it fired at once, a `stall` where
    the lost-node watch decides. The silence is now measured afresh after it."""
    from lightning_srifty.protocol import Progress
    from lightning_srifty.provision.launcher.legs import Legs
    from lightning_srifty.provision.launcher.watches import StallWatch

    fleet = _fleet_of(plan)
    stall = StallWatch(0.2, read_s=0.0)
    run = types.SimpleNamespace(name="f", launch_id=LID, ckpt="unused")
    legs = Legs(Killing(), types.SimpleNamespace(max_life_until_unix=None), run, print, None, stall)
    legs.up.append(fleet)
    stall.started(fleet)
    t = time.time()
    records = {Started: Started(launch_id=LID, first_step_unix=t), Progress: Progress(launch_id=LID, step=3, unix=t)}
    poll = types.SimpleNamespace(code=None, read=records.get)
    replacing = types.SimpleNamespace(replacing=lambda: True)
    assert legs.hung(fleet, poll) is None  # marked
    time.sleep(0.3)
    assert legs.hung(fleet, poll, replacing) is None  # past the limit, but a replacement boots
    assert legs.hung(fleet, poll, types.SimpleNamespace(replacing=lambda: False)) is None  # afresh: not at once
    time.sleep(0.3)
    left = legs.hung(fleet, poll)
    assert left is not None and left.trigger == "stall" and legs.provisioner.calls == [("kill", "f-1"), ("down", "f-1")]
