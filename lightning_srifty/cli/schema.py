"""``srifty schema profile|plan [--format json|markdown]``: the JSON Schema or field reference (torch-free)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_schema(args: argparse.Namespace) -> int:
    from predictor.documents.plan import Plan, plan_json_schema
    from predictor.documents.profile import Profile, Stats, profile_json_schema
    from predictor.documents.schema import markdown_reference

    if args.document == "plan":
        if args.format == "markdown":
            print(markdown_reference(Plan), end="")
        else:
            print(json.dumps(plan_json_schema(), indent=2))
    elif args.format == "markdown":
        print(markdown_reference(Profile, shared=(Stats,)), end="")
    else:
        print(json.dumps(profile_json_schema(), indent=2))
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    schema = sub.add_parser("schema", help="print a JSON Schema")
    schema.add_argument("document", choices=["profile", "plan"])
    schema.add_argument(
        "--format",
        choices=["json", "markdown"],
        default="json",
        help="json: the JSON Schema; markdown: the field reference table",
    )
    schema.set_defaults(func=cmd_schema)
