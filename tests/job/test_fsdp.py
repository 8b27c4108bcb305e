"""Sharded layouts on the job side: the plan's layout reaches the job (SRIFTY_STRATEGY), plan_strategy() builds it
(FSDP with block classes by name, DDP with activation checkpointing), srifty launch runs it as real FSDP processes
(CPU, gloo), and SriftyCallback profiles it (layout, all-gather / reduce-scatter time and bytes, the full model)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from _support import SCRIPTS, drift_plan, plan_layout
from lightning_srifty import plan_strategy
from lightning_srifty.migrate.checkpoints import _recorded, _say_on_this_node, forget_on_this_node, on_this_node
from lightning_srifty.profiling.sharded import ShardedCollectiveTimer, _TimedDist, layout_name, structure
from lightning_srifty.protocol import LaunchEnv, entry_strategy, strategy_text
from lightning_srifty.strategies.ddp import SriftyDDPStrategy, apply_checkpointing
from lightning_srifty.strategies.fsdp import SriftyFSDPStrategy, loss_weight, resolve_policy, scale_loss
from predictor.exceptions import ConfigError, MigrationError


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


def stack() -> nn.Module:
    return nn.Sequential(Block(), Block(), nn.Linear(4, 1))


@pytest.fixture
def launched(monkeypatch):
    """Sets the environment srifty launch gives a job: ``launched(strategy_json, "8,8")``."""

    def set_env(strategy: str, batches: str = "8,8") -> None:
        env = LaunchEnv(launch_id="t", checkpoint_uri="/tmp/ck", batch_sizes=tuple(map(int, batches.split(","))))
        for k, v in dataclasses.replace(env, strategy=strategy).to_env().items():
            monkeypatch.setenv(k, v)

    monkeypatch.delenv("SRIFTY_CHECKPOINT_URI", raising=False)
    return set_env


def test_the_launcher_passes_each_entrys_layout_and_refuses_a_pipeline(catalog, tmp_path) -> None:
    from lightning_srifty.provision.terraform.generate import Options, tfvars

    plan = drift_plan(catalog, tmp_path)
    entry = plan.entries[0]
    assert json.loads(entry_strategy(entry)) == {"name": "ddp", "args": {}}  # a plan made before layouts
    fsdp = dataclasses.replace(entry, layout=plan_layout("fsdp:shard_grad_op+ac"))
    # srifty terraform exports it on every instance (srifty launch's handover carries the whole LaunchEnv)
    sharded = dataclasses.replace(plan, entries=[fsdp], chosen=0)
    env = tfvars(sharded, 0, Options(name="fsdp-run"), catalog)["train"]["env"]
    assert env["SRIFTY_STRATEGY"] == entry_strategy(fsdp)
    assert "SRIFTY_STRATEGY" not in tfvars(plan, 0, Options(name="fsdp-run"), catalog)["train"].get("env", {})
    spec = LaunchEnv.from_env({**LaunchEnv("l", "/c", strategy=entry_strategy(fsdp)).to_env()}).strategy_spec()
    assert spec == ("fsdp", fsdp.layout.lightning_args)
    assert spec[1]["sharding_strategy"] == "SHARD_GRAD_OP" and spec[1]["activation_checkpointing_policy"] == ["Block"]
    with pytest.raises(
        MigrationError,
        match=r"pipeline:2, which srifty launch cannot start: Lightning has no pipeline strategy.*plan \(choice\)\.$",
    ):
        entry_strategy(dataclasses.replace(entry, layout=plan_layout("pipeline:2")))
    with pytest.raises(ConfigError, match=r"\$SRIFTY_STRATEGY must be a JSON object.*Got '\[1\]'"):
        LaunchEnv("l", "/c", strategy="[1]").strategy_spec()


def test_plan_strategy_builds_the_layouts_strategy_and_outside_a_launch_the_default(launched) -> None:
    assert plan_strategy("ddp_spawn") == "ddp_spawn"
    launched(strategy_text("fsdp", plan_layout("fsdp:hybrid_shard+ac").lightning_args))
    fsdp = plan_strategy(model=stack())
    assert isinstance(fsdp, SriftyFSDPStrategy) and fsdp._process_group_backend == "gloo"
    assert str(fsdp.sharding_strategy) == "ShardingStrategy.HYBRID_SHARD" and fsdp._state_dict_type == "sharded"
    assert fsdp.kwargs["auto_wrap_policy"]._module_classes == {Block} and fsdp.batch_sizes == [8, 8]
    assert fsdp._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}
    launched(strategy_text("ddp", {"activation_checkpointing_policy": ["Block"]}), "5,3")
    ddp = plan_strategy()
    assert isinstance(ddp, SriftyDDPStrategy) and ddp.batch_sizes == [5, 3]
    launched(strategy_text("ddp"), "8")
    assert plan_strategy("auto") == "auto"  # one rank of plain ddp


def test_plan_strategy_names_a_cpu_device_per_local_process(launched, monkeypatch) -> None:
    """The local provisioner runs N processes on a CPU: Lightning's devices="auto" counts one CPU device and fails
    under torchrun's local ranks (IndexError in root_device), so a user's Trainer(strategy=plan_strategy()) would
    need devices= it cannot know. The strategy names one CPU device per process instead."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    launched(strategy_text("fsdp", plan_layout("fsdp:full_shard").lightning_args), "4,4,4")
    assert plan_strategy().parallel_devices == [torch.device("cpu")] * 3
    launched(strategy_text("ddp"), "4,4,4")
    ddp = plan_strategy("auto")
    assert isinstance(ddp, SriftyDDPStrategy) and ddp.parallel_devices == [torch.device("cpu")] * 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    launched(strategy_text("ddp"), "12")
    assert plan_strategy("auto") == "auto"


