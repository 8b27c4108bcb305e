"""Heterogeneous ranks and exact resume on another world size: the global-batch sampler, the weighted gradient
(2 real gloo processes), and a run preempted on 1 process and finished on 2 with unequal batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _support import (
    MINIMAL,
    SCRIPTS,
    bench_module,
    ddp_failure,
    params_by_step,
    run_bounded,
    run_ddp_script,
    seen_samples,
)
from lightning_srifty.strategies.hetero import GlobalBatchSampler, rank_weights
from predictor.exceptions import ConfigError


def test_shares_partition_every_global_batch_and_an_epoch_once() -> None:
    samplers = [GlobalBatchSampler(100, [5, 3], r, seed=3) for r in (0, 1)]
    steps = [list(s) for s in samplers]
    assert len(steps[0]) == len(steps[1]) == 12 == len(samplers[0])  # 100 // 8, the last 4 samples dropped
    for a, b in zip(*steps):
        assert len(a) == 5 and len(b) == 3 and not set(a) & set(b)
    seen = [i for step in zip(*steps) for part in step for i in part]
    assert len(seen) == len(set(seen)) == 96
    assert list(samplers[0]) != steps[0]  # the next epoch is another permutation
    assert rank_weights([5, 3]) == [1.25, 0.75]


def test_position_carries_over_to_another_split() -> None:
    one = GlobalBatchSampler(64, [8], 0, seed=1)
    it = iter(one)
    first = [next(it) for _ in range(3)]
    state = one.state_dict()
    assert state["consumed"] == 24
    rest = []
    for r in (0, 1):
        s = GlobalBatchSampler(64, [6, 2], r, seed=1)
        s.load_state_dict(state)
        rest.append(list(s))
    resumed = [a + b for a, b in zip(*rest)]
    full = list(GlobalBatchSampler(64, [8], 0, seed=1))
    assert [sorted(b) for b in first + resumed] == [sorted(b) for b in full]
    with pytest.raises(ConfigError, match="global batch of 8, this run has 16"):
        GlobalBatchSampler(64, [8, 8], 0).load_state_dict(state)


@pytest.mark.ddp
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_unequal_batches_give_the_global_batch_gradient(tmp_path, ddp_env, strategy) -> None:
    """DDP weights the gradient buckets, FSDP the losses: both reduce to the global batch's gradient."""
    flag = ["--fsdp"] if strategy == "fsdp" else []
    result = run_bounded(  # mp.spawn with its own port: none of run_ddp_script's retries applies
        [sys.executable, str(SCRIPTS / "hetero_grad_check.py"), str(tmp_path / "r.txt"), *flag],
        timeout=180,
        env=ddp_env,
    )
    assert result.returncode == 0, ddp_failure(result)
    fields = {k: float(v) for k, v in (kv.split("=") for kv in result.stdout.split())}
    assert fields["max_abs_diff"] < 1e-6 * fields["max_abs_grad"] and fields["max_abs_grad"] > 0.01


