"""The code and environment a fleet runs (issue #22 item 1): what the snapshot holds (git's view of a work tree,
.gitignore / .sriftyignore elsewhere, never a root module srifty wrote, never a link out), that it is reproducible
and bounded, the pins it carries from the profile, and what `srifty terraform` refuses or warns about. The
snapshot's boot on a node (fetch, check, bootstrap, torchrun) is run in test_terraform_boot.py."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from _support import plan_layout
from lightning_srifty.provision.terraform.generate import Options, generate
from lightning_srifty.provision.terraform.snapshot import build_snapshot, code_files, environment_spec, repacked_wheel
from predictor.documents.plan import load_plan
from predictor.documents.profile import Software
from predictor.exceptions import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"
SPEC = {"packages": ["torch==2.13.0"], "requirements": None}


def _project(folder: Path) -> Path:
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("from lightning_srifty import plan_strategy\n")
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "__pycache__").mkdir()
    (folder / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"x" * 10_000)
    (folder / "notes.tmp").write_text("scratch")
    (folder / ".gitignore").write_text("data/\n")
    (folder / ".sriftyignore").write_text("*.tmp\n")
    return folder


def _members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_a_folder_outside_git_honours_its_ignore_files_and_leaves_out_caches_links_and_srifty_roots(tmp_path) -> None:
    project = _project(tmp_path / "p")
    (project / "infra").mkdir()
    (project / "infra" / ".srifty.json").write_text("{}")  # a root module srifty terraform wrote earlier
    (project / "infra" / "main.tf").write_text("")
    (project / "outside").symlink_to(tmp_path)  # a link out of the folder
    (project / "alias.py").symlink_to(project / "train.py")  # a link inside it: its content is carried
    files, source = code_files(project)
    assert source == "walk"
    assert files == [".gitignore", ".sriftyignore", "alias.py", "pkg/__init__.py", "train.py"]


def test_a_git_work_tree_is_read_as_git_sees_it(tmp_path) -> None:
    project = _project(tmp_path / "p")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "train.py"], check=True)
    (project / "gone.py").write_text("")
    subprocess.run(["git", "-C", str(project), "add", "gone.py"], check=True)
    (project / "gone.py").unlink()  # tracked but deleted: not carried
    files, source = code_files(project)
    assert source == "git"
    # untracked files come too (the user's working state), ignored ones never; .sriftyignore is git's business
    # here only if git ignores it, so notes.tmp is carried
    assert files == [".gitignore", ".sriftyignore", "notes.tmp", "pkg/__init__.py", "train.py"]


def test_the_snapshot_is_reproducible_content_addressed_and_carries_the_environment(tmp_path) -> None:
    project = _project(tmp_path / "p")
    (project / "run.sh").write_text("#!/bin/sh\n")
    (project / "run.sh").chmod(0o755)
    first = build_snapshot(project, tmp_path / "a", SPEC)
    os.utime(project / "train.py", (1, 1))  # a new time stamp alone changes nothing
    second = build_snapshot(project, tmp_path / "b", SPEC)
    assert first.sha256 == second.sha256 and first.path.read_bytes() == second.path.read_bytes()
    assert first.path.name == f"{first.sha256}.tar.gz"
    (project / "train.py").write_text("print('changed')\n")
    assert build_snapshot(project, tmp_path / "c", SPEC).sha256 != first.sha256
    members = _members(first.path)
    assert members["run.sh"].mode == 0o755 and members["train.py"].mode == 0o644
    assert {m.mtime for m in members.values()} == {0} and {m.uid for m in members.values()} == {0}
    with tarfile.open(first.path, "r:gz") as tar:
        env = json.loads(tar.extractfile(".srifty/environment.json").read())
        wheel = next(n for n in members if n.startswith(".srifty/wheels/"))
        assert ".srifty/bootstrap.py" in members
        assert env["wheel"] == wheel and env["packages"] == ["torch==2.13.0"]
        assert env["schema"] == "srifty.environment/v1"


def test_the_repacked_wheel_is_this_installation(tmp_path) -> None:
    name, data = repacked_wheel()
    path = tmp_path / name
    path.write_bytes(data)
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        record = wheel.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    assert ("lightning_srifty/__init__.py" in names and "predictor/data/ec2_catalog.csv" in names) or any(
        n.startswith("predictor/data/") for n in names
    )
    assert not any("__pycache__" in n for n in names)
    assert "Requires-Dist: torch" in metadata and "Requires-Dist: lightning" in metadata
    assert all(n in record for n in names if not n.endswith("RECORD"))
    assert repacked_wheel()[1] == data  # reproducible


def test_the_repacked_wheel_keeps_every_entry_point(tmp_path) -> None:
    """A trial: the wheel a fleet installs had the console script alone, without Lightning's callbacks_factory entry
    point, so no Trainer on a node got SpotPreemption and a plain script trained through a spot notice (the README
    says it leaves). The repack carries the installation's entry points, each group as pyproject.toml declares it."""
    import configparser
    import importlib.metadata

    from lightning_srifty.provision.terraform.snapshot import ENTRY_POINTS

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    name, data = repacked_wheel()
    (tmp_path / name).write_bytes(data)
    with zipfile.ZipFile(tmp_path / name) as wheel:
        text = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    shipped = configparser.ConfigParser()
    shipped.read_string(text)
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    declared = {"console_scripts": project["scripts"], **project["entry-points"]}
    assert {g: dict(shipped[g]) for g in shipped.sections()} == declared
    fallback = configparser.ConfigParser()
    fallback.read_string(ENTRY_POINTS)
    assert {g: dict(fallback[g]) for g in fallback.sections()} == declared
    factories = importlib.metadata.entry_points(group="lightning.pytorch.callbacks_factory")
    assert "lightning_srifty.migrate.preemption:launch_callbacks" in {e.value for e in factories}


def test_a_snapshot_over_its_bound_names_the_largest_files(tmp_path) -> None:
    project = _project(tmp_path / "p")
    (project / "weights.pt").write_bytes(b"\0" * 300_000)
    with pytest.raises(ConfigError, match=r"over the snapshot's limit of 0.1 MiB; the largest files: weights.pt") as e:
        build_snapshot(project, tmp_path / "out", SPEC, max_mb=0.1)
    assert e.value.parameter == "max_code_mb"
    assert not (tmp_path / "out").exists()