def test_fsdp_weights_unequal_batches_and_names_a_missing_block(launched) -> None:
    launched(strategy_text("fsdp", {"sharding_strategy": "FULL_SHARD"}), "5,3")
    fsdp = plan_strategy()
    assert fsdp.batch_sizes == [5, 3]
    # rank r's mean loss x b_r x ranks / sum(b): the mean over ranks FSDP reduces is the global-batch mean
    assert [loss_weight([5, 3], r) for r in (0, 1)] == [1.25, 0.75] and loss_weight([4, 4], 1) == 1.0
    loss = torch.tensor(2.0)
    assert scale_loss(loss, 0.75).item() == 1.5 and scale_loss({"loss": loss, "n": 1}, 1.25)["loss"].item() == 2.5
    assert scale_loss(None, 0.5) is None and scale_loss(loss, 1.0) is loss
    launched(strategy_text("fsdp", {"auto_wrap_policy": ["LlamaDecoderLayer"]}))
    with pytest.raises(ConfigError, match=r"'LlamaDecoderLayer'.*its classes are: Block, Linear, ReLU, Sequential"):
        plan_strategy(model=nn.Sequential(Block(), nn.ReLU()))
    launched(strategy_text("pipeline", {}))
    with pytest.raises(ConfigError, match="names the strategy 'pipeline'"):
        plan_strategy()
    size = resolve_policy({"min_num_params": 1000}, None, "auto_wrap_policy")
    assert isinstance(size, functools.partial) and size.keywords == {"min_num_params": 1000}


def test_ddp_activation_checkpointing_wraps_the_named_blocks_and_gives_the_same_gradients() -> None:
    torch.manual_seed(0)
    plain = stack()
    wrapped = stack()
    wrapped.load_state_dict(plain.state_dict())
    apply_checkpointing(wrapped, ["Block"])
    assert layout_name(None, wrapped) == "ddp+ac" and layout_name(None, plain) is None
    assert structure(wrapped) == {
        "blocks": 2,
        "block": "Block",
        "block_parameters": 20,
        "method": "activation-checkpointed blocks",
    }
    x = torch.randn(3, 4)
    for m in (plain, wrapped):
        m(x).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), wrapped.parameters()))


class ScriptedClock:
    name = "scripted"

    def __init__(self) -> None:
        self.t = 0.0

    def mark(self) -> float:
        self.t += 0.5
        return self.t

    def resolve(self, marks):
        return list(marks)


