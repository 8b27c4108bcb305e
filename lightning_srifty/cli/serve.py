"""``srifty serve [--host 127.0.0.1] [--port 8000]``: the predictor as an HTTP service (torch-free); ``srifty
run-token --service URL``: a run token for a training run's jobs (issue #36 M5)."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import Any

from lightning_srifty.cli._common import load_catalog, nonneg_int, positive, positive_int, whole
from predictor.documents.atomic import read_bounded

TOKEN_ENV = "SRIFTY_SERVICE_TOKEN"


def read_token(path: str | None) -> tuple[str | None, str]:
    """The write token from ``--token-file`` (first) or $SRIFTY_SERVICE_TOKEN, and where it came from."""
    from predictor.exceptions import ConfigError

    if path is not None:
        file = Path(path).expanduser()
        try:
            token = read_bounded(file, 64 << 10).decode("utf-8").strip()  # a token is bytes, not a document
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"The 'token_file' parameter of srifty serve must name a readable UTF-8 file holding the token. "
                f"Got {path!r} ({exc}).",
                parameter="token_file",
                value=path,
            ) from None
        if not token:
            raise ConfigError(
                f"The 'token_file' parameter of srifty serve names an empty file ({path!r}). Write a random token "
                "into it, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE`.",
                parameter="token_file",
                value=path,
            )
        mode = file.stat().st_mode
        where = f"--token-file {path}"
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            where += f" (readable by others: chmod 600 {path})"
        return token, where
    token = os.environ.get(TOKEN_ENV, "").strip()
    return (token, f"${TOKEN_ENV}") if token else (None, "")


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from predictor.documents.checks import refused
    from predictor.service.app import ServiceSettings, create_app, server_config

    if not 0 <= args.port <= 65535:
        raise refused("--port", "a TCP port from 0 to 65535", args.port, "Give one such as 8000 (0: any free port).")
    token, source = read_token(args.token_file)
    settings = _settings(ServiceSettings, args, token, source)
    _check_port_free(args.host, args.port)
    if token is not None:
        writes = (
            f"writes (POST /v1/observations, /v1/runs) need 'Authorization: Bearer <token>' (token from {source}); "
            "give training jobs a run token instead (srifty run-token): their observations count as one run"
        )
    elif settings.allow_unauthenticated_writes:
        writes = (
            "writes (POST /v1/observations, /v1/runs) are open to anyone who reaches the port "
            "(--allow-unauthenticated-writes)"
        )
    else:
        writes = (
            "writes (POST /v1/observations, /v1/runs) are refused: no token is configured; give --token-file PATH or "
            f"${TOKEN_ENV}, or --allow-unauthenticated-writes on a machine you trust"
        )
    print(f"srifty serve: {writes}.")
    print(
        "srifty serve: reads (/v1/predict, /v1/rank, /v1/catalog, GET /v1/observations) need no token; Host names "
        f"answered: {', '.join(sorted(settings.host_names()))}; at most {settings.max_concurrent} rankings/"
        f"predictions at once, {settings.max_queued} waiting, {settings.request_timeout_s:g} s each; at most "
        f"{settings.max_connections} connections, each request sent within {settings.read_timeout_s:g} s."
    )
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"srifty serve: listening on {args.host}: anyone who reaches the port can read; the token travels in "
            "clear over http, so put the service behind a TLS proxy (or keep it on localhost)."
        )
    app = create_app(catalog=load_catalog(args), observations=args.observations, settings=settings)
    config = server_config(app, settings, args.host, args.port, log_level=args.log_level, access_log=args.access_log)
    uvicorn.Server(config).run()
    return 0


def _check_port_free(host: str, port: int) -> None:
    """Refuse an address the server could not listen on (a port another process holds, an address not this
    machine's, a port below 1024 without root), with the fix, before the server starts (uvicorn printed its own
    "[Errno 98] error while attempting to bind" and exited 3, a trial found)."""
    import errno
    import socket

    from predictor.exceptions import ConfigError

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as exc:
            why = {
                errno.EADDRINUSE: "another process listens there. Give another port with --port (0: any free "
                "port), or stop the other server",
                errno.EADDRNOTAVAIL: "the --host address is not one of this machine's. Give one of its addresses, "
                "127.0.0.1 or 0.0.0.0",
                errno.EACCES: "ports below 1024 need root. Give --port 1024 or above (8000 by default)",
            }.get(exc.errno or 0, "the system refused it. Give another --host or --port")
            raise ConfigError(
                f"srifty serve cannot listen on {host} port {port} ({exc.strerror or exc}): {why}.",
                parameter="port",
                value=port,
            ) from None


def _settings(settings_class: Any, args: argparse.Namespace, token: str | None, source: str) -> Any:
    """The service's settings from the command line; a token refused is said where it came from (--token-file or
    $SRIFTY_SERVICE_TOKEN), not as a parameter of a class the user never met."""
    from predictor.exceptions import ConfigError

    try:
        return settings_class(
            max_body_bytes=args.max_body,
            max_concurrent=args.max_concurrent,
            max_queued=args.max_queued,
            request_timeout_s=args.request_timeout_s,
            token=token,
            allow_unauthenticated_writes=args.allow_unauthenticated_writes,
            host=args.host,
            allowed_hosts=tuple(args.allowed_host),
            read_timeout_s=args.read_timeout_s,
            max_connections=args.max_connections,
        )
    except ConfigError as exc:
        if exc.parameter != "token":
            raise
        said = str(exc).split(" must be ", 1)[1]
        raise ConfigError(f"The token in {source} must be {said}", parameter="token_file", value=source) from None


def cmd_run_token(args: argparse.Namespace) -> int:
    """Print a run token (stdout, alone, for ``$(...)``); its run and expiry go to stderr."""
    import sys

    from predictor.service.client import ServiceClient
    from predictor.service.runs import is_run_token

    token, source = read_token(args.token_file)
    if token is None or is_run_token(token):
        from predictor.exceptions import ConfigError

        what = f"{source} holds a run token" if token else "no token was given"
        raise ConfigError(
            f"srifty run-token needs the service's own token ({what}). Give --token-file PATH (the file `srifty "
            f"serve --token-file` reads) or set ${TOKEN_ENV} to the service's token.",
            parameter="token_file",
        )
    from predictor.service.runs import MAX_TTL_S

    if args.days * 86400 > MAX_TTL_S:  # the service's own refusal spoke in seconds (a trial's --days 400)
        from predictor.exceptions import ConfigError

        raise ConfigError(
            f"--days {args.days:g} is longer than the {MAX_TTL_S // 86400} days a run token is accepted at most: give "
            f"--days {MAX_TTL_S // 86400} or fewer, and issue a new token for a longer run.",
            parameter="days",
            value=args.days,
        )
    issued = ServiceClient(args.service, token=token).issue_run(round(args.days * 86400))
    print(issued["token"])
    print(
        f"srifty run-token: {issued['run_id']}, accepted until {issued['expires_at']}. Give this token to the run's "
        f"jobs as ${TOKEN_ENV} (e.g. in SSM: `srifty terraform --secret-env {TOKEN_ENV}=ssm:/PARAM`); their "
        "observations count as one run.",
        file=sys.stderr,
    )
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve /v1/predict, /v1/rank, /v1/catalog, /v1/observations")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=whole, default=8000)
    p.add_argument(
        "--observations",
        metavar="PATH",
        help="SQLite file of observed runs (default: $SRIFTY_OBSERVATIONS or ~/.cache/srifty/observations.sqlite)",
    )
    _limit_flags(p)
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"file holding the token that writes (POST /v1/observations, /v1/runs) need (default: ${TOKEN_ENV})",
    )
    p.add_argument(
        "--allow-unauthenticated-writes",
        action="store_true",
        help="with no token, accept observations from anyone who reaches the port (refused otherwise)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer besides the bound address, 127.0.0.1, localhost and ::1 (repeatable)",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True)
    p.set_defaults(func=cmd_serve)
    _add_run_token(sub, common)


def _add_run_token(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run-token",
        parents=[common],
        help="a run token for a training run's jobs: their observations count as one run (POST /v1/runs)",
    )
    p.add_argument("--service", required=True, metavar="URL", help="where srifty serve listens")
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"file holding the service's own token (default: ${TOKEN_ENV})",
    )
    p.add_argument(
        "--days", type=positive, default=30.0, metavar="D", help="how long the token is accepted (default 30)"
    )
    p.set_defaults(func=cmd_run_token)


def _limit_flags(p: argparse.ArgumentParser) -> None:
    """How much the service takes on at once: sizes, concurrency, queues, time-outs, connections."""
    p.add_argument(
        "--max-body", type=positive_int, default=1 << 20, metavar="BYTES", help="request size limit (413 above)"
    )
    p.add_argument(
        "--max-concurrent",
        type=positive_int,
        default=2,
        metavar="N",
        help="rankings/predictions computed at once (default 2)",
    )
    p.add_argument(
        "--max-queued",
        type=nonneg_int,
        default=64,
        metavar="N",
        help="requests waiting for them; one more is a 429 (64)",
    )
    p.add_argument(
        "--request-timeout-s",
        type=positive,
        default=60.0,
        metavar="S",
        help="a ranking/prediction not answered by then is a 503 (default 60; the started work still finishes)",
    )
    p.add_argument(
        "--read-timeout-s",
        type=positive,
        default=30.0,
        metavar="S",
        help="a request's head, then its body, must arrive within this (408, or the connection closed; default 30)",
    )
    p.add_argument(
        "--max-connections",
        type=positive_int,
        default=256,
        metavar="N",
        help="connections open at once; one more is answered 503 and closed (default 256)",
    )