def test_a_requirements_file_must_be_in_the_snapshot(tmp_path) -> None:
    project = _project(tmp_path / "p")
    with pytest.raises(ConfigError, match=r"requirements file data/req.txt is not among the code's files"):
        build_snapshot(project, tmp_path / "out", {**SPEC, "requirements": "data/req.txt"})


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        ("torch==2.5.1", "line 2 asks for 'torch==2.5.1', but every node installs the profiled torch 2.13.0"),
        ("torch>=2.1,<3  # any 2.x", None),
        ("lightning==2.4.0", "asks for 'lightning==2.4.0', but every node installs the profiled lightning 2.6.6"),
        ("torchvision==0.20.1", "this release of torchvision is built for another torch"),
        ("torchvision==0.28.0", None),
        ("torchaudio~=2.13.0", None),
        ("torch==2.5.1; sys_platform == 'darwin'", None),  # not on a Linux node
        ("-r other.txt", None),
    ],
)
def test_a_requirements_pin_the_nodes_cannot_install_beside_the_profiled_torch_is_refused(tmp_path, line, refused):
    """A trial: a requirements file pinning torch==2.5.1 beside the profiled 2.13.0 passed srifty terraform and
    srifty check, and every node stopped at boot on pip's ResolutionImpossible, after the fleet was paid for."""
    project = _project(tmp_path / "p")
    (project / "requirements.txt").write_text(f"pyyaml\n{line}\n")
    spec = {**SPEC, "packages": ["torch==2.13.0", "lightning==2.6.6"], "requirements": "requirements.txt"}
    if refused is None:
        assert build_snapshot(project, tmp_path / "out", spec).sha256
        return
    with pytest.raises(ConfigError, match=re.escape(refused)) as info:
        build_snapshot(project, tmp_path / "out", spec)
    assert info.value.parameter == "requirements" and "Remove the pin from requirements.txt" in str(info.value)


@pytest.mark.parametrize(
    ("torch", "profiled_build", "note"),
    [
        ("2.7.1+cpu", None, "profiled as the cpu build"),
        ("2.7.1+cu126", "cu126", None),
        ("2.7.1", None, None),
    ],
)
def test_the_nodes_get_the_profiled_torch_and_lightning(torch, profiled_build, note) -> None:
    spec, notes = environment_spec(Software(python="3.11.7", torch=torch, lightning="2.6.6"), index_url="https://m/x")
    assert spec["packages"] == ["torch==2.7.1", "lightning==2.6.6"]
    assert spec["extra_index_urls"] == [] and spec["index_url"] == "https://m/x"  # the CUDA index is the node's pick
    assert spec["profiled"]["torch"] == torch
    assert spec["torch_cuda"]["profiled"] == profiled_build and sorted(spec["torch_cuda"]["builds"]) == [
        "cu118", "cu126", "cu128"]  # fmt: skip
    assert (note is None and not notes) or any(note in n for n in notes)


# (profiled torch, node's driver, the index it installs torch from; None: the boot stops)
DRIVERS = [
    ("2.9.1", "580.82.07", "cu130"),  # the newest build the driver supports (CUDA 13.0 needs 580.65.06)
    ("2.9.1", "570.133.20", "cu128"),  # the Deep Learning AMI's driver
    ("2.9.1", "560.35.05", "cu126"),
    ("2.9.1", "535.183.01", "cu128"),  # under every build's own minimum: CUDA 12 minor version compatibility
    ("2.9.1", "525.60.13", "cu128"),
    ("2.9.1", "520.61.05", None),  # under 12.x's 525.60.13 and 13.0's 580.65.06: refused
    ("2.7.1+cu126", "580.82.07", "cu126"),  # the profiled build, which this driver supports
    ("2.7.1+cu128", "565.57.01", "cu126"),  # the profiled cu128 needs 570.26: the newest this driver supports
    ("2.7.1", "470.82.01", "cu118"),  # CUDA 11 minor version compatibility from 450.80.02
    ("2.13.0+cpu", "570.133.20", "cu126"),  # 2.13 has no cu128 build (RELEASE.md): cu126 runs on 570 (issue #35 H1)
    ("2.13.0+cpu", "580.95.05", "cu130"),
    ("2.13.0+cpu", "470.82.01", None),
]


@pytest.mark.parametrize(("torch", "driver", "build"), DRIVERS)
def test_a_gpu_node_installs_the_torch_build_its_driver_runs(torch, driver, build) -> None:
    from lightning_srifty.provision.terraform.bootstrap import torch_index

    spec, _ = environment_spec(Software(python="3.11.7", torch=torch, lightning="2.6.6"))
    args, why = torch_index(spec, driver)
    if build is None:
        release = torch.split("+")[0]
        assert args is None and f"NVIDIA driver {driver} runs none of the CUDA builds torch {release}" in why
        assert "needs driver >= 525.60.13" in why and "--index-url" in why  # the minimum, then the fix
        return
    assert args == ["--extra-index-url", f"https://download.pytorch.org/whl/{build}"]
    assert why.startswith(f"NVIDIA driver {driver}: torch {torch.split('+')[0]} {build} from ")
    assert torch_index(spec, None) == ([], None)  # no GPU (nvidia-smi absent): the index's default build
    mine, _ = environment_spec(Software(torch=torch, lightning="2.6.6"), extra_index_urls=("https://m/cu",))
    args, why = torch_index(mine, driver)
    assert args == [] and "your package index" in why  # the user's index wins, and the node says so


def test_the_cuda_table_is_one_place_and_names_the_default_image(tmp_path, catalog) -> None:
    """cuda_builds.json: every build of every torch release has NVIDIA's minimum drivers; the default image it
    knows is the one the module resolves; srifty terraform names the pick on it and the rule every node applies."""
    from lightning_srifty.provision.terraform import cuda
    from lightning_srifty.provision.terraform.bootstrap import cuda_release
    from lightning_srifty.provision.terraform.summary import node_summary

    data = cuda.table()
    for builds in data["torch_builds"].values():
        for build in builds:
            assert cuda_release(build) in data["toolkit_driver"]
            assert cuda_release(build).split(".")[0] in data["minor_compatibility_driver"]
    (image,) = data["images"]
    assert image in (ROOT / "terraform" / "modules" / "training_fleet" / "variables.tf").read_text()
    project = _project(tmp_path / "p")
    plan = dataclasses.replace(load_plan(PLAN), software=Software(torch="2.9.1+cu128", lightning="2.6.6"))
    options = Options(name="cuda-pick", code=str(project))
    got = generate(plan, tmp_path / "infra", options=options, catalog=catalog)
    text = node_summary(got, options)
    # the environment's pins come from the index, the lightning-srifty wheel from the archive; the Python is named
    assert "environment  a new virtual environment: torch==2.9.1, lightning==2.6.6\n" in text, text
    assert "from PyPI; lightning-srifty from the code archive (lightning_srifty-" in text
    assert "python       the image's python3" in text
    assert (
        "torch build  g5.xlarge (A10G, compute capability 8.6): cu128 on the Deep Learning AMI (NVIDIA driver "
        "570.133.20): the profiled build" in text
    )
    # the profiled cu128 wherever the driver supports it, even where cu130 would run
    assert "at boot: >= 570.26 cu128; >= 560.28.03 cu126; >= 525.60.13 cu128 (minor version compatibility); older: " \
        "the boot stops" in text  # fmt: skip
    options = Options(name="cuda-pick", code=str(project), index_url="https://mirror.example/simple")
    text = node_summary(generate(plan, tmp_path / "infra", options=options, catalog=catalog), options)
    assert "torch build  what your package index serves" in text


