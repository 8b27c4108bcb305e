"""A Lightning Fabric loop on a srifty fleet (``FabricPreemption``): resume, periodic checkpoints, the notice's
checkpoint and exit 75, the node's alive file and exit marks, the launcher's records.

Before it, a Fabric script on a fleet trained through a spot notice and its replacements started it over (a trial);
the fast tests run one Fabric in this process, the slow one two real ranks under torchrun with checkpoints in S3
(moto's server), left on a SIGTERM and resumed to the parameters of a run never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_srifty.migrate.fabric import FabricPreemption
from lightning_srifty.protocol import Failed, Finished, Preempted, Started, read_record
from predictor.exceptions import ConfigError

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """A fleet node's environment as the module's boot script sets it: the checkpoint folder, resume "latest", the
    node's state folder."""
    folders = {"checkpoints": tmp_path / "ckpt", "state": tmp_path / "state"}
    folders["state"].mkdir()
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(folders["checkpoints"]))
    monkeypatch.setenv("SRIFTY_RESUME", "latest")
    monkeypatch.setenv("SRIFTY_NODE_STATE", str(folders["state"]))
    monkeypatch.setenv("SRIFTY_ALLOW_CPU", "1")
    return folders


def _fabric_and_state():
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(1)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    return fabric, {"model": model, "optimizer": optimizer, "step": 0}


def _train(state, spot, steps: int) -> None:
    model, optimizer = state["model"], state["optimizer"]
    for _ in range(steps):
        g = torch.Generator().manual_seed(state["step"])
        x = torch.randn(8, 4, generator=g)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        spot.fabric.backward(loss)
        optimizer.step()
        state["step"] += 1
        spot.step()


def _params(state) -> list[float]:
    return torch.cat([p.detach().flatten() for p in state["model"].parameters()]).tolist()


def test_a_notice_saves_the_loops_state_leaves_with_75_and_the_next_start_resumes_it(fleet) -> None:
    fabric, state = _fabric_and_state()
    with pytest.raises(SystemExit) as left, FabricPreemption(fabric, state) as spot:
        _train(state, spot, 3)
        spot.request_leave("a spot notice, played")  # the watcher's or SIGTERM's flag: the next step leaves
        _train(state, spot, 5)
    assert left.value.code == 75 and state["step"] == 4 and spot.preempted
    record = read_record(str(fleet["checkpoints"]), Preempted)
    assert record is not None and record.step == 4 and record.checkpoint.endswith("preempt-step=4.ckpt")
    assert (fleet["state"] / "preempted").read_text().strip() == record.checkpoint  # the node reads it: not a failure
    assert Path(record.checkpoint + ".sha256").exists()  # sealed before it was published
    started = read_record(str(fleet["checkpoints"]), Started)
    assert started is not None and started.step == 1 and started.world_size == 1 and started.mismatches == ()
    assert (fleet["state"] / "alive").read_text().split()[0] == "1"  # the node's stall watch starts at the first
    assert read_record(str(fleet["checkpoints"]), Finished) is None
    saved = _params(state)

    fabric, state = _fabric_and_state()  # the replacement: a fresh process's model
    assert _params(state) != saved
    with FabricPreemption(fabric, state) as spot:
        assert spot.resumed_from == record.checkpoint and state["step"] == 4 and _params(state) == saved
        assert state["optimizer"].state_dict()["state"]  # the momentum came back too
        _train(state, spot, 2)
    finished = read_record(str(fleet["checkpoints"]), Finished)
    assert finished is not None and finished.step == 6
    assert (fleet["state"] / "alive").read_text().split()[-1] == "1"  # training is over: the node's after-fit limit


