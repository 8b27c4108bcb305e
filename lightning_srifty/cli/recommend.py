"""``srifty recommend --profile P.json --steps 100000 [--deadline 12h] [--budget 500]``: torch-free."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lightning_srifty.cli._common import console, hours, load_catalog, number, whole
from predictor.exceptions import SriftyError
from predictor.model.fleets import SCALINGS
from predictor.ranking.constraints import LAYOUTS, OBJECTIVES, constraint_defaults

DEFAULTS = constraint_defaults()
# rank()'s constraint -> this command's flag where the names differ (the others: the same name with dashes);
# tests/test_cli.py checks that every constraint has a flag here
FLAG_OF = {
    "deadline_h": "--deadline",
    "budget_usd": "--budget",
    "current_fleet": "--current",
    "max_hourly_usd": "--max-hourly",
    "min_memory_headroom": "--min-headroom",
}
UNIT_OF = {"deadline_h": "h"}


def flag_of(name: str) -> str:
    return FLAG_OF.get(name, "--" + name.replace("_", "-"))


def in_flags(message: str) -> str:
    """An error of the ranking in this command's words: ``deadline_h=60`` reads ``--deadline 60h``, ``market='any'``
    ``--market any``, ``max_instances`` ``--max-instances``. Names without an underscore are translated only in
    ``name=value`` form, so that prose ("optimizer steps") stays prose."""
    import dataclasses
    import re

    from predictor.ranking import Constraints

    for f in dataclasses.fields(Constraints):
        flag, unit = flag_of(f.name), UNIT_OF.get(f.name, "")

        def value(m: re.Match[str], flag: str = flag, unit: str = unit) -> str:
            v = m.group(1) if m.group(1) is not None else m.group(2)
            return flag if v == "True" else f"{flag} {v}{unit}"

        message = re.sub(rf"(?<![-\w]){f.name}=(?:'([^']*)'|([^\s,;)]+))", value, message)
        if "_" in f.name:
            message = re.sub(rf"(?<![-\w.]){f.name}\b", flag, message)
    return message.replace("rank()", "srifty recommend")


def _spot_stats(args: argparse.Namespace) -> Any:
    """Spot capacity from ``--spot-trace`` files (skypilot-org/spot-traces format), or None."""
    if not args.spot_trace:
        return None
    from predictor.model import deadline as dl

    read = [dl.read_trace(p, values=args.trace_values) for p in args.spot_trace]
    for _, notes in read:
        for note in notes:
            print(f"note: {note}")
    names = ", ".join(t.names[0] for t, _ in read)
    return dl.SpotStats.of([t for t, _ in read], source=names)


def cmd_recommend(args: argparse.Namespace) -> int:
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints
    from predictor.recommend import recommend

    profile = load_profile(args.profile)
    try:
        return _recommend(args, profile, Constraints, recommend)
    except SriftyError as exc:
        exc.args = (in_flags(str(exc)),)
        raise


def _recommend(args: argparse.Namespace, profile: Any, Constraints: Any, recommend: Any) -> int:
    constraints = Constraints.build(
        steps=args.steps,
        samples=args.samples,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        deadline_h=args.deadline,
        budget_usd=args.budget,
        objective=args.objective,
        regions=args.regions,
        market=args.market,
        spot_share=args.spot_share,
        on_demand_base=args.on_demand_base,
        max_instances=args.max_instances,
        max_types=args.max_types,
        current_fleet=args.current,
        max_hourly_usd=args.max_hourly,
        allow=_names(args.allow),
        deny=_names(args.deny),
        min_memory_headroom=args.min_headroom,
        top=max(args.top or DEFAULTS["top"], LAUNCHABLE_POOL) if args.launchable else args.top,
        scaling=args.scaling,
        allow_arm64=args.allow_arm64 or None,
        startup_s=args.startup_s,
        dataset_gb=args.dataset_gb,
        layouts=args.layouts,
    )
    catalog = load_catalog(args)
    refine = _launchable(catalog, args.top or DEFAULTS["top"]) if args.launchable else None
    result = recommend(
        profile,
        constraints,
        catalog=catalog,
        plan_path=args.out or None,
        report_path=args.report or None,
        refine=refine,
        spot_stats=_spot_stats(args),
    )
    plan = result.plan
    if "plan" in result.written:
        print(f"plan written to {result.written['plan']}")
    if "report" in result.written:
        print(f"report written to {result.written['report']} (plot: {result.written['plot']})")
    if args.format == "json":
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    from lightning_srifty.console import plan_table

    console().print(plan_table(plan, profile.model.name, wide=args.wide))
    if args.launchable and plan.notes:
        print(plan.notes[-1])  # what was left out and what a quota increase would buy
    return 0


LAUNCHABLE_POOL = 40  # fleets ranked before --launchable keeps those the account can start


def _launchable(catalog: Any, top: int) -> Any:
    """The plan refined to what this account can start now (quotas after what runs, offerings), per region."""

    def refine(plan: Any) -> Any:
        from lightning_srifty.provision.preflight import account_limits, clients, launchable_plan

        vcpus = lambda t: catalog.get(t).vcpus  # noqa: E731
        regions = sorted({e.region for e in [*plan.entries, *plan.pareto]})
        types = sorted({g.instance_type for e in [*plan.entries, *plan.pareto] for g in e.groups})
        limits = {r: account_limits(r, types, vcpus, clients(r)) for r in regions}
        return launchable_plan(plan, limits, vcpus, top)

    return refine


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("recommend", parents=[common], help="rank fleets under deadline and budget")
    p.add_argument("--profile", required=True, help="srifty.profile/v1 JSON")
    work = p.add_mutually_exclusive_group(required=True)
    work.add_argument(
        "--steps", type=whole, help="optimizer steps of the profiled global batch (Lightning's max_steps)"
    )
    work.add_argument("--samples", type=number, help="training samples")
    work.add_argument("--epochs", type=number, help="epochs (with --steps-per-epoch)")
    p.add_argument("--steps-per-epoch", type=whole, help="optimizer steps in one epoch")
    p.add_argument("--deadline", type=hours, help="e.g. 12h, 90m, 2d")
    p.add_argument(
        "--spot-trace",
        action="append",
        metavar="TRACE.json",
        help="spot capacity as a skypilot-org/spot-traces file recorded it (repeatable: zones): its interruption rate "
        "and wait for capacity replace the catalog's in the spot prices and the deadline fallback",
    )
    p.add_argument(
        "--trace-values",
        choices=("available", "preempted"),
        default=None,
        help="what --spot-trace's numbers are: instances available (default) or preempted flags",
    )
    p.add_argument("--budget", type=number, help="US dollars")
    p.add_argument("--objective", choices=OBJECTIVES, help=f"what to minimise (default {DEFAULTS['objective']})")
    p.add_argument(
        "--market",
        help="on-demand, spot, mixed, any (all three; the default), or spot:SHARE (mixed with that spot share, "
        "e.g. spot:0.75)",
    )
    p.add_argument(
        "--spot-share", type=number, help=f"mixed market: share on spot above the base ({DEFAULTS['spot_share']})"
    )
    p.add_argument("--on-demand-base", type=whole, help="mixed market: on-demand instances first (default 1)")
    p.add_argument("--max-types", type=whole, help="instance types per fleet: 2 or 3 allows mixes (default 1)")
    p.add_argument("--current", help="the fleet you run on now (instance_type:count), for savings")
    p.add_argument("--regions", help="comma-separated (default us-east-1)")
    p.add_argument("--max-instances", type=whole, help=f"default {DEFAULTS['max_instances']}")
    p.add_argument("--max-hourly", type=number, help="US dollars per hour for the whole fleet")
    p.add_argument(
        "--allow", action="append", help="instance types or families, comma-separated (repeatable), e.g. g5,g6e"
    )
    p.add_argument("--deny", action="append", help="instance types or families, comma-separated (repeatable)")
    p.add_argument("--min-headroom", type=number, help="GPU memory to keep free, as a share (0.1 = 10%%)")
    p.add_argument("--top", type=whole, help=f"fleets listed (default {DEFAULTS['top']})")
    p.add_argument(
        "--launchable",
        action="store_true",
        help="only fleets this AWS account can start now (its EC2 vCPU quotas after what runs, the types its "
        "regions offer); the plan notes what a quota increase would buy",
    )
    p.add_argument(
        "--scaling",
        choices=SCALINGS,
        help="strong (the default): every fleet trains the profiled global batch, with gradient accumulation where "
        "needed; weak: keep the per-GPU batch, so the global batch (and the training) changes with the fleet",
    )
    p.add_argument(
        "--allow-arm64",
        action="store_true",
        help="rank arm64 (Graviton, e.g. g5g) types too: the training image must be built for arm64",
    )
    p.add_argument(
        "--startup-s",
        type=number,
        help="a new fleet's whole start-up in seconds (default: per instance type, measured by srifty launch where "
        "it has launched the type; provisioning, boot, setup and warm-up otherwise)",
    )
    p.add_argument("--dataset-gb", type=number, help="data staged onto every new instance before training (GB)")
    p.add_argument(
        "--layouts",
        help="parallel layouts each fleet may use, comma-separated (default all: " + ", ".join(LAYOUTS) + "; "
        "pipeline: one stage per node, evaluated and shown, never chosen)",
    )
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--wide", action="store_true", help="every column (GPUs, region, cost interval, effort, memory)")
    p.add_argument("--out", help="write the plan (srifty.plan/v1) here")
    p.add_argument("--report", help="write a self-contained HTML report here (and the plot as PNG beside it)")
    p.set_defaults(func=cmd_recommend)


def _names(values: list[str] | None) -> list[str] | None:
    """``--allow g5,g6 --allow p4d`` -> ["g5", "g6", "p4d"] (commas as --regions and --layouts take them)."""
    if values is None:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]
