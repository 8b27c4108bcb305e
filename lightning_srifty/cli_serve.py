"""``srifty serve [--host 127.0.0.1] [--port 8000]``: the predictor as an HTTP service (torch-free)."""

from __future__ import annotations

import argparse
from typing import Any

from lightning_srifty.cli_catalog import load_catalog


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from predictor.service import create_app

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"srifty serve: listening on {args.host}: the service has no authentication; put it behind a proxy "
            "that has, or keep it on localhost."
        )
    app = create_app(catalog=load_catalog(args), observations=args.observations, max_body_bytes=args.max_body)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log)
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve /v1/predict, /v1/rank, /v1/catalog, /v1/observations")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--observations",
        metavar="PATH",
        help="SQLite file of observed runs (default: $SRIFTY_OBSERVATIONS or ~/.cache/srifty/observations.sqlite)",
    )
    p.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES", help="request size limit (413 above)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True)
    p.set_defaults(func=cmd_serve)
