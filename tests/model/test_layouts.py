"""Sharded layouts in the predictor (issue #15): memory per GPU of each layout term by term, time of FSDP, hybrid
sharding, activation checkpointing and pipelines, the ranking over fleet x layout and the plan's layout."""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from predictor.documents.plan import load_plan
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError, NoFeasibleConfigError, PredictionError
from predictor.model.fleets import bases
from predictor.model.layout import parse
from predictor.model.memory import CUDA_CONTEXT_BYTES, estimate_memory, memory_parts, profile_sizes
from predictor.model.predict import predict
from predictor.ranking import Constraints, rank

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "profiles" / "llama-7b-bf16-handwritten.json"
LORA = ROOT / "examples" / "profiles" / "llama-7b-bf16-handwritten-lora.json"

P, UNIT, BLOCKS = 1_000_000, 200_000, 4  # 4 blocks of 200k parameters + 200k outside them (embedding, head)
SAVED, BLOCK_SAVED, BLOCK_INPUT, TRANSIENT = 10e6, 2e6, 1e5, 5e5


def small(precision: str = "32-true", trainable: int | None = None, structure: dict | None = None, **extra):
    model = {
        "name": "toy",
        "parameters": P,
        "precision": precision,
        "structure": {
            "blocks": BLOCKS,
            "block": "Block",
            "block_parameters": UNIT,
            "saved_bytes_per_sample": SAVED,
            "block_saved_bytes_per_sample": BLOCK_SAVED,
            "block_input_bytes_per_sample": BLOCK_INPUT,
            "transient_bytes_per_sample": TRANSIENT,
            **(structure or {}),
        },
    }
    if trainable is not None:
        model["trainable_parameters"] = trainable
    data = {
        "schema": "srifty.profile/v1",
        "model": model,
        "batch": {"per_device": 8, "accumulate_grad_batches": 2},
        "hardware": {"gpu": "A10G", "devices": 1, "nodes": 1},
        "timing": {"step_time_s": {"p50": 0.2, "cv": 0.02}},
    }
    data.update(extra)
    return load_profile(data)


def parts(profile, layout, micro, **kw):
    return {k: float(v) for k, v in memory_parts(profile, parse(layout), micro, **kw).items()}


