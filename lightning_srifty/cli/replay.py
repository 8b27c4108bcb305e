"""``srifty replay --plan plan.json --trace TRACE.json [--policy NAME] [--format json]``: how the plan's run would
have fared on the spot capacity a trace recorded (skypilot-org/spot-traces format), under each deadline policy and
against the hindsight optimum. Torch-free."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from lightning_srifty.cli._common import hours, load_catalog, nonneg_int

ALL = "all"


def cmd_replay(args: argparse.Namespace) -> int:
    from predictor.documents.atomic import check_distinct_outputs
    from predictor.documents.plan import load_plan
    from predictor.runs import deadline as dl
    from predictor.runs import traces

    inputs = {"--plan": args.plan, **{f"--trace {path}": path for path in args.trace}}
    check_distinct_outputs({"--plot": args.plot}, inputs=inputs)  # before anything is read (issue #36 L1)
    plan = load_plan(args.plan)
    run = dl.job_from_plan(
        plan, args.choice, deadline_h=args.deadline_h, catalog=load_catalog(args), step_quantile=args.step_quantile
    )
    read = [traces.read_trace(path, nodes=run.spot_nodes, values=args.trace_values) for path in args.trace]
    trace = traces.combine_traces([t for t, _ in read])
    notes = [n for _, ns in read for n in ns] + list(run.notes)
    trace = _window(args, trace)
    notes += _tick_notes(run.job, trace)
    names = list(dl.POLICIES) if args.policy == ALL else [args.policy]
    outcomes = [dl.replay(run.job, trace, dl.policy(n), record=bool(args.plot)) for n in names]
    if args.policy == ALL or args.optimum:
        outcomes.append(dl.optimum(run.job, trace))
    if args.plot:
        _plot(outcomes, run, trace.gap_s / 3600, args.plot)
    doc = _document(args, run, trace, outcomes, notes)
    if args.format == "json":
        print(json.dumps(doc, indent=2, allow_nan=False))
        return 0
    _table(doc)
    return 0


def _tick_notes(job: Any, trace: Any) -> list[str]:
    """What the replay's whole ticks mean for this run: a trace shorter than the deadline, a deadline no run meets,
    and the time whole ticks add to the work and each start (a trial: a 0.32 h entry replayed in 0.50 h)."""
    from predictor.runs import deadline as dl

    notes, ticks = [], dl.Ticks.of(job, trace.gap_s)
    if ticks.deadline > trace.ticks:
        notes.append(
            f"the trace covers {trace.hours:.1f} h after --start-h, less than the {job.deadline_s / 3600:.1f} h "
            "deadline: a run still going when it ends is reported unfinished"
        )
    if not ticks.feasible:
        notes.append(
            "even all on-demand the run cannot meet the deadline: every policy misses it and runs on-demand as soon as "
            "it can; the optimum is the cheapest run finishing as early as any can"
        )
    added = (ticks.work * ticks.tick_s - job.work_s) + (ticks.restart * ticks.tick_s - job.restart_s)
    if added > 0.05 * job.work_s:
        notes.append(
            f"whole ticks of {ticks.tick_s:g} s round the work and each start up: {added / 3600:.2f} h more than the "
            f"plan's for the work and one start ({added / job.work_s:.0%} of the work); a trace with a finer gap "
            "replays this run closer"
        )
    return notes


def _document(args: argparse.Namespace, run: Any, trace: Any, outcomes: list[Any], notes: list[str]) -> dict[str, Any]:
    """The ``srifty.replay/v1`` document: the plan's run, the trace, each policy's outcome and the notes."""
    return {
        "schema": "srifty.replay/v1",
        "plan": str(args.plan),
        "fleet": run.fleet,
        "market": run.market,
        "spot_nodes": run.spot_nodes,
        "trace": [str(p) for p in args.trace],
        "tick_s": trace.gap_s,
        "start_h": args.start_h,
        "spot_available_share": round(trace.availability(), 4),
        "job": {
            "work_h": round(run.job.work_s / 3600, 4),
            "step_quantile": args.step_quantile if args.step_quantile is not None else 0.5,
            "planned_work_h": round((run.job.planned_work_s or run.job.work_s) / 3600, 4),
            "measured_after_s": run.job.measured_after_s,
            "checkpoint_interval_h": (
                None if run.job.checkpoint_interval_s is None else round(run.job.checkpoint_interval_s / 3600, 4)
            ),
            "deadline_h": round(run.job.deadline_s / 3600, 4),
            "restart_s": round(run.job.restart_s, 1),
            "first_start_s": round(run.job.restart_s if run.job.startup_s is None else run.job.startup_s, 1),
            "save_s": round(run.job.save_s, 1),
            # what the hard rule keeps in hand for an on-demand finish of the whole work (its saves and node failures
            # at the plan's confidence; less as the work left shrinks), as srifty launch's guard does
            "on_demand_finish_extra_h": _finish_extra_h(run.job, trace.gap_s),
            "spot_usd_hr": round(run.job.spot_usd_hr, 4),
            "on_demand_usd_hr": round(run.job.od_usd_hr, 4),
            "save_on_notice": run.job.save_on_notice,
        },
        "results": [o.to_dict() for o in outcomes],
        "notes": notes,
    }


def _window(args: argparse.Namespace, trace: Any) -> Any:
    """The trace resampled to ``--tick`` and cut at ``--start-h``, each refused with the fix when it cannot be."""
    from predictor.exceptions import ConfigError

    if not (args.start_h >= 0 and math.isfinite(args.start_h)):  # -5 replayed the trace's last 5 h (issue #36 M6)
        raise ConfigError(
            f"--start-h must be hours >= 0 into the trace. Got {args.start_h}: give where to start, e.g. --start-h 5.",
            parameter="start_h",
            value=args.start_h,
        )
    factor = 1
    if args.tick is not None:  # 0 and a tick that is not a multiple of the trace's gap were ignored (issue #36 M6)
        ratio = args.tick / trace.gap_s if math.isfinite(args.tick) else 0.0
        if not (ratio >= 1 and abs(ratio - round(ratio)) < 1e-9):
            raise ConfigError(
                f"--tick must be a whole multiple of the trace's {trace.gap_s:g} s between samples. Got {args.tick:g}: "
                f"give {trace.gap_s:g}, {2 * trace.gap_s:g}, ... or leave it out (one decision a sample).",
                parameter="tick",
                value=args.tick,
            )
        factor = round(ratio)
    trace = trace.resample(factor)
    start = round(args.start_h * 3600 / trace.gap_s)
    if start >= trace.ticks:
        raise ConfigError(
            f"--start-h {args.start_h} is past the trace's end ({trace.hours:.1f} h).", parameter="start_h",
            value=args.start_h,
        )  # fmt: skip
    return trace.window(start, trace.ticks - start)


def _table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    from lightning_srifty.cli._common import console

    j = doc["job"]
    # hours to a precision the run's length can show: 0.1 h of a 29 h run, 0.001 h (3.6 s) of a 14-minute one (a
    # trial's short job read 0.2, 0.3 and 0.5 h for every policy)
    d = min(3, max(1, 2 - math.floor(math.log10(max(j["work_h"], 1e-3)))))
    table = Table(
        title=(
            f"Replay of {doc['fleet']} ({doc['market']}): {j['work_h']:.{d}f} h of training, deadline "
            f"{j['deadline_h']:.{d}f} h, spot there {doc['spot_available_share']:.0%} of the time"
        ),
        title_justify="left",
    )
    for col in ("policy", "finished (h)", "cost ($)", "deadline", "preemptions", "spot h", "on-demand h", "waiting h"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in doc["results"]:
        h = r["hours"]
        table.add_row(
            r["policy"],
            "-" if r["finished_h"] is None else f"{r['finished_h']:.{d}f}",
            "-" if r["cost_usd"] is None else f"{r['cost_usd']:,.2f}",
            "met" if r["deadline_met"] else "MISSED",
            str(r["preemptions"]) if r["policy"] != "optimum" else "-",
            f"{h['spot']:.{d}f}" if h else "-",
            f"{h['on-demand']:.{d}f}" if h else "-",
            f"{h['waiting']:.{d}f}" if h else "-",
        )
    out = console()
    out.print(table)
    for note in doc["notes"]:
        out.print(f"note: {note}")


def _finish_extra_h(job: Any, tick_s: float) -> float | None:
    """The hours the replay's hard rule keeps in hand for an on-demand finish of the whole work (None: none)."""
    from predictor.runs.deadline import Ticks

    if job.finish is None:
        return None
    return round(job.finish.extra_ticks(Ticks.of(job, tick_s).work, tick_s, True) * tick_s / 3600, 4)


