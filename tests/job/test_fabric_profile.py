"""A Lightning Fabric loop profiled (``FabricProfiler``): the window a Trainer's ``SriftyCallback`` measures, from the
marks a Fabric loop gives (``prof.step(batch)``, ``prof.backward(loss)``).

Before it, a Fabric user had no profile of their own loop: ``SriftyCallback`` is a Trainer's and ``srifty capture``
builds a LightningModule, a torchvision or a transformers model. The fast tests run one Fabric in this process; two
ranks (DDP's all-reduce hook, FSDP's collectives) and a resumed leg are in ``test_fabric.py``'s torchrun test.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from lightning_srifty.migrate.fabric import FabricPreemption
from lightning_srifty.profiling.fabric import FabricProfiler
from predictor.exceptions import ConfigError
from predictor.ranking.constraints import Constraints

pytestmark = pytest.mark.usefixtures("no_launch")


@pytest.fixture
def no_launch(monkeypatch):
    for name in ("SRIFTY_LAUNCH_ID", "SRIFTY_CHECKPOINT_URI", "SRIFTY_PLAN"):
        monkeypatch.delenv(name, raising=False)


def _setup(seed: int = 1):
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    return fabric, model, optimizer


def _batch(i: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _loop(model, optimizer, prof, steps: int, *, mark_backward: bool = True, fabric=None) -> None:
    for i in range(steps):
        x, y = _batch(i)
        with prof.step((x, y)) if prof is not None else _nothing():
            loss = nn.functional.cross_entropy(model(x), y)
            if prof is not None and mark_backward:
                prof.backward(loss)
            else:
                fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _profiler(fabric, model, optimizer, tmp_path, **kw):
    kw = {"warmup_steps": 2, "profile_steps": 5, "recommend": False, "verbose": False, **kw}
    return FabricProfiler(fabric, model, optimizer, output=tmp_path / "profile.json", **kw)


def test_a_fabric_loop_is_profiled_with_its_phases_operators_and_checkpoint_cost(tmp_path) -> None:
    fabric, model, optimizer = _setup()
    with _profiler(fabric, model, optimizer, tmp_path, accumulate_grad_batches=1) as prof:
        _loop(model, optimizer, prof, 12)
        assert prof.done  # after batch 2 + 5: the loop may stop or train on unprofiled
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["schema"].startswith("srifty.profile/")
    assert profile["model"]["name"] == "Sequential"  # the user's module, not Fabric's wrapper
    assert profile["model"]["parameters"] == 16 * 32 + 32 + 32 * 4 + 4
    assert profile["model"]["optimizer"].endswith("AdamW") and profile["model"]["precision"] == "32-true"
    assert profile["batch"]["per_device"] == 8 and profile["batch"]["global_batch"] == 8
    assert profile["timing"]["step_time_s"]["count"] == 5 and not profile["timing"]["window"]["truncated"]
    phases = profile["timing"]["phases_s"]
    assert all(phases[p]["count"] == 5 for p in ("data", "forward", "backward", "optimizer"))
    ops = profile["ops"]["ops"]
    assert {op["phase"] for op in ops} == {"forward", "backward", "optimizer"}, ops
    assert any(op["op"].startswith("aten.addmm") and op["phase"] == "forward" for op in ops)
    assert profile["checkpoint"]["bytes"] > 0 and profile["checkpoint"]["save_s"] > 0
    assert profile["communication"]["reason"] == "a single process: no gradient all-reduce"


def test_profiling_leaves_the_training_as_it_was(tmp_path) -> None:
    """The operator capture (a dispatch mode, CUDA's autocast policy off a GPU) and the marks change no number."""
    fabric, model, optimizer = _setup()
    _loop(model, optimizer, None, 10, fabric=fabric)
    plain = [p.detach().clone() for p in model.parameters()]
    fabric, model, optimizer = _setup()
    with _profiler(fabric, model, optimizer, tmp_path) as prof:
        _loop(model, optimizer, prof, 10)
    assert prof.profile is not None
    for a, b in zip(plain, model.parameters(), strict=True):
        assert torch.equal(a, b.detach())


def test_a_loop_that_calls_fabric_backward_is_timed_but_gets_no_operator_table_and_is_told_why(tmp_path, caplog):
    fabric, model, optimizer = _setup()
    with (
        caplog.at_level(logging.WARNING, logger="lightning_srifty"),
        _profiler(fabric, model, optimizer, tmp_path) as p,
    ):
        _loop(model, optimizer, p, 10, mark_backward=False, fabric=fabric)
    said = [r.getMessage() for r in caplog.records if "prof.backward(loss)" in r.getMessage()]
    assert len(said) == 1, said  # once, not a line a batch
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["timing"]["step_time_s"]["count"] == 5
    assert profile["timing"].get("phases_s") is None  # no backward mark: no split, rather than a wrong one
    assert profile.get("ops") is None
    assert any("call prof.backward(loss) instead of fabric.backward(loss)" in n for n in profile.get("notes", []))


def test_a_loop_shorter_than_the_window_is_profiled_as_far_as_it_ran(tmp_path) -> None:
    fabric, model, optimizer = _setup()
    with _profiler(fabric, model, optimizer, tmp_path, profile_steps=50) as prof:
        _loop(model, optimizer, prof, 6)
        assert not prof.done
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["timing"]["window"]["truncated"] and profile["timing"]["step_time_s"]["count"] == 4
    assert any("4 of 50 requested steps ran" in n for n in profile["notes"])


def test_a_loop_too_short_to_time_writes_nothing_and_says_how_long_to_train(tmp_path, caplog) -> None:
    fabric, model, optimizer = _setup()
    with (
        caplog.at_level(logging.ERROR, logger="lightning_srifty"),
        _profiler(fabric, model, optimizer, tmp_path) as prof,
    ):
        _loop(model, optimizer, prof, 1)
    assert not (tmp_path / "profile.json").exists() and prof.profile is None
    assert "Train longer, e.g. 7 batches" in caplog.text


def test_a_loop_that_raises_writes_no_profile(tmp_path) -> None:
    fabric, model, optimizer = _setup()
    with pytest.raises(RuntimeError, match="a bug"), _profiler(fabric, model, optimizer, tmp_path) as prof:
        _loop(model, optimizer, prof, 3)
        with prof.step(_batch(3)):
            raise RuntimeError("a bug")
    assert prof.done and not (tmp_path / "profile.json").exists()


def test_an_interrupted_step_is_left_out_and_counted_by_its_reason(tmp_path) -> None:
    fabric, model, optimizer = _setup()
    with _profiler(fabric, model, optimizer, tmp_path) as prof:
        for i in range(10):
            if i == 4:
                prof.interrupt("validation")  # the loop validated between batches 3 and 4
            x, y = _batch(i)
            with prof.step((x, y)):
                prof.backward(nn.functional.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["timing"]["step_time_s"]["count"] == 4
    assert profile["timing"]["window"]["excluded_steps"] == {"validation": 1}, profile["timing"]["window"]


def test_a_run_its_state_says_was_profiled_is_not_profiled_again_unless_asked(tmp_path) -> None:
    fabric, model, optimizer = _setup()
    state = {"model": model, "optimizer": optimizer, "step": 0}
    with _profiler(fabric, model, optimizer, tmp_path, state=state) as prof:
        _loop(model, optimizer, prof, 8)
    assert state["srifty_profiled"] is True  # FabricPreemption's checkpoints carry it to the resumed run
    (tmp_path / "profile.json").unlink()
    with _profiler(fabric, model, optimizer, tmp_path, state=state) as again:
        assert again.done
        _loop(model, optimizer, again, 8)
    assert not (tmp_path / "profile.json").exists()
    with _profiler(fabric, model, optimizer, tmp_path, state=state, reprofile=True) as third:
        _loop(model, optimizer, third, 8)
    assert (tmp_path / "profile.json").exists()


def test_with_constraints_the_window_ends_in_a_plan_for_the_whole_run(tmp_path) -> None:
    fabric, model, optimizer = _setup()
    constraints = Constraints(steps=20_000, market="on-demand", max_instances=2)
    with _profiler(fabric, model, optimizer, tmp_path, recommend=True, constraints=constraints) as prof:
        _loop(model, optimizer, prof, 8)
    assert prof.plan is not None and (tmp_path / "plan.json").exists()
    plan = json.loads((tmp_path / "plan.json").read_text())
    # the work is the loop's optimizer steps x its profiled global batch (8), as everywhere
    assert plan["constraints"]["work_samples"] == 20_000 * 8 and plan["constraints"]["global_batch"] == 8
    assert plan["constraints"]["market"] == "on-demand" and plan["constraints"]["max_instances"] == 2
    assert plan["entries"] and plan["chosen"] is not None
    assert set(prof.written) == {"profile", "plan", "report"}


def test_a_recommendation_without_the_runs_length_is_refused_before_training(tmp_path) -> None:
    fabric, model, optimizer = _setup()
    with pytest.raises(ConfigError, match=r"constraints=Constraints\(steps=\.\.\.\)") as err:
        FabricProfiler(fabric, model, optimizer, output=tmp_path / "p.json")
    assert err.value.parameter == "constraints"


@pytest.mark.parametrize(
    ("field", "build", "match"),
    [
        ("fabric", lambda f, m, o: (object(), m, o), "takes the script's Fabric, not a object"),
        ("model", lambda f, m, o: (f, "model", o), "takes the module fabric.setup returned, not a str"),
        ("optimizers", lambda f, m, o: (f, m, [o, 3]), "not a int"),
    ],
)
def test_what_is_not_a_fabric_a_module_or_an_optimizer_is_refused_by_name(tmp_path, field, build, match) -> None:
    fabric, model, optimizer = _setup()
    with pytest.raises(ConfigError, match=match) as err:
        FabricProfiler(*build(fabric, model, optimizer), recommend=False, output=tmp_path / "p.json")
    assert err.value.parameter == field


@pytest.mark.parametrize(
    ("field", "value"), [("warmup_steps", 0), ("profile_steps", -1), ("accumulate_grad_batches", 0)]
)
def test_window_settings_out_of_range_are_refused_naming_the_field(tmp_path, field, value) -> None:
    fabric, model, optimizer = _setup()
    with pytest.raises(ConfigError) as err:
        FabricProfiler(fabric, model, optimizer, recommend=False, output=tmp_path / "p.json", **{field: value})
    assert err.value.parameter == field or field in str(err.value)


def test_a_checkpoint_fabric_preemption_saves_in_the_window_leaves_its_step_out(tmp_path, monkeypatch, caplog):
    """As a Trainer's callback hears ``on_save_checkpoint``: the fleet's periodic checkpoint is not a training step's
    time. Its interval passes once in the window (a slow batch 4); with a checkpoint every step no step is left, and
    the error says why."""
    monkeypatch.setenv("SRIFTY_CHECKPOINT_URI", str(tmp_path / "ckpt"))
    monkeypatch.setenv("SRIFTY_NODE_STATE", str(tmp_path))

    def run(every_s: str, slow: int) -> None:
        monkeypatch.setenv("SRIFTY_CHECKPOINT_EVERY_S", every_s)
        fabric, model, optimizer = _setup()
        state = {"model": model, "optimizer": optimizer, "step": 0}
        with FabricPreemption(fabric, state, keep=1) as spot, _profiler(fabric, model, optimizer, tmp_path) as prof:
            for i in range(10):
                x, y = _batch(i)
                with prof.step((x, y)):
                    prof.backward(nn.functional.cross_entropy(model(x), y))
                    optimizer.step()
                    optimizer.zero_grad()
                    if i == slow:
                        time.sleep(float(every_s) * 1.5)
                state["step"] += 1
                spot.step()

    run("1.0", slow=4)  # saved after batch 4: batch 5 is left out
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["timing"]["window"]["excluded_steps"] == {"checkpoint": 1}, profile["timing"]["window"]
    assert profile["timing"]["step_time_s"]["count"] == 4
    (tmp_path / "profile.json").unlink()
    with caplog.at_level(logging.ERROR, logger="lightning_srifty"):
        run("0", slow=-1)
    assert not (tmp_path / "profile.json").exists()
    assert "every step of the window had other work in it (checkpoint 5)" in caplog.text


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fabric_example_profiles_itself_and_ranks_fleets_for_its_run(tmp_path, subprocess_env) -> None:
    """examples/fabric_digits.py as the README runs it, off a fleet: batches 20-219 profiled, the plan for 20,000
    steps beside the profile, and the loop trained to its end."""
    env = {**subprocess_env, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for name in ("SRIFTY_CHECKPOINT_URI", "SRIFTY_LAUNCH_ID", "SRIFTY_PLAN"):
        env.pop(name, None)
    command = [
        sys.executable,
        str(ROOT / "examples" / "fabric_digits.py"),
        "--accelerator",
        "cpu",
        "--max-steps",
        "230",
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 230 steps" in done.stdout
    profile = json.loads((tmp_path / "srifty" / "profile.json").read_text())
    assert profile["model"]["name"] == "DigitsCNN"
    window = profile["timing"]["window"]  # 23 batches an epoch: the first batch of each epoch in the window left out
    assert window["steps"] + window["excluded_steps"]["epoch_boundary"] == 200, window
    assert 8 <= window["excluded_steps"]["epoch_boundary"] <= 10, window
    assert profile["batch"]["global_batch"] == 64 and profile["batch"]["loader_workers"] == 0
    plan = json.loads((tmp_path / "srifty" / "plan.json").read_text())
    assert plan["constraints"]["work_samples"] == 20_000 * 64 and plan["chosen"] is not None
    assert (tmp_path / "srifty" / "report.html").exists()


@pytest.mark.slow
@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_three_ranks_one_raising_inside_the_window_neither_hang_nor_train_otherwise(tmp_path, subprocess_env) -> None:
    """torchrun, 3 gloo ranks (tests/scripts/fabric_profile_ranks.py). Rank 0's batch 3 raises inside the window and
    its loop catches it: that step is left out on rank 0 and the window goes on, so every rank reaches its end (the
    gather, the checkpoint's collectives) at the same batch (before, rank 0 aborted alone and the others waited in the
    gather until gloo's timeout killed the job). The profiled model's parameters equal, bit for bit, those of its
    unprofiled twin after 20 steps: the profiler's all-reduce hook is DDP's own mean (torch's default hook divides,
    which at world 3 differs in the last bit). A second profiler of the model times the all-reduces through the
    first's hook."""
    env = {**subprocess_env, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    port = _free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", "--master_port", str(port)]
    command += [str(ROOT / "tests" / "scripts" / "fabric_profile_ranks.py"), str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(tmp_path / f"equal-rank{r}.txt").read_text().strip() for r in range(3)] == ["True"] * 3
    first = json.loads((tmp_path / "profile.json").read_text())
    assert first["timing"]["window"]["excluded_steps"] == {"exception": 1}, first["timing"]["window"]
    assert first["hardware"]["world_size"] == 3 and first["batch"]["global_batch"] == 48
    for profile in (first, json.loads((tmp_path / "profile2.json").read_text())):
        assert profile["communication"]["backend"] == "gloo", profile["communication"]
        assert profile["communication"]["bytes_per_step"] > 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_epoch_that_begins_in_the_window_leaves_its_first_step_out(tmp_path) -> None:
    """As a Trainer's callback leaves out a step after ``on_train_epoch_start``: Fabric's loader says when it begins
    an epoch (its sampler's shuffle, a worker pool's start)."""
    fabric, model, optimizer = _setup()
    data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randint(0, 4, (32,)))
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=8))  # 4 batches an epoch
    with _profiler(fabric, model, optimizer, tmp_path, profile_steps=6, dataloader=loader) as prof:
        for _ in range(3):
            for x, y in loader:
                with prof.step((x, y)):
                    prof.backward(nn.functional.cross_entropy(model(x), y))
                    optimizer.step()
                    optimizer.zero_grad()
    profile = json.loads((tmp_path / "profile.json").read_text())
    # the window is batches 2-7: batch 4 begins the second epoch (batch 8, the third, is after it)
    assert profile["timing"]["window"]["excluded_steps"] == {"epoch_boundary": 1}, profile["timing"]["window"]


def test_a_profiler_that_cannot_start_logs_why_and_the_loop_trains_on(tmp_path, monkeypatch, caplog) -> None:
    from lightning_srifty.profiling import fabric as module

    def broken(*args, **kwargs):
        raise RuntimeError("no clock")

    monkeypatch.setattr(module, "ProfileWindow", broken)
    fabric, model, optimizer = _setup()
    prof = _profiler(fabric, model, optimizer, tmp_path)
    with caplog.at_level(logging.ERROR, logger="lightning_srifty"), prof:
        assert prof.done
        _loop(model, optimizer, prof, 8)
    assert "FabricProfiler could not start profiling (RuntimeError: no clock); training goes on" in caplog.text
    assert not (tmp_path / "profile.json").exists()


def test_an_unwritable_output_keeps_the_profile_in_memory_and_says_where(tmp_path, caplog) -> None:
    (tmp_path / "file").write_text("")
    fabric, model, optimizer = _setup()
    with caplog.at_level(logging.ERROR, logger="lightning_srifty"), FabricProfiler(
        fabric, model, optimizer, warmup_steps=2, profile_steps=3, recommend=False, verbose=False,
        output=tmp_path / "file" / "profile.json",
    ) as prof:  # fmt: skip
        _loop(model, optimizer, prof, 8)
    assert prof.profile is not None and "kept in memory (prof.profile)" in caplog.text
