"""Issue #35 H1 and M4: builds that exist. The table (predictor/data/cuda_builds.json) knows every torch release up to
the newest, the CUDA builds PyTorch publishes each with (RELEASE.md's compatibility matrix), NVIDIA's minimum driver
of each, and the compute capabilities each build carries code for. A node picks a build that exists for its driver
*and* its GPU; srifty recommend leaves out GPUs no build of the profiled torch runs (with the torch that would);
srifty terraform refuses a torch release the table does not know, and a fleet whose GPU the default image's driver
cannot run with any build; srifty check fails the same."""

from __future__ import annotations

import dataclasses

import pytest

from _support import MINIMAL
from conftest import ROOT
from lightning_srifty.provision.preflight import check_torch_build
from lightning_srifty.provision.terraform import cuda
from lightning_srifty.provision.terraform.bootstrap import choose_torch_build, cuda_release
from lightning_srifty.provision.terraform.generate import Options, generate
from predictor.catalog import torch_builds
from predictor.documents.plan import load_plan
from predictor.documents.profile import Software, load_profile
from predictor.exceptions import ConfigError
from predictor.ranking import Constraints, rank

PLAN = ROOT / "terraform" / "examples" / "single-node-on-demand" / "plan.json"


def spec(torch: str) -> dict:
    cuda_spec, notes = cuda.torch_cuda(torch)
    assert cuda_spec is not None, notes
    return cuda_spec


def test_the_table_reaches_the_newest_releases_with_drivers_and_architectures() -> None:
    data = torch_builds.table()
    assert data["schema"] == "srifty.cuda-builds/v2"
    # RELEASE.md: 2.12 and 2.13 are published for CUDA 12.6 and 13.0 (13.2 experimental), no 12.8 build
    assert set(data["torch_builds"]["2.13"]) == {"cu126", "cu130", "cu132"}
    assert "cu128" not in data["torch_builds"]["2.12"] and "cu128" in data["torch_builds"]["2.11"]
    for release, builds in data["torch_builds"].items():
        for build, arches in builds.items():
            assert cuda_release(build) in data["toolkit_driver"], (release, build)
            assert arches is None or all(torch_builds.cc_numbers(a.removesuffix("+PTX")) for a in arches)
    for release in ("2.5", "2.8", "2.10", "2.13", "2.14"):  # every recent release says which GPUs it runs
        assert all(a is not None for a in data["torch_builds"][release].values()), release


@pytest.mark.parametrize(
    ("cc", "arches", "ok"),
    [
        ("8.9", ["8.0", "8.6"], True),  # a cubin for 8.6 runs on 8.9 (same major, higher minor)
        ("8.0", ["8.6"], False),  # ... never on a lower minor
        ("9.0", ["8.0", "8.6"], False),  # nor on another major
        ("10.3", ["9.0", "10.0"], True),
        ("12.1", ["9.0", "12.0+PTX"], True),  # PTX compiles for any newer GPU
        ("7.0", ["7.5", "8.0", "12.0+PTX"], False),  # ... never for an older one
    ],
)
def test_which_gpu_runs_which_build(cc, arches, ok) -> None:
    assert torch_builds.runs(cc, arches) is ok


def test_the_node_picks_a_build_that_exists_for_its_driver_and_its_gpu() -> None:
    """The walk's H1: torch 2.13.0 on the Deep Learning AMI's driver 570 took the (absent) cu128 index, pip fell back
    to PyPI's CUDA 13 build, and CUDA was unavailable on every node. Now: cu126, which 570 runs."""
    torch213 = spec("2.13.0")
    build, why = choose_torch_build("570.133.20", torch213, "8.6")
    assert build == "cu126" and "newest build it supports" in why
    # M4: a V100 (7.0) on a driver that runs cu130: cu130 has no Volta code, the node takes cu126
    assert choose_torch_build("580.95.05", torch213, "7.0")[0] == "cu126"
    assert choose_torch_build("580.95.05", torch213, "8.6")[0] == "cu130"
    assert choose_torch_build("595.58.03", torch213, "9.0")[0] == "cu132"
    # a Blackwell GPU (10.0) needs cu130 or cu132: driver 570 runs neither (12.x builds have no Blackwell code)
    build, why = choose_torch_build("570.133.20", torch213, "10.0")
    assert build is None and "that run this GPU (compute capability 10.0)" in why and ">= 580.65.06" in why
    # a K80 (3.7): no build of 2.13 at all, whatever the driver
    build, why = choose_torch_build("595.58.03", torch213, "3.7")
    assert build is None and "no CUDA build of torch 2.13.0 runs this GPU (compute capability 3.7)" in why
    # an unknown GPU: every build counts (the old rule)
    assert choose_torch_build("570.133.20", torch213, None)[0] == "cu126"