def test_a_notice_from_the_metadata_service_is_logged_in_the_loops_own_name(fleet, caplog) -> None:
    """The spot watcher is FabricPreemption's in a Fabric loop: its lines named SriftyCallback, a class the script
    never used (seen in a Fabric user's ``srifty launch``)."""
    import time

    from imds_server import FakeIMDS

    fabric, state = _fabric_and_state()
    with (
        FakeIMDS({}) as imds,
        caplog.at_level("INFO", logger="lightning_srifty"),
        pytest.raises(SystemExit) as left,
        FabricPreemption(fabric, state, endpoint=imds.endpoint) as spot,
    ):
        imds.notify()
        end = time.monotonic() + 10
        while not spot.preempted and time.monotonic() < end:
            _train(state, spot, 1)
            time.sleep(0.02)
    assert left.value.code == 75
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("FabricPreemption: spot interruption notice") for line in lines), lines
    assert not any("SriftyCallback" in line for line in lines), lines


def test_periodic_checkpoints_follow_the_plans_interval_and_keep_the_newest(fleet, monkeypatch) -> None:
    monkeypatch.setenv("SRIFTY_CHECKPOINT_EVERY_S", "0")  # the fleet's Young-Daly interval: every step here
    fabric, state = _fabric_and_state()
    with FabricPreemption(fabric, state, keep=2) as spot:
        assert spot.every_s == 0.0
        _train(state, spot, 5)
    names = sorted(p.name for p in fleet["checkpoints"].glob("*.ckpt"))
    assert names == ["periodic-step=4.ckpt", "periodic-step=5.ckpt"]


def test_a_loop_that_raises_records_its_failure_and_marks_no_end(fleet) -> None:
    from lightning_srifty.migrate import exit_mark

    fabric, state = _fabric_and_state()
    with pytest.raises(RuntimeError, match="a bug"), FabricPreemption(fabric, state) as spot:
        _train(state, spot, 2)
        raise RuntimeError("a bug")
    failed = read_record(str(fleet["checkpoints"]), Failed)
    assert failed is not None and failed.step == 2 and "RuntimeError: a bug" in failed.error
    assert exit_mark._armed is None  # the node keeps torchrun's failure: no exit mark
    assert signal.getsignal(signal.SIGTERM) is not spot._sigterm  # SIGTERM handed back


def test_a_loop_that_leaves_without_exiting_saves_once_and_its_later_steps_do_nothing(fleet) -> None:
    fabric, state = _fabric_and_state()
    with FabricPreemption(fabric, state, exit_process=False) as spot:
        _train(state, spot, 2)
        spot.request_leave("a spot notice, played")
        _train(state, spot, 4)  # a loop that does not break on spot.preempted: no checkpoint a step
        assert spot.preempted
    assert sorted(p.name for p in fleet["checkpoints"].glob("*.ckpt")) == ["preempt-step=3.ckpt"]
    assert read_record(str(fleet["checkpoints"]), Finished) is None  # it left: not the end of its training
    assert signal.getsignal(signal.SIGTERM) is not spot._sigterm


def test_a_step_outside_its_block_is_refused_before_it_trains_from_scratch(fleet) -> None:
    """A loop that called spot.step() without the with block trained its first step from scratch, then resumed the
    fleet's checkpoint under it (a review): the resume must come first."""
    fabric, state = _fabric_and_state()
    spot = FabricPreemption(fabric, state)
    with pytest.raises(ConfigError, match=r"runs inside the loop's `with FabricPreemption"):
        spot.step()
    with spot:
        _train(state, spot, 1)
    with pytest.raises(ConfigError, match="already started a loop"):
        spot.start()


def test_a_failure_entering_the_block_is_recorded_and_hands_sigterm_back(fleet, monkeypatch) -> None:
    """A with block whose entry raises runs no exit: a resume that failed left no FAILED.json, the watches running
    and SIGTERM taken (a review)."""

    def broken(self):
        raise OSError("the store said no")

    monkeypatch.setattr(FabricPreemption, "resume", broken)
    fabric, state = _fabric_and_state()
    spot = FabricPreemption(fabric, state)
    with pytest.raises(OSError, match="the store said no"), spot:
        pass
    failed = read_record(str(fleet["checkpoints"]), Failed)
    assert failed is not None and "OSError: the store said no" in failed.error
    assert signal.getsignal(signal.SIGTERM) is not spot._sigterm and spot._watcher._stop.is_set()  # watch stopped


