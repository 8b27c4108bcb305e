"""The ``srifty`` command line: one module per command, each with ``add_parser(sub, common)``.

Importing it loads neither torch nor lightning: each command imports what it uses when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from predictor.exceptions import SriftyError

# the order of `srifty --help`; each module declares its command(s) with add_parser(sub, common)
COMMANDS = (
    "demo",
    "capture",
    "profile",
    "schema",
    "catalog",
    "predict",
    "recommend",
    "terraform",
    "check",
    "launch",
    "replay",
    "operations",
    "serve",
    "eval",
)


def build_parser() -> argparse.ArgumentParser:
    from lightning_srifty import __version__

    parser = argparse.ArgumentParser(prog="srifty", description="Profile Lightning training and pick cloud GPUs.")
    parser.add_argument("--version", action="version", version=f"lightning-srifty {__version__}")
    parser.add_argument(
        "--catalog-extra",
        action="append",
        metavar="YAML",
        dest="global_catalog_extra",
        help="user-defined GPUs and instance types merged over the catalog (repeatable)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)  # the catalog flags, for the commands that read the catalog
    common.add_argument(
        "--catalog-extra",
        action="append",
        metavar="YAML",
        help="user-defined GPUs and instance types merged over the catalog (repeatable; also $SRIFTY_CATALOG_EXTRA)",
    )
    common.add_argument("--catalog", metavar="DIR", help="use this catalog copy instead of the newest one")
    for name in COMMANDS:
        importlib.import_module(f"lightning_srifty.cli.{name}").add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``srifty`` console script; SriftyError becomes a one-line message and exit code 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SriftyError as exc:
        print(f"srifty: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the user named cannot be read or written: say which and why, no traceback
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) not in str(exc.strerror) else ""
        print(f"srifty: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
