"""``srifty predict --profile P.json --fleet "p4d.24xlarge:2"``: torch-free."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lightning_srifty.cli._common import console, load_catalog
from predictor.documents.plan import TRANSPORTS


def cmd_predict(args: argparse.Namespace) -> int:
    from predictor.documents.profile import load_profile
    from predictor.model.predict import predict

    profile = load_profile(args.profile)
    catalog = load_catalog(args)
    options = {"catalog": catalog, "scaling": args.scaling, "transport": args.transport}
    result = predict(profile, args.fleet, layout=args.layout, **options)  # auto: the layout recommend runs
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    from rich.table import Table

    from lightning_srifty.console import styled

    lo, hi = result.interval["iteration_time_s"]
    tlo, thi = result.interval["throughput_samples_s"]
    table = Table(
        title=f"Prediction for {result.fleet} ({profile.model.name or 'model'}, {result.layout}, {result.scaling} "
        "scaling)",
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold cyan")
    table.add_column()
    for note in result.cannot_run:  # first: the rule srifty recommend leaves such types out by
        table.add_row(styled(("cannot run", "red")), f"{note}. srifty recommend leaves it out; the time below is what "
                      "this training would take if it could run there")  # fmt: skip
    for name, value in _rows(result, lo, hi, tlo, thi):
        table.add_row(name, value)
    for g in result.groups:
        if not g.fits_memory:
            table.add_row(styled(("won't fit", "red")), _wont_fit(profile, result, g, catalog))
    for note in result.assumptions:
        if note != result.batch_split:  # the Batch row says it already
            table.add_row("assumes", note)
    for note in result.extrapolation:
        table.add_row(styled(("extrapolates", "yellow")), note)
    console().print(table)
    return 0


def _wont_fit(profile: Any, result: Any, group: Any, catalog: Any) -> str:
    """What a group that cannot hold its share needs, and the ways out: where it trains more than one sample a
    micro-step, what it needs at one (accumulating the rest: the same global batch), as srifty recommend says it
    (a trial read 271 GiB here and 129 GiB "even at 1 sample per micro-step" from srifty recommend)."""
    from predictor.model.layout import parse
    from predictor.model.memory import estimate_memory
    from predictor.model.predict import NONE_FITS

    text = f"{group.instance_type}: about {group.memory_gib:.1f} GiB per GPU is needed"
    if group.micro_batch > 1:
        it = catalog.get(group.instance_type)
        ranks = sum(g.count * catalog.get(g.instance_type).gpus for g in result.groups)
        least = estimate_memory(profile, 1.0, it.gpu_memory_gib, parse(result.layout), ranks, it.gpus)
        text += f" at {group.micro_batch} samples a micro-step, {least.bytes_per_gpu / 2**30:.1f} even at 1"
    ranks = sum(g.count * catalog.get(g.instance_type).gpus for g in result.groups)
    tried = any(note.startswith(NONE_FITS) for note in result.assumptions)  # --layout auto tried every layout
    ways = "" if tried else _layouts_left(result.layout, ranks)
    return f"{text}. Use a GPU with more memory, more GPUs (a smaller share of the global batch each){ways}."


def _layouts_left(layout: str, ranks: int) -> str:
    """The layouts that hold less than ``layout`` does on ``ranks`` GPUs (a trial was told --layout fsdp:full_shard
    having asked for it; on one GPU sharding divides nothing); none left: srifty recommend's choice."""
    sharded, ac = layout.startswith("fsdp"), layout.endswith("+ac")
    if ranks == 1:
        return ", or checkpoint activations (--layout ddp+ac)" if not ac else ""
    if not sharded:
        return ", or shard the model and optimizer state (--layout fsdp:full_shard" + (
            "+ac)" if ac else ", +ac to checkpoint activations)"
        )
    if not ac:
        return f", or checkpoint activations (--layout {layout}+ac)"
    if not layout.startswith("fsdp:full_shard"):
        return ", or shard across every GPU (--layout fsdp:full_shard+ac)"
    return " (this layout holds the least; --layout auto, the default, predicts the one srifty recommend runs)"


def _collectives(layout: str) -> str:
    """What a step's gradient traffic is under ``layout``: a sharded one all-gathers the parameters and reduce-scatters
    the gradients (the Breakdown said "all-reduce" for FSDP, a trial)."""
    return "all-gather + reduce-scatter" if layout.startswith("fsdp") else "all-reduce"


def _rate(per_second: float) -> str:
    """A throughput with three significant digits at least (a 13B model's 4 samples/s read "4 (4-4)")."""
    return f"{per_second:,.0f}" if per_second >= 100 else f"{per_second:.3g}"