def test_memory_of_each_layout_term_by_term() -> None:
    prof = small()
    ddp = parts(prof, "ddp", 2)
    assert ddp == {
        "weights": 4 * P,
        "gradients": 4 * P,
        "optimizer": 8 * P,  # two fp32 Adam moments
        "gathered": 0.0,
        "activations": 2 * SAVED,
        "transient": 2 * TRANSIENT,
        "context": CUDA_CONTEXT_BYTES,
    }
    full = parts(prof, "fsdp:full_shard", 2, shard=4)
    assert (full["weights"], full["gradients"], full["optimizer"]) == (P, P, 2 * P)
    # the root unit (200k outside the blocks) + 2 units in flight + one unsharded gradient unit, fp32
    assert full["gathered"] == 4 * (200_000 + 3 * UNIT)
    grad_op = parts(prof, "fsdp:shard_grad_op", 2, shard=4)
    assert grad_op["gathered"] == 4 * (P + UNIT)  # the whole model gathered from forward to backward
    assert parts(prof, "fsdp:full_shard", 2, shard=1)["gathered"] == 0  # one GPU gathers nothing
    # a model of one unit gathers itself once (+ its gradient): it was 3x the model (a review's 1.5M-parameter model)
    one_unit = small(structure={"blocks": 1, "block_parameters": P})
    assert parts(one_unit, "fsdp:full_shard", 2, shard=4)["gathered"] == 4 * (P + P)
    ac = parts(prof, "ddp+ac", 2)
    # each block keeps its input; the head's phase (saved outside the blocks + the loss temporaries) and one block's
    # recompute peak at different times: the larger of the two
    assert ac["activations"] == 2 * BLOCKS * BLOCK_INPUT
    assert ac["transient"] == 2 * max(SAVED - BLOCKS * BLOCK_SAVED + TRANSIENT, BLOCK_SAVED)
    # what does not grow with the batch (autocast's weight copies) adds once; under FSDP only the gathered share
    fixed = small(structure={"fixed_bytes": 3e6})
    assert parts(fixed, "ddp", 2)["transient"] == 3e6 + 2 * TRANSIENT
    share = (200_000 + 2 * UNIT) / P  # the root + two units in flight
    assert parts(fixed, "fsdp:full_shard", 2, shard=4)["transient"] == pytest.approx(3e6 * share + 2 * TRANSIENT)
    # the optimizer step's own peak (foreach temporaries) wins when larger than the backward's, sharded with the state
    opt = small(structure={"optimizer_transient_bytes": 50e6})
    assert parts(opt, "ddp", 2)["transient"] == 50e6 - 2 * SAVED
    assert parts(opt, "fsdp:full_shard", 2, shard=4)["transient"] == pytest.approx(
        max(50e6 / 4, 2 * (SAVED + TRANSIENT)) - 2 * SAVED
    )
    pipe = parts(prof, "pipeline:2", 3, stages=2, micro_steps=4)
    assert (pipe["weights"], pipe["optimizer"]) == (2 * P, 4 * P)
    assert pipe["activations"] == 3 * SAVED / 2 * 2  # half the blocks, 2 micro-batches in flight on stage 1
    assert parts(prof, "pipeline:4", 1, stages=4, micro_steps=2)["activations"] == SAVED / 4 * 2
    # mixed precision: fp32 shards, bf16 gathered copies
    mixed = parts(small("bf16-mixed"), "fsdp:full_shard", 1, shard=4)
    assert mixed["weights"] == P and mixed["gathered"] == 2 * (200_000 + 3 * UNIT)
    # LoRA: only trainable parameters have gradients and Adam state under ddp; FSDP's flat gradient is whole
    lora = small("bf16-true", trainable=10_000)
    lp = parts(lora, "ddp", 1)
    assert (lp["weights"], lp["gradients"], lp["optimizer"]) == (2 * P, 2 * 10_000, 8 * 10_000)
    assert parts(lora, "fsdp:full_shard", 1, shard=2)["gradients"] == 2 * P / 2
    # the one-GPU view sums the same parts; hybrid shards over the node only
    est = estimate_memory(prof, 2, 24, "fsdp:hybrid_shard", ranks=8, gpus_per_node=2)
    assert est.parts == parts(prof, "fsdp:hybrid_shard", 2, shard=2)
    assert est.bytes_per_gpu == pytest.approx(sum(est.parts.values())) and est.context_bytes == CUDA_CONTEXT_BYTES
    assert est.static_bytes == pytest.approx(2 * P + 2 * P + 4 * P + 4 * (200_000 + 3 * UNIT))


def test_memory_falls_with_shards_and_checkpointing_and_needs_a_structure() -> None:
    prof = small()
    needs = [estimate_memory(prof, 2, 24, "fsdp:full_shard", ranks=n).bytes_per_gpu for n in (2, 4, 8, 16)]
    assert all(a > b for a, b in itertools.pairwise(needs))
    for base in ("ddp", "fsdp:full_shard"):
        plain = estimate_memory(prof, 4, 24, base, ranks=4)
        ac = estimate_memory(prof, 4, 24, base + "+ac", ranks=4)
        assert ac.activation_bytes < plain.activation_bytes and ac.static_bytes == plain.static_bytes
    bare = load_profile({**json.loads(json.dumps(_plain_dict())), "memory": {"peak_allocated_bytes": 20 * P}})
    with pytest.raises(ConfigError, match=r"'ddp\+ac' needs the model's structure"):
        estimate_memory(bare, 1, 24, "ddp+ac")
    # without a structure: activations from the measured peak, as before layouts
    assert estimate_memory(bare, 8, 24).activation_bytes == pytest.approx(20 * P - 16 * P)


def _plain_dict():
    return {
        "schema": "srifty.profile/v1",
        "model": {"name": "toy", "parameters": P, "precision": "32-true"},
        "batch": {"per_device": 8},
        "hardware": {"gpu": "A10G", "devices": 1, "nodes": 1},
        "timing": {"step_time_s": {"p50": 0.2}},
    }