def _leg(out: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    steps = [] if "--max-steps" in args else ["--max-steps", "30"]
    run = run_ddp_script(
        [sys.executable, str(SCRIPTS / "migrate_run.py"), str(out), *steps, *args],
        env,
        timeout=300,
    )
    assert run.returncode == 0, ddp_failure(run)
    return run


@pytest.mark.ddp
def test_preempted_on_one_process_finished_on_two_with_unequal_batches(tmp_path, ddp_env) -> None:
    """1 process -> SIGTERM at step 10 -> checkpoint at the next step -> resume on 2 processes (batches 5 + 3 of the
    same global 8) -> step 30: the same samples at every step as an uninterrupted run, 0 lost or repeated steps,
    and the same parameters to float noise."""
    _leg(tmp_path / "ref", ddp_env, "--batch-sizes", "8")
    _leg(tmp_path / "run", ddp_env, "--batch-sizes", "8", "--sigterm-at", "10")
    preempted = json.loads((tmp_path / "run" / "preempted.json").read_text())
    assert preempted["step"] == 11 and (tmp_path / "run" / "ckpt" / "preempt-step=11.ckpt").is_file()
    _leg(tmp_path / "run", ddp_env, "--batch-sizes", "5,3", "--resume")
    ref, run = seen_samples(tmp_path / "ref"), seen_samples(tmp_path / "run")
    assert sorted(run) == sorted(ref) and len(ref) == 30  # every step once: none lost, none repeated
    assert all(sorted(run[k]) == sorted(ref[k]) for k in ref)  # the same global batch at every step
    for epoch in (0, 1):  # whole epochs: every sample exactly once
        ids = [i for (e, _), v in run.items() if e == epoch for i in v]
        assert sorted(ids) == list(range(96))
    assert (tmp_path / "run" / "seen-rank1.txt").read_text().count("\n") == 19  # steps 12..30 on the second rank
    p_ref, p_run = params_by_step(tmp_path / "ref"), params_by_step(tmp_path / "run")
    assert sorted(p_run) == list(range(1, 31))
    assert max(abs(a - b) for s in p_ref for a, b in zip(p_ref[s], p_run[s])) < 1e-5


@pytest.mark.ddp
@pytest.mark.parametrize(
    ("script_mode", "seed"),
    [(("--from-env",), "7"), (("--plain",), "0")],
    ids=["glue-from-launch-env", "plain-script-srifty-auto"],
)
def test_srifty_launch_moves_a_spot_run_from_one_to_two_processes(
    tmp_path, subprocess_env, catalog, script_mode, seed
) -> None:
    """srifty launch on a plan's spot fleet (1 GPU) -> a simulated spot notice from a local metadata service ->
    checkpoint -> relaunch on the plan's next fleet (2 GPUs, the same global batch split 4 + 4) -> finish at step 60:
    the same samples at every step as an uninterrupted run, no step lost or repeated, the migration logged.

    Twice: a script that reads the launch itself (sampler, ExactResume, SpotPreemption, ckpt_path), and a plain one
    (``DataLoader(batch_size=8, shuffle=True)``, ``Trainer(strategy="srifty_auto")``, ``fit()`` without ckpt_path)
    to which the strategy applies the plan: the split, the position, the move and the resume."""
    import copy

    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    profile = load_profile({**copy.deepcopy(MINIMAL), "batch": {"per_device": 8}})
    c = Constraints(steps=1000, market="spot", allow=("g4dn.xlarge",), max_instances=2)
    plan = rank(profile, c, catalog=catalog)
    assert [e.fleet for e in plan.entries] == ["g4dn.xlarge:1", "g4dn.xlarge:2"]
    plan.save(tmp_path / "plan.json")
    script = [str(SCRIPTS / "migrate_run.py"), str(tmp_path / "run"), "--max-steps", "60"]
    _leg(tmp_path / "ref", subprocess_env, "--batch-sizes", "8", "--max-steps", "60", "--seed", seed)
    env = {**subprocess_env, "SRIFTY_SPOT_POLL_S": "0.05"}
    cmd = [sys.executable, "-m", "lightning_srifty.cli", "launch", "--plan", str(tmp_path / "plan.json")]
    cmd += ["--workdir", str(tmp_path / "w"), "--simulate-notice-after", "10", "--", *script, *script_mode]
    launched = subprocess.run([*cmd, "--step-sleep", "0.2"], env=env, capture_output=True, text=True, timeout=600)
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-3000:]
    assert "g4dn.xlarge:2 (spot) as 2 local process(es), batches [4, 4]" in launched.stdout
    (move,) = [json.loads(line) for line in (tmp_path / "w" / "migrations.jsonl").read_text().splitlines()]
    assert (move["from_fleet"], move["to_fleet"]) == ("g4dn.xlarge:1", "g4dn.xlarge:2")
    assert "spot interruption notice" in move["why"] and 0 <= move["step"] < 60
    ref, run = seen_samples(tmp_path / "ref"), seen_samples(tmp_path / "run")
    assert sorted(run) == sorted(ref) and len(ref) == 60
    assert all(sorted(run[k]) == sorted(ref[k]) for k in ref)
    p_ref, p_run = params_by_step(tmp_path / "ref"), params_by_step(tmp_path / "run")
    # the plain script's own on_train_batch_end does not run on the leaving step: Lightning calls the callbacks'
    # hooks (SpotPreemption saves and exits there) before the module's
    missing = sorted(set(p_ref) - set(p_run))
    assert missing == [] or (script_mode == ("--plain",) and len(missing) == 1), missing
    assert max(abs(a - b) for s in p_run for a, b in zip(p_ref[s], p_run[s])) < 1e-5


