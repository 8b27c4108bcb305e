"""The constraints, declared once (issue #24 item 2): ``Constraints``' fields carry their ``Spec``; the service's
request model, ``srifty recommend``'s flags, the checks and the plan's record are read from it, and these tests keep
each of them from drifting (a constraint added to the library appears everywhere, or a test here names where not)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from predictor.documents.plan import PlanConstraints
from predictor.documents.work import Work
from predictor.exceptions import ConfigError
from predictor.ranking.constraints import LAYOUTS, SPECS, Constraints, Spec, constraint_defaults
from predictor.ranking.words import PYTHON, doc

KINDS = {"int", "number", "text", "texts", "choice", "bool"}
# the CLI's flags that are not constraints (what they are for is in their help)
NOT_CONSTRAINTS = {"-h", "--help", "--profile", "--catalog", "--catalog-extra", "--spot-trace", "--trace-values",
                   "--launchable", "--format", "--wide", "--out", "--report", "--html"}  # fmt: skip
# PlanConstraints fields that record the request's consequences, not a constraint of its own
DERIVED_IN_PLAN = {"work_samples": "the work, in samples (steps, samples or epochs)", "global_batch": "strong scaling"}


def test_every_constraint_is_declared_with_a_spec() -> None:
    names = [f.name for f in dataclasses.fields(Constraints)]
    assert list(SPECS) == names
    for name, spec in SPECS.items():
        assert isinstance(spec, Spec) and spec.kind in KINDS and spec.doc, name
        if spec.kind == "choice":
            assert spec.choices and constraint_defaults()[name] in spec.choices, name
        if spec.minimum is not None and spec.maximum is not None:
            assert spec.minimum < spec.maximum, name
        if spec.service_max is not None and spec.maximum is not None:
            assert spec.service_max <= spec.maximum, name


def test_the_services_request_model_is_the_declaration() -> None:
    pytest.importorskip("fastapi")
    from predictor.service.app import RankConstraints

    fields = RankConstraints.model_fields
    assert list(fields) == list(SPECS)
    defaults = constraint_defaults()
    limits = {name: p for name, p in RankConstraints.model_json_schema()["properties"].items()}

    def bound(name: str, key: str) -> float | None:
        prop = limits[name]
        options = prop.get("anyOf", [prop])
        return next((o[key] for o in options if key in o), None)

    for name, spec in SPECS.items():
        info = fields[name]
        default = info.get_default(call_default_factory=True)
        assert default == (list(defaults[name]) if isinstance(defaults[name], tuple) else defaults[name]), name
        assert info.description == doc(name, PYTHON), name  # a doc naming another constraint names it as a field
        if spec.kind in ("int", "number"):  # the bounds as the published schema says them (JSON Schema's words)
            if spec.minimum is not None:
                assert bound(name, "exclusiveMinimum" if spec.exclusive else "minimum") == spec.minimum, name
            high = min(b for b in (spec.maximum, spec.service_max, math.inf) if b is not None)
            assert (bound(name, "maximum") or math.inf) == high, name
            assert not {"ge", "gt", "le", "lt"} & {k for o in limits[name].get("anyOf", [limits[name]]) for k in o}
    # the service's limits, as 0.2's hand-written model had them (a Spec edit that loosens one shows here)

    assert [bound(n, "maximum") for n in ("steps", "max_instances", "max_types", "top", "on_demand_base")] == [
        10**12,
        64,
        2,
        200,
        1000,
    ]
    assert [bound(n, "exclusiveMinimum") for n in ("samples", "deadline_h", "budget_usd", "max_hourly_usd")] == [0] * 4
    assert bound("min_memory_headroom", "maximum") == 0.9 and bound("startup_s", "maximum") == 7 * 86400
    assert [bound(n, "maxItems") for n in ("regions", "allow", "deny", "layouts")] == [8, 100, 100, len(LAYOUTS)]
    assert bound("regions", "minItems") == 1 and bound("current_fleet", "maxLength") == 500
    schema = RankConstraints.model_json_schema()
    assert schema["properties"]["objective"]["enum"] == list(SPECS["objective"].choices)
    assert schema["additionalProperties"] is False
    # the service is stricter than the library where it says so, and only there
    RankConstraints(steps=10, max_instances=64)
    with pytest.raises(ValueError):
        RankConstraints(steps=10, max_instances=65)
    Constraints(steps=10, max_instances=65).validate()


def _recommend_parser():
    from lightning_srifty.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["recommend"]


def test_every_constraint_is_a_flag_of_srifty_recommend_and_every_flag_is_accounted_for() -> None:
    from lightning_srifty.cli.recommend import flag_of

    actions = {o: a for a in _recommend_parser()._actions for o in a.option_strings}
    for name, spec in SPECS.items():
        if spec.flag is None:
            continue
        action = actions[flag_of(name)]
        assert action.dest == name, (name, action.dest)
        assert spec.doc.split(";")[0].split(" (")[0] in action.help, name  # the constraint's own words
    constraint_flags = {flag_of(n) for n, s in SPECS.items() if s.flag is not None}
    assert set(actions) - constraint_flags == NOT_CONSTRAINTS


def test_the_cli_builds_the_constraints_the_library_would() -> None:
    """Flags in, Constraints out (the command's own builder): each flag reaches its field, in the library's units."""
    from lightning_srifty.cli.recommend import LAUNCHABLE_POOL, constraints_from_args

    def built(*flags: str):
        return constraints_from_args(_recommend_parser().parse_args(["--profile", "p.json", *flags]))

    assert built("--steps", "1000") == Constraints(steps=1000)  # nothing else given: the library's defaults
    got = built(
        "--steps", "1000", "--deadline", "90m", "--regions", "us-east-1,us-west-2", "--regions", "eu-west-1",
        "--market", "spot:0.75", "--objective", "time", "--scaling", "weak", "--allow", "g5,g6e", "--deny", "p3",
        "--layouts", "ddp,fsdp:full_shard", "--current", "g5.xlarge:1", "--allow-arm64", "--max-types", "2",
        "--min-headroom", "0.2", "--budget", "500", "--max-hourly", "40", "--max-instances", "8",
        "--on-demand-base", "2", "--startup-s", "300", "--dataset-gb", "12", "--top", "5",
    )  # fmt: skip
    assert got == Constraints(
        steps=1000, deadline_h=1.5, regions=("us-east-1", "us-west-2", "eu-west-1"), market="mixed", spot_share=0.75,
        objective="time", scaling="weak", allow=("g5", "g6e"), deny=("p3",), layouts=("ddp", "fsdp:full_shard"),
        current_fleet="g5.xlarge:1", allow_arm64=True, max_types=2, min_memory_headroom=0.2, budget_usd=500.0,
        max_hourly_usd=40.0, max_instances=8, on_demand_base=2, startup_s=300.0, dataset_gb=12.0, top=5,
    )  # fmt: skip
    assert built("--samples", "5e6", "--launchable").top == LAUNCHABLE_POOL  # a larger pool, refined to the account
    epochs = built("--epochs", "3", "--steps-per-epoch", "500")
    assert (epochs.epochs, epochs.steps_per_epoch, epochs.steps) == (3.0, 500, None)
    with pytest.raises(SystemExit):  # a duration without its unit is refused by the parser
        built("--steps", "10", "--deadline", "90")


def _random_constraints(rng: random.Random) -> Constraints:
    market = rng.choice(["on-demand", "spot", "mixed", "any"])
    return Constraints(
        samples=rng.uniform(1e3, 1e8),
        deadline_h=rng.choice([None, rng.uniform(0.5, 500)]),
        budget_usd=rng.choice([None, rng.uniform(1, 1e5)]),
        objective=rng.choice(SPECS["objective"].choices),
        regions=tuple(rng.sample(["us-east-1", "us-west-2", "eu-west-1"], rng.randint(1, 3))),
        market=market,
        **({"spot_share": rng.uniform(0, 1)} if market in ("mixed", "any") else {}),  # a mixed fleet's share only
        **({"on_demand_base": rng.randint(0, 4)} if market in ("mixed", "any") else {}),  # a mixed fleet's base only
        max_instances=rng.randint(1, 64),
        max_types=rng.randint(1, 3),
        max_hourly_usd=rng.choice([None, rng.uniform(1, 500)]),
        allow=tuple(rng.sample(["g5", "p4d", "g6e"], rng.randint(0, 2))),
        deny=tuple(rng.sample(["p3", "g4dn"], rng.randint(0, 1))),
        min_memory_headroom=rng.uniform(0, 0.9),
        current_fleet=rng.choice([None, "g5.xlarge:1"]),
        scaling=rng.choice(["strong", "weak"]),
        allow_arm64=rng.choice([True, False]),
        startup_s=rng.choice([None, rng.uniform(0, 3600)]),
        dataset_gb=rng.choice([0.0, rng.uniform(0, 500)]),
        layouts=tuple(rng.sample(LAYOUTS, rng.randint(0, 3))),
    )


def test_the_plan_records_every_constraint_it_names_and_gives_it_back() -> None:
    plan_fields = {f.name for f in dataclasses.fields(PlanConstraints)}
    recorded = {name: spec.plan for name, spec in SPECS.items() if spec.plan is not None}
    assert set(recorded.values()) <= plan_fields
    assert plan_fields - set(recorded.values()) == set(DERIVED_IN_PLAN)
    not_recorded = {name for name, spec in SPECS.items() if spec.plan is None}
    assert not_recorded == {"steps", "samples", "epochs", "steps_per_epoch", "top"}  # the work is work_samples
    rng = random.Random(24)
    for _ in range(200):
        c = _random_constraints(rng)
        c.validate()
        work = Work(float(c.samples), 64, 1)
        back = Constraints.from_plan(c.to_plan(work, c.current_fleet))
        mixed = c.market in ("mixed", "any")
        for name in recorded:
            if name in ("spot_share", "on_demand_base") and not mixed:
                continue  # recorded for the mixed market only
            want = getattr(c, name) or (LAYOUTS if name == "layouts" else getattr(c, name))
            assert getattr(back, name) == want, (name, getattr(back, name), want)
        assert back.samples == pytest.approx(c.samples)


def test_the_plans_bounds_are_the_constraints_own() -> None:
    """A plan the library wrote, and any it accepts, can be ranked again: each recorded constraint's bounds in the plan
    are the declaration's (a plan with a headroom of 0.95 loaded, then its re-plan refused it: the library's bound is
    0.9)."""
    plan = {f.name: f.metadata for f in dataclasses.fields(PlanConstraints)}
    for name, spec in SPECS.items():
        if not spec.plan or spec.kind not in ("int", "number"):
            continue
        bounds = plan[spec.plan]
        low = bounds.get("exclusive_min") if spec.exclusive else bounds.get("min")
        assert (low, bounds.get("max")) == (spec.minimum, spec.maximum), (name, bounds, spec)


def test_a_mixed_markets_share_and_base_are_refused_where_no_mixed_fleet_is_bought() -> None:
    """``--market spot --on-demand-base 5`` was ranked with the base dropped without a word; the defaults are not
    sent to a service (a library ``Constraints(market="spot")`` through ``ServiceClient`` was refused: its default
    share went out as a given 0.5)."""
    for market in ("spot", "on-demand"):
        for given in ({"spot_share": 0.5}, {"on_demand_base": 1}):
            with pytest.raises(ConfigError) as err:
                Constraints(steps=10, market=market, **given).validate()
            assert err.value.parameter == next(iter(given)) and "buys no mixed fleet" in str(err.value)
        asked = Constraints(steps=10, market=market)
        asked.validate()
        request = asked.to_request()
        assert "spot_share" not in request and "on_demand_base" not in request
        Constraints.build(**request).validate()  # what the service builds from it
    mixed = Constraints(steps=10, market="mixed", spot_share=0.5, on_demand_base=1).to_request()
    assert (mixed["spot_share"], mixed["on_demand_base"]) == (0.5, 1)  # given: sent, though equal to the defaults
    assert constraint_defaults()["on_demand_base"] == 1 and type(constraint_defaults()["on_demand_base"]) is int


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_types", 4), ("min_memory_headroom", 0.95), ("steps", 0), ("deadline_h", 0.0), ("startup_s", -1.0),
     ("objective", "speed"), ("allow_arm64", "yes")],
)  # fmt: skip
def test_the_checks_come_from_the_declaration(name: str, value: object) -> None:
    base = {"steps": 10} if name != "steps" else {}
    with pytest.raises(ConfigError) as err:
        Constraints(**{**base, name: value}).validate()
    assert err.value.parameter == name


def test_the_objective_and_market_names_are_declared_once() -> None:
    """The plan document declares the words (documents/plan.py); the ranking's enums mirror them exactly, and what a
    request may ask is those words less the deprecated objective."""
    from typing import get_args

    from predictor.documents.plan import DEPRECATED_OBJECTIVES, FleetMarket, MarketName, ObjectiveName
    from predictor.ranking.constraints import MARKETS, OBJECTIVES, Market, Objective

    assert {o.value for o in Objective} == set(get_args(ObjectiveName))
    assert SPECS["objective"].choices == OBJECTIVES and not set(OBJECTIVES) & set(DEPRECATED_OBJECTIVES)
    assert tuple(m.value for m in Market) == get_args(MarketName) == MARKETS == SPECS["market"].choices
    assert Market.ANY.markets() == get_args(FleetMarket)


def test_allow_and_deny_name_a_gpu_as_the_catalog_knows_it(catalog) -> None:
    """Issue #37 M6: `--allow A100` was refused although the catalog knows which types carry an A100. A GPU's model
    names every type of it (A100: both A100s; L4 is not L40S), in any case; an unknown name is still refused."""
    from _support import MINIMAL
    from predictor.documents.profile import load_profile
    from predictor.ranking import rank

    profile = load_profile(MINIMAL)
    a100 = rank(profile, Constraints(steps=1000, allow=("A100",), top=50), catalog=catalog)
    assert {catalog.get(g.instance_type).gpu for e in a100.entries for g in e.groups} <= {
        "A100-SXM-40GB",
        "A100-SXM-80GB",
    }
    l4 = rank(profile, Constraints(steps=1000, allow=("l4",), max_instances=1, top=50), catalog=catalog)
    assert {catalog.get(g.instance_type).gpu for e in l4.entries for g in e.groups} == {"L4"}
    no_t4 = rank(profile, Constraints(steps=1000, deny=("T4",), top=50), catalog=catalog)
    assert all(catalog.get(g.instance_type).gpu != "T4" for e in no_t4.entries for g in e.groups)
    with pytest.raises(ConfigError, match="neither an instance type, a family nor a GPU of the catalog"):
        rank(profile, Constraints(steps=1000, allow=("A1000",)), catalog=catalog)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"steps": 10**30}, "'steps' parameter of rank() must be an int >= 1 and <= 1e+12. Got 1000000000000000000000"),
        ({"samples": 1e30}, "'samples' parameter of rank() must be a number > 0 and <= 1e+18. Got 1e+30."),
        ({"epochs": 1e7, "steps_per_epoch": 10}, "'epochs' parameter of rank() must be a number > 0 and <= 1000000."),
        ({"epochs": 1, "steps_per_epoch": 10**13}, "'steps_per_epoch' parameter of rank() must be an int >= 1 and"),
        ({"steps": 100, "steps_per_epoch": 50}, "steps_per_epoch counts epochs in steps, and the work is given as st"),
    ],
)
def test_the_works_bounds_hold_in_the_library_too(given: dict, says: str) -> None:
    """A trial's ``steps: 1e30`` was ranked in Python (5.9e24 h on the cheapest fleet) where the service refused it:
    the work's bounds (no training within 1,000x of them) hold everywhere, said in a reader's numbers."""
    with pytest.raises(ConfigError) as info:
        Constraints(**given).validate()
    assert says in str(info.value)


def test_a_chance_under_the_confidence_asked_never_reads_as_the_confidence_itself() -> None:
    """A trial: a fleet left out for risk at 89.6 % read "meets 12 h at 90%" beside "under the 90% asked"."""
    from predictor.ranking.words import chance_beside

    assert chance_beside(0.896, 0.9) == "89.6%" and chance_beside(0.8999, 0.9) == "89.99%"
    assert chance_beside(0.62, 0.9) == "62%" and chance_beside(0.95, 0.9) == "95%" and chance_beside(0.9, 0.9) == "90%"


def test_a_figure_in_the_rankings_prose_never_reads_in_exponent_form() -> None:
    """A trial read "its predicted 2.04e+03 h"; a review, "$1e+03" for $999.70 (rounded to three digits first)."""
    from predictor.ranking.explain import fmt
    from predictor.ranking.words import three

    said = [three(x) for x in (0.012345, 12.345, 999.4, 999.7, 2040.0, 123_456.0)]
    assert said == ["0.0123", "12.3", "999", "1,000", "2,040", "123,456"]
    assert fmt("time_h", 2040.0) == "2,040 h" and fmt("time_h", 0.5) == "30 min"


def test_validations_are_counted_as_lightning_runs_them_or_said_uncountable() -> None:
    """The count's cases (checked against real Trainers in tests/job/test_callback.py): an interval in batches counted
    over the run (``check_val_every_n_epoch=None``) or within each epoch; one larger than the planned epoch, which
    Lightning refuses; a share of an epoch without any epoch's length."""
    from predictor.documents.profile import ValidationTiming
    from predictor.ranking.validation import validation_count

    work = Work.of_steps(1000, 8)
    planned = Constraints(epochs=2, steps_per_epoch=500)
    assert validation_count(ValidationTiming(every_batches=30), work, planned, PYTHON)[1] == 33  # over the run
    assert validation_count(ValidationTiming(every_batches=30, every_epochs=1), work, planned, PYTHON)[1] == 32
    said = validation_count(ValidationTiming(every_batches=30, every_epochs=2), work, planned, PYTHON)[0]
    assert said == "every 30 training batches of one epoch in 2, counted from its start", said  # a review
    said, runs = validation_count(ValidationTiming(every_batches=600, every_epochs=1), work, planned, PYTHON)
    assert runs is None and "more than the planned epoch's 500: Lightning refuses it" in said
    said, runs = validation_count(ValidationTiming(every_epoch_fraction=0.5), work, Constraints(steps=1000), PYTHON)
    assert (said, runs) == ("every 0.5 of an epoch", None)
    said, runs = validation_count(ValidationTiming(every_epoch_fraction=1.0, every_epochs=1), work, planned, PYTHON)
    assert (said, runs) == ("once an epoch (at the end of the planned epoch's 500 training batches)", 2)  # the default
    said, runs = validation_count(ValidationTiming(every_s=10_800.0), work, planned, PYTHON)
    assert runs is None and said.startswith("every 10,800 s of training")