def test_time_of_checkpointing_hybrid_and_pipelines(catalog) -> None:
    prof = small("bf16-mixed", batch={"per_device": 8, "accumulate_grad_batches": 2})
    plain = predict(prof, "g5.12xlarge:1", catalog=catalog, layout="fsdp:full_shard")
    ac = predict(prof, "g5.12xlarge:1", catalog=catalog, layout="fsdp:full_shard+ac")
    assert ac.iteration_time_s > plain.iteration_time_s and ac.layout == "fsdp:full_shard+ac"
    assert ac.groups[0].memory_gib < plain.groups[0].memory_gib
    # hybrid: full_shard inside each node + one all-reduce of the gradients' shard across nodes, per micro-step
    one = predict(prof, "g5.12xlarge:1", catalog=catalog, layout="fsdp:full_shard", scaling="weak")
    hybrid = predict(prof, "g5.12xlarge:2", catalog=catalog, layout="fsdp:hybrid_shard", scaling="weak")
    full = predict(prof, "g5.12xlarge:2", catalog=catalog, layout="fsdp:full_shard", scaling="weak")
    link = bases(prof, ["g5.12xlarge"], catalog)[1][0].inter
    a = hybrid.accumulate_grad_batches
    units = profile_sizes(prof).parameters / profile_sizes(prof).unit  # one all-reduce call per FSDP unit
    assert units > 1
    cross = a * (2 * (2 - 1) / 2 * P * 2 / 1e9 / link.gbps + units * 2 * link.latency_s)  # 2 nodes: a ring
    assert hybrid.breakdown["allreduce_s"] == pytest.approx(one.breakdown["allreduce_s"] + cross)
    assert full.breakdown["allreduce_s"] > hybrid.breakdown["allreduce_s"]  # 3 collectives cross the network
    # pipeline 1F1B: (m + p - 1) slots of 1/p of the model; as many micro-batches as the batch has samples
    pipe = predict(prof, "g5.xlarge:2", catalog=catalog, layout="pipeline:2")
    m, micro = pipe.accumulate_grad_batches, pipe.groups[0].micro_batch
    assert (m, micro) == (16, 1) and pipe.global_batch == 16
    per_sample = bases(prof, ["g5.xlarge"], catalog)[1][0].per_sample_s
    assert pipe.breakdown["compute_s"] == pytest.approx(per_sample * micro * (m + 2 - 1) / 2)
    assert pipe.layout == "pipeline:2" and pipe.breakdown["exposed_comm_s"] > 0  # activations cross the link
    with pytest.raises(ConfigError, match=r"one stage per node\. Use pipeline:2"):
        predict(prof, "g5.xlarge:2", catalog=catalog, layout="pipeline:3")
    with pytest.raises(ConfigError, match="does not apply"):
        predict(prof, "g5.xlarge:1", catalog=catalog, layout="fsdp:hybrid_shard")


def test_checkpointed_profile_is_normalised_to_a_plain_step(catalog) -> None:
    plain = small(timing={"step_time_s": {"p50": 0.2}})
    measured = predict(plain, "g5.xlarge:1", catalog=catalog, layout="ddp+ac", scaling="weak")
    ran_ac = load_profile({**plain.to_dict(), "layout": "ddp+ac", "timing": {"step_time_s": {"p50": 0.2}}})
    assert ran_ac.layout == "ddp+ac"
    again = predict(ran_ac, "g5.xlarge:1", catalog=catalog, layout="ddp+ac", scaling="weak")
    back = predict(ran_ac, "g5.xlarge:1", catalog=catalog, scaling="weak")
    # the checkpointed run, predicted with +ac on its own GPU, is its measured step; without +ac it is faster
    assert again.breakdown["compute_s"] == pytest.approx(8 * 0.2 / 8 * 2 * 1.0, rel=1e-9)
    assert back.breakdown["compute_s"] < again.breakdown["compute_s"] < measured.breakdown["compute_s"]


