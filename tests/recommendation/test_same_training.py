"""Issue #12: a recommendation a user can act on. The same training on every fleet (strong scaling: the profiled
global batch, whole per-GPU batches, gradient accumulation where memory needs it), feasible fleets only (CPU
architecture, GPU support in torch, precision, memory from what is trainable) with the reasons counted, and one
vocabulary for the work (optimizer steps, samples, batches, accumulation) and the binding constraint."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from _support import MINIMAL
from predictor.catalog.feasible import ARM64, OLD_FOR_TORCH2
from predictor.documents.profile import load_profile
from predictor.documents.work import Work
from predictor.exceptions import ConfigError, NoFeasibleConfigError
from predictor.model.batch import fleet_batches
from predictor.model.predict import predict
from predictor.ranking import Constraints, global_batch, rank


def _profile(**changes):
    data = copy.deepcopy(MINIMAL)
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return load_profile(data)


A100_16 = {
    "hardware__gpu": "A100-SXM-40GB",
    "batch__per_device": 16,
    "model__precision": "bf16-mixed",
    "timing__step_time_s": {"p50": 0.05},
}


def test_p4d_two_nodes_keep_the_global_batch_of_16(catalog) -> None:
    profile = _profile(**A100_16)
    plan = rank(profile, Constraints(steps=1000, allow=("p4d.24xlarge",), max_instances=2), catalog=catalog)
    by_fleet = {e.fleet: e for e in plan.entries}
    two = by_fleet["p4d.24xlarge:2"]
    assert plan.constraints.scaling == "strong" and plan.constraints.global_batch == 16
    assert two.global_batch == 16 and list(two.groups[0].micro_batches) == [1] * 16  # 16 GPUs, one sample each
    assert two.groups[0].per_device_batch == 1 and two.groups[0].accumulate_grad_batches == 1
    assert list(by_fleet["p4d.24xlarge:1"].groups[0].micro_batches) == [2] * 8
    assert plan.constraints.work_samples == 1000 * 16
    assert any("strong scaling" in n and "16 samples" in n for n in plan.notes)
    weak = rank(
        profile, Constraints(samples=16_000, allow=("p4d.24xlarge",), max_instances=2, scaling="weak"), catalog=catalog
    )
    assert {e.fleet: e.global_batch for e in weak.entries}["p4d.24xlarge:2"] == 256  # the explicit choice
    assert weak.constraints.scaling == "weak" and any("weak scaling (asked)" in n for n in weak.notes)


def test_a_fleet_with_more_gpus_than_samples_is_excluded_with_the_reason(catalog) -> None:
    profile = _profile(**{**A100_16, "batch__per_device": 8})
    asked = Constraints(steps=10, allow=("p4d.24xlarge",), max_instances=3, market="on-demand")
    plan = rank(profile, asked, catalog=catalog)
    assert [e.fleet for e in plan.entries] == ["p4d.24xlarge:1"]
    assert plan.excluded["more GPUs than the 8 samples of the global batch"] == 2  # :2 and :3
    with pytest.raises(Exception, match="more than the 8 samples of the profiled global batch"):
        predict(profile, "p4d.24xlarge:2", catalog=catalog)


def test_gradient_accumulation_where_a_gpu_cannot_hold_its_share(catalog) -> None:
    # 64 per GPU on an A100-80GB used 70 GiB: about 1.1 GiB of activations per sample
    profile = _profile(
        **{
            "hardware__gpu": "A100-SXM-80GB",
            "batch__per_device": 64,
            "model__parameters": 10_000_000,
            "memory": {"peak_allocated_bytes": 70 * 2**30},
        }
    )
    one = predict(profile, "g5.xlarge:1", catalog=catalog)  # an A10G, 24 GB
    (group,) = one.groups
    assert one.fits_memory and one.global_batch == 64 and one.accumulate_grad_batches == 4
    assert group.micro_batch == 16 and group.per_device_batch == 64 and group.rank_batches == (16,)
    assert "16 x 4 accumulated = 64 samples per GPU" in one.batch_split
    assert not predict(profile, "g5.xlarge:1", catalog=catalog, scaling="weak").fits_memory
    # one all-reduce per optimizer step, four micro-steps of compute
    four = predict(profile, "g5.12xlarge:1", catalog=catalog)  # 4 x A10G: 16 each, no accumulation needed
    assert four.accumulate_grad_batches == 1 and four.groups[0].rank_batches == (16, 16, 16, 16)
    assert one.breakdown["compute_s"] == pytest.approx(4 * four.breakdown["compute_s"], rel=1e-9)
    plan = rank(profile, Constraints(steps=100, allow=("g5.xlarge",), max_instances=1), catalog=catalog)
    g = plan.entries[0].groups[0]
    assert (list(g.micro_batches), g.accumulate_grad_batches, g.per_device_batch) == ([16], 4, 64)
    assert fleet_batches(plan.entries[0]) == ([16], 4)  # what srifty launch hands the job
    assert plan.entries[0].batch_per_gpu() == "16x4"


def test_g5g_is_excluded_as_arm64_unless_allowed(catalog) -> None:
    profile = _profile()
    with pytest.raises(NoFeasibleConfigError) as info:
        rank(profile, Constraints(steps=100, allow=("g5g",)), catalog=catalog)
    assert info.value.binding == ("instance_types",) and info.value.excluded[ARM64] == 6
    allowed = rank(profile, Constraints(steps=100, allow=("g5g",), allow_arm64=True), catalog=catalog)
    assert allowed.entries and all(e.fleet.startswith("g5g.") for e in allowed.entries)
    arm_profile = _profile(hardware__cpu_arch="aarch64")  # measured on Graviton: arm64 images exist
    assert rank(arm_profile, Constraints(steps=100, allow=("g5g",)), catalog=catalog).entries
    everything = rank(profile, Constraints(steps=100), catalog=catalog)
    assert everything.excluded_types[ARM64] == 6
    assert not any(g.instance_type.startswith("g5g") for e in everything.entries for g in e.groups)


def test_a_bf16_profile_never_ranks_a_t4_or_v100_and_torch2_never_a_k80(catalog) -> None:
    profile = _profile(**{**A100_16, "software": {"torch": "2.4.1+cu121"}})
    plan = rank(profile, Constraints(steps=1000, max_types=2, max_instances=3, top=200), catalog=catalog)
    gpus = {g.gpu for e in (*plan.entries, *plan.pareto) for g in e.groups}
    assert gpus and not gpus & {"T4", "V100-SXM2-16GB", "V100-SXM2-32GB", "K80", "M60"}
    assert plan.excluded_types["no bf16 on the GPU (compute capability < 8.0)"] > 0
    assert plan.excluded_types[OLD_FOR_TORCH2] == 3  # p2.xlarge, p2.8xlarge, p2.16xlarge
    fp16 = rank(_profile(), Constraints(steps=1000, allow=("p2",)), catalog=catalog)  # torch unknown: K80 (3.7) ranks
    assert fp16.entries and OLD_FOR_TORCH2 not in (fp16.excluded_types or {})


def test_a_bf16_profile_measured_on_the_cpu_says_how_to_profile_what_the_gpus_will_run(catalog) -> None:
    """Lightning runs precision="16-mixed" on a CPU as bf16-mixed and the profile records what ran: a trial's CNN lost
    the V100s and T4s without a word on why its 16-mixed script was taken for bf16."""
    cpu = _profile(hardware__gpu=None, hardware__cpu_count=4, model__precision="bf16-mixed",
                   model__flops__per_sample=1e10)  # fmt: skip
    (why,) = [w for w in rank(cpu, Constraints(steps=1000), catalog=catalog).excluded_types or {} if "bf16" in w]
    assert why.startswith("no bf16 on the GPU (compute capability < 8.0); the profile ran on the CPU, where")
    assert "srifty capture --precision 16-mixed" in why
    gpu = rank(_profile(**A100_16), Constraints(steps=1000), catalog=catalog)  # measured on a GPU: bf16 was asked
    assert "no bf16 on the GPU (compute capability < 8.0)" in (gpu.excluded_types or {})
    captured = load_profile(
        Path(__file__).resolve().parents[2] / "examples" / "profiles" / "llama-7b-bf16-captured.json"
    )
    assert "no bf16 on the GPU (compute capability < 8.0)" in (  # a capture is asked its precision: nothing to add
        rank(captured, Constraints(steps=1000), catalog=catalog).excluded_types or {}
    )


def test_lora_memory_counts_gradients_and_optimizer_state_of_trainable_parameters_only(catalog) -> None:
    lora = {"model__parameters": 7_000_000_000, "model__precision": "bf16-true", "hardware__gpu": "A100-SXM-40GB"}
    full = predict(_profile(**lora), "g5.xlarge:1", catalog=catalog)
    light = predict(_profile(**lora, model__trainable_parameters=40_000_000), "g5.xlarge:1", catalog=catalog)
    assert not full.fits_memory and light.fits_memory  # 14 GB of frozen bf16 weights fit a 24 GB A10G
    static = 7e9 * 2 + 40e6 * 2 + 40e6 * 8  # weights + trainable gradients + Adam state of the trainable ones
    assert light.groups[0].memory_gib * 2**30 == pytest.approx(static + 600 * 2**20, rel=1e-6)
    assert any("trainable parameters only" in a for a in light.assumptions)


def test_accumulate_grad_batches_4_counts_the_work_in_samples(catalog) -> None:
    profile = _profile(batch__per_device=8, batch__accumulate_grad_batches=4)
    assert global_batch(profile) == 32
    work = Constraints(epochs=2, steps_per_epoch=100).work(profile)  # optimizer steps per epoch
    assert (work.samples, work.optimizer_steps, work.batches, work.batch_samples) == (6400, 200, 800, 8)
    plan = rank(profile, Constraints(epochs=2, steps_per_epoch=100, market="on-demand"), catalog=catalog)
    assert plan.constraints.work_samples == 6400 and plan.constraints.global_batch == 32
    assert Work.of_batches(800, 32, 4).samples == 6400
    # a part of an epoch is whole optimizer steps (a trial's --epochs 0.5 read 500.5 steps in the plan's work)
    half = Constraints(epochs=0.5, steps_per_epoch=1001).work(profile)
    assert (half.optimizer_steps, half.samples) == (501, 501 * 32)
    assert Constraints(epochs=0.07, steps_per_epoch=100).work(profile).optimizer_steps == 7  # not 8: 7.000000000000001


def test_a_hand_written_8_device_profile_has_one_global_batch_everywhere(catalog) -> None:
    profile = _profile(hardware__devices=8)  # 256 per device, no world_size nor global_batch written
    assert global_batch(profile) == 2048
    assert predict(profile, "p3.16xlarge:1", catalog=catalog).global_batch == 2048
    plan = rank(profile, Constraints(steps=10, allow=("p3.16xlarge",), market="on-demand"), catalog=catalog)
    assert plan.constraints.work_samples == 10 * 2048 and plan.entries[0].global_batch == 2048


def test_the_binding_constraint_is_named_when_max_hourly_binds(catalog) -> None:
    profile = _profile()
    fastest = rank(profile, Constraints(steps=100_000, market="on-demand", objective="time"), catalog=catalog)
    limit = fastest.entries[0].usd_per_hour / 2
    plan = rank(
        profile,
        Constraints(steps=100_000, market="on-demand", objective="time", max_hourly_usd=limit, budget_usd=1e9),
        catalog=catalog,
    )
    assert plan.entries[0].usd_per_hour <= limit
    assert f"the limit of ${limit:,.4g}/h binds" in plan.why and "budget" not in plan.why
    assert plan.excluded["over max_hourly_usd"] > 0
    with pytest.raises(NoFeasibleConfigError) as info:
        rank(profile, Constraints(steps=100_000, max_hourly_usd=0.01, budget_usd=1e9), catalog=catalog)
    assert info.value.binding == ("max_hourly_usd",) and info.value.best["usd_per_hour"] > 0.01


def test_savings_are_never_against_a_fleet_that_cannot_hold_the_model(catalog) -> None:
    profile = _profile(**{"model__parameters": 1_300_000_000, "hardware__gpu": "A100-SXM-40GB"})
    assert not predict(profile, "g4dn.xlarge:1", catalog=catalog).fits_memory  # 21 GB of state on a 16 GB T4
    plan = rank(profile, Constraints(steps=1000, current_fleet="g4dn.xlarge:1"), catalog=catalog)
    assert all(e.savings_vs_current is None for e in plan.entries)
    assert plan.constraints.current_fleet is None
    assert any("no savings computed: the current fleet g4dn.xlarge:1 cannot train" in n for n in plan.notes)
    fits = rank(profile, Constraints(steps=1000, current_fleet="p4d.24xlarge:1"), catalog=catalog)
    assert all(e.savings_vs_current is not None for e in fits.entries)


def test_the_launcher_splits_a_batch_as_the_ranking_does(catalog) -> None:
    """One split (issue #24 item 2): the launcher's per-rank batches for a plan entry, recomputed from its per-GPU
    shares (what it does for another global batch), are the ranking's own recorded ones, on mixes of unequal GPUs
    too; and a global batch the plan did not rank is split the same way, every rank at least one sample."""
    import glob

    from conftest import ROOT
    from predictor.documents.plan import load_plan
    from predictor.model.batch import rank_batch_sizes

    profile = _profile(batch__per_device=24)
    mixed = rank(profile, Constraints(steps=100, max_types=2, max_instances=4, top=20), catalog=catalog)
    entries = [e for f in sorted(glob.glob(str(ROOT / "terraform/examples/*/plan.json"))) for e in load_plan(f).entries]
    entries += mixed.entries
    assert any(len(e.groups) > 1 for e in entries)  # unequal GPUs are among them
    for entry in entries:
        recorded = entry.rank_batches()
        if recorded is not None:
            assert rank_batch_sizes(entry) == recorded, entry.fleet
        n = sum(g.count * g.gpus_per_instance for g in entry.groups)
        for total in (n, n + 1, 3 * n + 2):
            sizes = rank_batch_sizes(entry, total)
            assert sum(sizes) == total and min(sizes) >= 1 and len(sizes) == n, (entry.fleet, total, sizes)


def test_steps_under_weak_scaling_are_refused_with_the_way_out(catalog) -> None:
    """An audit: ``--steps 1000 --scaling weak`` priced 1,000 steps of the profiled global batch (4,000 samples), 9
    steps of a 480-GPU fleet's own batch, where a script stopped at max_steps runs 1,000 of them. Under weak scaling
    the work is samples or epochs; a step count is refused, naming both ways out."""
    profile = _profile(**A100_16)
    with pytest.raises(ConfigError) as err:
        rank(profile, Constraints(steps=1000, scaling="weak"), catalog=catalog)
    said = str(err.value)
    assert err.value.parameter == "steps" and "samples" in said and "epochs" in said and "strong" in said, said
    by_samples = rank(profile, Constraints(samples=16_000, scaling="weak", max_instances=2), catalog=catalog)
    by_epochs = rank(
        profile, Constraints(epochs=2, steps_per_epoch=500, scaling="weak", max_instances=2), catalog=catalog
    )
    assert by_samples.constraints.work_samples == by_epochs.constraints.work_samples == 16_000
