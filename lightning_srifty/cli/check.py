"""``srifty check --dir ROOT``: the pre-flight of a root module written by ``srifty terraform`` (torch-free)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_check(args: argparse.Namespace) -> int:
    from lightning_srifty.cli._common import load_catalog
    from lightning_srifty.provision.preflight import preflight_root

    report = preflight_root(args.dir, load_catalog(args))
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.text())
    return 0 if report.ok else 1


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "check",
        parents=[common],
        help="pre-flight of a root module before any money is spent: script and imports, vCPU quotas, offerings in "
        "the zone, bucket, credentials (exit 1 when something must be fixed)",
    )
    p.add_argument("--dir", required=True, help="the folder srifty terraform wrote")
    p.add_argument("--json", action="store_true", help="the report as JSON (srifty.preflight/v1)")
    p.set_defaults(func=cmd_check)
