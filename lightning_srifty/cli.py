"""The ``srifty`` command line. Importing it loads neither torch nor lightning: each command imports what it uses.

srifty demo [--model cnn|lm] ...         train a demo model with SriftyCallback, print and write the profile
srifty capture pkg.mod:Model --batch ... a profile from the operator table of one step, without a GPU
srifty profile show PROFILE.json         validate a profile and print its summary (or --format json)
srifty schema profile                    print the JSON Schema of srifty.profile/v1
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from predictor.exceptions import SriftyError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _cmd_demo(args: argparse.Namespace) -> int:
    from lightning_srifty.demo.run import DemoConfig, run_demo

    config = DemoConfig(
        model=args.model,
        max_steps=args.max_steps,
        warmup_steps=args.warmup_steps,
        profile_steps=args.profile_steps,
        devices=args.devices,
        num_nodes=args.num_nodes,
        accelerator=args.accelerator,
        strategy=args.strategy,
        precision=args.precision,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        output=None if args.output == "-" else args.output,
        seed=args.seed,
        progress=not args.no_progress,
        size=args.size,
        total_steps=args.total_steps,
    )
    callback, trainer = run_demo(config)
    # only rank 0 builds the profile; a rank 0 without one failed (the reason was logged)
    if not trainer.is_global_zero:
        return 0
    if callback.profile is None:
        return 1
    for line in demo_summary(callback):
        print(line)
    return 0


def demo_summary(callback: Any) -> list[str]:
    """What ``srifty demo`` wrote where, and how far to trust GPU figures that come from a CPU profile."""
    lines = [f"{what} written to {path}" for what, path in callback.written.items()]
    if "report" in callback.written:
        lines[-1] += " (open it in a browser)"
    hw = callback.profile.hardware
    if callback.plan is not None and not hw.gpu and (hw.accelerator or "cpu") == "cpu":
        lines.append(
            "note: this profile ran on the CPU: every GPU figure above (times, costs, the ranking) is extrapolated "
            "from CPU timings through the performance model, and can be off by a wide margin. Profile on one GPU "
            "(srifty demo --accelerator gpu, or SriftyCallback in your own run) for a prediction to act on."
        )
    return lines


def _cmd_profile_show(args: argparse.Namespace) -> int:
    from predictor.profile import load_profile

    profile = load_profile(args.profile)
    if args.format == "json":
        print(json.dumps(profile.to_dict(), indent=2))
    else:
        from lightning_srifty.report import print_profile

        print_profile(profile)
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    from predictor._schema import markdown_reference
    from predictor.plan import Plan, plan_json_schema
    from predictor.profile import Profile, Stats, profile_json_schema

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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--catalog-extra",
        action="append",
        metavar="YAML",
        help="user-defined GPUs and instance types merged over the catalog (repeatable; also $SRIFTY_CATALOG_EXTRA)",
    )
    common.add_argument("--catalog", metavar="DIR", help="use this catalog copy instead of the newest one")

    demo = sub.add_parser(
        "demo",
        help="train a demo model with SriftyCallback and print its profile",
        description="Train a demo model (no downloads) with SriftyCallback, print the profile "
        "summary and write the profile JSON.",
    )
    demo.add_argument(
        "--model",
        choices=["cnn", "lm"],
        default="cnn",
        help="cnn: a CNN on scikit-learn's digits; lm: a small transformer LM on synthetic tokens",
    )
    demo.add_argument("--size", choices=["small", "medium", "large"], default="small", help="model width/depth")
    demo.add_argument(
        "--max-steps", type=_positive_int, default=None, help="training steps (default: warm-up + profile window + 50)"
    )
    demo.add_argument("--warmup-steps", type=_positive_int, default=20)
    demo.add_argument("--profile-steps", type=_positive_int, default=200)
    demo.add_argument("--devices", type=_positive_int, default=1, help="processes/GPUs per node")
    demo.add_argument("--num-nodes", type=_positive_int, default=1)
    demo.add_argument("--accelerator", default="auto", help="auto, cpu, cuda")
    demo.add_argument("--strategy", default="auto", help="auto, srifty_ddp, ddp, ...")
    demo.add_argument("--precision", default="32-true", help="Lightning precision, e.g. 32-true, bf16-mixed")
    demo.add_argument("--batch-size", type=_positive_int, default=None)
    demo.add_argument("--num-workers", type=int, default=0, help="data-loader worker processes")
    demo.add_argument("--output", default="srifty/profile.json", help="profile path ('-' to keep it in memory)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.add_argument(
        "--total-steps",
        type=_positive_int,
        default=100_000,
        help="steps of the full run the fleet recommendation is made for (default 100000)",
    )
    demo.set_defaults(func=_cmd_demo)

    profile = sub.add_parser("profile", help="work with profile files")
    psub = profile.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    show = psub.add_parser("show", help="validate a profile and print its summary")
    show.add_argument("profile", help="path to a srifty.profile/v1 JSON file")
    show.add_argument("--format", choices=["table", "json"], default="table")
    show.set_defaults(func=_cmd_profile_show)

    schema = sub.add_parser("schema", help="print a JSON Schema")
    schema.add_argument("document", choices=["profile", "plan"])
    schema.add_argument(
        "--format",
        choices=["json", "markdown"],
        default="json",
        help="json: the JSON Schema; markdown: the field reference table",
    )
    schema.set_defaults(func=_cmd_schema)
    from lightning_srifty import (
        cli_capture,
        cli_catalog,
        cli_eval,
        cli_launch,
        cli_predict,
        cli_recommend,
        cli_serve,
        cli_terraform,
    )

    cli_catalog.add_parser(sub, common)
    cli_predict.add_parser(sub, common)
    cli_recommend.add_parser(sub, common)
    cli_serve.add_parser(sub, common)
    cli_terraform.add_parser(sub, common)
    cli_launch.add_parser(sub)
    cli_eval.add_parser(sub)
    cli_capture.add_parser(sub)
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