def _plot(outcomes: list[Any], run: Any, tick_h: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(9, 5))
    for o in outcomes:
        if o.progress is None:
            continue
        t = np.arange(1, len(o.progress) + 1) * tick_h
        ax.plot(t, o.progress, label=f"{o.policy}: ${o.cost_usd:,.0f}")
    ax.axvline(run.job.deadline_s / 3600, color="k", ls="--", lw=1, label="deadline")
    ax.set_xlabel("hours since the start")
    ax.set_ylabel("training done (h)")
    ax.legend()
    fig.tight_layout()
    from predictor.documents.atomic import write_png

    try:
        write_png(fig, path)
    finally:
        plt.close(fig)
    print(f"srifty replay: wrote {path}")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from predictor.runs.deadline import POLICIES

    p = sub.add_parser(
        "replay", parents=[common], help="replay a plan's run on a spot availability or preemption trace"
    )
    p.add_argument("--plan", required=True, help="srifty.plan/v1 JSON (srifty recommend --out)")
    p.add_argument(
        "--trace",
        required=True,
        action="append",
        metavar="TRACE.json",
        help="a trace in the skypilot-org/spot-traces format; repeat for zones the run may move between",
    )
    p.add_argument("--policy", choices=(*POLICIES, ALL), default=ALL, help="default: all, with the hindsight optimum")
    p.add_argument("--optimum", action="store_true", help="with one --policy: the hindsight optimum too")
    p.add_argument("--choice", type=nonneg_int, default=None, help="the plan entry (default: the plan's choice)")
    p.add_argument(
        "--deadline",
        type=hours,
        dest="deadline_h",  # job_from_plan()'s parameter: a refusal of it names this flag
        metavar="DEADLINE",
        help="override the plan's deadline, e.g. 36h",
    )
    p.add_argument(
        "--trace-values",
        choices=("available", "preempted"),
        default=None,
        help="what the trace's numbers are: instances available (the spot-traces README, default) or preempted "
        "flags (how the Can't Be Late simulator reads its single-node files)",
    )
    p.add_argument(
        "--step-quantile",
        type=float,
        default=None,
        metavar="Q",
        dest="step_quantile",  # job_from_plan()'s parameter: a refusal of it names this flag
        help="the run's step at this quantile of the prediction, e.g. 0.9 (default: the predicted step, as the "
        "plan's cost assumes); either way the policy plans for the plan's --confidence until it has measured the step "
        "in its first minute of training, as srifty launch does",
    )
    p.add_argument("--start-h", type=float, default=0.0, help="start this many hours into the trace")
    p.add_argument("--tick", type=float, default=None, help="seconds per decision (a multiple of the trace's gap)")
    p.add_argument("--plot", metavar="PNG", help="progress vs time per policy")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_replay)