def test_a_plan_without_profiled_versions_pins_what_is_installed_here_and_says_so() -> None:
    spec, notes = environment_spec(None)
    from importlib.metadata import version

    assert spec["packages"] == [f"torch=={version('torch').split('+')[0]}", f"lightning=={version('lightning')}"]
    assert any("records no profiled versions" in n for n in notes)


def test_srifty_terraform_refuses_a_script_the_snapshot_does_not_have(tmp_path, catalog) -> None:
    project = _project(tmp_path / "p")
    options = Options(name="code-check", code=str(project), train_command="python src/train.py --epochs 3")
    with pytest.raises(ConfigError, match=r"training script src/train.py is not in the code snapshot") as e:
        generate(load_plan(PLAN), tmp_path / "infra", options=options, catalog=catalog)
    assert e.value.parameter == "train_command" and "Did you mean 'train.py'?" in str(e.value)
    assert not (tmp_path / "infra").exists()  # nothing written
    typo = dataclasses.replace(options, train_command="trian.py --epochs 3")
    with pytest.raises(ConfigError, match=r"training script trian.py is not .* Did you mean 'train.py'\? Run srifty"):
        generate(load_plan(PLAN), tmp_path / "infra", options=typo, catalog=catalog)


def test_srifty_terraform_writes_the_snapshot_once_and_replaces_a_stale_one(tmp_path, catalog) -> None:
    project = _project(tmp_path / "p")
    options = Options(name="code-root", code=str(project))
    first = generate(load_plan(PLAN), tmp_path / "infra", options=options, catalog=catalog)
    code = first.values["train"]["code"]
    assert code == {"source": f"code/{first.snapshot.sha256}.tar.gz", "sha256": first.snapshot.sha256}
    assert (tmp_path / "infra" / code["source"]).is_file()
    assert not any("plan's strategy" in n or "delivers" in n for n in first.notes)
    again = generate(load_plan(PLAN), tmp_path / "infra", options=options, catalog=catalog)
    assert not again.changed
    (project / "train.py").write_text("from lightning_srifty import plan_strategy  # v2\n")
    third = generate(load_plan(PLAN), tmp_path / "infra", options=options, catalog=catalog)
    assert third.changed and sorted(p.name for p in (tmp_path / "infra" / "code").iterdir()) == [
        f"{third.snapshot.sha256}.tar.gz"
    ]


def test_srifty_terraform_warns_of_missing_glue(tmp_path, catalog) -> None:
    project = _project(tmp_path / "p")
    (project / "train.py").write_text("import lightning\n")  # builds its own Trainer, never plan_strategy()
    plan = load_plan(PLAN)
    sharded = dataclasses.replace(
        plan, entries=[dataclasses.replace(e, layout=plan_layout("fsdp:full_shard", "Block")) for e in plan.entries]
    )
    got = generate(sharded, tmp_path / "a", options=Options(name="glue-a", code=str(project)), catalog=catalog)
    assert any("never asks for the plan's strategy" in n and 'strategy="srifty_auto"' in n for n in got.notes)
    bare = generate(plan, tmp_path / "b", options=Options(name="glue-b"), catalog=catalog)
    assert bare.snapshot is None and any("nothing delivers your code" in n for n in bare.notes)


def test_srifty_terraform_says_when_the_script_would_train_another_global_batch(tmp_path, catalog) -> None:
    """A trial's 16 GPUs at 16 a GPU (the profiled 256) ran its script's own DataLoader batch of 32, 512 a step, and
    the summary said "ddp (the script builds its Trainer)" as it does for srifty_auto: where the plan splits the
    batch otherwise than the profiled run and the script never asks for the plan, srifty terraform says so."""
    import copy

    from _support import MINIMAL
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    project = _project(tmp_path / "p")
    (project / "train.py").write_text("import lightning\n")  # its own Trainer and DataLoader
    (project / "srifty").mkdir()
    (project / "srifty" / "profile.json").write_text(json.dumps(MINIMAL))  # 256 a GPU, one V100
    profile = load_profile(copy.deepcopy(MINIMAL))
    plan = rank(profile, Constraints(steps=1000, allow=("g5.xlarge",), max_instances=4, market="on-demand",
                                     objective="time"), catalog=catalog)  # fmt: skip
    choice = next(i for i, e in enumerate(plan.entries) if e.gpus == 4)
    options = Options(name="batch-a", code=str(project), train_command="train.py")
    got = generate(plan, tmp_path / "a", choice=choice, options=options, catalog=catalog)
    (note,) = [n for n in got.notes if "another training than the one ranked" in n]
    assert "the plan trains 64 a GPU on 4 GPUs" in note and "(256 a GPU), 1024 samples a step" in note
    assert note.endswith("set the batch from SRIFTY_BATCH_SIZES"), note  # the same accumulation: the batch alone
    one = next(i for i, e in enumerate(plan.entries) if e.gpus == 1)  # the profiled split: nothing to say
    same = generate(plan, tmp_path / "b", choice=one, options=dataclasses.replace(options, name="batch-b"),
                    catalog=catalog)  # fmt: skip
    assert not any("another training" in n for n in same.notes)
    (project / "train.py").write_text('Trainer(strategy="srifty_auto")\n')  # applies the plan's batch
    glued = generate(plan, tmp_path / "c", choice=choice, options=dataclasses.replace(options, name="batch-c"),
                     catalog=catalog)  # fmt: skip
    assert not any("another training" in n for n in glued.notes)


def _profiled_project(path, script: str, accumulate: int):
    """A project whose train.py is ``script`` and whose srifty/profile.json ran 32 a batch on one GPU, accumulating
    ``accumulate``, validating every 50 of its epoch's 64 batches; (the folder, the profile's dict)."""
    import copy

    from _support import MINIMAL

    project = _project(path)
    (project / "train.py").write_text(script)
    profiled = copy.deepcopy(MINIMAL)
    profiled["batch"] = {"per_device": 32, "all_devices": 32, "accumulate_grad_batches": accumulate}
    profiled["validation"] = {"every_batches": 50, "every_epochs": 1, "epoch_batches": 64}
    (project / "srifty").mkdir()
    (project / "srifty" / "profile.json").write_text(json.dumps(profiled))
    return project, profiled