@pytest.mark.parametrize(("raised", "record"), [(SystemExit(0), Finished), (KeyboardInterrupt(), Failed)])
def test_how_the_block_ends_says_which_record(fleet, raised, record) -> None:
    fabric, state = _fabric_and_state()
    with pytest.raises(type(raised)), FabricPreemption(fabric, state) as spot:
        _train(state, spot, 1)
        raise raised
    assert read_record(str(fleet["checkpoints"]), record) is not None
    assert signal.getsignal(signal.SIGTERM) is not spot._sigterm


def test_a_state_a_weights_only_load_refuses_is_refused_before_any_checkpoint(fleet) -> None:
    """A numpy array in the state saved fine, and every replacement then skipped every checkpoint (a weights-only
    load refuses it) and started from step 0 (a review)."""
    import numpy as np

    fabric, state = _fabric_and_state()
    with pytest.raises(ConfigError, match=r"holds state\['rng'\]\[0\] \(numpy.ndarray\), which a weights-only"):
        FabricPreemption(fabric, {**state, "rng": [np.zeros(3)]})
    FabricPreemption(fabric, {**state, "rng": [torch.zeros(3)], "epoch": {"n": 1, "name": "a"}})


def test_outside_a_fleet_it_resumes_nothing_and_writes_no_launcher_records(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SRIFTY_CHECKPOINT_URI", raising=False)
    fabric, state = _fabric_and_state()
    with FabricPreemption(fabric, state, str(tmp_path / "ck")) as spot:
        assert spot.launch is None and spot.watch is None and spot.resumed_from is None
        _train(state, spot, 2)
    assert (tmp_path / "ck" / "FINISHED.json").exists() and not (tmp_path / "ck" / "STARTED.json").exists()


def test_a_loop_ends_its_gloo_process_group_at_exit_as_the_strategies_do(tmp_path, monkeypatch) -> None:
    """Stop 96's clean clone: a Fabric FSDP leg on gloo (2 ranks) aborted in a rank's exit ("terminate called without
    an active exception", SIGABRT) before the other had finished: nothing destroyed its process group before the
    interpreter's teardown, which srifty_ddp and srifty_fsdp register (:func:`lightning_srifty.teardown.
    destroy_at_exit`). FabricPreemption registers it when its loop starts."""
    import torch.distributed as dist

    from lightning_srifty import teardown

    registered: list = []
    monkeypatch.setattr(teardown.atexit, "register", registered.append)
    monkeypatch.setattr(teardown, "_DESTROY_REGISTERED", False)
    monkeypatch.delenv("SRIFTY_CHECKPOINT_URI", raising=False)
    fabric, state = _fabric_and_state()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # as under torchrun's ranks
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")
    with FabricPreemption(fabric, state, str(tmp_path / "ck")) as spot:
        assert registered == [teardown._destroy_process_group]
        monkeypatch.setattr(dist, "is_initialized", lambda: False)  # one process here: nothing to gather with
        _train(state, spot, 1)


@pytest.mark.parametrize(
    ("state", "field"),
    [
        ([1, 2], "state"),
        ({"model": 1}, "state['step']"),
        ({"step": -1}, "state['step']"),
        ({"step": 1.5}, "state['step']"),
        ({"step": True}, "state['step']"),
    ],
)
def test_a_state_without_its_step_counter_is_refused_naming_the_field_and_the_fix(state, field) -> None:
    fabric, _ = _fabric_and_state()
    with pytest.raises(ConfigError) as refused:
        FabricPreemption(fabric, state)
    assert refused.value.parameter == field and ("'step': 0" in str(refused.value) or "dict" in str(refused.value))


def test_something_else_than_a_fabric_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"takes the script's Fabric, not a Trainer-ish \(no \.strategy\)"):
        FabricPreemption(type("Trainer-ish", (), {})(), {"step": 0})


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp-sharded", "fsdp-full"])
def test_two_ranks_leave_on_a_sigterm_to_s3_and_resume_to_the_parameters_of_a_run_never_interrupted(
    tmp_path, subprocess_env, strategy
) -> None:
    """torchrun, 2 gloo ranks, Fabric's DDP or FSDP (each Linear its own unit; sharded: each rank saves its part of
    a directory; full: rank 0 one file, gathered by a collective), checkpoints in S3 (moto's server, as the fleet's
    bucket): rank 1's node gets a rebalance recommendation after step 3 (both ranks save it and train on), rank 0
    gets SIGTERM after step 7 (the node's watchdog passes a notice on so); both ranks save, exit 75, and the node's
    marker says preempted. The next leg resumes from S3 at step 7 (a sharded directory downloaded and checked
    against its manifest first; a full file fetched, since Fabric's FSDP load reads a local path) and ends at 20
    with every rank's parameters those of a reference run that was never interrupted, FINISHED.json, and each
    rank's exit mark. (FSDP's full state dict is gathered as on a GPU: Lightning 2.6's CPU offload of shards already
    on the CPU ends rank 0 with SIGSEGV, srifty or not, Lightning-AI/pytorch-lightning#21804; the script gathers
    without it, ``fabric_run._full_state_dict_on_the_cpu``.)"""
    pytest.importorskip("s3fs")
    import boto3

    from conftest import moto_server

    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
        env = {**subprocess_env, "AWS_ENDPOINT_URL": endpoint, "OMP_NUM_THREADS": "1", "SRIFTY_ALLOW_CPU": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS.parents[1]), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update({"SRIFTY_RESUME": "latest", "SRIFTY_SPOT_POLL_S": "0.2"})

        tmp = tmp_path / "node-tmp"  # the node's temporary folder: where it keeps what it fetched to resume
        tmp.mkdir()

        def leg(out: Path, uri: str, *args: str) -> subprocess.CompletedProcess[str]:
            state = out / "state"
            state.mkdir(parents=True, exist_ok=True)
            port = str(_free_port())
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
            command += [str(SCRIPTS / "fabric_run.py"), str(out), "--max-steps", "20", *args]
            command += ["--fsdp", strategy.removeprefix("fsdp-")] if strategy != "ddp" else []
            leg_env = {**env, "SRIFTY_CHECKPOINT_URI": uri, "SRIFTY_NODE_STATE": str(state), "TMPDIR": str(tmp)}
            return subprocess.run(command, env=leg_env, capture_output=True, text=True, timeout=240)

        ref = leg(tmp_path / "ref", "s3://ckpts/ref")
        assert ref.returncode == 0, ref.stderr[-3000:]
        first = leg(tmp_path / "run", "s3://ckpts/run", "--sigterm-at", "7", "--rebalance-at", "3", "--profile")
        assert first.returncode != 0 and (tmp_path / "run" / "state" / "preempted").exists(), first.stderr[-3000:]
        assert "checkpoint s3://ckpts/run/preempt-step=7.ckpt durable in the store" in first.stderr
        profiled = (tmp_path / "run" / "profile.json").read_bytes()  # batches 2-4 of the first leg
        second = leg(tmp_path / "run", "s3://ckpts/run", "--profile")
        assert second.returncode == 0, second.stderr[-3000:]
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        records = {
            key: json.loads(s3.get_object(Bucket="ckpts", Key=f"run/{key}")["Body"].read())
            for key in ("PREEMPTED.json", "FINISHED.json", "STARTED.json")
        }
        listed = s3.list_objects_v2(Bucket="ckpts", Prefix="run/preempt-step=7.ckpt")["Contents"]
    names = sorted(o["Key"].removeprefix("run/preempt-step=7.ckpt") for o in listed)
    if strategy == "fsdp-sharded":  # a directory: each rank's shard, the metadata, and the manifest beside it
        assert names == [".sha256", "/.metadata", "/__0_0.distcp", "/__1_0.distcp", "/meta.pt"], names
    else:
        assert names == ["", ".sha256"], names
    assert records["PREEMPTED.json"]["step"] == 7 and records["PREEMPTED.json"]["trigger"] == "sigterm"
    assert records["FINISHED.json"]["step"] == 20
    assert records["STARTED.json"]["step"] == 8 and records["STARTED.json"]["world_size"] == 2
    assert records["STARTED.json"]["strategy"] == strategy.split("-")[0]
    if strategy != "ddp":  # no plan says so here: the plan's default is DDP, and the job says it trains otherwise
        assert "the plan trains this fleet with ddp" in records["STARTED.json"]["mismatches"][0]
    else:
        assert records["STARTED.json"]["mismatches"] == []
    assert "a peer's rebalance recommendation: checkpoint s3://ckpts/run/rebalance-step=3.ckpt" in first.stderr
    assert (tmp_path / "run" / "started-at.txt").read_text().strip() == "7"
    assert "resumed from" in second.stderr and "preempt-step=7.ckpt at step 7" in second.stderr
    for rank in (0, 1):  # each rank's parameters (its shard under FSDP)
        ref_params = (tmp_path / "ref" / f"params-rank{rank}.txt").read_text().splitlines()
        run_params = (tmp_path / "run" / f"params-rank{rank}.txt").read_text().splitlines()
        assert [line.split()[0] for line in run_params] == [str(s) for s in range(1, 21)]  # 1-7, then 8-20 resumed
        assert run_params[-1] == ref_params[-1]  # the same training: every parameter, to the printed 9 digits
    marks = sorted(p.name for p in (tmp_path / "run" / "state").glob("exit.*"))
    assert marks == ["exit.0", "exit.1"]  # the node takes a teardown death after them for the end it is
    # the checkpoint came onto the node once, by local rank 0, for both ranks (each rank fetched its own copy of a
    # full file before: an 8-GPU node, 8 copies of a 7B model's 81 GB at once), and went once both had loaded it
    assert second.stderr.count("is on this node at") == 1, second.stderr[-3000:]
    assert not list(tmp.glob("srifty-resume/*/*")), sorted(str(p) for p in tmp.rglob("*"))
    # the run legs were profiled (FabricProfiler over batches 2-4) and the reference was not: the same parameters
    # above, so the profiler (its operator capture, its all-reduce hook) changed nothing of the training; the
    # resumed leg did not profile again (the mark came back with the checkpoint)
    assert (tmp_path / "run" / "profile.json").read_bytes() == profiled
    profile = json.loads(profiled)
    assert profile["hardware"]["world_size"] == 2 and profile["batch"]["global_batch"] == 16
    # batch 3 came after the rebalance's checkpoint (state step 3): left out, as a Trainer's checkpoint step is
    assert profile["timing"]["window"]["excluded_steps"] == {"checkpoint": 1}, profile["timing"]["window"]
    assert profile["timing"]["phases_s"]["backward"]["count"] == 2 and profile["ops"]["ops"]
    if strategy == "ddp":  # the all-reduce hook's timings, over gloo
        assert profile["communication"]["backend"] == "gloo" and profile["communication"]["bytes_per_step"] > 0
    else:  # FSDP's all-gathers and reduce-scatters, and its layout
        assert profile["communication"]["allgather_bytes_per_step"] > 0, profile["communication"]
        assert profile["layout"].startswith("fsdp"), profile.get("layout")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_writer_never_asks_a_state_dict_of_one_rank_alone(tmp_path) -> None:
    """Under FSDP ``state_dict()`` is a collective: the writer's size estimate (asked on rank 0 alone, before a save
    to a remote store) hung rank 0 of a Fabric FSDP full-state run (a review). It reads the tensors, scaled by the
    world size for a sharded strategy. And a save into a folder that is not there yet: FSDP's full save is a bare
    ``torch.save``, which makes none."""
    from lightning_srifty.migrate.writer import CheckpointWriter, checkpoint_bytes

    class Collective(nn.Linear):
        def state_dict(self, *args, **kwargs):
            raise AssertionError("a collective, asked of one rank")

    module = Collective(100, 10)  # 1,010 float32 parameters
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)

    class FSDPStrategy:  # Lightning's and Fabric's sharding strategies share the name
        def barrier(self, name=None) -> None:
            pass

    class Run:
        global_step, lightning_module, optimizers, world_size, strategy = 3, module, [optimizer], 4, FSDPStrategy()
        is_global_zero, global_rank, local_rank = True, 0, 0

        def save_checkpoint(self, path, weights_only=False) -> None:
            torch.save({"w": torch.zeros(1)}, path)

    assert checkpoint_bytes(Run()) == 1010 * 4 * 4
    folder = tmp_path / "not" / "yet"
    saved = CheckpointWriter(str(folder), str(tmp_path / "fallback")).save(Run(), "periodic")
    assert saved == f"{folder}/periodic-step=3.ckpt" and Path(saved + ".sha256").exists()