def test_a_dataset_smaller_than_one_global_batch_is_refused_not_trained_as_nothing() -> None:
    """Issue #36 L7: a plan's micro_batches of 1e9 left every epoch empty and the launch "finished" having trained
    nothing; a plan whose batches no dataset holds is refused where it is read, and a sampler with no whole
    optimizer step in its dataset says so."""
    with pytest.raises(ConfigError, match=r"has 100 samples, fewer than one global batch of 128 \(64 per micro"):
        GlobalBatchSampler(100, [40, 24], 0, accumulate_grad_batches=2)


@pytest.mark.ddp
def test_a_rebalance_recommendation_one_node_alone_sees_is_saved_by_every_rank_and_training_goes_on(
    tmp_path, ddp_env
) -> None:
    """A rebalance recommendation is each instance's own: on a fleet of two nodes one rank has it. The ranks voted
    twice a step, on a notice and on "a checkpoint", so the other rank took its own flag's absence for a periodic
    save while the first made the rebalance one: collectives that never matched, and the job hung at that step
    (until a node's stall watch took it for a hang). One vote of three flags sends every rank the same way: both
    save ``rebalance-step=5``, and the run trains on to its end."""
    run = _leg(tmp_path / "run", ddp_env, "--batch-sizes", "8,8", "--max-steps", "12", "--rebalance-at", "5")
    assert sorted(p.name for p in (tmp_path / "run" / "ckpt").glob("*.ckpt")) == ["rebalance-step=5.ckpt"]
    assert "a peer's rebalance recommendation: checkpoint" in run.stderr
    assert (tmp_path / "run" / "params.txt").read_text().splitlines()[-1].split()[0] == "12"


@pytest.mark.parametrize(
    ("before", "after", "stop_at"),
    [(([8], 1), ([4], 2), 5), (([4], 2), ([8], 1), 5), (([4], 2), ([8], 1), 17), (([8], 1), ([2], 4), 30)],
    ids=["8-to-4x2", "4x2-to-8", "4x2-to-8-second-epoch", "8-to-2x4-third-epoch"],
)
def test_a_resume_whose_micro_batches_differ_keeps_lightnings_epoch(tmp_path, before, after, stop_at) -> None:
    """A trial: a run moved mid-epoch from 2 GPUs of 32 to 1 GPU of 32 x 2 accumulated (the same global batch of 64)
    lost its epoch's validation (EarlyStopping then failed: 'val_loss not available'), and the move back lost a step:
    Lightning's count of the epoch's batches, restored from the checkpoint, was in the old fleet's micro-batches while
    the sampler stood at the samples consumed. On one process, micro-batches of 8 vs 4 x 2 (or 2 x 4): every step
    trains the samples an uninterrupted run does, every epoch has its 12 steps, and validation runs at each end."""
    lab = bench_module("resume_micro_batches")  # bench/resume_micro_batches.py: before and after, in a table
    ref: dict = {"ids": {}, "validated": []}
    run: dict = {"ids": {}, "validated": []}
    lab.leg(tmp_path, ref, *after)
    lab.leg(tmp_path, run, *before, stop_at=stop_at)
    assert (tmp_path / "notice.ckpt").is_file() and max(run["ids"]) == stop_at - 1
    lab.leg(tmp_path, run, *after, resume=tmp_path / "notice.ckpt")
    assert sorted(ref["ids"]) == list(range(36)) and all(len(v) == 8 for v in ref["ids"].values())
    assert ref["validated"] == [12, 24, 36] and ref["epoch_steps"] == {0: 12, 1: 24, 2: 36}
    assert sorted(run["ids"]) == list(range(36)), sorted(run["ids"])
    assert {k: sorted(v) for k, v in run["ids"].items()} == {k: sorted(v) for k, v in ref["ids"].items()}
    assert run["validated"] == ref["validated"], run["validated"]
    assert run["epoch_steps"] == ref["epoch_steps"], run["epoch_steps"]