def test_seven_b_recommendation_offers_sharded_fleets_of_small_gpus(catalog, tmp_path) -> None:
    full = load_profile(LLAMA)
    plan = rank(full, Constraints(steps=1000, market="on-demand", top=400), catalog=catalog)
    gpus = {e.groups[0].gpu for e in plan.entries}
    assert {"A10G", "L4"} & gpus and {"A100-SXM-80GB", "H100-SXM"} & gpus  # small and large GPUs side by side
    small_gpu = [e for e in plan.entries if e.groups[0].gpu in ("A10G", "L4")]
    assert small_gpu and all(e.layout.name.startswith("fsdp:") for e in small_gpu)
    assert any(e.layout.name == "fsdp:full_shard+ac" for e in small_gpu)
    assert all(e.memory_gib <= 22.35 * 0.92 + 1e-9 for e in small_gpu)
    assert {e.global_batch for e in plan.entries} == {64}  # strong scaling: the same training on every layout
    best = plan.entries[0]
    assert best.layout.lightning_strategy == "fsdp" and best.layout.lightning_args["auto_wrap_policy"] == [
        "LlamaDecoderLayer"
    ]
    assert "ddp would need" in plan.why and best.layout.name in plan.why
    assert any(n.startswith("pipelines (evaluated, not launchable") for n in plan.notes)
    # the plan round-trips with its layouts, and a plan from before layouts still loads (ddp)
    path = plan.save(tmp_path / "plan.json")
    assert load_plan(path).entries[0].layout == best.layout
    old = json.loads(path.read_text())
    for e in old["entries"] + old["pareto"]:
        e.pop("layout")
    old["constraints"].pop("layouts")
    assert load_plan(old).entries[0].layout is None
    assert Constraints.from_plan(load_plan(old).constraints).layouts == ("ddp",)
    # ddp alone: a 7B full fine-tuning fits no 24 GB GPU at all
    with pytest.raises(NoFeasibleConfigError, match="No fleet holds the model"):
        rank(full, Constraints(steps=1000, market="on-demand", layouts=("ddp",), allow=("g5", "g6")), catalog=catalog)


def test_lora_is_not_sized_as_full_fine_tuning() -> None:
    full, lora = load_profile(LLAMA), load_profile(LORA)
    f, lo = estimate_memory(full, 1, 24), estimate_memory(lora, 1, 24, "ddp+ac")
    assert f.parts["gradients"] + f.parts["optimizer"] > 80e9  # 12 bytes x 6.74B
    assert lo.parts["gradients"] + lo.parts["optimizer"] < 0.5 * 2**30  # 10 bytes x 40M
    assert lo.fits and not f.fits


def test_layouts_constraint_is_checked(catalog) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'fsdp:full_shard'"):
        Constraints(steps=10, layouts=("fsdp:fullshard",)).validate()
    assert Constraints(steps=10, layouts="ddp, fsdp:full_shard+ac").layouts == ("ddp", "fsdp:full_shard+ac")
    with pytest.raises(ConfigError, match="no layout srifty launch can start"):
        rank(small(), Constraints(steps=10, layouts=("pipeline",)), catalog=catalog)
    # a model that fits: every fleet keeps ddp unless another layout is clearly faster
    plan = rank(small(), Constraints(steps=10, market="on-demand", allow=("g5.xlarge",)), catalog=catalog)
    assert all(e.layout.name == "ddp" for e in plan.entries if e.nodes == 1)
    assert np.isfinite([e.memory_gib for e in plan.entries]).all()


def test_cli_shows_layout_and_memory(capsys) -> None:
    from lightning_srifty.cli import main

    assert main(["predict", "--profile", str(LLAMA), "--fleet", "g5.12xlarge:2", "--layout", "fsdp:full_shard+ac"]) == 0
    out = capsys.readouterr().out
    assert "fsdp:full_shard+ac" in out and "gathered" in out and "fits" in out
    assert main(["recommend", "--profile", str(LLAMA), "--steps", "100", "--layouts", "ddp,fsdp:ful_shard"]) == 2
    assert "Did you mean 'fsdp:full_shard'" in capsys.readouterr().err
    data = copy.deepcopy(json.loads(LLAMA.read_text()))
    assert data["model"]["structure"]["blocks"] == 32


