"""``srifty catalog show | gpus | refresh``: torch-free."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lightning_srifty.cli._common import console, load_catalog, nonneg
from predictor.catalog.catalog import Catalog
from predictor.catalog.fields import GPU_SPECS
from predictor.catalog.gpus import SPEC_FIELDS
from predictor.exceptions import CatalogError, did_you_mean

LISTING_SCHEMA = "srifty.catalog-listing/v1"


def _money(value: float | None, estimated: bool = False) -> str:
    if value is None:
        return "-"
    return f"{'~' if estimated else ''}{value:,.3f}"


def cmd_show(args: argparse.Namespace) -> int:
    from predictor.catalog.instances import instance_to_dict

    catalog = load_catalog(args)
    regions = sorted({r for it in catalog for r in it.regions})
    if args.region and args.region not in regions:  # "../../x" listed 0 of 73 types, as if none were offered
        from predictor.documents.checks import suggest
        from predictor.exceptions import ConfigError

        close = suggest(args.region, regions, n=2, cutoff=0.85)
        raise ConfigError(
            f"--region {args.region!r}: the catalog has no prices there. "
            + (f"{did_you_mean(close)} " if close else "")
            + f"Regions with prices: {', '.join(regions)} (`srifty catalog refresh --regions ...` adds more).",
            parameter="region",
            value=args.region,
        )
    items = catalog.filter(
        gpu=args.gpu,
        region=args.region,
        cuda_only=not args.all,
        max_price=args.max_price,
        min_gpu_memory_gib=args.min_gpu_memory,
    )
    if args.format == "json":
        doc = {
            "schema": LISTING_SCHEMA,
            "source": catalog.info.source,
            "snapshot": catalog.info.snapshot,
            "extras": list(catalog.info.extras),
            "region": args.region,
            "instance_types": [instance_to_dict(it, args.region) for it in items],
        }
        print(json.dumps(doc, indent=2))
        return 0
    table = _types_table(args, catalog, items)
    out = console()
    out.print(table)
    out.print(
        f"{len(items)} of {len(catalog)} instance types"
        + ("" if args.all else " (CUDA only; --all for Neuron, Gaudi and AMD types)")
    )
    return 0


def _types_table(args: argparse.Namespace, catalog: Any, items: list[Any]) -> Any:
    """The instance types as a table: GPUs, memory, network, EFA, interconnect, prices and the spot bucket."""
    from rich.table import Table

    table = Table(
        title=f"EC2 accelerator instance types in {args.region or 'any region'} "
        f"(catalog: {catalog.info.source}, snapshot {catalog.info.snapshot})",
        caption="spot: cheapest zone; ~ marks an estimate from Spot Advisor savings. "
        "Interruption: Spot Advisor frequency bucket (share of instances interrupted per month).",
    )
    for col, justify in (
        ("instance type", "left"),
        ("GPU", "left"),
        ("GPUs", "right"),
        ("GPU GiB", "right"),
        ("vCPUs", "right"),
        ("network Gbps", "right"),
        ("EFA", "center"),
        ("interconnect", "left"),
        ("on-demand $/h", "right"),
        ("spot $/h", "right"),
        ("interruption", "center"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for it in items:
        spot = it.price(args.region, "spot")
        net = "-" if it.network_gbps is None else f"{'≤' if it.network_up_to else ''}{it.network_gbps:g}"
        table.add_row(
            it.name,
            it.gpu or it.accelerator,
            str(it.gpus),
            f"{it.gpu_memory_gib:g}",
            str(it.vcpus),
            net,
            "yes" if it.efa else "",
            it.gpu_interconnect,
            _money(it.price_usd_hr(args.region, "on-demand")),
            _money(spot.usd_hr if spot else None, bool(spot and spot.estimated)),
            it.spot_interruption_bucket or "-",
        )
    return table


def cmd_gpus(args: argparse.Namespace) -> int:
    catalog = load_catalog(args)
    shown = [f for f in GPU_SPECS if f.key("json") is not None]  # the declarations' JSON keys
    rows: list[dict[str, Any]] = [
        {f.key("json") or "": list(v) if isinstance(v := getattr(g, f.name), tuple) else v for f in shown}
        for g in catalog.gpus.gpus.values()
    ]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    table = Table(title="GPUs (dense peak TFLOPS per GPU)")
    for col in ("key", "arch", "memory GB", "bandwidth GB/s", "FP32", "TF32", "FP16", "BF16", "NVLink GB/s"):
        table.add_column(col, justify="left" if col in ("key", "arch") else "right")
    for r in rows:
        table.add_row(
            r["key"],
            r["arch"],
            *("-" if r[k] is None else f"{r[k]:g}" for k in SPEC_FIELDS),
        )
    console().print(table)
    return 0


def cmd_refresh(args: argparse.Namespace) -> int:
    from predictor.catalog.refresh import has_credentials, refresh_catalog

    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    current = Catalog.load(use_env=False)
    if not has_credentials():
        print(
            f"srifty: no AWS credentials found, so the catalog was not refreshed; the {current.info.source} "
            f"catalog (snapshot {current.info.snapshot}) stays in use. Configure credentials (aws configure, "
            "AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) to refresh.",
            file=sys.stderr,
        )
        return 1
    from rich.progress import Progress

    with Progress(transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("refreshing", total=None)

        def progress(message: str, i: int, n: int) -> None:
            bar.update(task, description=message, completed=i, total=n)

        try:
            result = refresh_catalog(regions, previous=current, progress=progress)
        except CatalogError as exc:
            print(f"srifty: error: {exc}", file=sys.stderr)
            return 2
    print(
        f"wrote {result.path}: {result.instance_types} accelerator instance types, {result.prices} prices "
        f"({', '.join(regions)})"
    )
    for note in result.notes:
        print(f"note: {note}")
    for failure in result.failures:
        print(f"failed: {failure}", file=sys.stderr)
    return 1 if result.failures else 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Print the JSON Schema of a catalog extra (generated from the fields' declarations)."""
    from predictor.catalog.extra import extra_schema

    print(json.dumps(extra_schema(), indent=2))
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    catalog = sub.add_parser("catalog", help="EC2 accelerator instance types, GPUs and prices")
    csub = catalog.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")
    show = csub.add_parser("show", parents=[common], help="list instance types, cheapest first")
    show.add_argument("--gpu", help="GPU key or prefix, e.g. A100, H100-SXM, T4")
    show.add_argument("--region", default="us-east-1", help="price region (default us-east-1)")
    show.add_argument("--max-price", type=nonneg, help="on-demand $/h at most")
    show.add_argument("--min-gpu-memory", type=nonneg, help="GiB per GPU at least")
    show.add_argument("--all", action="store_true", help="include non-CUDA accelerators (Neuron, Gaudi, AMD)")
    show.add_argument("--format", choices=["table", "json"], default="table")
    show.set_defaults(func=cmd_show)
    gpus = csub.add_parser("gpus", parents=[common], help="list known GPUs and their specs")
    gpus.add_argument("--format", choices=["table", "json"], default="table")
    gpus.set_defaults(func=cmd_gpus)
    schema = csub.add_parser(
        "schema", help="the JSON Schema of a --catalog-extra YAML file (for an editor; the loader checks the same)"
    )
    schema.set_defaults(func=cmd_schema)
    refresh = csub.add_parser("refresh", help="refresh specs and prices from AWS (boto3) into the user cache")
    refresh.add_argument("--regions", default="us-east-1,us-west-2", help="comma-separated regions")
    refresh.set_defaults(func=cmd_refresh)
