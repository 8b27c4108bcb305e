"""What the commands share: argument types, the catalog the global flags select, the console (torch-free)."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from predictor.catalog.catalog import Catalog

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$")


def _ascii(text: str, what: str) -> str:
    """``text`` when it is ASCII: int() and float() read other scripts' digits ('\u0662' is 2), which no one types on
    purpose (issue #23 item 12)."""
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"expected {what} in ASCII digits 0-9, got {text!r}")
    return text


def whole(text: str) -> int:
    """argparse's ``type=int``, ASCII digits only; a whole number in exponent form too (``--steps 1e6``, as
    ``--samples 5e6`` and the service's JSON take it)."""
    raw = _ascii(text, "a whole number")
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value == int(value) and abs(value) <= 2**53:
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")


def number(text: str) -> float:
    """argparse's ``type=float``, ASCII digits only."""
    try:
        return float(_ascii(text, "a number"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_int(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def nonneg_int(text: str) -> int:
    """A whole number >= 0 (a count, an index): -1 was taken and meant nothing."""
    value = whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (seconds, hours, megabytes, dollars): -5, 0, nan and inf were taken silently."""
    value = number(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def nonneg(text: str) -> float:
    """A finite number >= 0 (a lower or upper bound that may be 0)."""
    value = number(text)
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def hours(text: str) -> float:
    """'12h', '90m', '2d' or '3600s', in hours. A bare number is refused: ``--deadline 90`` could mean 90 minutes as
    well as 90 hours."""
    match = _DURATION.match(_ascii(text, "a duration"))
    if match and not match.group(2):
        raise argparse.ArgumentTypeError(
            f"{text!r} has no unit: write {match.group(1)}h (hours), {match.group(1)}m (minutes), "
            f"{match.group(1)}d (days) or {match.group(1)}s (seconds)"
        )
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration like 12h, 90m or 2d, got {text!r}")
    return float(match.group(1)) * {"": 1, "h": 1, "m": 1 / 60, "s": 1 / 3600, "d": 24}[match.group(2)]


def load_catalog(args: argparse.Namespace) -> Catalog:
    """The catalog named by ``--catalog`` with every ``--catalog-extra`` (before or after the command) merged."""
    extra = [*(getattr(args, "global_catalog_extra", None) or ()), *(getattr(args, "catalog_extra", None) or ())]
    return Catalog.load(getattr(args, "catalog", None), extra=extra)


def console(width: int = 170) -> Any:
    """:func:`lightning_srifty.console.console`, imported when a command prints (rich is not needed to start)."""
    from lightning_srifty.console import console as make

    return make(width)


def add_code_arguments(p: Any) -> None:
    """The flags of the code and environment every node runs and the training data it reads (``srifty terraform``
    and ``srifty launch``)."""
    p.add_argument(
        "--code",
        default=".",
        metavar="DIR",
        help="the folder every node runs from (default: this one): packed as a content-addressed snapshot (git's "
        "view of it in a work tree; else .gitignore/.sriftyignore), uploaded beside the checkpoints, checked by "
        "sha256 on every node",
    )
    p.add_argument("--no-code", action="store_true", help="deliver no code (the image or --setup-command has it)")
    p.add_argument(
        "--image",
        help="a container image to run the job in (docker run with the GPUs, EFA and the host's network; the code at "
        "/workspace) instead of a virtual environment of the profiled versions",
    )
    p.add_argument(
        "--requirements", help="requirements file inside --code, installed on the nodes (default: requirements.txt)"
    )
    p.add_argument("--index-url", help="the package index the nodes install from (default: PyPI; a mirror)")
    p.add_argument(
        "--extra-index-url",
        action="append",
        dest="extra_index_urls",  # the option's own name: a refusal of it names this flag
        metavar="EXTRA_INDEX_URL",
        help="another index (repeatable)",
    )
    p.add_argument(
        "--base-python",
        metavar="PATH",
        help="an interpreter of the image whose packages the nodes' environment may reuse (a custom image with "
        "torch: pins it satisfies are not downloaded)",
    )
    p.add_argument("--max-code-mb", type=positive, default=200.0, help="refuse a code snapshot larger than this")
    p.add_argument(
        "--include-secret",
        action="append",
        dest="include_secrets",  # the option's own name: a refusal of it names this flag
        metavar="PATH",
        help="pack this credential file (.env, a key: left out by default) all the same; repeatable",
    )
    p.add_argument(
        "--any-model",
        action="store_true",
        help="write (or launch) the fleet although the plan's model is not one the code's own profiles "
        "(srifty/*.json) measured",
    )
    add_data_arguments(p)


def add_data_arguments(p: Any) -> None:
    """The flags of the training data every node reads from S3, read-only (``srifty terraform``, ``srifty launch``)."""
    p.add_argument(
        "--data",
        action="append",
        metavar="NAME=s3://bucket/prefix/",
        help="training data the job reads from S3 itself (repeatable): the instance role may list and read that "
        "folder, never write it; every node exports NAME as the folder's URI once its boot has listed it",
    )
    p.add_argument(
        "--data-copy",
        action="append",
        metavar="NAME=s3://bucket/prefix/",
        help="training data every node copies to its own disk while its environment installs (repeatable; read-only, "
        "as --data): NAME is the local folder, and the node is ready to train once its copy is whole",
    )
    p.add_argument(
        "--data-kms-key",
        action="append",
        metavar="KEY_ARN",
        help="a customer-managed KMS key a data bucket encrypts with (repeatable): the role may decrypt through S3 "
        "only",
    )


def code_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~lightning_srifty.provision.terraform.generate.Options` fields of :func:`add_code_arguments`."""
    return {
        "code": None if args.no_code else args.code,
        "image": args.image,
        "requirements": args.requirements,
        "index_url": args.index_url,
        "extra_index_urls": tuple(args.extra_index_urls or ()),
        "base_python": args.base_python,
        "max_code_mb": args.max_code_mb,
        "include_secrets": tuple(args.include_secrets or ()),
        "any_model": bool(getattr(args, "any_model", False)),
        "data": tuple(args.data or ()),
        "data_copy": tuple(args.data_copy or ()),
        "data_kms_keys": tuple(args.data_kms_key or ()),
    }
