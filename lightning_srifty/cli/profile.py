"""``srifty profile show PROFILE.json``: validate a profile and print its summary (torch-free)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def cmd_show(args: argparse.Namespace) -> int:
    from predictor.documents.profile import load_profile

    profile = load_profile(args.profile)
    if args.format == "json":
        print(json.dumps(profile.to_dict(), indent=2))
    else:
        from lightning_srifty.console import print_profile

        print_profile(profile)
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    profile = sub.add_parser("profile", help="work with profile files")
    psub = profile.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    show = psub.add_parser("show", help="validate a profile and print its summary")
    show.add_argument("profile", help="path to a srifty.profile/v1 JSON file")
    show.add_argument("--format", choices=["table", "json"], default="table")
    show.set_defaults(func=cmd_show)