def _limiting_words(result: Any) -> str:
    """The link that limits the all-reduce; on several nodes, that an intra-node phase is the longer one (the
    assumptions name the network across nodes: a reader took "intra-node nvswitch" for the transport priced)."""
    nodes = sum(g.count for g in result.groups)
    if nodes > 1 and result.allreduce_limiting.startswith("intra-node"):
        return f"{result.allreduce_limiting}: its phase is longer than the network's"
    return str(result.allreduce_limiting)


def _rows(result: Any, lo: float, hi: float, tlo: float, thi: float) -> list[tuple[str, Any]]:
    """The prediction's table rows: its time and throughput with their intervals, the breakdown, the bottleneck,
    the memory, the batch split and the model that made it."""
    from lightning_srifty.console import styled

    b = result.breakdown
    return [
        ("Iteration time", f"{result.iteration_time_s * 1e3:.1f} ms (80% interval {lo * 1e3:.1f}-{hi * 1e3:.1f} ms)"),
        (
            "Throughput",
            f"{_rate(result.throughput_samples_s)} samples/s ({_rate(tlo)}-{_rate(thi)}); global batch "
            f"{result.global_batch:g}",
        ),
        (
            "Breakdown",
            f"compute {_ms(b['compute_s'])} · input {_input(result, b['input_s'])} · {_collectives(result.layout)} "
            f"{_ms(b['allreduce_s'])} of which exposed {_ms(b['exposed_comm_s'])} ({_limiting_words(result)}"
            + (f"; {_ms(b['baseline_wait_s'])} waiting for its baseline" if b.get("baseline_wait_s", 0.0) > 0 else "")
            + ")"
            + (f" · data-parallel losses {_ms(b['dp_loss_s'])}" if b.get("dp_loss_s", 0.0) > 0 else ""),
        ),
        ("Bottleneck", result.bottleneck),
        (
            "Memory",
            styled(
                ("fits" if result.memory_known else ("unknown", "yellow"))
                if result.fits_memory
                else ("does not fit", "red"),
                ": "
                + ", ".join(
                    f"{g.instance_type} {g.memory_gib:.1f} GiB/GPU ({g.memory_margin:+.0%} margin)"
                    if result.memory_known
                    else f"{g.instance_type}: weights, gradients, optimizer state and the CUDA context alone "
                    f"{g.memory_gib:.1f} GiB/GPU; "
                    "the profile has no activation memory (a CUDA profile measures it; srifty capture sizes it), "
                    "so micro-batches are held to the profiled one, the largest known to fit"
                    for g in result.groups
                ),
            ),
        ),
        ("Batch", result.batch_split),
        (
            "Memory/GPU",
            f"{result.layout}: "
            + " · ".join(
                f"{_part_name(name, result)} {gib:.2f}"
                for name, gib in result.groups[0].memory_parts_gib.items()
                if gib >= 0.005
            )
            + " GiB",
        ),
        ("Model", result.performance_model),
    ]


def _ms(seconds: float) -> str:
    """Milliseconds with a tenth, or two significant digits below 0.1 ms (a small step's parts read 0.0 ms)."""
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if ms >= 0.1 or ms == 0 else f"{ms:.2g} ms"


def _part_name(name: str, result: Any) -> str:
    """A memory part's label; DDP's gradients on more than one rank include the reducer's bucket copy of them."""
    ranks = sum(len(g.rank_batches) for g in result.groups)
    if name == "gradients" and result.layout.startswith("ddp") and ranks > 1:
        return "gradients (+ DDP's bucket copy)"
    return name


def _input(result: Any, input_s: float) -> str:
    """The input pipeline's time, or "not modelled" where the prediction says so (a capture runs no DataLoader: a
    trial read "input 0.0 ms" as a measured zero)."""
    from predictor.model.predict import INPUT_NOT_MODELLED

    return "not modelled" if any(a.startswith(INPUT_NOT_MODELLED) for a in result.assumptions) else _ms(input_s)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("predict", parents=[common], help="predict iteration time, throughput and memory of a fleet")
    p.add_argument("--profile", required=True, help="srifty.profile/v1 JSON")
    p.add_argument("--fleet", required=True, help='instance_type:count[,instance_type:count], e.g. "p4d.24xlarge:2"')
    p.add_argument(
        "--scaling",
        choices=["strong", "weak"],
        default="strong",
        help="strong (the default): keep the profiled global batch (the same training), with gradient accumulation "
        "where a GPU cannot hold its share; weak: keep the profiled per-GPU batch (the global batch grows)",
    )
    p.add_argument(
        "--layout",
        default="auto",
        help="parallel layout: ddp, fsdp:full_shard, fsdp:shard_grad_op, fsdp:hybrid_shard, pipeline:<nodes>; "
        "+ac for activation checkpointing; auto (the default): the one srifty recommend runs this fleet with",
    )
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="auto",
        help="how a multi-node fleet's nodes meet: auto (the default), EFA on the types that have it, as srifty "
        "terraform builds the fleet; tcp, NCCL's sockets on every type (a cluster without EFA)",
    )
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_predict)