def test_a_fabric_pinned_to_the_cpu_on_a_gpu_node_stops_before_training_in_its_own_words(fleet, monkeypatch) -> None:
    """A script profiled on a laptop says Fabric(accelerator="cpu"): on a GPU fleet it would train on the CPU until
    its life cap. The block refuses it before a step, naming the Fabric (the check spoke of a Trainer), and the
    refusal is the loop's failure on record."""
    monkeypatch.delenv("SRIFTY_ALLOW_CPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    fabric, state = _fabric_and_state()
    with (
        pytest.raises(ConfigError, match=r"the Fabric runs on the CPU while CUDA sees 8 GPU"),
        FabricPreemption(fabric, state),
    ):
        pass
    failed = read_record(str(fleet["checkpoints"]), Failed)
    assert failed is not None and "the Fabric runs on the CPU" in failed.error and failed.step == 0


def test_an_option_neither_class_takes_is_refused_in_its_callers_name(fleet) -> None:
    """A typo met Python's "Leaving.__init__() got an unexpected keyword argument", a class the user never named."""
    from lightning_srifty.migrate.preemption import SpotPreemption

    with pytest.raises(ConfigError, match=r"SpotPreemption\(\) takes no option 'evry_s': its options are .*every_s"):
        SpotPreemption(evry_s=5)
    fabric, state = _fabric_and_state()
    with pytest.raises(ConfigError, match=r"FabricPreemption\(\) takes no option 'keep_last'"):
        FabricPreemption(fabric, state, keep_last=3)


def _indices_run(fleet, steps: int, *, leave_at: int | None, seen: list[list[int]]) -> None:
    """A Fabric loop over a GlobalBatchSampler (44 samples, batches of 8: 5 steps an epoch, 4 samples left out of
    each), recording each step's sample indices; ``leave_at``: a notice after that step."""
    from lightning_srifty.strategies.hetero import GlobalBatchSampler

    fabric, state = _fabric_and_state()
    sampler = GlobalBatchSampler(44, [8], rank=0, seed=3)
    data = torch.utils.data.TensorDataset(torch.arange(44))
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    model, optimizer = state["model"], state["optimizer"]
    with FabricPreemption(fabric, state, sampler=sampler) as spot:
        while state["step"] < steps:
            for (index,) in loader:
                seen.append(index.tolist())
                x = index.float().unsqueeze(1).repeat(1, 4) / 44
                loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
                optimizer.zero_grad()
                fabric.backward(loss)
                optimizer.step()
                state["step"] += 1
                if state["step"] == leave_at:
                    spot.request_leave("a spot notice, played")
                spot.step()
                if state["step"] >= steps:
                    break


def test_a_resumed_loop_with_its_sampler_trains_on_the_samples_of_a_run_never_interrupted(fleet) -> None:
    """``FabricPreemption(sampler=...)``: the replacement's loader continues at the checkpoint's step, across the
    epoch's end, and not from its epoch's start (without the sampler the data position is the loop's)."""
    reference: list[list[int]] = []
    _indices_run(fleet, 12, leave_at=None, seen=reference)
    for leftover in fleet["checkpoints"].iterdir():  # the reference's FINISHED.json: the next run starts afresh
        leftover.unlink()
    run: list[list[int]] = []
    with pytest.raises(SystemExit):
        _indices_run(fleet, 12, leave_at=7, seen=run)
    assert len(run) == 7  # steps 1-7 (epoch 0, then 2 of epoch 1), then the notice's checkpoint at 7
    _indices_run(fleet, 12, leave_at=None, seen=run)
    assert run == reference  # steps 8-12: the rest of epoch 1, then epoch 2, as never interrupted
    assert len({i for batch in reference[:5] for i in batch}) == 40  # an epoch: 40 distinct samples


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_sampler_sought_to_a_step_stands_where_the_run_did_on_any_split(accumulate) -> None:
    from lightning_srifty.strategies.hetero import GlobalBatchSampler

    def steps(sampler, n: int) -> list[list[int]]:  # n optimizer steps of index lists (accumulated batches joined)
        out: list[list[int]] = []
        while len(out) < n:
            batches = list(iter(sampler))
            for i in range(0, len(batches) - accumulate + 1, accumulate):
                out.append(sorted(j for b in batches[i : i + accumulate] for j in b))
        return out[:n]

    whole = steps(GlobalBatchSampler(50, [8], seed=5, accumulate_grad_batches=accumulate), 17)
    for k in range(14):
        one = GlobalBatchSampler(50, [8], seed=5, accumulate_grad_batches=accumulate)
        one.seek(k)
        assert steps(one, 3) == whole[k : k + 3], k
        split = [GlobalBatchSampler(50, [5, 3], rank=r, seed=5, accumulate_grad_batches=accumulate) for r in (0, 1)]
        for sampler in split:
            sampler.seek(k)
        a, b = (steps(s, 3) for s in split)  # two ranks of another split: the same global batches
        assert [sorted(x + y) for x, y in zip(a, b, strict=True)] == whole[k : k + 3], k


def test_something_else_than_a_global_batch_sampler_is_refused_as_the_sampler(fleet) -> None:
    fabric, state = _fabric_and_state()
    with pytest.raises(ConfigError, match=r"takes a lightning_srifty\.GlobalBatchSampler") as err:
        FabricPreemption(fabric, state, sampler=torch.utils.data.RandomSampler(range(4)))
    assert err.value.parameter == "sampler"


def test_a_checkpoint_in_a_file_url_folder_is_resumed_and_left_where_it_is(fleet, monkeypatch) -> None:
    """A review: only a copy the node fetched is removed after the load. A fleet whose checkpoint folder is a
    ``file://`` URL loads its checkpoint where it is, and it stays (the only copy of the run's state)."""
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", "file://" + str(fleet["checkpoints"]))
    fabric, state = _fabric_and_state()
    with pytest.raises(SystemExit), FabricPreemption(fabric, state) as spot:
        _train(state, spot, 2)
        spot.request_leave("a spot notice, played")
        _train(state, spot, 2)
    record = read_record(str(fleet["checkpoints"]), Preempted)
    assert record is not None
    saved = {p.name for p in fleet["checkpoints"].iterdir()}
    fabric, state = _fabric_and_state()
    with FabricPreemption(fabric, state) as spot:
        assert spot.resumed_from is not None and state["step"] == record.step
    assert saved <= {p.name for p in fleet["checkpoints"].iterdir()}, saved  # nothing of it removed
