"""predict(): fleets, scaling, communication, memory, bad input; and `srifty predict`."""

from __future__ import annotations

import copy
import json
import math

import pytest

from _support import MINIMAL
from conftest import ROOT
from lightning_srifty.cli import main
from predictor.catalog import Catalog
from predictor.catalog.fleet import parse_fleet
from predictor.catalog.gpus import GpuTable
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError, PredictionError, UnknownNameError
from predictor.model.network import allreduce_time, calibrate
from predictor.model.predict import predict


@pytest.fixture
def minimal():
    return load_profile(copy.deepcopy(MINIMAL))


def test_fleet_strings(catalog) -> None:
    fleet = parse_fleet("p3.8xlarge:2, g5.12xlarge", catalog)
    assert [(g.instance.name, g.count) for g in fleet.groups] == [("p3.8xlarge", 2), ("g5.12xlarge", 1)]
    assert fleet.gpus == 12 and fleet.nodes == 3 and fleet.heterogeneous and str(fleet) == "p3.8xlarge:2,g5.12xlarge:1"
    with pytest.raises(ConfigError, match=r"count of 'p3.8xlarge' .* must be a whole number from 1 to 10,000. Got 0"):
        parse_fleet("p3.8xlarge:0", catalog)
    with pytest.raises(ConfigError, match=r"Cannot read fleet group 'p3.8xlarge:two'"):
        parse_fleet("p3.8xlarge:two", catalog)
    with pytest.raises(ConfigError, match="appears twice"):
        parse_fleet("g5.xlarge:1,g5.xlarge:2", catalog)
    with pytest.raises(ConfigError, match="empty"):
        parse_fleet(" ", catalog)
    with pytest.raises(UnknownNameError, match=r"Did you mean 'p4d.24xlarge'"):
        parse_fleet("p4d.24xlarg:1", catalog)


def test_same_gpu_single_device_reproduces_the_profile(minimal, catalog) -> None:
    r = predict(minimal, "p3.2xlarge:1", catalog=catalog)  # one V100-SXM2-16GB, as profiled
    assert r.iteration_time_s == pytest.approx(0.31)
    assert r.throughput_samples_s == pytest.approx(256 / 0.31)
    lo, hi = r.interval["iteration_time_s"]
    assert lo < 0.31 < hi
    assert r.breakdown["allreduce_s"] == 0 and r.bottleneck == "compute" and r.fits_memory


def test_more_gpus_add_communication_and_slow_networks_hurt(minimal, catalog) -> None:
    one_node = predict(minimal, "p3.16xlarge:1", catalog=catalog, scaling="weak")
    four_nodes = predict(minimal, "p3.16xlarge:4", catalog=catalog, scaling="weak")
    assert one_node.global_batch == 8 * 256 and four_nodes.global_batch == 32 * 256
    assert 0.31 < one_node.iteration_time_s < four_nodes.iteration_time_s
    assert four_nodes.breakdown["allreduce_s"] > one_node.breakdown["allreduce_s"] > 0
    assert four_nodes.allreduce_limiting == "network tcp"
    big = copy.deepcopy(MINIMAL)
    big["model"]["parameters"] = 1_300_000_000  # 5.2 GB of gradients per step
    slow = predict(load_profile(big), "g5.xlarge:8", catalog=catalog)  # "up to 10 Gigabit", 8 single-GPU nodes
    assert slow.bottleneck.startswith("network") and slow.allreduce_limiting == "network tcp"


def test_faster_gpu_is_faster_but_less_than_the_flops_ratio(minimal, catalog) -> None:
    a100 = predict(minimal, "p4d.24xlarge:1", catalog=catalog)
    v100 = predict(minimal, "p3.16xlarge:1", catalog=catalog)
    speedup = v100.breakdown["compute_s"] / a100.breakdown["compute_s"]
    flops_ratio = 312 / 125  # FP16 tensor peaks A100 / V100
    assert 1.3 < speedup < flops_ratio
    assert any("V100-SXM2-16GB -> A100-SXM-40GB" in a for a in a100.assumptions)