def test_srifty_terraform_says_which_of_the_batch_and_the_accumulation_differ_and_a_refused_validation(
    tmp_path, catalog
) -> None:
    """A trial: a script accumulating 2 (32 a GPU, 64 a step on one GPU) planned on two GPUs at 32 each, 1 micro-step,
    was told to set the batch only, where the accumulation differed; and its validation every 50 of its 64 batches
    was more than the 32 a rank trains on two GPUs, which Lightning refuses at the first step (only the rehearsal
    found it). srifty terraform names the accumulation's variable, and says of the validation."""
    import copy

    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    project, profiled = _profiled_project(tmp_path / "p", "import lightning\n", 2)  # its own Trainer and DataLoader
    plan = rank(load_profile(copy.deepcopy(profiled)), Constraints(steps=1000, allow=("g5.xlarge",), max_instances=2,
                market="on-demand", objective="time"), catalog=catalog)  # fmt: skip
    two = next(i for i, e in enumerate(plan.entries) if e.gpus == 2)
    assert plan.entries[two].batch_per_gpu() == "32"
    options = Options(name="val-a", code=str(project), train_command="train.py")
    notes = generate(plan, tmp_path / "a", choice=two, options=options, catalog=catalog).notes
    (batch,) = [n for n in notes if "another training than the one ranked" in n]
    assert batch.endswith("set the accumulation from SRIFTY_ACCUMULATE_GRAD_BATCHES"), batch
    (val,) = [n for n in notes if "val_check_interval" in n]
    assert "validated every 50 training batches" in val and "more than the 32 batches a rank trains" in val, val
    assert "Lightning refuses it" in val and "check_val_every_n_epoch=None" in val
    one = next(i for i, e in enumerate(plan.entries) if e.gpus == 1)  # 64 batches a rank: validates at the 50th
    options = dataclasses.replace(options, name="val-b")
    assert not any("val_check_interval" in n for n in generate(plan, tmp_path / "b", choice=one, options=options,
                                                                 catalog=catalog).notes)  # fmt: skip
    (project / "train.py").write_text('Trainer(strategy="srifty_auto")\n')  # the plan's batch: the same epoch
    options = dataclasses.replace(options, name="val-c")
    glued = generate(plan, tmp_path / "c", choice=two, options=options, catalog=catalog).notes
    assert any("more than the 32 batches a rank trains" in n for n in glued)
    # srifty_auto's sampler draws whole global batches of the plan's micro-steps (a review: 2,048 samples at 16 a
    # rank on 2 ranks, 3 accumulated, are 21 whole steps, 63 batches a rank, where a rounded-up count said 64)
    accumulated = dataclasses.replace(
        plan.entries[two],
        groups=tuple(dataclasses.replace(g, micro_batches=(16, 16), accumulate_grad_batches=3)
                     for g in plan.entries[two].groups),
    )  # fmt: skip
    profiled["batch"] = {"per_device": 32, "all_devices": 32, "accumulate_grad_batches": 2}
    profiled["validation"] = {"every_batches": 64, "every_epochs": 1, "epoch_batches": 64}  # 2,048 samples
    (project / "srifty" / "profile.json").write_text(json.dumps(profiled))
    from lightning_srifty.provision.terraform.generate import _project_profile, _validation_notes

    (val,) = _validation_notes(accumulated, _project_profile(options), "train.py", True)
    assert "more than the 63 batches a rank trains" in val, val
    profiled["validation"]["every_batches"] = 63
    (project / "srifty" / "profile.json").write_text(json.dumps(profiled))
    assert _validation_notes(accumulated, _project_profile(options), "train.py", True) == []


def test_srifty_terraform_says_when_the_commands_trainer_runs_another_length_or_accumulation(tmp_path, catalog) -> None:
    """A trial's LightningCLI config said max_steps: 600 under a plan of 2,000,000 steps, whose folder told reviewers
    3.91 h; another's max_steps: 5,000,000 under a plan of 1,000 got a life cap of 1 h 10 min for about 9.9 h of
    training; a config's accumulate_grad_batches: 4 trained another global batch. srifty terraform reads the
    Trainer's max_steps / max_epochs / accumulate_grad_batches from the command's configs and --trainer.* arguments
    (the last wins, as LightningCLI applies them), and a plain script's --max-steps."""
    import copy

    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    project, profiled = _profiled_project(tmp_path / "p", "from lightning.pytorch.cli import LightningCLI\n", 1)
    (project / "requirements.txt").write_text("jsonargparse[signatures]\n")
    plan = rank(load_profile(copy.deepcopy(profiled)), Constraints(steps=1000, allow=("g5.xlarge",), max_instances=1,
                market="on-demand"), catalog=catalog)  # fmt: skip
    entry = plan.entries[0]

    def notes(config: str, command: str, name: str) -> list[str]:
        (project / "config.yaml").write_text(config)
        options = Options(name=name, code=str(project), train_command=command)
        got = generate(plan, tmp_path / name, options=options, catalog=catalog).notes
        return [n for n in got if "the plan prices" in n or "accumulate_grad_batches:" in n]

    (short,) = notes("trainer:\n  max_steps: 600\n", "train.py fit --config config.yaml", "len-a")
    assert "train.py runs 600 steps of 32 samples by config.yaml (max_steps 600), the plan prices 1,000" in short
    assert "srifty recommend --steps 600" in short and "set max_steps to 1,000" in short and "life cap" in short
    assert "past the fleet's life cap" not in short
    (long,) = notes("trainer:\n  max_steps: 5000000\n", "train.py fit --config config.yaml", "len-b")
    assert "past the fleet's life cap" in long and "stops every node before the run's end" in long
    # the command's --trainer.max_steps wins over the config's; within 5 % nothing is said
    assert notes("trainer:\n  max_steps: 600\n", "train.py fit -c config.yaml --trainer.max_steps=1020", "len-c") == []
    (epochs,) = notes("trainer:\n  max_epochs: 3\n", "train.py fit --config config.yaml", "len-d")
    assert "(max_epochs 3, 64 steps an epoch)" in epochs and "runs 192 steps" in epochs
    # Lightning stops at the first limit it meets: 3 epochs before 100,000 steps (a review)
    (both,) = notes("trainer:\n  max_epochs: 3\n  max_steps: 100000\n", "train.py fit -c config.yaml", "len-d2")
    assert "runs 192 steps" in both and "past the fleet's life cap" not in both
    # the command line's order: a config after --trainer.max_steps wins over it (LightningCLI's)
    (order,) = notes("trainer:\n  max_steps: 600\n", "train.py fit --trainer.max_steps 1000 -c config.yaml", "len-d3")
    assert "(max_steps 600)" in order
    (acc,) = notes("trainer:\n  max_steps: 1000\n  accumulate_grad_batches: 4\n", "train.py fit -c config.yaml",
                   "len-e")  # fmt: skip
    assert "config.yaml sets accumulate_grad_batches: 4, the profiled run accumulated 1" in acc
    assert "the Trainer runs it, another global batch than the plan's" in acc
    (project / "config.yaml").write_text("trainer:\n  strategy: srifty_auto\n  accumulate_grad_batches: 4\n")
    options = Options(name="len-f", code=str(project), train_command="train.py fit --config config.yaml")
    (acc,) = [n for n in generate(plan, tmp_path / "f", options=options, catalog=catalog).notes if "accumulate_" in n]
    assert "srifty_auto replaces it with the plan's, so the fleet trains the plan's global batch (32)" in acc
    # a plain script's flag is read as its Trainer's max_steps
    (project / "train.py").write_text("import lightning\n")
    (flag,) = notes("", "train.py --max-steps 800 --lr 0.1", "len-g")
    assert "by --max-steps (max_steps 800), the plan prices 1,000" in flag
    assert entry.global_batch == 32


