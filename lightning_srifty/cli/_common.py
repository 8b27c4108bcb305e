"""What the commands share: argument types, the catalog the global flags select, the console (torch-free)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from predictor.catalog.catalog import Catalog

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def hours(text: str) -> float:
    """'12h', '90m', '2d', '3600s' or a number of hours."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration like 12h, 90m or 2d, got {text!r}")
    return float(match.group(1)) * {"": 1, "h": 1, "m": 1 / 60, "s": 1 / 3600, "d": 24}[match.group(2)]


def load_catalog(args: argparse.Namespace) -> Catalog:
    """The catalog named by ``--catalog`` with every ``--catalog-extra`` (before or after the command) merged."""
    extra = [*(getattr(args, "global_catalog_extra", None) or ()), *(getattr(args, "catalog_extra", None) or ())]
    return Catalog.load(getattr(args, "catalog", None), extra=extra)


def console() -> Any:
    from lightning_srifty.console import console as make

    return make()