def test_the_summary_names_the_pick_for_each_gpu_of_the_fleet() -> None:
    torch213 = {"torch_cuda": spec("2.13.0")}
    lines = cuda.summary(torch213, None, [("p3.2xlarge (V100-SXM2-16GB, compute capability 7.0)", "7.0")])
    text = "\n".join(lines)
    assert "p3.2xlarge (V100-SXM2-16GB, compute capability 7.0): cu126 on the Deep Learning AMI" in text
    assert ">= 525.60.13 cu126 (minor version compatibility); older: the boot stops" in text
    assert "cu130" not in text  # no cu130 for a Volta GPU, whatever the driver


def test_recommend_leaves_out_gpus_no_build_of_the_profiled_torch_runs(catalog) -> None:
    profile = load_profile({**MINIMAL, "batch": {"per_device": 8}, "software": {"torch": "2.13.0+cu130"}})
    plan = rank(profile, Constraints(steps=1000, max_instances=2, top=200), catalog=catalog)
    reason = "no torch 2.13 build for its GPU (compute capability 3.7); torch 2.7 (cu118) runs it"
    assert plan.excluded_types[reason] == 3  # p2.xlarge, p2.8xlarge, p2.16xlarge (K80)
    gpus = {g.gpu for e in (*plan.entries, *plan.pareto) for g in e.groups}
    assert "K80" not in gpus
    assert torch_builds.unsupported("2.13.0", "7.0") is None  # V100 runs cu126: ranked
    assert torch_builds.unsupported("2.6.0", "10.0") == (
        "no torch 2.6 build for its GPU (compute capability 10.0); torch 2.14 (cu130) runs it"
    )


def test_terraform_refuses_a_torch_the_table_does_not_know(tmp_path, catalog) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text("print('train')\n")
    plan = dataclasses.replace(load_plan(PLAN), software=Software(torch="2.99.0", lightning="2.6.6"))
    with pytest.raises(ConfigError, match=r"torch 2.99.0 is not in srifty's table .*: extra_index_urls ") as info:
        generate(plan, tmp_path / "infra", options=Options(name="new-torch", code=str(project)), catalog=catalog)
    assert info.value.parameter == "torch" and not (tmp_path / "infra").exists()
    # the user's index says where torch comes from: accepted, and the pre-flight says so
    options = Options(name="new-torch", code=str(project), extra_index_urls=("https://download.pytorch.org/whl/cu130",))
    got = generate(plan, tmp_path / "infra", options=options, catalog=catalog)
    assert got.snapshot is not None and (tmp_path / "infra" / got.values["train"]["code"]["source"]).is_file()


def test_terraform_and_check_refuse_a_gpu_the_default_images_driver_cannot_run(tmp_path, catalog, monkeypatch) -> None:
    """A driver older than every build that runs the fleet's GPU: the boot would stop on every node (exit 6)."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text("print('train')\n")
    plan = dataclasses.replace(load_plan(PLAN), software=Software(torch="2.13.0", lightning="2.6.6"))
    monkeypatch.setattr(cuda, "default_image", lambda: ("an old image", "520.61.05"))
    with pytest.raises(ConfigError, match=r"Every such node would stop at boot.*NVIDIA driver 520.61.05 runs none"):
        generate(plan, tmp_path / "infra", options=Options(name="old-driver", code=str(project)), catalog=catalog)
    env = {"packages": ["torch==2.13.0"], "torch_cuda": spec("2.13.0")}
    gpus = cuda.fleet_gpus([(g.instance_type, g.gpu) for g in plan.entries[0].groups], catalog)
    (finding,) = check_torch_build(env, {}, gpus)
    assert finding.status == "fail" and "runs none of the CUDA builds torch 2.13" in finding.message
    monkeypatch.undo()
    (finding,) = check_torch_build(env, {}, gpus)
    assert finding.status == "ok" and "has a build for every GPU of the fleet" in finding.message
