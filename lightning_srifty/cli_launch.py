"""``srifty launch --plan plan.json [--choice N] -- train.py [args]``: run on the plan's fleet, migrate on notices."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_launch(args: argparse.Namespace) -> int:
    from lightning_srifty.launch import launch
    from predictor.exceptions import ConfigError
    from predictor.plan import load_plan

    script = [a for a in args.command if a != "--"]
    if not script:
        raise ConfigError(
            "Give the training script after --, e.g. srifty launch --plan plan.json -- train.py --epochs 3.",
            parameter="command",
        )
    migrations = launch(
        load_plan(args.plan),
        script,
        choice=args.choice,
        workdir=args.workdir,
        max_migrations=args.max_migrations,
        simulate_notice_after=args.simulate_notice_after,
        max_local_processes=args.max_local_processes,
    )
    print(f"{len(migrations)} migration(s); log: {args.workdir}/migrations.jsonl")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "launch", help="run a training script on the plan's fleet (local provisioner), migrate on notices"
    )
    p.add_argument("--plan", required=True, help="srifty.plan/v1 JSON")
    p.add_argument("--choice", type=int, default=0, help="the ranked fleet to start on")
    p.add_argument("--workdir", default="srifty/launch", help="checkpoints and the migration log go here")
    p.add_argument("--max-migrations", type=int, default=3)
    p.add_argument("--max-local-processes", type=int, default=8)
    p.add_argument(
        "--simulate-notice-after", type=float, metavar="S", help="serve a local metadata service; spot notice after S s"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [args]: what torchrun starts per GPU")
    p.set_defaults(func=cmd_launch)