def test_a_plain_http_endpoint_gets_a_bucket_that_takes_the_applys_uploads(tmp_path, catalog) -> None:
    """The module's bucket denies requests without TLS; through an http:// endpoint (an emulator such as moto, which
    enforces the policy) the apply's own uploads (the boot scripts, always; the code) got 403. For such an endpoint
    only, srifty terraform asks for a bucket without that policy and says so; with https (every AWS endpoint) or the
    user's bucket nothing changes."""
    project = _project(tmp_path / "p")
    http = Options(name="tls-a", code=str(project), aws_endpoint="http://127.0.0.1:5000")
    got = generate(load_plan(PLAN), tmp_path / "a", options=http, catalog=catalog)
    assert got.values["checkpoints"]["tls_only"] is False
    assert any("is not made TLS-only" in n and "on AWS (https) it is" in n for n in got.notes), got.notes
    for fine in (dataclasses.replace(http, bucket="runs"), dataclasses.replace(http, aws_endpoint="https://x.test")):
        got = generate(load_plan(PLAN), tmp_path / fine.name / (fine.bucket or "b"), options=fine, catalog=catalog)
        assert not any("TLS" in n for n in got.notes), got.notes
        assert "tls_only" not in got.values["checkpoints"]


def test_run_outputs_are_never_code_and_a_script_path_is_read_as_a_user_types_it(tmp_path, catalog) -> None:
    project = _project(tmp_path / "p")
    for out in ("srifty/profile.json", "srifty/launch/checkpoints/plans/plan-1.json", "lightning_logs/v0/x.ckpt"):
        (project / out).parent.mkdir(parents=True, exist_ok=True)
        (project / out).write_text("{}")
    # a local launch's --workdir (its move log, its checkpoints with the heartbeat): a trial's archive carried 12.6 MiB
    for out in ("wd1/migrations.jsonl", "wd1/checkpoints/HEARTBEAT.json", "wd1/checkpoints/preempt-step=9.ckpt",
                "wd2/checkpoints/HEARTBEAT.json", "wd2/checkpoints/last.ckpt", "wd2/notes.txt"):  # fmt: skip
        (project / out).parent.mkdir(parents=True, exist_ok=True)
        (project / out).write_text("{}")
    files, _ = code_files(project)
    assert not [f for f in files if f.startswith(("srifty/", "lightning_logs/", "wd1/", "wd2/checkpoints/"))], files
    assert "wd2/notes.txt" in files and "train.py" in files  # a folder beside a launch's checkpoints is the user's
    (project / "migrations.jsonl").write_text("{}")  # a launch with --workdir . : the project itself stays code
    assert "train.py" in code_files(project)[0]
    got = generate(load_plan(PLAN), tmp_path / "a", options=Options(name="dot-slash", code=str(project),
                   train_command="./train.py"), catalog=catalog)  # fmt: skip
    assert got.values["train"]["argv"] == ["./train.py"]  # runs the same from the snapshot's folder
    absolute = str(project / "train.py")
    with pytest.raises(ConfigError, match=r"is an absolute path: .* code folder: train_command 'train.py'"):
        generate(load_plan(PLAN), tmp_path / "b", options=Options(name="abs", code=str(project),
                 train_command=absolute), catalog=catalog)  # fmt: skip


@pytest.mark.slow
def test_the_node_bootstrap_installs_the_snapshot_and_stops_when_torch_cannot_use_the_gpus(tmp_path) -> None:
    """.srifty/bootstrap.py, run as user_data runs it (the image's python3, this machine's packages standing for the
    image's): the environment is made and checked; on a node whose nvidia-smi answers, a torch that cannot use the
    GPUs (here the CPU build) stops the boot with the driver named, exit 5."""
    import shutil
    import sys

    project = _project(tmp_path / "p")
    spec, _ = environment_spec(Software(torch=_release("torch"), lightning=_release("lightning")))
    spec["base_python"] = sys.executable
    snap = build_snapshot(project, tmp_path / "out", spec)
    code = tmp_path / "code"
    with tarfile.open(snap.path) as tar:
        tar.extractall(code, filter="data")
    python3 = shutil.which("python3") or sys.executable
    env = {**os.environ, "PYTHONPATH": ""}
    ok = subprocess.run([python3, str(code / ".srifty/bootstrap.py"), str(tmp_path / "env")], capture_output=True,
                        text=True, env=env)  # fmt: skip
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    report = json.loads((tmp_path / "env" / "srifty-environment.json").read_text())
    assert report["lightning_srifty_file"].startswith(str(tmp_path / "env"))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 570.133.20\n")
    (fake / "nvidia-smi").chmod(0o755)
    gpu = subprocess.run([python3, str(code / ".srifty/bootstrap.py"), str(tmp_path / "env2")], capture_output=True,
                         text=True, env={**env, "PATH": f"{fake}:{env['PATH']}"})  # fmt: skip
    assert gpu.returncode == 5, gpu.stdout[-2000:] + gpu.stderr[-2000:]
    assert "cannot use this node's GPUs (NVIDIA driver 570.133.20)" in gpu.stderr and "a CPU build" in gpu.stderr
    # the build chosen for the driver (pip kept the image's torch, which satisfies the pin: nothing was downloaded)
    assert "cu126 from https://download.pytorch.org/whl/cu126" in gpu.stdout  # torch 2.13 has no cu128 build


def _release(name: str) -> str:
    from importlib.metadata import version

    return version(name).split("+")[0]


