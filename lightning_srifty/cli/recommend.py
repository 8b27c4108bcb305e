"""``srifty recommend --profile P.json --steps 100000 [--deadline 12h] [--budget 500]``: torch-free."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lightning_srifty.cli._common import console, hours, load_catalog, number, whole
from predictor.ranking.constraints import SPECS, constraint_defaults
from predictor.ranking.words import FLAGS, doc

DEFAULTS = constraint_defaults()
# what a flag's help adds to the constraint's own words (predictor.ranking.constraints.SPECS declares the flags)
CLI_HINTS = {
    "steps": (
        "Lightning's max_steps (strong scaling; under --scaling weak give --samples or --epochs); a module that steps "
        "k optimizers a batch by itself counts k a batch in max_steps: give max_steps / k (the plan's note says k)"
    ),
    "deadline_h": "on the command line a duration with its unit, e.g. 12h, 90m, 2d (a bare number is refused)",
    "current_fleet": "instance_type:count, e.g. g5.12xlarge:2",
    "allow": "e.g. g5,g6e",
    "min_memory_headroom": "0.1 = 10%",
    "startup_s": "the per-type figure is srifty launch's measurement where it has launched the type",
    "layouts": "pipeline: one stage per node, evaluated and shown, never chosen",
    "allow_arm64": "the training image must be built for arm64",
    "move_if_late": "add SpotPreemption() and MigrationTriggers() to the Trainer's callbacks (docs/migration.md)",
}
WORK = ("steps", "samples", "epochs")  # one of them, required


def flag_of(name: str) -> str:
    """The flag of constraint ``name`` (its :class:`~predictor.ranking.constraints.Spec`)."""
    flag = SPECS[name].flag
    return flag or "--" + name.replace("_", "-")


def _spot_stats(args: argparse.Namespace) -> Any:
    """Spot capacity from ``--spot-trace`` files (skypilot-org/spot-traces format), or None."""
    if not args.spot_trace:
        return None
    from predictor.runs import odds, traces

    read = [traces.read_trace(p, values=args.trace_values) for p in args.spot_trace]
    for _, notes in read:
        for note in notes:
            print(f"note: {note}")
    names = ", ".join(t.names[0] for t, _ in read)
    return odds.SpotStats.of([t for t, _ in read], source=names)


def cmd_recommend(args: argparse.Namespace) -> int:
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints
    from predictor.recommend import recommend

    profile = load_profile(args.profile)
    return _recommend(args, profile, Constraints, recommend)


def constraints_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~predictor.ranking.Constraints` the flags ask for: each constraint's flag to its field (a flag not
    given is the library's default), texts split at commas, ``--launchable`` ranking a larger pool first."""
    from predictor.ranking import Constraints

    given = {name: getattr(args, name) for name in SPECS if SPECS[name].flag is not None}
    for name, spec in SPECS.items():
        if spec.kind == "texts" and given.get(name) is not None:
            given[name] = _names(given[name])
        if spec.kind == "bool":
            given[name] = given[name] or None  # an absent switch is the default, not False
    if getattr(args, "launchable", False):
        given["top"] = max(args.top or DEFAULTS["top"], LAUNCHABLE_POOL)
    return Constraints.build(**given)


def _recommend(args: argparse.Namespace, profile: Any, Constraints: Any, recommend: Any) -> int:
    from predictor.documents.atomic import check_distinct_outputs

    check_distinct_outputs(
        {
            "--out": args.out or None,
            "--report": args.report or None,
            "--report's plot (--report with .png)": Path(args.report).with_suffix(".png") if args.report else None,
        },
        inputs={"--profile": args.profile},
    )
    _check_epoch_steps(args, profile)
    constraints = constraints_from_args(args)
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
        words=FLAGS,  # the plan's prose and the ranking's errors name this command's flags
    )
    plan = result.plan
    said = sys.stderr if args.format == "json" else sys.stdout  # stdout is the JSON alone: a pipe reads it (a trial)
    if "plan" in result.written:
        print(f"plan written to {result.written['plan']}", file=said)
    if "report" in result.written:
        print(f"report written to {result.written['report']} (plot: {result.written['plot']})", file=said)
    if args.format == "json":
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    from lightning_srifty.console import plan_table

    console(260 if args.wide else 170).print(plan_table(plan, profile.model.name, wide=args.wide))
    from predictor.catalog.instances import SPOT_OUTLIER_HINT, SPOT_UNLISTED_HINT
    from predictor.ranking.core import BUDGET_NOTE, DEADLINE_ONLY_NOTE, LATE_MOVE_NOTE, RISK_NOTE, TRANSPORT_NOTE
    from predictor.ranking.explain import manual_loop_note, no_table_note, unmeasured_note
    from predictor.ranking.validation import VALIDATION_NOTE

    caveat = unmeasured_note(profile) or no_table_note(profile)
    # the notes the table's reader must see (an audit: a --confidence without --deadline was taken without a word)
    tagged = (SPOT_OUTLIER_HINT, SPOT_UNLISTED_HINT, DEADLINE_ONLY_NOTE)
    shown = [
        n
        for n in plan.notes or ()
        if any(t in n for t in tagged)
        or n.startswith((RISK_NOTE, LATE_MOVE_NOTE, VALIDATION_NOTE, TRANSPORT_NOTE, BUDGET_NOTE))
    ]
    for note in [caveat, manual_loop_note(profile), *shown]:
        if note:
            print(f"note: {note}")
    if args.launchable and plan.notes:
        print(plan.notes[-1])  # what was left out and what a quota increase would buy
    return 0