def test_heterogeneous_split_is_speed_proportional(minimal, catalog) -> None:
    r = predict(minimal, "p3.8xlarge:2,g5.12xlarge:1", catalog=catalog, scaling="weak")
    v100, a10g = r.groups
    assert v100.per_device_batch * 8 + a10g.per_device_batch * 4 == r.global_batch == 12 * 256
    # whole samples per GPU, adding up exactly; equal time per step up to one sample: no straggler
    assert sum(v100.rank_batches) + sum(a10g.rank_batches) == r.global_batch
    assert v100.compute_s == pytest.approx(a10g.compute_s, rel=2 / min(v100.rank_batches + a10g.rank_batches))
    strong = predict(minimal, "p3.8xlarge:2,g5.12xlarge:1", catalog=catalog)
    assert strong.global_batch == sum(strong.groups[0].rank_batches + strong.groups[1].rank_batches) == 256
    assert "in proportion to predicted speed" in r.batch_split


def test_strong_scaling_keeps_the_global_batch(minimal, catalog) -> None:
    r = predict(minimal, "p3.16xlarge:1", catalog=catalog)  # strong by default
    assert r.scaling == "strong" and r.global_batch == 256 and r.groups[0].per_device_batch == 32
    assert r.accumulate_grad_batches == 1 and "global batch 256" in r.batch_split
    with pytest.raises(ConfigError, match="'scaling' parameter of predict\\(\\) must be one of"):
        predict(minimal, "p3.16xlarge:1", catalog=catalog, scaling="medium")


def test_memory_fit_flags_a_model_too_big_for_the_gpu(catalog) -> None:
    big = copy.deepcopy(MINIMAL)
    big["model"] = {"name": "7b", "parameters": 7_000_000_000, "precision": "bf16-mixed"}
    r = predict(load_profile(big), "g4dn.xlarge:1", catalog=catalog)  # a 16 GB T4
    assert not r.fits_memory and r.groups[0].memory_margin < 0
    plain = predict(load_profile(big), "p5.48xlarge:1", catalog=catalog, layout="ddp")
    assert plain.fits_memory is False  # 7B + Adam > 80 GB a GPU under plain DDP
    # the default is the layout srifty recommend runs there: sharded over the node's 8 GPUs, it fits
    auto = predict(load_profile(big), "p5.48xlarge:1", catalog=catalog)
    assert auto.fits_memory and auto.layout.startswith("fsdp"), auto.layout


def test_measured_activation_memory_scales_with_batch(catalog) -> None:
    data = copy.deepcopy(MINIMAL)
    data["memory"] = {"peak_allocated_bytes": 12 * 2**30}
    weak = predict(load_profile(data), "p3.16xlarge:1", catalog=catalog, scaling="weak")  # 256 per GPU
    strong = predict(load_profile(data), "p3.16xlarge:1", catalog=catalog)  # 32 per GPU
    assert strong.groups[0].memory_gib < weak.groups[0].memory_gib


def test_bad_inputs(minimal, catalog) -> None:
    with pytest.raises(PredictionError, match="not a CUDA GPU"):
        predict(minimal, "trn1.32xlarge:1", catalog=catalog)
    no_b200 = Catalog(catalog._instances, GpuTable({k: g for k, g in catalog.gpus.gpus.items() if k != "B200-SXM"}),
                      catalog.info)  # fmt: skip
    with pytest.raises(PredictionError, match=r"B200-SXM.* no specs .*--catalog-extra"):
        predict(minimal, "p6-b200.48xlarge:1", catalog=no_b200)
    cpu = copy.deepcopy(MINIMAL)
    cpu["hardware"] = {"devices": 1}
    with pytest.raises(PredictionError, match="without a GPU and has neither an operator table nor FLOPs"):
        predict(load_profile(cpu), "p3.2xlarge:1", catalog=catalog)
    unknown = copy.deepcopy(MINIMAL)
    unknown["hardware"]["gpu"] = "X9000"
    with pytest.raises(PredictionError, match="no specs in the catalog"):
        predict(load_profile(unknown), "p3.2xlarge:1", catalog=catalog)


def test_cpu_profile_with_flops_predicts_as_an_extrapolation(catalog) -> None:
    cpu = copy.deepcopy(MINIMAL)
    cpu["hardware"] = {"devices": 1, "cpu_count": 2}
    cpu["model"]["flops"] = {"per_sample": 12.3e9}
    r = predict(load_profile(cpu), "p4d.24xlarge:1", catalog=catalog, scaling="weak")
    assert r.breakdown["compute_s"] == pytest.approx(256 * 12.3e9 / (312e12 * 0.35))
    assert r.extrapolation and "FLOPs alone" in r.extrapolation[0]


