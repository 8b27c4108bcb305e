"""Moving sharded training (#15 item 5): 2 FSDP ranks (gloo, CPU) checkpoint to S3 (moto's server) through
torch.distributed.checkpoint on SIGTERM, and the run resumes on 1 FSDP rank, on 3 FSDP ranks and on one plain device
at the exact next sample, with the Adam moments resharded and the parameters of an uninterrupted run. Then the
checkpoints are damaged in every way find_checkpoint must notice."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _support import SCRIPTS, ended_after_its_work, run_nodes
from _support import params_by_step as _params
from _support import seen_samples as _seen
from conftest import moto_server
from lightning_srifty import store
from lightning_srifty.migrate.checkpoints import (
    DIGEST_SUFFIX,
    consolidate,
    find_checkpoint,
    local_checkpoint,
    read_manifest,
)
from lightning_srifty.provision.rehearsal.node import on_its_own_disk, private_disk

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

STEPS, LEAVE_AT = 12, 5
URL = "s3://ckpts/fsdp-run"
# Float tolerance of "the same parameters": the global batch (12) is averaged in another order (6+6 reduce-scattered,
# 12 at once, 4+4+4), a rounding difference of ~1 float32 ulp that Adam's normalised update does not damp. Measured:
# 1.2e-7 at each of the 7 resumed steps, all three legs, on parameters of size ~0.1-1 (float32 eps is 1.2e-7). A
# reset of the moments moves them by ~1e-3 at the first step (lr 0.01): this tolerance tells the two apart.
ATOL = 2e-6


def _start(out: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    cmd = [sys.executable, str(SCRIPTS / "fsdp_migrate_run.py"), str(out), "--max-steps", str(STEPS), *args]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.txt", "w") as log:  # the child writes through its own copy
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait(*procs: tuple[Path, subprocess.Popen]) -> None:
    """Wait for every leg; on any failure the others are killed and reaped first (a leg left running was reported,
    as a ResourceWarning, in whatever test the collector next ran on that worker: stop 77's second failure)."""
    try:
        for out, proc in procs:
            code = proc.wait(300)
            log = (out / "log.txt").read_text()
            assert ended_after_its_work(code, log), f"exit {code}:\n{log[-4000:]}"
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """The legs, two at a time: an uninterrupted reference and the leg that leaves at step 5 (both 2 FSDP ranks);
    then the resumes from S3 on 1 and 3 FSDP ranks and one plain device (global batch 12 each time)."""
    pytest.importorskip("s3fs")
    import boto3

    root = tmp_path_factory.mktemp("fsdp-move")
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    with moto_server() as endpoint, pytest.MonkeyPatch.context() as mp:
        for name, value in {**aws, "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"}.items():
            mp.setenv(name, value)  # for the legs, and for the tests reading the store in this process
        env = _job_env()
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="ckpts")
        ref = _start(root / "ref", env, "--batch-sizes", "6,6")
        leave = ["--batch-sizes", "6,6", "--sigterm-at", str(LEAVE_AT), "--ckpt-uri", URL, "--every-s", "0"]
        _wait((root / "ref", ref), (root / "leave", _start(root / "leave", env, *leave)))
        legs = {
            "fsdp-1": ["--batch-sizes", "12"],
            "fsdp-3": ["--batch-sizes", "4,4,4"],
            "one-device": ["--batch-sizes", "12", "--strategy", "single"],
        }
        started = [(root / n, _start(root / n, env, *a, "--resume-from", URL)) for n, a in legs.items()]
        _wait(*started)
        yield root