def test_gloo_collectives_block_and_reduce_scatter_as_an_all_reduce(tmp_path) -> None:
    """A CPU lab's type (process_group_backend: gloo): FSDP calls each collective synchronously, so all of it is
    exposed, and gloo's reduce-scatter is an all-reduce (twice a ring reduce-scatter). DDP is unchanged: its reducer
    launches gloo's all-reduce asynchronously, behind the backward."""
    from predictor.catalog import Catalog

    types = "".join(
        f"  - {{name: lab-{b}, gpu: host-cpu, gpus: 1, vcpus: 1, memory_gib: 12, network_gbps: 0.2, "
        f"process_group_backend: {b}}}\n"
        for b in ("nccl", "gloo")
    )
    extra = tmp_path / "lab.yaml"
    extra.write_text(f"gpus:\n  - {{name: host-cpu, memory_gb: 24, fp32_tflops: 0.1}}\ninstance_types:\n{types}")
    catalog = Catalog.load(extra=[extra], use_refreshed=False, use_env=False)
    assert catalog.get("lab-gloo").process_group_backend == "gloo"
    prof = small(hardware={"gpu": "host-cpu", "devices": 1, "nodes": 1})
    nccl, gloo = (
        predict(prof, f"lab-{b}:2", catalog=catalog, layout="fsdp:full_shard", scaling="weak") for b in ("nccl", "gloo")
    )
    # per micro-step: gather (forward) + gather (backward) + reduce-scatter: 3 collectives' worth, 4 under gloo
    assert gloo.breakdown["allreduce_s"] == pytest.approx(nccl.breakdown["allreduce_s"] * 4 / 3)
    assert gloo.breakdown["exposed_comm_s"] == pytest.approx(gloo.breakdown["allreduce_s"])
    assert nccl.breakdown["exposed_comm_s"] < 0.5 * nccl.breakdown["allreduce_s"]  # prefetch hides most of it
    ddp = [predict(prof, f"lab-{b}:2", catalog=catalog, scaling="weak", layout="ddp").iteration_time_s
           for b in ("nccl", "gloo")]  # fmt: skip
    assert ddp[0] == pytest.approx(ddp[1])
    bad = tmp_path / "bad.yaml"
    bad.write_text(types.replace("gloo}", "mpi}").replace("  - ", "instance_types:\n  - ", 1))
    with pytest.raises(
        Exception, match=r"instance_types\[1\] \(\S+\)\.process_group_backend: must be one of nccl, gloo .*'mpi'"
    ):
        Catalog.load(extra=[extra, bad], use_refreshed=False, use_env=False)


def test_the_current_fleet_is_judged_under_the_layout_it_runs(catalog) -> None:
    """A run profiled under FSDP on 8 A10G is compared as FSDP: judged as DDP, a 7B model fits no 24 GB GPU and the
    plan could compute no savings."""
    ran = load_profile({**load_profile(LLAMA).to_dict(), "layout": "fsdp:full_shard+ac"})
    c = Constraints(steps=1000, market="on-demand", current_fleet="g5.48xlarge:1", top=50)
    plan = rank(ran, c, catalog=catalog)
    assert all(e.savings_vs_current is not None for e in plan.entries), plan.notes
    assert not any("no savings computed" in n for n in plan.notes)
    as_ddp = rank(load_profile(LLAMA), c, catalog=catalog)
    assert all(e.savings_vs_current is None for e in as_ddp.entries)
    assert any("cannot hold the model in GPU memory" in n for n in as_ddp.notes), as_ddp.notes