def test_a_pipeline_is_named_one_way_in_a_ranking_and_a_prediction(catalog) -> None:
    """An audit: ``srifty predict --layout pipeline`` was refused (it took pipeline:<stages> only) and ``srifty
    recommend --layouts pipeline:2`` was refused naming the Python field. A prediction now takes the ranking's
    ``pipeline`` (one stage per node), and a ranking refuses a staged name in its own flag's words, with the fix."""
    from predictor.model.predict import predict

    with pytest.raises(ConfigError) as err:
        Constraints(steps=10, layouts=("pipeline:2+ac",)).validate()
    said = str(err.value)
    assert err.value.parameter == "layouts" and "one stage per node" in said and "'pipeline+ac'" in said, said
    import json
    from pathlib import Path

    from predictor.documents.profile import load_profile

    fleet = "p4d.24xlarge:2"
    examples = Path(__file__).resolve().parents[2] / "examples" / "profiles"
    profile = load_profile(json.loads((examples / "llama-7b-bf16-captured.json").read_text()))
    staged = predict(profile, fleet, catalog=catalog, layout="pipeline:2+ac")
    named = predict(profile, fleet, catalog=catalog, layout="pipeline+ac")
    assert named.iteration_time_s == staged.iteration_time_s and named.layout == staged.layout