def test_user_defined_types_predict(minimal) -> None:
    cat = Catalog.load(extra=[ROOT / "tests" / "data" / "extra_example.yaml"], use_refreshed=False)
    two = predict(minimal, "dgx-a100-40g:2", catalog=cat, scaling="weak")
    one = predict(minimal, "dgx-a100-40g:1", catalog=cat, scaling="weak")
    assert two.breakdown["allreduce_s"] > one.breakdown["allreduce_s"] > 0
    assert one.allreduce_limiting == "intra-node nvswitch"
    assert two.groups[0].gpu == "A100-SXM-40GB" and two.global_batch == 16 * 256


def test_ring_allreduce_formula_and_calibration(catalog) -> None:
    g5 = catalog.get("g5.xlarge")  # 1 GPU, "up to 10 Gigabit", no EFA
    est = allreduce_time(1e9, [(g5, 2)], catalog.gpus)
    bus = 10 / 8 * 0.4 * 0.95  # GB/s: burst rate x sustained share x TCP efficiency
    assert est.seconds == pytest.approx(2 * 1 / 2 * 1 / bus + 2 * 60e-6)
    link = calibrate([1_000_000, 4_000_000], [0.0011, 0.0041], world=2)
    assert link.gbps == pytest.approx(1.0) and link.latency_s == pytest.approx(0.0001 / 2)