def test_a_gpu_node_whose_driver_runs_no_build_stops_before_installing(tmp_path) -> None:
    """The bootstrap with a fake nvidia-smi reporting an old driver: exit 6 naming the driver, the minimum and the
    fix, before a virtual environment is made or pip runs (no network)."""
    import sys

    spec, _ = environment_spec(Software(torch="2.9.1", lightning="2.6.6"))
    snap = build_snapshot(_project(tmp_path / "p"), tmp_path / "out", spec)
    code = tmp_path / "code"
    with tarfile.open(snap.path) as tar:
        tar.extractall(code, filter="data")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 470.82.01\necho 470.82.01\n")  # two GPUs
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    run = subprocess.run([sys.executable, str(code / ".srifty/bootstrap.py"), str(tmp_path / "env")],
                         capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert run.returncode == 6, run.stdout + run.stderr
    assert "NVIDIA driver 470.82.01 runs none of the CUDA builds torch 2.9.1 is published with (cu126, cu128, " \
        "cu130): the oldest needs driver >= 525.60.13" in run.stderr  # fmt: skip
    assert not (tmp_path / "env").exists()


def test_a_requirements_file_beside_a_script_in_a_subfolder_is_named_when_it_would_not_be_installed(
    tmp_path, catalog
) -> None:
    outer = tmp_path / "outer"  # srifty run from above the project: the project is a subfolder
    project = _project(outer / "proj")
    (project / "requirements.txt").write_text("einops\n")
    options = Options(name="req-beside", code=str(outer), train_command="proj/train.py --epochs 1")
    got = generate(load_plan(PLAN), tmp_path / "infra", options=options, catalog=catalog)
    (note,) = [n for n in got.notes if "requirements.txt" in n]
    assert note.startswith("proj/requirements.txt lies beside the training script but is not installed")
    assert "--requirements proj/requirements.txt" in note and "run srifty from proj/" in note
    # from the project's own folder it is the requirements file, and nothing is said
    inside = Options(name="req-top", code=str(project), train_command="train.py --epochs 1")
    top = generate(load_plan(PLAN), tmp_path / "infra2", options=inside, catalog=catalog)
    assert not any("lies beside" in n for n in top.notes)
    named = dataclasses.replace(options, name="req-named", requirements="proj/requirements.txt")
    given = generate(load_plan(PLAN), tmp_path / "infra3", options=named, catalog=catalog)
    assert not any("lies beside" in n for n in given.notes)


def test_srifty_terraform_says_when_the_script_keeps_the_training_off_the_gpus(tmp_path, monkeypatch, capsys) -> None:
    """The script's offline checks run where the module is reviewed: a Trainer pinned to the CPU is named at
    `srifty terraform`, not only at `srifty check` (an infra team may apply with terraform alone)."""
    from lightning_srifty.cli import main

    project = _project(tmp_path / "p")
    (project / "train.py").write_text('import lightning as L\n\ntrainer = L.Trainer(accelerator="cpu", max_steps=5)\n')
    monkeypatch.chdir(project)
    # the root is written for review, and the command fails: a pipeline going on to terraform apply stops here
    assert main(["terraform", "--plan", str(PLAN), "--out", str(tmp_path / "infra"), "--name", "cpu-pinned"]) == 1
    err = capsys.readouterr().err
    assert "[FAIL] device: train.py:3: Trainer(accelerator='cpu')" in err and 'accelerator="auto"' in err, err
    assert "1 check(s) of the script failed (above): its nodes would not train" in err
    assert (tmp_path / "infra" / "srifty.auto.tfvars.json").is_file()
    (project / "train.py").write_text("import lightning as L\n\ntrainer = L.Trainer(max_steps=5)\n")
    assert main(["terraform", "--plan", str(PLAN), "--out", str(tmp_path / "infra"), "--name", "cpu-pinned"]) == 0
    assert "device:" not in capsys.readouterr().err


def test_credentials_stay_out_of_the_archive_and_what_is_uncommitted_is_named(tmp_path, catalog) -> None:
    """Issue #35 M2: an untracked .env went into the archive, to S3 and into the root module folder a team may
    commit, with no word. Credential files are left out by default and named; --include-secret packs one all the same;
    untracked and uncommitted files are named; the root module gets a .gitignore for the archive and state."""
    project = _project(tmp_path / "p")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    git = ["git", "-C", str(project), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "add", "train.py", "pkg/__init__.py", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    (project / "train.py").write_text("from lightning_srifty import plan_strategy  # changed\n")
    (project / ".env").write_text("WANDB_API_KEY=abc\n")
    (project / ".env.example").write_text("WANDB_API_KEY=\n")
    (project / "deploy.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    (project / ".aws").mkdir()
    (project / ".aws" / "credentials").write_text("[default]\n")
    got = generate(
        load_plan(PLAN), tmp_path / "infra", options=Options(name="secrets", code=str(project)), catalog=catalog
    )
    members = _members(got.snapshot.path)
    assert ".env.example" in members and "train.py" in members
    assert not {".env", "deploy.pem", ".aws/credentials"} & set(members)
    assert got.snapshot.secrets_left_out == (".aws/credentials", ".env", "deploy.pem")
    (note,) = [n for n in got.notes if n.startswith("left out of the code archive as credentials")]
    assert ".env" in note and "--include-secret" in note and "--secret-env" in note
    (note,) = [n for n in got.notes if "untracked or uncommitted" in n]
    assert "train.py" in note and ".env.example" in note and "pkg/__init__.py" not in note  # committed, unchanged
    ignore = (tmp_path / "infra" / ".gitignore").read_text()
    assert "code/" in ignore.splitlines() and "*.tfstate" in ignore.splitlines()
    options = Options(name="secrets", code=str(project), include_secrets=(".env",))
    kept = generate(load_plan(PLAN), tmp_path / "infra2", options=options, catalog=catalog)
    assert ".env" in _members(kept.snapshot.path) and kept.snapshot.secrets_left_out == (
        ".aws/credentials",
        "deploy.pem",
    )
    with pytest.raises(ConfigError, match=r"^include_secrets nope.env is not among the code's files"):
        generate(load_plan(PLAN), tmp_path / "infra3", options=Options(name="secrets", code=str(project),
                 include_secrets=("nope.env",)), catalog=catalog)  # fmt: skip


def test_a_credential_inside_a_packed_file_is_named(tmp_path, catalog) -> None:
    """An infra team's env.sh, exporting AWS_SECRET_ACCESS_KEY, was packed without a word (credential files are left
    out by name; this one's name says nothing). The archive goes to S3, onto every node and into the root module's
    code/ folder: a packed text file whose line reads as a credential's value is named, with the fix. AWS's own
    documented example keys are not."""
    project = _project(tmp_path / "p")
    secret = "Zx9" + "q" * 37  # 40 characters, as AWS's secret keys are
    (project / "env.sh").write_text(f"export A=1\nexport AWS_SECRET_ACCESS_KEY={secret}\n")
    (project / "config.py").write_text("KEY_ID = 'AKIA" + "QWERTYUIOP234567" + "'\n")
    (project / "docs.md").write_text("aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n")  # AWS's documentation's example
    (project / "model.bin").write_bytes(b"\0AKIA" + b"QWERTYUIOP234567")  # binary: not read
    got = generate(load_plan(PLAN), tmp_path / "infra", options=Options(name="scan", code=str(project)),
                   catalog=catalog)  # fmt: skip
    assert got.snapshot.secrets_inside == (
        "config.py:1 (an AWS access key ID)",
        "env.sh:2 (an AWS secret access key)",
    ), got.snapshot.secrets_inside
    (note,) = [n for n in got.notes if n.startswith("the code archive carries what reads as credentials")]
    assert "--secret-env" in note and ".sriftyignore" in note
    (project / "env.sh").unlink()
    (project / "config.py").unlink()
    clean = generate(load_plan(PLAN), tmp_path / "infra2", options=Options(name="scan", code=str(project)),
                     catalog=catalog)  # fmt: skip
    assert clean.snapshot.secrets_inside == () and not [n for n in clean.notes if "reads as credentials" in n]


def test_the_scripts_glue_is_read_from_its_code_not_its_comments(tmp_path, catalog) -> None:
    """A trial: a script whose docstring and comment named srifty_auto but whose Trainer took "ddp" was said to ask for
    the plan (a substring search), so an FSDP plan's sharded layout went silently unused; and a script naming
    strategy="srifty_auto" without importing lightning_srifty (which registers the name) stopped on every node with
    no word from srifty terraform or srifty check. Both are read from the code (ast); an import through a module of
    the code counts. srifty check warns (a package of the requirements may import it unseen)."""
    from lightning_srifty.provision.preflight import check_imports
    from lightning_srifty.provision.terraform.command import train_argv

    plan = load_plan(PLAN)
    sharded = dataclasses.replace(
        plan, entries=[dataclasses.replace(e, layout=plan_layout("fsdp:full_shard", "Block")) for e in plan.entries]
    )
    trainer = "import lightning.pytorch as pl\ntrainer = pl.Trainer(strategy={!r})\n"
    scripts = {
        "mentions": '"""Uses srifty_auto? Not yet."""\n# strategy="srifty_auto" later\n' + trainer.format("ddp"),
        "unregistered": trainer.format("srifty_auto"),
        "imported": "import lightning_srifty\n" + trainer.format("srifty_auto"),
        "through-a-module": "from helpers import setup\n" + trainer.format("srifty_auto"),
    }
    said = {}
    for i, (case, text) in enumerate(scripts.items()):
        project = _project(tmp_path / case)
        (project / "train.py").write_text(text)
        (project / "helpers.py").write_text("from lightning_srifty import SpotPreemption\n\ndef setup(): ...\n")
        options = Options(name=f"glue-{i}", code=str(project))
        got = generate(sharded, tmp_path / f"infra-{case}", options=options, catalog=catalog)
        never = any("never asks for the plan's strategy" in n for n in got.notes)
        unregistered = [n for n in got.notes if "Add `import lightning_srifty` to train.py" in n]
        assert never is (case == "mentions"), (case, got.notes)
        assert bool(unregistered) is (case == "unregistered"), (case, got.notes)
        said[case] = unregistered
        warned = [f for f in check_imports(got.snapshot, train_argv(options.train_command)) if f.status != "ok"]
        assert [f.check for f in warned] == (["imports"] if case == "unregistered" else []), (case, warned)
    words = 'names the strategy "srifty_auto" but neither it nor a module of its code imports'
    assert words in said["unregistered"][0]


def test_a_lightning_cli_strategy_and_a_fabric_script_are_read_as_they_train(tmp_path, catalog) -> None:
    """A trial: a LightningCLI script whose config.yaml set trainer.strategy: srifty_auto was told it never asked for
    the plan (only Python was read), and a Fabric script (no Trainer) trained as a separate job on each node, with
    no checkpoint on the notice and no word from srifty terraform or srifty check. The CLI's --config files and
    --trainer.strategy are read; a Fabric script gets a note and a warning (the nodes set LT_NUM_NODES)."""
    from lightning_srifty.provision.preflight import check_imports
    from lightning_srifty.provision.terraform.command import train_argv
    from lightning_srifty.provision.terraform.glue import command_glue

    project = tmp_path / "p"
    project.mkdir()
    (project / "main.py").write_text(
        "import lightning_srifty\nfrom lightning.pytorch.cli import LightningCLI\nLightningCLI(save_config_kwargs={})\n"
    )
    (project / "bare.py").write_text("from lightning.pytorch.cli import LightningCLI\nLightningCLI()\n")
    (project / "config.yaml").write_text("trainer:\n  strategy: srifty_auto\n  max_steps: 600\n")
    (project / "ddp.yaml").write_text("trainer:\n  strategy: ddp\n")
    (project / "fabric.py").write_text(
        "import lightning as L\nfabric = L.Fabric(accelerator='auto')\nfabric.launch()\n"
    )
    snapshot = build_snapshot(project, tmp_path / "stage", SPEC)
    for argv, asks in (
        (["main.py", "fit", "--config", "config.yaml"], True),
        (["main.py", "fit", "--config=config.yaml"], True),
        (["main.py", "fit", "-c", "ddp.yaml"], False),
        (["main.py", "fit", "--trainer.strategy=srifty_auto"], True),
        (["main.py", "fit", "--config", "missing.yaml"], False),
    ):
        glue = command_glue(snapshot, argv)
        assert glue is not None and glue.asks_for_the_plan is asks and not glue.unregistered, argv
    bare = command_glue(snapshot, ["bare.py", "fit", "--config", "config.yaml"])
    assert bare is not None and bare.unregistered  # the YAML names it; nothing imports the package that registers it
    fabric = command_glue(snapshot, ["fabric.py"])
    assert fabric is not None and fabric.fabric_only and not command_glue(snapshot, ["main.py"]).fabric_only
    got = generate(
        load_plan(PLAN), tmp_path / "infra", options=Options(name="fab", code=str(project), train_command="fabric.py"),
        catalog=catalog,
    )  # fmt: skip
    (note,) = [n for n in got.notes if "trains with Lightning Fabric, not a Trainer" in n]
    assert "LT_NUM_NODES" in note and "Wrap its loop in lightning_srifty.FabricPreemption" in note
    warned = [f for f in check_imports(got.snapshot, train_argv("fabric.py")) if f.status == "warn"]
    assert [f.check for f in warned] == ["script"]


def test_a_fabric_loop_in_fabric_preemption_is_not_warned_of_and_is_told_where_its_batch_comes_from(
    tmp_path, catalog
) -> None:
    """A Fabric script whose loop is wrapped in FabricPreemption checkpoints, resumes and leaves on a fleet: srifty
    check no longer warns that a notice ends it without a checkpoint, and srifty terraform's note says what is still
    the loop's own (its batch and accumulation: launch_settings())."""
    from lightning_srifty.provision.preflight import check_imports
    from lightning_srifty.provision.terraform.command import train_argv
    from lightning_srifty.provision.terraform.glue import command_glue

    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text(
        "import lightning as L\nfrom lightning_srifty import FabricPreemption\n"
        "fabric = L.Fabric(accelerator='auto')\nfabric.launch()\nstate = {'step': 0}\n"
        "with FabricPreemption(fabric, state) as spot:\n    spot.step()\n"
    )
    snapshot = build_snapshot(project, tmp_path / "stage", SPEC)
    glue = command_glue(snapshot, ["train.py"])
    assert glue is not None and glue.fabric_only and glue.fabric_preemption and not glue.fabric_unguarded
    got = generate(
        load_plan(PLAN), tmp_path / "infra", options=Options(name="fab", code=str(project), train_command="train.py"),
        catalog=catalog,
    )  # fmt: skip
    (note,) = [n for n in got.notes if "trains with Lightning Fabric and FabricPreemption" in n]
    assert "launch_settings().batch_size" in note and "does not call" not in note
    assert not [f for f in check_imports(got.snapshot, train_argv("train.py")) if f.status == "warn"]


def test_the_glue_of_a_module_an_alias_and_a_large_code_base(tmp_path) -> None:
    """A review of the glue reader: ``python -m pkg.train`` runs ``pkg/__init__.py`` first (an import there
    registers the strategies); ``plan_strategy`` imported under another name still asks for the plan; a code base of
    600 modules is read whole (the script check's walk, shared since the fortieth session: it gave no answer past
    500 modules before), so an import in its last module is found and its absence is said."""
    from lightning_srifty.provision.terraform import glue
    from lightning_srifty.provision.terraform.glue import command_glue

    project = tmp_path / "p"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("import lightning_srifty\n")
    (project / "pkg" / "train.py").write_text("import lightning.pytorch as pl\npl.Trainer(strategy='srifty_auto')\n")
    (project / "alias.py").write_text("from lightning_srifty import plan_strategy as ps\nTrainer(strategy=ps())\n")
    (project / "big").mkdir()
    (project / "big" / "__init__.py").write_text("".join(f"from big import m{i}\n" for i in range(600)))
    for i in range(600):
        (project / "big" / f"m{i}.py").write_text("x = 1\n")
    (project / "wide.py").write_text("import big\nTrainer(strategy='srifty_auto')\n")
    (project / "deep").mkdir()
    (project / "deep" / "__init__.py").write_text("".join(f"from deep import m{i}\n" for i in range(600)))
    for i in range(599):
        (project / "deep" / f"m{i}.py").write_text("x = 1\n")
    (project / "deep" / "m599.py").write_text("import lightning_srifty\n")
    (project / "far.py").write_text("import deep\nTrainer(strategy='srifty_auto')\n")
    snapshot = build_snapshot(project, tmp_path / "stage", SPEC)
    module = command_glue(snapshot, ["-m", "pkg.train"])
    assert module is not None and module.imports_srifty is True and not module.unregistered
    alias = command_glue(snapshot, ["alias.py"])
    assert alias is not None and alias.asks_for_the_plan
    wide = command_glue(snapshot, ["wide.py"])
    assert wide is not None and wide.imports_srifty is False and wide.unregistered
    far = command_glue(snapshot, ["far.py"])
    assert far is not None and far.imports_srifty is True and not far.unregistered
    sources = glue.python_sources(snapshot)  # read in one pass of the archive
    assert {"pkg/__init__.py", "pkg/train.py", "alias.py", "wide.py", "big/m599.py"} <= set(sources)


def test_a_lightning_cli_module_whose_package_imports_srifty_is_not_told_nothing_does(tmp_path) -> None:
    """``python -m pkg.main fit --config config.yaml``: the YAML names srifty_auto, the script names no strategy and
    ``pkg/__init__.py`` imports lightning_srifty (python -m runs it first). The import was looked for in no file
    at all (the script and its package's inits were read only for a strategy the script names), so the command was
    told nothing imports the package that registers the name."""
    from lightning_srifty.provision.terraform.glue import command_glue

    project = tmp_path / "p"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "__init__.py").write_text("import lightning_srifty\n")
    (project / "pkg" / "main.py").write_text("from lightning.pytorch.cli import LightningCLI\nLightningCLI()\n")
    (project / "bare").mkdir()
    (project / "bare" / "__init__.py").write_text("")
    (project / "bare" / "main.py").write_text("from lightning.pytorch.cli import LightningCLI\nLightningCLI()\n")
    (project / "config.yaml").write_text("trainer:\n  strategy: srifty_auto\n")
    snapshot = build_snapshot(project, tmp_path / "stage", SPEC)
    glue = command_glue(snapshot, ["-m", "pkg.main", "fit", "--config", "config.yaml"])
    assert glue is not None and glue.asks_for_the_plan and glue.imports_srifty is True and not glue.unregistered
    assert glue.unregistered_note("pkg/main.py") is None
    bare = command_glue(snapshot, ["-m", "bare.main", "fit", "--config", "config.yaml"])
    assert bare is not None and bare.asks_for_the_plan and bare.unregistered  # nothing of its code imports it


def test_fabric_preemption_imported_under_another_name_still_counts(tmp_path) -> None:
    """`from lightning_srifty import FabricPreemption as FP` wraps the loop as well (a review: it was warned of)."""
    from lightning_srifty.provision.terraform.glue import command_glue

    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text(
        "import lightning as L\nfrom lightning_srifty import FabricPreemption as FP\n"
        "fabric = L.Fabric()\nstate = {'step': 0}\nwith FP(fabric, state) as spot:\n    spot.step()\n"
    )
    glue = command_glue(build_snapshot(project, tmp_path / "stage", SPEC), ["train.py"])
    assert glue is not None and glue.fabric_only and not glue.fabric_unguarded


def test_the_find_unused_parameters_name_of_srifty_auto_asks_for_the_plan(tmp_path) -> None:
    """A GAN's script names strategy="srifty_auto_find_unused_parameters_true" (DDP's find_unused_parameters, as
    Lightning's ddp_find_unused_parameters_true): it applies the plan as srifty_auto does, and needs the import."""
    from lightning_srifty.provision.terraform.glue import command_glue

    project = tmp_path / "p"
    project.mkdir()
    (project / "gan.py").write_text(
        "import lightning_srifty\nimport lightning.pytorch as pl\n"
        'pl.Trainer(strategy="srifty_auto_find_unused_parameters_true")\n'
    )
    (project / "bare.py").write_text(
        'import lightning.pytorch as pl\npl.Trainer(strategy="srifty_ddp_find_unused_parameters_true")\n'
    )
    snapshot = build_snapshot(project, tmp_path / "stage", SPEC)
    glue = command_glue(snapshot, ["gan.py"])
    assert glue is not None and glue.asks_for_the_plan and not glue.unregistered
    bare = command_glue(snapshot, ["bare.py"])
    assert bare is not None and not bare.asks_for_the_plan and bare.unregistered  # a srifty name, never imported