def test_a_sharded_capture_takes_the_width_calibrated_on_sharded_steps(catalog, monkeypatch) -> None:
    """The operator path's width is per regime (issue #21 item 7): FSDP predictions from a capture take the width
    calibrated on whole FSDP steps (the MPT set), not one GPU's width floored by the DDP-calibrated scaling width."""
    from predictor.model import uncertainty

    errors = {"ops-absolute": 0.2, "ops-absolute-sharded": 0.05, "scaling": 0.1}
    monkeypatch.setattr(uncertainty, "model_artefact", lambda: {"errors": errors})
    prof = load_profile(ROOT / "examples" / "profiles" / "llama-1b-meta.json")
    kind = bases(prof, ["p4d.24xlarge"], catalog)[1][0].kind
    assert kind == "ops-absolute" and uncertainty.SHARDED_KINDS[kind] == "ops-absolute-sharded"

    def sd(layout: str, fleet: str) -> float:
        p = predict(prof, fleet, catalog=catalog, layout=layout, scaling="weak")
        lo, hi = p.interval["iteration_time_s"]
        return float(np.log(hi / lo) / (2 * uncertainty.Z80))

    exposed = [0.1 * p.breakdown["exposed_comm_s"] / p.iteration_time_s for p in
               (predict(prof, "p4d.24xlarge:2", catalog=catalog, layout=lay, scaling="weak")
                for lay in ("fsdp:full_shard", "ddp"))]  # fmt: skip
    # FSDP on 16 GPUs: the sharded width (with the exposed communication's term), not max(0.2, 0.1)
    assert sd("fsdp:full_shard", "p4d.24xlarge:2") == pytest.approx(np.hypot(0.05, exposed[0]), rel=1e-6)
    # DDP on 16 GPUs keeps the one-GPU width, floored by the scaling width
    assert sd("ddp", "p4d.24xlarge:2") == pytest.approx(np.hypot(0.2, exposed[1]), rel=1e-6)
    # on a GPU the sharded width was not calibrated on (the MPT set: A100s and H100s), the one-GPU width and the
    # scaling floor: a capture's FSDP on A10Gs was given the narrowest interval of all (a review)
    artefact = {"errors": errors, "errors_gpus": {"ops-absolute-sharded": ["A100-SXM-40GB", "H100-SXM"]}}
    monkeypatch.setattr(uncertainty, "model_artefact", lambda: artefact)
    assert sd("fsdp:full_shard", "p4d.24xlarge:2") == pytest.approx(np.hypot(0.05, exposed[0]), rel=1e-6)
    a10g = predict(prof, "g5.48xlarge:2", catalog=catalog, layout="fsdp:full_shard", scaling="weak")
    staged = uncertainty.model_error("net-host-staged")  # g5's EFA has no GPUDirect RDMA: the host-staged width
    a10g_exposed = staged * a10g.breakdown["exposed_comm_s"] / a10g.iteration_time_s
    assert sd("fsdp:full_shard", "g5.48xlarge:2") == pytest.approx(np.hypot(0.2, a10g_exposed), rel=1e-6)
    # a kind without a sharded calibration keeps its own width and the scaling floor under FSDP too
    errors["ops-absolute"], errors["scaling"] = 0.02, 0.1
    monkeypatch.delitem(uncertainty.SHARDED_KINDS, "ops-absolute")
    assert sd("fsdp:full_shard", "p4d.24xlarge:2") == pytest.approx(np.hypot(0.1, exposed[0]), rel=1e-6)


@pytest.mark.parametrize(
    ("profile_name", "fleet"),
    [
        ("resnet50-v100", "g5.xlarge:4"),  # DDP fits without accumulation: recommend keeps it (FSDP is faster)
        ("resnet50-v100", "g4dn.12xlarge:4"),
        ("resnet50-v100", "g5.12xlarge:2"),
        ("llama-1b-meta", "g5.xlarge:2"),
        ("llama-7b-bf16-captured", "p4d.24xlarge:2"),
        ("llama-7b-bf16-captured", "g5.48xlarge:2"),
    ],
)
def test_srifty_predict_runs_the_layout_recommend_runs(profile_name: str, fleet: str) -> None:
    """`srifty predict` without --layout says "the one srifty recommend runs this fleet with": it is, at the same
    step. Until 2026-11-30 it chose by a rule of its own and said FSDP (258 ms) for ResNet-50 on 4 g5.xlarge, which
    recommend runs with DDP (517 ms)."""
    from predictor.catalog import Catalog
    from predictor.model.predict import predict_auto

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    profile = load_profile(ROOT / "examples" / "profiles" / f"{profile_name}.json")
    name, count = fleet.split(":")
    plan = rank(profile, Constraints(steps=1000, allow=(name,), max_instances=int(count), top=50), catalog=catalog)
    entry = next(e for e in plan.entries if e.fleet == fleet and e.market == "on-demand")
    auto = predict_auto(profile, fleet, catalog=catalog)
    assert auto.layout == entry.layout.name
    assert auto.iteration_time_s == pytest.approx(entry.iteration_time_s, rel=1e-9)
    assert auto.assumptions[0].startswith(f"layout {entry.layout.name}: the one srifty recommend runs")