def _check_epoch_steps(args: argparse.Namespace, profile: Any) -> None:
    """``--epochs`` without ``--steps-per-epoch``, refused as everywhere, with the profiled run's count where the
    profile has it (a trial worked out 64 from the callback's own figures).

    Raises:
        ConfigError: ``--epochs`` without ``--steps-per-epoch``.
    """
    if getattr(args, "epochs", None) is None or getattr(args, "steps_per_epoch", None) is not None:
        return
    import math

    from predictor.exceptions import ConfigError

    v, accumulate = profile.validation, profile.batch.accumulate_grad_batches or 1
    known = ""
    if v is not None and v.epoch_batches:
        steps = math.ceil(v.epoch_batches / accumulate)
        known = (
            f"; the profiled run's epoch was {steps} ({v.epoch_batches} batches a rank"
            + (f", {accumulate} accumulated a step" if accumulate > 1 else "")
            + f"): --steps-per-epoch {steps} trains its epochs"
        )
    raise ConfigError(
        f"--epochs {args.epochs:g} needs --steps-per-epoch, the optimizer steps in one epoch{known}.",
        parameter="steps_per_epoch",
        value=None,
    )


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
    for name, spec in SPECS.items():
        if spec.flag is not None:
            (work if name in WORK else p).add_argument(flag_of(name), dest=name, **_flag_options(name, spec))
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
    p.add_argument(
        "--launchable",
        action="store_true",
        help="only fleets this AWS account can start now (its EC2 vCPU quotas after what runs, the types its "
        "regions offer); the plan notes what a quota increase would buy",
    )
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument(
        "--wide",
        action="store_true",
        help="every column (GPUs, region, cost interval, prediction risk, effort, memory)",
    )
    p.add_argument("--out", help="write the plan (srifty.plan/v1) here")
    p.add_argument(
        "--report",
        "--html",
        dest="report",
        help="write a self-contained HTML report here (and the plot as PNG beside it)",
    )
    p.set_defaults(func=cmd_recommend)


def _flag_options(name: str, spec: Any) -> dict[str, Any]:
    """argparse's options for a constraint's flag, from its Spec: the type, the help (its words, this command's
    hint, its default)."""
    default = DEFAULTS[name]
    hint = CLI_HINTS.get(name)
    shown = ",".join(default) if isinstance(default, tuple) else default
    words = doc(name, FLAGS) + (f"; {hint}" if hint else "")  # a flag with a unit says it in its hint
    if spec.kind == "texts":
        words += "; comma-separated, repeatable"
    if shown not in (None, "", False, 0.0):
        words += f" (default {shown})"
    options: dict[str, Any] = {"help": words.replace("%", "%%")}
    if spec.kind not in ("bool", "choice"):
        options["metavar"] = flag_of(name).lstrip("-").replace("-", "_").upper()
    if spec.kind == "bool":
        return {**options, "action": "store_true"}
    if spec.kind == "texts":
        return {**options, "action": "append"}
    if spec.kind == "choice" and name != "market":  # the market also takes spot:SHARE
        return {**options, "choices": spec.choices}
    if spec.kind == "int":
        return {**options, "type": whole}
    if spec.kind == "number":
        return {**options, "type": hours if spec.unit == "h" else number}
    return options


def _names(values: list[str] | None) -> list[str] | None:
    """``--allow g5,g6 --allow p4d`` -> ["g5", "g6", "p4d"] (commas as --regions and --layouts take them)."""
    if values is None:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]
