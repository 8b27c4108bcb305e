"""The image the nodes boot is part of what a fleet can run: a GPU whose every build of the profiled torch needs a
newer NVIDIA driver than the image's would stop at boot (srifty terraform refuses to write it), so the ranking leaves
it out and a prediction says so; ``driver`` ranks for another image (a new user's trial: p6-b200 ranked first for a
torch 2.13 profile, then refused by srifty terraform on the Deep Learning AMI's driver 570)."""

from __future__ import annotations

import copy

import pytest

from _support import MINIMAL
from lightning_srifty.provision.terraform.bootstrap import choose_torch_build
from lightning_srifty.provision.terraform.cuda import torch_cuda
from predictor.catalog.torch_builds import default_image, image_stops, table
from predictor.documents.plan import load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError
from predictor.model.predict import predict
from predictor.ranking import Constraints, rank


def _profile(torch: str = "2.13.0+cpu"):
    raw = copy.deepcopy(MINIMAL)
    raw["model"]["precision"] = "bf16-mixed"
    raw["software"] = {"torch": torch}
    raw["hardware"] = {"gpu": "A100-SXM-80GB", "devices": 1, "nodes": 1}
    return load_profile(raw)


def test_the_rankings_rule_is_the_nodes_own(catalog) -> None:
    """image_stops (the ranking's, torch-free) says a node stops exactly where the node's own choice finds no build,
    for every release the table records, every GPU of the catalog and drivers around the thresholds."""
    ccs = sorted({g.compute_capability for g in catalog.gpus.gpus.values() if g.compute_capability})
    drivers = ["450.80.02", "525.60.13", default_image()[1], "575.51.03", "580.65.06", "590.44.01"]
    checked = 0
    for release, builds in table()["torch_builds"].items():
        if any(arches is None for arches in builds.values()):
            continue  # the table cannot tell which GPUs such a release runs: both sides say nothing
        spec, _ = torch_cuda(f"{release}.0")
        for cc in ccs:
            if not any(b for b, a in builds.items() if a is not None and choose_torch_build("999.0", spec, cc)[0]):
                continue  # no build runs the GPU at all: unsupported()'s reason, not the image's
            for driver in drivers:
                stops = image_stops(f"{release}.0", cc, driver)
                assert (stops is not None) == (choose_torch_build(driver, spec, cc)[0] is None), (release, cc, driver)
                checked += 1
    assert checked > 200


def test_a_gpu_the_default_image_cannot_boot_is_left_out_and_ranked_for_a_newer_driver(catalog, tmp_path) -> None:
    profile = _profile()
    plan = rank(profile, Constraints(steps=20_000, allow=("p6-b200", "p5")), catalog=catalog)
    assert not any("p6-b200" in e.fleet for e in plan.entries)
    (why,) = [w for w in plan.excluded_types or {} if "p6-b200" not in w and "driver" in w]
    assert "no torch 2.13 build for its GPU (compute capability 10.0: cu130, cu132) runs on NVIDIA driver" in why
    assert "they need >= 580.65.06" in why and "--driver VERSION" in why and "--ami" in why
    newer = rank(profile, Constraints(steps=20_000, allow=("p6-b200", "p5"), driver="580.65.06"), catalog=catalog)
    assert newer.entries[0].fleet.startswith("p6-b200") and newer.constraints.driver == "580.65.06"
    path = newer.save(tmp_path / "plan.json")
    assert Constraints.from_plan(load_plan(path).constraints).driver == "580.65.06"  # a re-plan keeps the image
    older = _profile("2.9.0")  # torch 2.9 has a cu128 build, which driver 570 runs on Blackwell
    assert any(
        e.fleet.startswith("p6-b200")
        for e in rank(older, Constraints(steps=20_000, allow=("p6-b200",)), catalog=catalog).entries
    )


def test_a_prediction_names_the_image_that_cannot_boot_it_and_a_bad_driver_is_refused(catalog) -> None:
    (note,) = predict(_profile(), "p6-b200.48xlarge:1", catalog=catalog).cannot_run
    assert note.startswith("p6-b200.48xlarge: no torch 2.13 build for its GPU") and "580.65.06" in note
    assert predict(_profile(), "p5.48xlarge:1", catalog=catalog).cannot_run == ()
    with pytest.raises(ConfigError, match=r"an NVIDIA driver version such as 580\.65\.06") as e:
        rank(_profile(), Constraints(steps=10, driver="latest"), catalog=catalog)
    assert e.value.parameter == "driver" and "'latest'" in str(e.value)


def test_srifty_terraform_says_when_the_plan_was_ranked_for_another_image(catalog) -> None:
    """A plan ranked with driver= keeps GPUs that need it: the module written without --ami (the default image) says
    so, and says nothing once the image is given, or for a plan ranked for the default image."""
    import dataclasses

    from lightning_srifty.provision.terraform.generate import Options, _driver_notes

    profile = _profile()
    newer = rank(profile, Constraints(steps=20_000, allow=("p6-b200",), driver="580.65.06"), catalog=catalog)
    (note,) = _driver_notes(newer, Options())
    assert "ranked for an image with NVIDIA driver 580.65.06" in note and "--ami" in note
    assert _driver_notes(newer, dataclasses.replace(Options(), ami="ami-0123456789abcdef0")) == []
    plain = rank(profile, Constraints(steps=20_000, allow=("p5",)), catalog=catalog)
    assert _driver_notes(plain, Options()) == []
