"""``srifty demo [--model cnn|lm] ...``: train a demo model with SriftyCallback, print and write the profile."""

from __future__ import annotations

import argparse
from typing import Any

from lightning_srifty.cli._common import nonneg_int, positive_int, whole


def cmd_demo(args: argparse.Namespace) -> int:
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
    return 1 if callback.profile is None else 0  # the callback said where everything went


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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
        "--max-steps", type=positive_int, default=None, help="training steps (default: warm-up + profile window + 50)"
    )
    demo.add_argument("--warmup-steps", type=positive_int, default=20)
    demo.add_argument("--profile-steps", type=positive_int, default=200)
    demo.add_argument("--devices", type=positive_int, default=1, help="processes/GPUs per node")
    demo.add_argument("--num-nodes", type=positive_int, default=1)
    demo.add_argument("--accelerator", default="auto", help="auto, cpu, cuda")
    demo.add_argument("--strategy", default="auto", help="auto, srifty_ddp, ddp, ...")
    demo.add_argument("--precision", default="32-true", help="Lightning precision, e.g. 32-true, bf16-mixed")
    demo.add_argument("--batch-size", type=positive_int, default=None)
    demo.add_argument("--num-workers", type=nonneg_int, default=0, help="data-loader worker processes")
    demo.add_argument("--output", default="srifty/profile.json", help="profile path ('-' to keep it in memory)")
    demo.add_argument("--seed", type=whole, default=0)
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.add_argument(
        "--total-steps",
        type=positive_int,
        default=100_000,
        help="steps of the full run the fleet recommendation is made for (default 100000)",
    )
    demo.set_defaults(func=cmd_demo)
