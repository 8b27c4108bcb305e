"""``srifty rehearse --dir ROOT``: the fleet of a root module played on this machine against a local AWS, to the first
steps, a spot notice and the resume, before any money is spent (torch-free here; the nodes import what the job does)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def cmd_rehearse(args: argparse.Namespace) -> int:
    from lightning_srifty.cli._common import load_catalog
    from lightning_srifty.provision.rehearsal.walk import Settings, rehearse
    from predictor.exceptions import LaunchInterrupted

    settings = Settings(
        nodes=args.nodes,
        notice_after_s=args.notice_after_s,
        stagger_s=args.stagger_s,
        timeout_s=args.timeout_s,
        work=Path(args.work) if args.work else None,
        data_samples=tuple(args.data_sample or ()),
        lose_node=args.lose_node,
        hang_node=args.hang_node,
        finish=args.finish,
    )
    work = settings.work or Path(args.dir).resolve() / ".srifty-rehearsal"
    try:
        report = rehearse(args.dir, settings, echo=print, catalog=load_catalog(args))
    except LaunchInterrupted as exc:
        print(
            f"srifty rehearse: stopped by {exc.signal_name}; the local AWS, the nodes and their jobs were torn down "
            f"(what was seen is in {work / 'rehearsal.json'})",
            file=sys.stderr,
        )
        return exc.exit_code
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.text())
    if not args.json:
        print(f"the nodes' logs and rehearsal.json are in {work}")
    return 0 if report.ok else 1


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "rehearse",
        parents=[common],
        help="play the fleet of a root module on this machine against a local AWS (moto, the instance role's policy "
        "enforced): each node's user_data byte-for-byte, to the first steps, a spot notice and the resume on the "
        "replacements (exit 1 when a check fails)",
    )
    p.add_argument("--dir", required=True, help="the folder srifty terraform wrote")
    p.add_argument(
        "--nodes",
        type=int,
        help="rehearse with this many nodes instead of the fleet's count (a fleet of one instance type)",
    )
    p.add_argument(
        "--notice-after-s",
        type=float,
        default=10.0,
        help="seconds of training, after each leg's first step, before the spot notice (default 10)",
    )
    p.add_argument(
        "--stagger-s",
        type=float,
        default=20.0,
        help="seconds between the nodes' boots: nodes never come up together (default 20)",
    )
    p.add_argument(
        "--timeout-s", type=float, default=1800.0, help="the whole rehearsal's limit, in seconds (default 1800)"
    )
    p.add_argument(
        "--data-sample",
        action="append",
        metavar="NAME=DIR",
        help="local files the rehearsal puts in the fleet's data folder NAME (srifty terraform --data, --data-copy) "
        "for the script to read (repeatable; default: a placeholder file)",
    )
    _leg_options(p)
    p.add_argument("--work", help="the rehearsal's folder: the nodes' files and logs (default DIR/.srifty-rehearsal)")
    p.add_argument("--json", action="store_true", help="the report as JSON (srifty.rehearsal/v1)")
    p.set_defaults(func=cmd_rehearse)


def _leg_options(p: argparse.ArgumentParser) -> None:
    """The legs played after the first notice's replacements resume."""
    p.add_argument(
        "--lose-node",
        action="store_true",
        help="a third leg: the replacements' c10d host is lost without a notice (every process killed, the instance "
        "terminated), the other nodes leave and the group's new replacements resume from the newest periodic "
        "checkpoint (the fleet's checkpoint interval set to 5 s in the rehearsal's copy; multi-node Auto Scaling "
        "group fleets)",
    )
    p.add_argument(
        "--hang-node",
        action="store_true",
        help="one more leg: the job's ranks on one node are frozen, the node running (a GPU that stops answering); "
        "the boot script's hang watch (its limit set to 30 s in the nodes' environment) must find it, kill the job "
        "and let the group's replacements resume from the newest periodic checkpoint (after --lose-node's leg, "
        "with both; Auto Scaling group fleets whose hang watch is on)",
    )
    p.add_argument(
        "--finish",
        action="store_true",
        help="a last leg, after the last notice: the group's replacements train to the job's end (its train command "
        "must end within --timeout-s: give it a small step count), which must end the fleet: every node exits 0 with "
        "every rank's exit mark, the fleet's life ends, every node leaves its Auto Scaling group and nothing replaces "
        "them (Auto Scaling group fleets)",
    )