@pytest.mark.parametrize("profile_name", ["resnet50-v100", "llama-1b-meta", "llama-7b-bf16-captured"])
def test_predict_takes_the_layout_recommend_runs_by_default_and_at_the_sweeps_choice(profile_name, catalog) -> None:
    """One vocabulary: the library's predict() took plain DDP where srifty predict and the service take the layout
    recommend runs (a review). It takes "auto" too, and auto's shortcut (plain DDP where it fits without accumulation,
    one prediction) chooses what the sweep of every layout chooses, on fleets where DDP fits, needs accumulation or
    does not fit."""
    from predictor.model.fleets import predict_mixes
    from predictor.model.predict import AUTO_LAYOUTS, NONE_FITS

    profile = load_profile(ROOT / "examples" / "profiles" / f"{profile_name}.json")
    fleets = ("g4dn.xlarge:1", "g5.xlarge:2", "g5.12xlarge:1", "g6e.xlarge:4", "p4d.24xlarge:1", "p4d.24xlarge:2")
    chosen = set()
    for fleet in fleets:
        name, count = fleet.split(":")
        many = predict_mixes(profile, [name], np.array([[0]]), np.array([[float(count)]]), catalog=catalog,
                             layouts=AUTO_LAYOUTS)  # fmt: skip
        if not many.splittable[0]:  # more GPUs than samples: no layout trains it, and auto says so as DDP does
            with pytest.raises(PredictionError, match="more than the"):
                predict(profile, fleet, catalog=catalog)
            continue
        default = predict(profile, fleet, catalog=catalog)
        assert default == predict(profile, fleet, catalog=catalog, layout="auto")
        assert default.fits_memory == bool(many.fits_memory[0]), fleet
        if not many.fits_memory[0]:  # none fits: the closest layout's prediction, which says so (the next test)
            assert default.assumptions[0].startswith(NONE_FITS), fleet
            chosen.add((default.layout, False, default.accumulate_grad_batches > 1))
            continue
        swept = many.layout_names[int(many.layout_index[0])]
        assert default.layout == swept, fleet
        assert default.assumptions[0].startswith(f"layout {swept}: the one srifty recommend runs"), fleet
        chosen.add((swept, default.fits_memory, default.accumulate_grad_batches > 1))
    assert len(chosen) > 1 or profile_name == "resnet50-v100", chosen  # the LLMs reach past plain DDP


@pytest.mark.parametrize("fleet", ["g5.xlarge:1", "g5.xlarge:2", "g4dn.12xlarge:1"])
def test_auto_on_a_fleet_no_layout_fits_predicts_the_closest_and_says_so(fleet, catalog) -> None:
    """A fleet no launchable layout fits got plain DDP's prediction, with the advice to shard: a 7B model on two
    g5.xlarge read 669.8 GiB a GPU, "or shard the model and optimizer state", and sharding fits no better (an audit).
    Auto gives the layout that needs the least memory at one sample a micro-step, and says every layout it tried."""
    from predictor.model.predict import AUTO_LAYOUTS, NONE_FITS

    profile = load_profile(ROOT / "examples" / "profiles" / "llama-7b-bf16-captured.json")
    auto = predict(profile, fleet, catalog=catalog)
    assert not auto.fits_memory and auto.assumptions[0].startswith(NONE_FITS)
    it = catalog.get(fleet.split(":")[0])
    ranks = it.gpus * int(fleet.split(":")[1])

    def least(layout: str) -> float:
        return estimate_memory(profile, 1.0, it.gpu_memory_gib, parse(layout), ranks, it.gpus).bytes_per_gpu

    tried = []
    for name in AUTO_LAYOUTS:
        with contextlib.suppress(ConfigError):  # a layout that does not apply to this fleet
            tried.append(predict(profile, fleet, catalog=catalog, layout=name).layout)
    assert auto.layout == min(tried, key=least) and auto.layout != "ddp"
    assert f"({', '.join(tried)} tried)" in auto.assumptions[0]
    assert f"needs {least(auto.layout) / 2**30:.1f} GiB a GPU on {it.name}" in auto.assumptions[0]
    micro = auto.groups[0].micro_batch
    assert (
        f"Its time and memory here are at {micro} samples a micro-step, which no GPU of it holds"
        in (auto.assumptions[0])
    )
    assert auto.iteration_time_s == predict(profile, fleet, catalog=catalog, layout=auto.layout).iteration_time_s