def _optimizer_state(path: Path, names: list[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """Adam's state by parameter name, from a sharded directory (keyed by name) or a file checkpoint of a plain
    optimizer (keyed by position: ``names`` gives the order)."""
    if path.is_dir():
        from lightning.fabric.utilities.load import _load_distributed_checkpoint

        optimizer = _load_distributed_checkpoint(path)["optimizer_0"]
    else:
        optimizer = torch.load(path, weights_only=True)["optimizer_states"][0]
    names = names or [n for group in optimizer["param_groups"] for n in group["params"]]
    by_name = {str(names[k] if isinstance(k, int) else k): v for k, v in optimizer["state"].items()}
    return {n: by_name[n] for n in names if n in by_name}  # in the optimizer's order


@pytest.mark.parametrize("leg", ["fsdp-1", "fsdp-3", "one-device"])
def test_a_sharded_run_resumes_on_another_world_size_exactly(moved, leg) -> None:
    ref, left, resumed = _seen(moved / "ref"), _seen(moved / "leave"), _seen(moved / leg)
    assert len(ref) == STEPS  # (epoch, step): 8 steps of 12 samples per epoch, so the run crosses into epoch 1
    assert sorted(left) == sorted(ref)[:LEAVE_AT]  # the leaving leg trained steps 0..4 and stopped
    assert sorted(resumed) == sorted(ref)[LEAVE_AT:]  # the next sample on, nothing repeated or skipped
    assert {k: sorted(v) for k, v in (left | resumed).items()} == {k: sorted(v) for k, v in ref.items()}
    assert all(len(v) == 12 for v in resumed.values())  # the global batch kept: 12 -> 4+4+4 or 12 at once
    p_ref, p_run = _params(moved / "ref"), _params(moved / leg)
    assert sorted(p_run) == list(range(LEAVE_AT + 1, STEPS + 1))
    worst = max(abs(a - b) for s in p_run for a, b in zip(p_ref[s], p_run[s], strict=True))
    print(f"{leg}: largest parameter difference from the uninterrupted run {worst:.2g}")
    assert worst < ATOL
    # the Adam moments were resharded, not reset: what the resumed run holds before its first step is what was saved
    saved = _optimizer_state(Path(local_checkpoint(f"{URL}/preempt-step={LEAVE_AT}.ckpt", str(moved / "get"))))
    held = _optimizer_state(moved / leg / "at-start.ckpt", names=list(saved))
    assert saved.keys() == held.keys() and len(saved) == 16
    for name, state in saved.items():
        assert float(state["step"]) == float(held[name]["step"]) == LEAVE_AT
        for moment in ("exp_avg", "exp_avg_sq"):
            assert state[moment].abs().sum() > 0
            assert torch.equal(state[moment].flatten(), held[name][moment].flatten()), (name, moment)


def test_checkpoints_on_s3_are_published_with_a_manifest_and_pruned(moved) -> None:

    fs = store.filesystem(URL)  # the endpoint of the moment (fsspec caches by options)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(URL))
    # every step took a periodic checkpoint (every_s=0), keep=2 of them; the leaving one at step 5; no .partial
    assert names == [
        "PREEMPTED.json",
        "periodic-step=3.ckpt",
        "periodic-step=3.ckpt.sha256",
        "periodic-step=4.ckpt",
        "periodic-step=4.ckpt.sha256",
        "preempt-step=5.ckpt",
        "preempt-step=5.ckpt.sha256",
    ]
    manifest = read_manifest(fs, f"{URL}/preempt-step=5.ckpt")
    assert sorted(manifest) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert find_checkpoint(URL) == f"{URL}/preempt-step=5.ckpt"
    assert not (Path(os.environ.get("TMPDIR", "/tmp")) / "srifty-checkpoints" / "preempt-step=5.ckpt").exists()


TWO_NODES = "s3://ckpts/fsdp-two-nodes"


def _two_torchrun_nodes(out: Path, env: dict[str, str], *args: str) -> None:
    """The leg on two torchrun agents of one process each, node 1 started 2 s after node 0. Each agent runs in a mount
    namespace of its own with a tmpfs at the same path, its TMPDIR: two nodes with local disks of their own under one
    name, as every instance of a fleet has /tmp (Lightning saves every rank's shards under global rank 0's path)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"fsdp-{port}"]
    cmd += [str(SCRIPTS / "fsdp_migrate_run.py"), str(out), "--max-steps", str(STEPS), "--node-disk", *args]
    env = dict(env)
    run_nodes(out, [(on_its_own_disk(cmd, env, out / "disk"), env)] * 2)


def _job_env() -> dict[str, str]:
    """The legs' environment: one thread, this checkout's package and scripts first."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS.parents[1]), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_two_nodes_with_their_own_disks_publish_a_sound_sharded_checkpoint(moved, tmp_path) -> None:
    """A fleet of two nodes, FSDP sharded across them (a 7B plan's layout), checkpoints to S3 on a notice. Each node
    saves its ranks' shards on its own disk first. Only global rank 0 renamed the saved directory into place, so node
    1's shard stayed under its temporary name and was never uploaded: the manifest named a shard the store did not
    have and the run had no checkpoint to resume. Each node publishes and uploads its own shards, and keeps no copy."""
    why = private_disk()
    if why is not None:
        pytest.skip(f"two nodes with disks of their own need a mount namespace: {why}")
    env = _job_env()
    leave = tmp_path / "two-nodes"
    _two_torchrun_nodes(leave, env, "--batch-sizes", "6,6", "--sigterm-at", str(LEAVE_AT), "--ckpt-uri", TWO_NODES)
    ref = _seen(moved / "ref")
    assert sorted(_seen(leave)) == sorted(ref)[:LEAVE_AT]
    fs = store.filesystem(TWO_NODES)
    newest = f"{TWO_NODES}/preempt-step={LEAVE_AT}.ckpt"
    shards = [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(newest)) == shards
    assert find_checkpoint(TWO_NODES) == newest
    # each node's local copies went once the store held them (every step took a periodic checkpoint: keep=2)
    for rank in (0, 1):
        assert (leave / f"disk-rank{rank}.txt").read_text().split() == [], f"rank {rank}'s node kept a copy"
    # and a fleet of two new nodes resumes from it (each node downloads it to its own disk, under one path) at the
    # next sample, with the uninterrupted run's parameters
    resumed = tmp_path / "resumed"
    _two_torchrun_nodes(resumed, env, "--batch-sizes", "6,6", "--resume-from", TWO_NODES)
    assert sorted(_seen(resumed)) == sorted(ref)[LEAVE_AT:]
    p_ref, p_run = _params(moved / "ref"), _params(resumed)
    assert max(abs(a - b) for s in p_run for a, b in zip(p_ref[s], p_run[s], strict=True)) < ATOL


def test_the_profiler_measures_a_checkpoint_sharded_over_two_nodes_disks(moved, tmp_path) -> None:
    """A review: SriftyCallback's checkpoint measurement (on by default) saved under rank 0's temporary folder, whose
    shards then lay on each node's own disk, and rank 0 read the whole checkpoint back from its own: torch raised
    CheckpointException (a BaseException, past the measurement's guard) and the run died at the end of the profile
    window on every multi-node sharded fleet. Its size now counts every rank's files, the read-back is left out where
    rank 0 does not see every shard (said in the notes), and each node removes its copy."""
    why = private_disk()
    if why is not None:
        pytest.skip(f"two nodes with disks of their own need a mount namespace: {why}")
    env = _job_env()
    out = tmp_path / "profiled"
    _two_torchrun_nodes(out, env, "--batch-sizes", "6,6", "--profile")
    assert len(_seen(out)) == STEPS  # trained past the window
    profile = json.loads((out / "profile.json").read_text())
    shards = store.filesystem(URL).du(f"{URL}/preempt-step={LEAVE_AT}.ckpt", total=False)  # the same model's shards
    shard_bytes = sum(n for name, n in shards.items() if name.endswith(".distcp"))
    assert profile["checkpoint"]["bytes"] >= shard_bytes and profile["checkpoint"].get("load_s") is None
    assert any("files are on other nodes' disks" in note for note in profile["notes"])
    for rank in (0, 1):
        assert (out / f"disk-rank{rank}.txt").read_text().split() == [], f"rank {rank}'s node kept the measured one"


def test_a_full_state_dict_on_the_cpu_is_measured_saved_on_a_notice_and_resumed_on_three_ranks(moved, tmp_path) -> None:
    """FSDP's full state dict (Lightning's default ``state_dict_type``) on the CPU: Lightning 2.6 gathers it with a
    CPU offload that, for shards already there, frees the storage their views alias, and rank 0 died with SIGSEGV in
    the first save, the profiler's measured checkpoint at the end of its window (``srifty demo --strategy
    srifty_fsdp --accelerator cpu``; Lightning-AI/pytorch-lightning#21804). srifty_fsdp gathers it there without the
    offload: the window measures the checkpoint, the notice's is one file, and 3 ranks resume from it at the next
    sample with the parameters of the uninterrupted (sharded) run, as a fleet's replacement node does (the launch's
    "latest"). That resume read the S3 URL itself, which Lightning's FSDP load takes for a local ``Path``
    ("s3:/... does not point to a valid checkpoint"): the file is fetched to the node's disk first."""
    env = _job_env()
    uri = "s3://ckpts/fsdp-full"
    leave = ["--batch-sizes", "6,6", "--sigterm-at", str(LEAVE_AT), "--ckpt-uri", uri, "--profile"]
    _wait((tmp_path / "leave", _start(tmp_path / "leave", env, *leave, "--state-dict-type", "full")))
    profile = json.loads((tmp_path / "leave" / "profile.json").read_text())
    assert profile["checkpoint"]["bytes"] > 0 and profile["checkpoint"]["load_s"] > 0, profile.get("notes")
    newest = find_checkpoint(uri)
    assert newest == f"{uri}/preempt-step={LEAVE_AT}.ckpt" and store.filesystem(uri).isfile(newest)  # one file
    disk = tmp_path / "node-disk"  # the node's temporary folder, where its ranks' copy is fetched
    disk.mkdir()
    node = {**env, "SRIFTY_CHECKPOINT_URI": uri, "SRIFTY_RESUME": "latest", "TMPDIR": str(disk)}  # the boot script's
    resume = ["--batch-sizes", "4,4,4", "--ckpt-uri", uri, "--state-dict-type", "full"]
    _wait((tmp_path / "resumed", _start(tmp_path / "resumed", node, *resume)))
    said = (tmp_path / "resumed" / "log.txt").read_text()
    assert "resuming from the fleet's newest sound checkpoint" in said and f"{disk}/srifty-resume" in said, said[-3000:]
    # fetched once for the node and removed once every rank had loaded it (it stayed beside the next save before)
    assert said.count("is on this node at") == 1, said[-3000:]
    assert not [str(p) for p in (disk / "srifty-resume").rglob("*") if p.is_file()]
    ref = _seen(moved / "ref")
    assert sorted(_seen(tmp_path / "leave")) == sorted(ref)[:LEAVE_AT]
    assert sorted(_seen(tmp_path / "resumed")) == sorted(ref)[LEAVE_AT:]
    p_ref, p_run = _params(moved / "ref"), _params(tmp_path / "resumed")
    assert sorted(p_run) == list(range(LEAVE_AT + 1, STEPS + 1))
    assert max(abs(a - b) for s in p_run for a, b in zip(p_ref[s], p_run[s], strict=True)) < ATOL


def _copy(moved: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Local copies of the two newest checkpoints (with their manifests) in tmp_path/ckpt."""
    folder = tmp_path / "ckpt"
    for name in ("periodic-step=4.ckpt", f"preempt-step={LEAVE_AT}.ckpt"):
        local_checkpoint(f"{URL}/{name}", str(folder))
    return folder / "periodic-step=4.ckpt", folder / f"preempt-step={LEAVE_AT}.ckpt"


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _truncate(newest: Path) -> None:
    shard = newest / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])


def _flip(newest: Path) -> None:
    shard = newest / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(data)


def _plant_metadata(newest: Path) -> None:
    import pickle

    (newest / ".metadata").write_bytes(pickle.dumps(_Payload(str(newest.parent / "pwned"))))
    (Path(str(newest) + DIGEST_SUFFIX)).unlink()  # a planted directory comes without our manifest


def _plant_meta_pt(newest: Path) -> None:
    meta = torch.load(newest / "meta.pt", weights_only=True)
    torch.save(meta | {"evil": _Payload(str(newest.parent / "pwned"))}, newest / "meta.pt")
    (Path(str(newest) + DIGEST_SUFFIX)).unlink()


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_truncate, "__1_0.distcp ("),
        (_flip, "differs from the sha256 recorded"),
        (lambda d: (d / "__1_0.distcp").unlink(), "its file __1_0.distcp is missing"),
        (lambda d: (d / ".metadata").unlink(), "its file .metadata is missing"),
        (_plant_metadata, "would construct posix.system"),
        (_plant_meta_pt, "meta.pt pickle would construct"),
    ],
    ids=["truncated", "flipped-byte", "missing-shard", "missing-index", "code-in-index", "code-in-meta"],
)
def test_a_damaged_sharded_checkpoint_is_skipped_for_the_previous_one(moved, tmp_path, caplog, damage, why) -> None:
    older, newest = _copy(moved, tmp_path)
    damage(newest)
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        assert find_checkpoint(str(tmp_path / "ckpt")) == str(older)
    assert "skipping checkpoint" in caplog.text and "preempt-step=5.ckpt" in caplog.text and why in caplog.text
    assert not (tmp_path / "ckpt" / "pwned").exists(), "the planted checkpoint's code ran"


def test_a_sharded_directory_written_by_lightning_alone_is_checked_by_its_index(moved, tmp_path, caplog) -> None:
    """No manifest (Lightning's own ModelCheckpoint wrote it): sound when every indexed chunk is there."""
    older, newest = _copy(moved, tmp_path)
    for path in (older, newest):
        Path(str(path) + DIGEST_SUFFIX).unlink()
    assert find_checkpoint(str(tmp_path / "ckpt")) == str(newest)
    _truncate(newest)
    with caplog.at_level("WARNING", logger="lightning_srifty"):
        assert find_checkpoint(str(tmp_path / "ckpt")) == str(older)
    assert "__1_0.distcp is truncated" in caplog.text


def test_consolidate_refuses_a_damaged_directory_naming_the_file(moved, tmp_path) -> None:
    from predictor.exceptions import MigrationError

    _, newest = _copy(moved, tmp_path)
    (newest / "__0_0.distcp").unlink()
    with pytest.raises(MigrationError, match=r"cannot be consolidated: its file __0_0.distcp is missing"):
        consolidate(str(newest), str(tmp_path / "one.ckpt"))
    assert not (tmp_path / "one.ckpt").exists()


def test_a_remote_directory_that_does_not_match_its_manifest_is_not_downloaded_as_sound(moved, tmp_path) -> None:

    from predictor.exceptions import MigrationError

    fs = store.filesystem(URL)  # the endpoint of the moment (fsspec caches by options)
    broken = f"{URL}-broken/preempt-step=5.ckpt"
    fs.copy(f"{URL}/preempt-step=5.ckpt", broken, recursive=True)
    fs.copy(f"{URL}/preempt-step=5.ckpt.sha256", broken + DIGEST_SUFFIX)
    fs.pipe(f"{broken}/__1_0.distcp", b"not a shard")
    with pytest.raises(MigrationError, match="did not download intact"):
        local_checkpoint(broken, str(tmp_path))
    assert not (tmp_path / "preempt-step=5.ckpt").exists()
    shutil.rmtree(tmp_path, ignore_errors=True)