def test_the_collective_timer_times_fsdps_gathers_and_scatters_only_in_the_window() -> None:
    from torch.distributed.fsdp import _flat_param, _runtime_utils

    original = _flat_param.dist
    timer = ShardedCollectiveTimer()
    timer.start(ScriptedClock())
    assert isinstance(_flat_param.dist, _TimedDist) and isinstance(_runtime_utils.dist, _TimedDist)
    assert _flat_param.dist.get_world_size is torch.distributed.get_world_size  # everything else passes through
    calls = []

    def all_gather(out, inp, group=None):
        calls.append("ag")

    def reduce_scatter_single(out, inp, group=None):
        calls.append("rs")

    for step in (1, 2):
        timer.step = step
        chunks = [torch.zeros(4), torch.zeros(4)]  # gathered: 2 x 4 floats
        timer.call("allgather", all_gather, chunks, torch.zeros(4))
        timer.call("allgather", all_gather, chunks, torch.zeros(4))
        timer.call("reduce_scatter", reduce_scatter_single, torch.zeros(4), torch.zeros(8))
    timer.stop()
    assert _flat_param.dist is original and _runtime_utils.dist is torch.distributed
    series = timer.resolve([2])
    assert calls == ["ag", "ag", "rs"] * 2
    assert series.allgather_s == [1.0] and series.reduce_scatter_s == [0.5]  # two 0.5 s gathers, one scatter
    assert series.allgather_bytes_per_step == 2 * 32 and series.reduce_scatter_bytes_per_step == 32
    assert timer.resolve([7]) is None