def test_predict_cli(tmp_path, capsys) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(MINIMAL))
    assert main(["predict", "--profile", str(path), "--fleet", "p4d.24xlarge:2", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("iteration_time_s", "throughput_samples_s", "bottleneck", "fits_memory"):
        assert key in doc
    lo, hi = doc["interval"]["iteration_time_s"]
    assert lo < doc["iteration_time_s"] < hi
    assert main(["predict", "--profile", str(path), "--fleet", "p4d.24xlarge:2"]) == 0
    assert "Iteration time" in capsys.readouterr().out
    big = dict(MINIMAL, model={"name": "7b", "parameters": 7_000_000_000, "precision": "bf16-mixed"})
    path.write_text(json.dumps(big))
    assert main(["predict", "--profile", str(path), "--fleet", "g4dn.xlarge:1"]) == 0
    assert "a GPU with more memory" in capsys.readouterr().out
    assert main(["predict", "--profile", str(path), "--fleet", "p4d.24xlarge:0"]) == 2
    # the count is what must be, in the flag's words (it read "--fleet must be a whole number")
    assert "The count of 'p4d.24xlarge' in --fleet must be a whole number from 1 to 10,000" in capsys.readouterr().err


def test_every_cuda_type_with_specs_predicts(minimal, catalog) -> None:
    done = 0
    for it in catalog.filter():
        if it.gpu in catalog.gpus:
            r = predict(minimal, f"{it.name}:2", catalog=catalog)
            assert r.iteration_time_s > 0 and r.throughput_samples_s > 0
            done += 1
    assert done >= 55


def test_ddp_buckets_and_overlap_simulation() -> None:
    from predictor.model.network import ddp_bucket_sizes, exposed_time

    mib = 1024 * 1024
    assert ddp_bucket_sizes(0.5 * mib) == [0.5 * mib]
    assert ddp_bucket_sizes(60 * mib) == [mib, 25 * mib, 25 * mib, 9 * mib]
    # one bucket: ready when backward ends, nothing hides
    assert exposed_time(0.1, 0.5, [10.0]) == pytest.approx(0.1)
    # two equal buckets: the first (ready half-way) hides behind backward, the second does not
    assert exposed_time(0.2, 1.0, [5.0, 5.0]) == pytest.approx(0.1)
    # communication longer than backward: the queue spills over
    assert exposed_time(2.0, 1.0, [5.0, 5.0]) == pytest.approx(1.5)
    assert exposed_time(0.0, 1.0, [5.0]) == 0.0


def test_the_closed_form_overlap_equals_the_bucket_by_bucket_queue_and_costs_per_run() -> None:
    import numpy as np

    from predictor.model.network import ddp_buckets, exposed_many

    def queue(a: float, b: float, sizes: list[float]) -> float:  # the simulation it replaces, bucket by bucket
        total, free, done = sum(sizes), 0.0, 0.0
        for size in sizes:
            done += size
            free = max(b * done / total, free) + a * size / total
        return max(0.0, free - b)

    rng = np.random.default_rng(0)
    for _ in range(200):
        runs = [(float(rng.uniform(0.1, 30)), int(rng.integers(1, 6))) for _ in range(int(rng.integers(1, 5)))]
        sizes = [s for s, n in runs for _ in range(n)]
        a, b = rng.uniform(0, 2, 4), rng.uniform(0.01, 2, 4)
        got = exposed_many(a, b, runs)
        assert got == pytest.approx([queue(x, y, sizes) for x, y in zip(a, b, strict=True)], abs=1e-12)
    # 10^15 parameters of gradients: three runs, not 150 million buckets
    assert len(ddp_buckets(4e15)) == 3 and sum(s * n for s, n in ddp_buckets(4e15)) == pytest.approx(4e15)


def test_a_parameter_count_beyond_any_model_is_refused_naming_the_field() -> None:
    from predictor.documents.profile import profile_from_dict
    from predictor.exceptions import ProfileSchemaError

    with pytest.raises(ProfileSchemaError, match=r"model\.parameters"):
        profile_from_dict(
            {
                "schema": "srifty.profile/v1",
                "model": {"name": "m", "parameters": 10**15, "precision": "32-true"},
                "batch": {"per_device": 8},
                "hardware": {"gpu": "V100-SXM2-16GB", "devices": 1},
                "timing": {"step_time_s": {"p50": 0.1}},
            }
        )


def test_flops_in_the_profile_set_the_compute_bound_share(catalog) -> None:
    data = copy.deepcopy(MINIMAL)  # ResNet-50-like: 24.6 GFLOPs per image for training
    data["model"]["flops"] = {"per_sample": 24.6e9}
    r = predict(load_profile(data), "p4d.24xlarge:1", catalog=catalog, scaling="weak")
    share = 24.6e9 * 256 / 0.31 / 125e12  # achieved / V100 FP16 peak
    ratio = share * 125 / 312 + (1 - share) * 900 / 1555  # peak ratio and bandwidth ratio, V100 -> A100
    assert r.breakdown["compute_s"] == pytest.approx(0.31 * ratio)
    assert any("split from the profile's FLOPs" in a for a in r.assumptions)


@pytest.mark.parametrize(
    ("precision", "matmul", "fleet", "kind"),
    [
        ("32-true", "high", "g5.xlarge:1", "cross-flops-tf32"),  # V100 CUDA cores -> A10G TF32 tensor cores
        ("32-true", "highest", "g6e.xlarge:1", "cross-flops-tf32"),  # convolutions still TF32 (cuDNN's default)
        ("32-true", "high", "g4dn.xlarge:1", "cross-flops"),  # T4: CUDA cores too (compute capability 7.5)
        ("16-mixed", None, "g5.xlarge:1", "cross-flops"),  # tensor cores on both sides
        ("32-true", "medium", "g5.xlarge:1", "cross-flops-tf32"),  # "medium" is TF32 on CUDA, as "high"
        ("32-true", None, "g5.xlarge:1", "cross-flops-tf32"),  # not recorded: PyTorch's default, "highest"
        ("64-true", None, "g5.xlarge:1", "cross-flops"),  # FP64: no TF32 on either side
    ],
)
def test_fp32_flops_across_the_tf32_line_carry_their_own_width(catalog, precision, matmul, fleet, kind) -> None:
    """An FP32 step's FLOPs moved between CUDA cores and TF32 tensor cores cannot say which operators they are (the
    two reach shares of the peak 2x apart): the prediction carries that regime's held-out width, says why and how
    to narrow it; 16-bit steps and FP32 steps that stay on CUDA cores keep the FLOPs path's own width."""
    from predictor.model.uncertainty import Z80, model_error

    data = copy.deepcopy(MINIMAL)
    data["model"].update(flops={"per_sample": 24.6e9}, precision=precision)
    if matmul:
        data["model"]["float32_matmul_precision"] = matmul
    r = predict(load_profile(data), fleet, catalog=catalog)
    lo, hi = r.interval["iteration_time_s"]
    assert math.log(hi / lo) / (2 * Z80) == pytest.approx(model_error(kind), rel=1e-6)  # the profile has no CV
    assert model_error("cross-flops-tf32") > 1.5 * model_error("cross-flops")
    words = [e for e in r.extrapolation if e.startswith("FP32 across the TF32 line")]
    assert bool(words) == (kind == "cross-flops-tf32")
    if words:
        assert (
            "SriftyCallback records one by default" in words[0]
            and f"x{math.exp(Z80 * model_error(kind)):.2f}" in words[0]
        )
        assert ("convolutions and matmuls" in words[0]) == (matmul in ("high", "medium"))
        assert ("none at 'highest' is in the data" in words[0]) == (matmul not in ("high", "medium"))
        assert ("by PyTorch's default ('highest')" in words[0]) == (matmul is None)
        gpu = {"g5.xlarge:1": "A10G", "g6e.xlarge:1": "L40S"}[fleet]  # the target has the tensor cores
        assert f"the {gpu} runs convolutions" in words[0] and "the V100-SXM2-16GB on its FP32 CUDA cores" in words[0]


def test_the_tf32_regime_names_each_gpu_s_pipe_and_holds_without_flops_too(catalog) -> None:
    """From a GPU with TF32 to one without, the words name the source's tensor cores; without FLOPs per sample the
    analytic split (the A10G is not in the learned correction's data) has its own TF32 regime and width too."""
    from predictor.model.uncertainty import Z80, model_error

    data = copy.deepcopy(MINIMAL)
    data["model"].update(precision="32-true", float32_matmul_precision="high", flops={"per_sample": 24.6e9})
    data["hardware"]["gpu"] = "A10G"
    r = predict(load_profile(data), "g4dn.xlarge:1", catalog=catalog)  # A10G (TF32) -> T4 (CUDA cores)
    (words,) = [e for e in r.extrapolation if e.startswith("FP32 across the TF32 line")]
    assert "the A10G runs convolutions and matmuls on TF32" in words and "the T4 on its FP32 CUDA cores" in words
    assert "the profile's FLOPs do not say" in words
    del data["model"]["flops"]
    for gpu, kind in (("V100-SXM2-16GB", "cross-tf32"), ("T4", "cross")):  # across the line, and not
        data["hardware"]["gpu"] = gpu
        r = predict(load_profile(data), "g5.xlarge:1" if gpu != "T4" else "p3.2xlarge:1", catalog=catalog)
        lo, hi = r.interval["iteration_time_s"]
        assert math.log(hi / lo) / (2 * Z80) == pytest.approx(model_error(kind), rel=1e-6)
        words = [e for e in r.extrapolation if e.startswith("FP32 across the TF32 line")]
        assert bool(words) == (kind == "cross-tf32")
        if words:
            assert "a profile without FLOPs does not say" in words[0]
            assert f"x{math.exp(Z80 * model_error('cross-tf32')):.2f}" in words[0]
    assert model_error("cross-tf32") > 1.5 * model_error("cross")
    assert model_error("cross-corrected-tf32") > 1.5 * model_error("cross-corrected")


@pytest.mark.parametrize(
    ("precision", "capability", "tf32", "crosses"),
    [("32-true", "8.0", None, True), ("32-true", "7.0", None, False), ("32-true", None, 156.0, True),
     ("32-true", None, None, False), ("64-true", "8.0", None, False), ("16-mixed", "8.0", None, False),
     ("bf16-mixed", "8.0", None, False), ("16-true", "8.0", None, False), ("bf16-true", "8.0", None, False),
     ("transformer-engine", "8.9", None, False), ("transformer-engine-float16", "8.9", None, False)],
)  # fmt: skip
def test_which_steps_cross_the_tf32_line(precision, capability, tf32, crosses) -> None:
    """FP32 only; a GPU by its compute capability, or, where a user-defined one states none, by its TF32 peak."""
    import dataclasses

    from predictor.catalog import get_gpu
    from predictor.model.compute import crosses_tf32

    v100 = get_gpu("V100-SXM2-16GB")
    other = dataclasses.replace(v100, key="X", compute_capability=capability, tf32_tflops=tf32)
    assert crosses_tf32(v100, other, precision) is crosses and crosses_tf32(other, v100, precision) is crosses


def test_every_prediction_and_plan_names_the_model_that_made_it(minimal, catalog, tmp_path, monkeypatch, capsys):
    import hashlib
    from importlib import resources

    from predictor.model import artefact
    from predictor.ranking import Constraints, rank

    folder = resources.files("predictor.data")
    digest = hashlib.sha256(b"".join(folder.joinpath(n).read_bytes() for n in artefact.CONSTANT_FILES))
    for name, text in artefact.model_code():  # the formulas too
        digest.update(name.encode() + b"\0" + text)
    version = artefact.model_version()
    assert version == f"srifty.model/v3+{digest.hexdigest()[:12]}"
    assert artefact.model_artefact()["schema"] == "srifty.model/v3"  # the bundled constants are read, not defaults
    result = predict(minimal, "p3.2xlarge:1", catalog=catalog)
    assert result.to_dict()["performance_model"] == version
    plan = rank(minimal, Constraints(steps=1000, max_instances=2), catalog=catalog)
    assert plan.performance_model == version and plan.to_dict()["performance_model"] == version
    # the CLI's table says it too
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(minimal.to_dict()))
    assert main(["predict", "--profile", str(profile), "--fleet", "p3.2xlarge:1"]) == 0
    assert version in capsys.readouterr().out
    # other constants, another version: a refit is told apart
    artefact.model_version.cache_clear()
    try:
        monkeypatch.setattr(artefact, "CONSTANT_FILES", (*artefact.CONSTANT_FILES, "no-such-file.json"))
        assert artefact.model_version() == "srifty.model/v3+missing"
        monkeypatch.setattr(artefact, "CONSTANT_FILES", artefact.CONSTANT_FILES[:2])
        artefact.model_version.cache_clear()
        assert artefact.model_version() not in (version, "srifty.model/v3+missing")
    finally:
        monkeypatch.undo()
        artefact.model_version.cache_clear()
    assert artefact.model_version() == version


def test_srifty_predict_runs_the_layout_recommend_would(catalog, capsys) -> None:
    """Issue #37 M2: srifty predict said "does not fit: 604.9 GiB/GPU" for the bundled LoRA profile on g5.xlarge, which
    srifty recommend runs at 18.5 GiB (activation checkpointing, 16 micro-steps of 4). With no --layout it predicts
    the layout recommend chooses; --layout ddp still predicts plain DDP (and says what it would need)."""
    from predictor.ranking import Constraints, rank

    path = ROOT / "examples" / "profiles" / "llama-7b-bf16-handwritten-lora.json"
    assert main(["predict", "--profile", str(path), "--fleet", "g5.xlarge:1", "--format", "json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    plan = rank(load_profile(path), Constraints(steps=1000, allow=("g5.xlarge",), max_instances=1), catalog=catalog)
    assert auto["layout"] == plan.entries[0].layout.name == "ddp+ac"
    assert auto["fits_memory"] and auto["accumulate_grad_batches"] == 16  # 4 samples a micro-step, 16 of them
    args = ["predict", "--profile", str(path), "--fleet", "g5.xlarge:1", "--format", "json"]
    assert main([*args, "--layout", "ddp"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["layout"] == "ddp" and not plain["fits_memory"]


def test_a_changed_formula_changes_the_model_version(tmp_path) -> None:
    """The version names the formulas, not only the fitted constants: a term edited in predictor/model (no constant
    moved) gives another version; the same code gives the same."""
    import shutil
    import subprocess
    import sys

    def version(root) -> str:
        code = "from predictor.model.artefact import model_version; print(model_version())"
        return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                              env={"PYTHONPATH": str(root), "PATH": ""}).stdout.strip()  # fmt: skip

    shutil.copytree(ROOT / "predictor", tmp_path / "predictor", ignore=shutil.ignore_patterns("__pycache__"))
    before = version(tmp_path)
    assert before == version(ROOT) and before.startswith("srifty.model/v3+")
    model = tmp_path / "predictor" / "model"
    (model / ".#fleets.py").symlink_to(model / "gone")  # an editor's lock file (dangling): not the model, no crash
    (model / "fleets.py~").write_text("backup")
    assert version(tmp_path) == before
    fleets = model / "fleets.py"
    fleets.write_text(fleets.read_text() + "\n# a term changed\n")
    assert version(tmp_path) != before


def test_a_fleet_that_cannot_train_as_profiled_says_so(tmp_path, capsys) -> None:
    """srifty recommend leaves out a type whose GPU cannot run the profiled training (bf16 before Ampere); srifty
    predict of it still prices the step, but says it cannot run there (a new user's trial: a bf16 ConvNeXt got 190
    img/s on a V100 without a word)."""
    raw = copy.deepcopy(MINIMAL)
    raw["model"]["precision"] = "bf16-mixed"
    path = tmp_path / "bf16.json"
    path.write_text(json.dumps(raw))
    assert main(["predict", "--profile", str(path), "--fleet", "p3.2xlarge:1"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the table may wrap the row at any width
    assert "cannot run" in out and "p3.2xlarge: no bf16 on the GPU (compute capability < 8.0)" in out
    assert main(["predict", "--profile", str(path), "--fleet", "g5.xlarge:1"]) == 0  # A10G: Ampere
    assert "cannot run" not in capsys.readouterr().out


def test_without_activation_memory_a_gpu_is_held_to_the_profiled_micro_batch(catalog) -> None:
    """A profile that does not say what its activations take gives a memory floor, not a fit: the micro-batch it ran
    is the largest known to fit, so the profiled global batch (64 x 4 accumulated) stays accumulated on one GPU
    instead of becoming one micro-batch of 256 (a new user's trial: the ranking put 1,024 on one V100 of a profile that
    ran 256 there). A profile with its measured peak lets the memory model decide."""
    raw = copy.deepcopy(MINIMAL)
    raw["batch"] = {"per_device": 64, "accumulate_grad_batches": 4}
    held = predict(load_profile(raw), "p3.2xlarge:1", catalog=catalog)
    assert held.global_batch == 256 and held.accumulate_grad_batches == 4
    assert held.groups[0].rank_batches == (64,)
    four = predict(load_profile(raw), "p3.8xlarge:1", catalog=catalog)  # 4 GPUs: 64 each, nothing to accumulate
    assert four.accumulate_grad_batches == 1 and four.groups[0].rank_batches == (64, 64, 64, 64)
    raw["memory"] = {"peak_allocated_bytes": 2 * 2**30}  # 2 GiB at 64: 256 fits a 16 GB V100
    free = predict(load_profile(raw), "p3.2xlarge:1", catalog=catalog)
    assert free.accumulate_grad_batches == 1 and free.groups[0].rank_batches == (256,)


def test_predict_takes_a_parsed_profile_and_its_dict_reads_back_from_json(catalog) -> None:
    """Python's predict() takes the srifty.profile/v1 dict the service takes (validated as load_profile does), a
    clear TypeError otherwise; to_dict() is what JSON gives back, every tuple a list (a new user's trial)."""
    one = predict(copy.deepcopy(MINIMAL), "p3.8xlarge:2", catalog=catalog)
    loaded = predict(load_profile(copy.deepcopy(MINIMAL)), "p3.8xlarge:2", catalog=catalog)
    assert one.iteration_time_s == loaded.iteration_time_s
    with pytest.raises(TypeError, match="load_profile"):
        predict("profile.json", "p3.8xlarge:2", catalog=catalog)  # type: ignore[arg-type]
    d = one.to_dict()
    assert json.loads(json.dumps(d)) == d and isinstance(d["groups"][0]["rank_batches"], list)


def test_an_operator_table_of_another_precision_is_refused_naming_both() -> None:
    """model.precision edited over a table captured at another precision would price the table's dtypes while the GPU
    rules read the model's: refused, naming the field and both ways out; Lightning 1.x's names read as Lightning 2's."""
    from predictor.exceptions import ProfileSchemaError

    raw = copy.deepcopy(MINIMAL)
    raw["ops"] = {"device": "meta", "samples": 256, "ops": [], "precision": "32-true"}
    raw["model"]["precision"] = "bf16-mixed"
    with pytest.raises(ProfileSchemaError, match=r"ops\.precision: the operator table was captured at '32-true'") as e:
        load_profile(raw)
    assert e.value.field == "ops.precision" and "set model.precision back to '32-true'" in str(e.value)
    raw["ops"]["precision"], raw["model"]["precision"] = "16", "16-mixed"
    assert load_profile(raw).model.precision == "16-mixed"


def test_the_breakdown_says_when_an_intra_node_phase_limits_a_multi_node_all_reduce() -> None:
    """On several nodes the all-reduce's limit can be a node's NVSwitch phase while the assumptions name EFA across
    nodes: the breakdown says the intra-node phase is the longer one (a new user's trial read "(intra-node nvswitch)"
    as the transport priced)."""
    from types import SimpleNamespace

    from lightning_srifty.cli.predict import _limiting_words

    group = SimpleNamespace(count=4)
    multi = SimpleNamespace(groups=(group,), allreduce_limiting="intra-node nvswitch")
    assert _limiting_words(multi) == "intra-node nvswitch: its phase is longer than the network's"
    one = SimpleNamespace(groups=(SimpleNamespace(count=1),), allreduce_limiting="intra-node nvswitch")
    assert _limiting_words(one) == "intra-node nvswitch"
    assert _limiting_words(SimpleNamespace(groups=(group,), allreduce_limiting="network efa")) == "network efa"


def test_the_input_pipeline_scales_with_the_cores_its_loader_can_use(catalog) -> None:
    """A review: the input time scaled with vCPUs per GPU without bound, so a loader of 4 workers loaded 12x faster on
    a type of 48 vCPUs a GPU. A loader uses num_workers + 1 processes (batch.loader_workers); where the profile does
    not say, no more cores than the profiled host gave a GPU are credited (fewer still slow it)."""
    from predictor.model.basis import _cpu_ratio

    data = copy.deepcopy(MINIMAL)
    data["hardware"] = {**data["hardware"], "cpu_count": 8, "devices": 1}
    unknown = load_profile(data)
    big, small = catalog.get("g5.12xlarge"), catalog.get("g4dn.xlarge")  # 12 and 4 vCPUs a GPU
    assert _cpu_ratio(unknown, big) == 1.0  # 8 -> 12 cores a GPU: not credited without the workers
    assert _cpu_ratio(unknown, small) == pytest.approx(8 / 4)  # 8 -> 4: slower
    data["batch"] = {**data["batch"], "loader_workers": 3}
    four = load_profile(data)
    assert _cpu_ratio(four, big) == 1.0  # 4 processes fit both hosts
    assert _cpu_ratio(four, small) == 1.0
    data["batch"]["loader_workers"] = 15
    sixteen = load_profile(data)
    assert _cpu_ratio(sixteen, big) == pytest.approx(8 / 12)  # it can use 12 there, 8 here
    assert _cpu_ratio(sixteen, small) == pytest.approx(8 / 4)


def test_a_gpu_the_correction_never_saw_takes_its_dies_twin_correction(catalog) -> None:
    """Without FLOPs the learned correction applies only to GPUs it was fitted on; the H200 (not among them) has the
    H100's die, so it takes the V100 -> H100 pair's correction on its own analytic ratio, and says so. Before, it was
    priced x0.16 of the V100 against the H100's x0.30 (nearly twice the H100's speed; the lent H200 ran Lambda's
    models at 0.85-0.97x the lent H100's times)."""
    from predictor.catalog import get_gpu
    from predictor.catalog.gpus import die_twin, same_die

    data = copy.deepcopy(MINIMAL)
    data["model"].update(precision="16-mixed")
    data["model"].pop("flops", None)
    data["hardware"]["gpu"] = "V100-SXM2-16GB"
    data["batch"] = {"per_device": 256}
    notes = {}
    for fleet in ("p5.48xlarge:1", "p5e.48xlarge:1"):
        r = predict(load_profile(data), fleet, catalog=catalog)
        (notes[fleet],) = [a for a in r.assumptions if a.startswith("V100-SXM2-16GB -> H")]
    h100 = float(notes["p5.48xlarge:1"].split("time x")[1].split()[0])
    h200 = float(notes["p5e.48xlarge:1"].split("time x")[1].split()[0])
    assert "learned correction x1.50" in notes["p5.48xlarge:1"]
    assert "learned correction x1.50, H200-SXM as H100-SXM (its die)" in notes["p5e.48xlarge:1"]
    assert 0.7 < h200 / h100 < 1.0  # the H200's bandwidth helps the memory-bound half, not the whole
    assert same_die(get_gpu("H200-SXM"), get_gpu("H100-SXM")) and not same_die(
        get_gpu("H100-PCIe"), get_gpu("H100-SXM")
    )
    pool = [get_gpu(k) for k in ("H100-SXM", "A100-PCIe-40GB", "A100-PCIe-80GB", "A100-SXM-80GB")]
    assert die_twin(get_gpu("H200-SXM"), pool).key == "H100-SXM"
    assert die_twin(get_gpu("A100-SXM-40GB"), pool).key == "A100-SXM-80GB"  # its form factor, not the nearer memory
    assert die_twin(get_gpu("A100-PCIe-80GB"), pool[:2]).key == "A100-PCIe-40GB"
    assert die_twin(get_gpu("H100-SXM"), pool) is None  # one of the pool is its own
    assert die_twin(get_gpu("L4"), pool) is None