def test_auto_where_memory_is_not_what_keeps_a_fleet_out_stays_with_ddp(catalog) -> None:
    """A weak-scaling mix split past the profiled batch, which is the largest known to fit (the profile has no
    activation memory): every layout fits at one sample a micro-step, so none is "closest", and the note would have
    said a GPU with more memory holds 0.8 GiB (an audit)."""
    from predictor.model.predict import NONE_FITS

    profile = load_profile(ROOT / "examples" / "profiles" / "resnet50-v100.json")
    auto = predict(profile, "g4dn.xlarge:1,p3.2xlarge:1", catalog=catalog, scaling="weak")
    assert not auto.fits_memory and auto.layout == "ddp"
    assert not any(a.startswith(NONE_FITS) for a in auto.assumptions)


def test_srifty_predict_on_a_fleet_nothing_fits_advises_no_layout_it_tried(capsys) -> None:
    """The CLI's "won't fit" row offers the layouts that hold less; under auto every one was tried: only more
    memory or more GPUs are left."""
    from lightning_srifty.cli import main

    profile = ROOT / "examples" / "profiles" / "llama-7b-bf16-captured.json"
    assert main(["predict", "--profile", str(profile), "--fleet", "g5.xlarge:2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fsdp:full_shard+ac" in out and "no layout srifty launch can start fits" in out
    assert "shard the model" not in out and "--layout" not in out.split("won't fit", 1)[1].split("assumes", 1)[0]
    assert main(["predict", "--profile", str(profile), "--fleet", "g5.xlarge:2", "--layout", "ddp"]) == 0
    assert "shard the model and optimizer state" in " ".join(capsys.readouterr().out.split())


def test_a_captured_llms_bottleneck_is_its_gemms_not_the_captures_optimizer(catalog) -> None:
    """A new user's trial: every LLM fleet's bottleneck read "memory bandwidth": the GEMMs' share was taken over the
    capture's batch-1 step, half of it the unsharded Adam step, which runs once per optimizer step and is divided
    over the shard group. The share is the forward and backward work's."""
    prof = load_profile(ROOT / "examples" / "profiles" / "llama-7b-bf16-captured.json")
    assert predict(prof, "p4d.24xlarge:1", catalog=catalog, layout="fsdp:full_shard").bottleneck == "compute"


def test_predict_and_recommend_say_the_same_least_memory_of_a_fleet_ddp_cannot_hold(catalog) -> None:
    """A trial read 263 GiB from srifty predict (8 samples a micro-step) and "129 GiB even at 1 sample per
    micro-step" from srifty recommend (one GPU's, without DDP's bucket copy): predict says both, recommend the
    fleet's."""
    import re

    from lightning_srifty.cli.predict import _wont_fit

    prof = load_profile(ROOT / "examples" / "profiles" / "llama-7b-bf16-captured.json")
    result = predict(prof, "p4d.24xlarge:1", catalog=catalog, layout="ddp")
    (group,) = result.groups
    words = _wont_fit(prof, result, group, catalog)
    least = float(re.search(r"micro-step, ([\d.]+) even at 1", words).group(1))
    assert group.micro_batch == 8 and least < group.memory_gib
    plan = rank(prof, Constraints(steps=100, allow=("p4d.24xlarge",), market="on-demand"), catalog=catalog)
    said = re.search(r"ddp would need ([\d.]+) GiB/GPU even at 1 sample", plan.why)
    assert said is not None and float(said.group(1)) == least