@pytest.mark.ddp
def test_srifty_launch_runs_the_plans_fsdp_layout_as_real_processes_and_profiles_it(
    tmp_path, subprocess_env, catalog
) -> None:
    """A plan entry with an fsdp:full_shard+ac layout, through srifty launch's local provisioner: 2 real FSDP gloo
    processes built by plan_strategy() train and finish; SriftyCallback's profile records the layout, the full
    model, its blocks, and FSDP's collectives: per step every unit is gathered in forward and every block again in
    backward (the root stays gathered), every unit's gradient is reduce-scattered once."""
    import subprocess

    from predictor.documents.profile import load_profile

    plan = drift_plan(catalog, tmp_path)
    two = next(
        i for i, e in enumerate(plan.entries) if e.gpus == 2 and len({g.per_device_batch for g in e.groups}) == 1
    )
    entry = dataclasses.replace(plan.entries[two], layout=plan_layout("fsdp:full_shard+ac"))
    plan = dataclasses.replace(plan, entries=[entry], chosen=0)
    plan.save(tmp_path / "plan.json")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lightning_srifty.cli", "launch", "--plan", str(tmp_path / "plan.json")]
    cmd += ["--workdir", str(tmp_path / "w"), "--", str(SCRIPTS / "fsdp_run.py"), str(out), "--max-steps", "7"]
    launched = subprocess.run(cmd, env={**subprocess_env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-3000:]
    assert '"sharding_strategy":"FULL_SHARD"' in launched.stdout  # the launcher says what it started
    for rank in (0, 1):
        got = json.loads((out / f"strategy-rank{rank}.json").read_text())
        assert got["strategy"] == "SriftyFSDPStrategy" and got["sharding"] == "ShardingStrategy.FULL_SHARD"
        assert got["world_size"] == 2 and got["units"] == ["Stack", "Block", "Block", "Block"]
        assert got["checkpointed"] == ["Block"] * 3 and len(set(got["batch_sizes"])) == 1
    profile = load_profile(out / "profile.json")
    # what a checkpoint costs, measured on the sharded directory FSDP writes (every shard read back by one process)
    assert profile.checkpoint is not None and profile.checkpoint.bytes > 0 and "sharded" in profile.checkpoint.where
    assert profile.checkpoint.load_s is not None and profile.checkpoint.load_s > 0
    width = 64
    block = 4 * width * width + 3 * width  # up (64 -> 128) and down (128 -> 64), with biases
    assert profile.layout == "fsdp:full_shard+ac" and profile.model.parameters == 3 * block + width + 1
    assert profile.model.trainable_parameters == profile.model.parameters  # not this rank's shard
    s = profile.model.structure
    assert (s.blocks, s.block, s.block_parameters) == (3, "Block", block)
    comm = profile.communication
    root = -(-(width + 1) // 2) * 2  # the head's flat parameter, padded to split over 2 ranks
    gathered = 4 * (root + 3 * block)
    assert comm.backend == "gloo" and comm.allgather_bytes_per_step == gathered + 4 * 3 * block
    assert comm.reduce_scatter_bytes_per_step == gathered
    assert comm.allgather_s.p50 > 0 and comm.reduce_scatter_s.p50 > 0 and comm.allgather_s.count >= 2
    # the gathered size, about twice the fp32 model (forward + backward); (world - 1) / world of it crosses the wire
    assert comm.allgather_bytes_per_step == pytest.approx(2 * 4 * profile.model.parameters, rel=0.01)


def test_resume_checkpoint_under_a_launch(monkeypatch, tmp_path) -> None:
    """The job's one call for its resume path: None on a first start; a local path as it is; a remote sharded
    directory fetched by local rank 0 while the node's other ranks wait for it to appear (complete, by rename)."""
    import threading

    import fsspec

    from lightning_srifty import resume_checkpoint
    from predictor.exceptions import MigrationError

    for name in [v for v in os.environ if v.startswith("SRIFTY_")]:
        monkeypatch.delenv(name)
    assert resume_checkpoint() is None  # not under srifty launch
    for name, value in LaunchEnv(launch_id="L1", checkpoint_uri=str(tmp_path / "ckpt"), resume="").to_env().items():
        monkeypatch.setenv(name, value)
    assert resume_checkpoint() is None  # a first start
    local = str(tmp_path / "ckpt" / "preempt-step=5.ckpt")
    monkeypatch.setenv("SRIFTY_RESUME", local)
    assert resume_checkpoint() == local
    remote = "memory://bucket/run/preempt-step=5.ckpt"
    fsspec.filesystem("memory").makedirs(remote, exist_ok=True)
    fsspec.filesystem("memory").pipe(remote + "/.metadata", b"x")
    monkeypatch.setenv("SRIFTY_RESUME", remote)
    monkeypatch.setenv("LOCAL_RANK", "1")
    final = tmp_path / "cache" / "preempt-step=5.ckpt"
    said = functools.partial(_say_on_this_node, str(final), _recorded(remote))

    def local_rank_0(word: str = "ready") -> None:  # its rename, then its word beside it
        final.mkdir(parents=True, exist_ok=True)
        said(word)

    threading.Timer(0.3, local_rank_0).start()
    assert resume_checkpoint(str(tmp_path / "cache"), poll_s=0.05) == str(final)
    with pytest.raises(MigrationError, match=r"Waited 0 s for local rank 0 to download .*preempt-step=5"):
        resume_checkpoint(str(tmp_path / "other"), timeout_s=0.1, poll_s=0.05)
    # a review: a copy of another run's checkpoint of the same name was taken as it was, while local rank 0 fetched
    # this one over it; and a rank 0 that failed left its node's other ranks waiting for the whole timeout
    _say_on_this_node(str(final), "0123456789abcdef", "ready")  # another run's word, its copy still in place
    with pytest.raises(MigrationError, match=r"Waited 0 s"):
        resume_checkpoint(str(tmp_path / "cache"), timeout_s=0.2, poll_s=0.05)
    threading.Timer(0.2, local_rank_0, args=("failed: its sha256 differs",)).start()
    with pytest.raises(MigrationError, match=r"Local rank 0 could not bring .* onto this node: its sha256 differs"):
        resume_checkpoint(str(tmp_path / "cache"), timeout_s=60, poll_s=0.05)


def test_a_remote_file_is_fetched_for_a_strategy_that_loads_local_paths_only(monkeypatch, tmp_path) -> None:
    """Lightning's FSDP (a full state dict: one file) and model-parallel strategies take the checkpoint path as a
    local ``Path``: an ``s3://`` file was "not a valid checkpoint" and a fleet's replacement could not resume it. For
    them the file is fetched like a sharded directory: by local rank 0, checked against its recorded sha256, renamed
    into place (the node's other ranks wait for it); every other strategy still reads the URL through fsspec."""
    import hashlib
    import threading

    import fsspec
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from lightning_srifty import resume_checkpoint
    from lightning_srifty.migrate.checkpoints import loads_local_paths, local_checkpoint, write_digest
    from predictor.exceptions import MigrationError

    assert loads_local_paths(FSDPStrategy()) and not loads_local_paths(DDPStrategy())
    memory = fsspec.filesystem("memory")
    remote = "memory://bucket/full/preempt-step=5.ckpt"
    payload = b"a full state dict" * 1000
    memory.pipe(remote, payload)
    write_digest(memory, remote, hashlib.sha256(payload).hexdigest())  # as the writer seals it
    assert local_checkpoint(remote, str(tmp_path / "c")) == remote  # DDP's: fsspec reads it
    fetched = local_checkpoint(remote, str(tmp_path / "c"), fetch_file=True)
    assert fetched == str(tmp_path / "c" / "preempt-step=5.ckpt") and Path(fetched).read_bytes() == payload
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["preempt-step=5.ckpt"]  # no partial left
    assert local_checkpoint(remote, str(tmp_path / "c"), fetch_file=True) == fetched  # a sound copy is taken
    memory.pipe(remote, payload[:-1] + b"!")  # not what was saved
    Path(fetched).unlink()
    with pytest.raises(MigrationError, match=r"did not download intact .*sha256 differs"):
        local_checkpoint(remote, str(tmp_path / "c"), fetch_file=True)
    assert list((tmp_path / "c").iterdir()) == []  # nothing half-written left for a later reader
    # under a launch: the node's other ranks wait for local rank 0's file, as for a directory
    for name in [v for v in os.environ if v.startswith("SRIFTY_")]:
        monkeypatch.delenv(name)
    for name, value in LaunchEnv(launch_id="L1", checkpoint_uri="memory://bucket/full", resume=remote).to_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_RANK", "1")
    final = tmp_path / "cache" / "preempt-step=5.ckpt"
    assert resume_checkpoint(str(tmp_path / "cache")) == remote  # DDP: nothing to wait for
    final.parent.mkdir()

    def local_rank_0() -> None:  # its rename, then its word beside it
        final.write_bytes(payload)
        _say_on_this_node(str(final), _recorded(remote), "ready")

    threading.Timer(0.3, local_rank_0).start()
    assert resume_checkpoint(str(tmp_path / "cache"), poll_s=0.05, fetch_file=True) == str(final)
    # local rank 0's own call: the copy and its word; once every rank loaded it, forgotten (copy, digest, word)
    monkeypatch.setenv("LOCAL_RANK", "0")
    final.unlink()
    memory.pipe(remote, payload)  # what was saved, again
    assert resume_checkpoint(str(tmp_path / "cache"), fetch_file=True) == str(final) and final.read_bytes() == payload
    assert (tmp_path / "cache" / "preempt-step=5.ckpt.on-this-node").read_text().endswith(" ready")
    forget_on_this_node(str(final))
    assert list((tmp_path / "cache").iterdir()) == []
    # where nothing sets LOCAL_RANK (SLURM: SLURM_LOCALID), the rank the Trainer or Fabric knows waits, fetching none
    monkeypatch.delenv("LOCAL_RANK")
    with pytest.raises(MigrationError, match="Waited 0 s for local rank 0"):
        on_this_node(remote, str(tmp_path / "cache"), fetch_file=True, timeout_s=0.1, poll_s=0.02, local_rank=1)
    assert not final.exists()


def test_a_module_fsdp_holds_is_not_asked_its_state_dict_to_compare_a_checkpoint(tmp_path) -> None:
    """The launch's check that a checkpoint is this model's called ``state_dict()`` on the LightningModule inside
    FSDP's root: its flat parameters' shapes made a full state dict "not written by this model" (the run started
    over) and the call marked an inner unit the root, which broke the next step. A sharded module is left to FSDP's
    own load, which checks names and shapes; a plain one is still compared."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    from lightning_srifty.migrate.checkpoints import _held_sharded, architecture_differences

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"0.weight": torch.zeros(3, 3)}}, path)
    assert architecture_differences(str(path), model)  # a plain module: compared
    unit = FullyShardedDataParallel.__new__(FullyShardedDataParallel)  # an FSDP unit (no process group here)
    nn.Module.__init__(unit)
    holder = nn.Sequential(unit, nn.Linear(4, 8))
    assert _held_sharded(holder) and architecture_differences(str(path), holder) == []
    assert not _held_sharded(model)


def test_every_rank_resumes_the_latest_checkpoint_rank_zero_found(monkeypatch, tmp_path) -> None:
    """A review: on a srifty terraform fleet (SRIFTY_RESUME=latest) each rank looked for the newest sound checkpoint on
    its own, so a rank that could not read the newest (a transient store error) resumed an older one than its peers:
    another step, optimizer state and data position, and a hang at the end. Under a Trainer, global rank 0 looks and
    every rank resumes what it found (the strategy's broadcast); the other ranks do not read the store at all."""
    from types import SimpleNamespace

    from lightning_srifty import resume_checkpoint
    from lightning_srifty.migrate import checkpoints

    for name in [v for v in os.environ if v.startswith("SRIFTY_")]:
        monkeypatch.delenv(name)
    env = LaunchEnv(launch_id="L1", checkpoint_uri=str(tmp_path / "ckpt"), resume="latest").to_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    newest = str(tmp_path / "ckpt" / "preempt-step=9.ckpt")
    sent: list[object] = []

    def broadcast(obj: object, src: int = 0) -> object:
        sent.append(obj)
        return newest  # what rank 0 found, on every rank

    def unreadable(uri: str) -> str:
        raise AssertionError("only global rank 0 reads the store")

    monkeypatch.setattr(checkpoints, "find_checkpoint", unreadable)
    rank1 = SimpleNamespace(is_global_zero=False, strategy=SimpleNamespace(broadcast=broadcast))
    agree = lambda find: checkpoints._from_rank_zero(rank1, find)  # noqa: E731
    assert resume_checkpoint(agree=agree) == newest and sent == [None]
    monkeypatch.setattr(checkpoints, "find_checkpoint", lambda uri: newest if uri == str(tmp_path / "ckpt") else None)
    rank0 = SimpleNamespace(is_global_zero=True, strategy=SimpleNamespace(broadcast=lambda obj, src=0: obj))
    assert resume_checkpoint(agree=lambda find: checkpoints._from_rank_zero(rank0, find)) == newest
    assert resume_checkpoint() == newest  # without a Trainer: each rank looks on its own


def test_ranks_fetching_one_remote_directory_at_once_all_get_the_sound_copy(
    tmp_path, moto_endpoint, monkeypatch
) -> None:
    """Every rank of a node may call local_checkpoint on the same remote sharded directory (S3, moto's server) at the
    same moment (a job that resumes without srifty's launch): none may delete or vet another's half-copy, all get the
    one sound copy, and no temporary name is left behind."""
    pytest.importorskip("s3fs")
    import threading

    import boto3
    import fsspec
    import torch.distributed.checkpoint as dcp

    from lightning_srifty.migrate.checkpoints import local_checkpoint, sha256_of, write_manifest
    from lightning_srifty.store import filesystem

    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in {**aws, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
    saved = tmp_path / "saved"
    dcp.save({"w": torch.arange(4096.0), "b": torch.ones(64)}, checkpoint_id=str(saved), no_dist=True)
    remote = "s3://ckpts/run/preempt-step=5.ckpt"
    store, local = filesystem(remote), fsspec.filesystem("file")
    digests = {}
    for f in sorted(saved.iterdir()):
        store.pipe(f"{remote}/{f.name}", f.read_bytes())
        digests[f.name] = sha256_of(local, str(f))
    write_manifest(store, remote, digests)
    cache, got, failed = tmp_path / "cache", [], []

    def fetch() -> None:
        try:
            got.append(local_checkpoint(remote, str(cache)))
        except Exception as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    for _ in range(2):  # a cold cache, then one already filled
        threads = [threading.Thread(target=fetch) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failed, failed
    final = cache / "preempt-step=5.ckpt"
    assert got == [str(final)] * 12
    assert {f.name: sha256_of(local, str(f)) for f in final.iterdir()} == digests
    assert sorted(p.name for p in cache.iterdir()) == ["preempt-step=5.ckpt", "preempt-step=5.ckpt.sha256"]


def test_a_manifest_naming_a_path_outside_the_folder_is_never_downloaded(tmp_path, moto_endpoint, monkeypatch) -> None:
    """A sharded checkpoint's manifest is writable by every instance of the run: one that names ../x (or a file the
    folder does not hold) is refused before anything is written, and nothing lands outside the cache."""
    pytest.importorskip("s3fs")
    import boto3

    from lightning_srifty.migrate.checkpoints import local_checkpoint, write_manifest
    from lightning_srifty.store import filesystem
    from predictor.exceptions import MigrationError

    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in {**aws, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
    store = filesystem("s3://ckpts/run")
    for evil in ("../../escaped.txt", "not-listed.distcp"):
        remote = f"s3://ckpts/run/{evil.split('.')[0].strip('/') or 'x'}-step=5.ckpt"
        store.pipe(f"{remote}/.metadata", b"x")
        store.pipe("s3://ckpts/escaped.txt", b"planted")  # what ../../escaped.txt would fetch
        write_manifest(store, remote, {".metadata": "0" * 64, evil: "0" * 64})
        cache = tmp_path / "cache" / "a" / "b"
        with pytest.raises(MigrationError, match=r"manifest lists .*which is not a file of that folder"):
            local_checkpoint(remote, str(cache))
    assert not (tmp_path / "cache" / "escaped.txt").exists() and not list(tmp_path.rglob("escaped.txt"))
    assert not cache.exists() or not list(cache.iterdir())  # no half-copy left


def _sharded_checkpoint(folder) -> dict[str, str]:
    """A real DCP directory as Lightning's FSDP strategy writes one (an index, one shard, meta.pt), and its manifest's
    digests."""
    import torch.distributed.checkpoint as dcp

    from lightning_srifty.migrate.checkpoints import sha256_of
    from lightning_srifty.store import filesystem

    # no process group: torch saves as one rank, and says so in a UserWarning it gives once per process (whether this
    # test sees it depends on which test of the worker saved first: not asserted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": {"w": torch.arange(4096, dtype=torch.float32)}}, checkpoint_id=str(folder))
    torch.save({"global_step": 5, "epoch": 0}, folder / "meta.pt")
    local = filesystem(str(folder))
    return {f.name: sha256_of(local, str(f)) for f in folder.iterdir()}


def _flip_a_shard(read, write, shard: str) -> None:
    data = bytearray(read(shard))
    data[len(data) // 2] ^= 0xFF
    write(shard, bytes(data))


def test_a_checkpoint_without_its_manifest_never_resumes_under_a_launch(tmp_path, moto_endpoint, monkeypatch) -> None:
    """Issue #23 item 3: deleting a sharded checkpoint's manifest turned a bit-flipped shard into a silent resume. Under
    srifty launch the node refuses a directory without a manifest (on S3 and on local disk), a local directory is
    checked against its manifest too, and the launcher refuses to hand such a checkpoint over."""
    pytest.importorskip("s3fs")
    import boto3

    from lightning_srifty.migrate.checkpoints import resume_checkpoint, write_manifest
    from lightning_srifty.store import filesystem, require_manifest

    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in {**aws, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_RANK", "0")
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
    local = tmp_path / "saved" / "preempt-step=5.ckpt"
    digests = _sharded_checkpoint(local)
    store = filesystem("s3://ckpts/run")
    remote = "s3://ckpts/run/preempt-step=5.ckpt"
    store.put(str(local), remote, recursive=True)
    write_manifest(store, remote, digests)

    def resume(path: str) -> str | None:
        monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", "s3://ckpts/run")
        monkeypatch.setenv("SRIFTY_LAUNCH_ID", "l-1")
        monkeypatch.setenv("SRIFTY_RESUME", path)
        return resume_checkpoint(str(tmp_path / f"cache-{len(list(tmp_path.iterdir()))}"))

    assert os.path.isdir(resume(remote))  # sound, with its manifest: fetched and checked
    shard = next(n for n in digests if n.endswith(".distcp"))
    _flip_a_shard(store.cat_file, store.pipe_file, f"{remote}/{shard}")
    store.rm(remote + ".sha256")  # what made the flipped shard load silently
    with pytest.raises(MigrationError, match=r"has no manifest \(preempt-step=5\.ckpt\.sha256\)"):
        resume(remote)
    with pytest.raises(MigrationError, match="has no manifest"):
        require_manifest(remote)  # the launcher, before it starts the next fleet with it

    # the local provisioner's checkpoints: the same rule, and the manifest is checked, not only looked for
    write_manifest(filesystem(str(local)), str(local), digests)
    assert resume(str(local)) == str(local)
    _flip_a_shard(lambda p: (local / p).read_bytes(), lambda p, b: (local / p).write_bytes(b), shard)
    with pytest.raises(MigrationError, match=f"its file {shard} .*differs from the sha256 recorded"):
        resume(str(local))
    os.remove(str(local) + ".sha256")
    with pytest.raises(MigrationError, match="has no manifest"):
        resume(str(local))
