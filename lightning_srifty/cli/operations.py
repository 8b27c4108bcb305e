"""``srifty status`` (the fleets that are up, their cost so far), ``srifty logs`` (the nodes' logs), ``srifty outputs``
(what the nodes' jobs wrote) and ``srifty down`` (destroy a root module, then what its fleet cost): torch-free; boto3 is
imported when a command runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _counts(counter: Any) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def _env_region() -> str | None:
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or None


def _no_region(command: str) -> Exception:
    from predictor.exceptions import ConfigError

    return ConfigError(
        f"srifty {command} does not know which region to look in: give --region (e.g. --region us-east-1), set "
        "AWS_DEFAULT_REGION, or give --dir with a root module written by srifty terraform.",
        parameter="region",
        value=None,
    )


# --- srifty status ----------------------------------------------------------------------------------------------------


def _life_born(fleet: Any, uri: str | None, endpoint: str | None) -> float | None:
    """When the fleet's life began, from its nodes' record beside the checkpoints (None: unknown; the record is a
    refinement, without it the cap counts from the first live instance's launch)."""
    from lightning_srifty.provision import aws
    from lightning_srifty.provision.operations import fleets as ops
    from predictor.exceptions import SriftyError

    if not uri:
        return None
    try:
        with aws.aws_errors(f"reading {uri}{ops.LIFE.format(name=fleet.name)}"):
            return ops.read_life_born(aws.client("s3", fleet.region, endpoint), uri, fleet.name)
    except SriftyError:
        return None


def _fleet_record(fleet: Any, catalog: Any, at: float, root: Any, endpoint: str | None) -> dict:
    """Everything ``srifty status`` says of one fleet (``root``: the root module it came from, or None)."""
    from lightning_srifty.provision import aws
    from lightning_srifty.provision.operations import fleets as ops
    from predictor.exceptions import SriftyError

    cost = fleet.cost(catalog, at)
    heartbeat: dict[str, Any] | None = None
    uri = fleet.checkpoint_uri or (root.checkpoint_uri if root else None)
    cap = fleet.max_life_h if fleet.max_life_h is not None else (root.max_life_h if root else None)
    if uri:
        try:
            with aws.aws_errors(f"reading {uri}HEARTBEAT.json"):
                record = ops.read_heartbeat(aws.client("s3", fleet.region, endpoint), uri)
            heartbeat = {"found": record is not None}
            if record is not None:
                heartbeat.update(age_s=round(record.age_s(at), 1), max_age_s=record.max_age_s, stale=record.stale(at))
        except (SriftyError, ValueError) as exc:  # a heartbeat that cannot be read must not hide the fleet's line
            heartbeat = {"found": False, "error": str(exc)}
    network: str | None = None
    if uri:
        try:
            with aws.aws_errors(f"reading {uri}network/"):
                network = ops.network_note(ops.read_network(aws.client("s3", fleet.region, endpoint), uri, fleet.name))
        except (SriftyError, ValueError) as exc:
            network = f"the nodes' network records could not be read ({exc})"
    ends = fleet.life_ends_unix(cap, _life_born(fleet, uri, endpoint))
    return {
        "network_note": network,
        "name": fleet.name,
        "region": fleet.region,
        "states": dict(fleet.states()),
        "types": dict(fleet.types()),
        "markets": dict(fleet.markets()),
        "age_h": round(fleet.age_h(at), 4),
        "cost_usd": round(cost.usd, 4),
        "usd_per_hour": round(cost.usd_per_hour, 6),
        "unpriced": list(cost.unpriced),
        "max_life_h": cap,
        "life_ends_unix": ends,
        "checkpoint_uri": uri,
        "heartbeat": heartbeat,
        "instances": [
            {
                "id": i.id,
                "type": i.type,
                "state": i.state,
                "market": i.market,
                "launched_unix": i.launched_unix,
                "usd_per_hour": ops.usd_per_hour(catalog, i, fleet.region),
            }
            for i in fleet.instances
        ],
    }


def status_line(record: dict, at: float) -> list[str]:
    """The columns of one fleet in ``srifty status``."""
    from lightning_srifty.console import fmt_life

    states = record["states"]
    state = _counts({k: v for k, v in states.items() if k != "terminated"})
    if states.get("terminated"):
        ended = f"{states['terminated']} terminated"
        state = f"{state}, {ended}" if state != "-" else f"ended ({ended})"
    types = ", ".join(f"{n} x {t}" for t, n in sorted(record["types"].items())) or "-"
    cost = f"${record['cost_usd']:,.2f}"
    if record["usd_per_hour"]:
        cost += f" (${record['usd_per_hour']:,.2f}/h)"
    if record["unpriced"]:
        cost += f" + unpriced {', '.join(record['unpriced'])}"
    life = "-"
    if record["max_life_h"] is not None:
        life = fmt_life(record["max_life_h"])
        if record["life_ends_unix"] is not None:
            left = record["life_ends_unix"] - at
            life += f", ends in {_ago(left)}" if left > 0 else ", past"
    beat = record["heartbeat"]
    if beat is None:
        heartbeat = "- (checkpoint folder unknown)"
    elif beat.get("error"):
        heartbeat = "unreadable"
    elif not beat["found"]:
        heartbeat = "none"
    else:
        heartbeat = f"{_ago(beat['age_s'])} ago" + (" (stale)" if beat["stale"] else "")
    return [
        record["name"],
        record["region"],
        state,
        types,
        _counts(record["markets"]),
        _ago(record["age_h"] * 3600),
        cost,
        life,
        heartbeat,
    ]


def cmd_status(args: argparse.Namespace) -> int:
    from lightning_srifty.cli._common import load_catalog
    from lightning_srifty.provision import aws
    from lightning_srifty.provision.operations import fleets as ops

    roots = [ops.Root.load(d) for d in args.dir or ()]
    # where to look: each root's fleet in its own region (--region overrides); without --dir every srifty fleet
    queries: list[tuple[str, str | None, list[str] | None, Any]] = []  # region, endpoint, names, root
    for root in roots:
        queries.append((args.region or root.region, args.aws_endpoint or root.endpoint, [root.name], root))
    if not roots:
        region = args.region or _env_region()
        if region is None:
            raise _no_region("status")
        queries.append((region, args.aws_endpoint, None, None))
    catalog = load_catalog(args)
    records: list[Any] = []
    for region, endpoint, names, root in queries:
        with aws.aws_errors(f"listing the fleets in {region} (ec2:DescribeInstances)"):
            found = ops.find_fleets(aws.client("ec2", region, endpoint), region, names)
        at = ops.now()
        records.extend(_fleet_record(fleet, catalog, at, root, endpoint) for fleet in found)
    at = ops.now()
    if args.json:
        print(json.dumps({"at_unix": at, "fleets": records}, indent=1))
        return 0
    if not records:
        where = ", ".join(sorted({q[0] for q in queries}))
        named = ", ".join(r.name for r in roots)
        print(f"No srifty fleet {'named ' + named + ' ' if named else ''}has instances in {where}.")
        return 0
    header = ["FLEET", "REGION", "STATE", "INSTANCES", "MARKET", "AGE", "COST SO FAR", "LIFE CAP", "HEARTBEAT"]
    rows = [header, *(status_line(r, at) for r in records)]
    widths = [max(len(row[k]) for row in rows) for k in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for record in records:
        if record.get("network_note"):
            print(f"{record['name']}: {record['network_note']}")
    print("Cost so far: the catalog's $/h of each instance in its market x the hours since it launched (not the bill).")
    return 0


# --- srifty logs ------------------------------------------------------------------------------------------------------


class _Prefixed:
    """Writes whole lines, each prefixed with its instance id when several logs are printed."""

    def __init__(self, out: Any, prefix: bool) -> None:
        self.out, self.prefix = out, prefix
        self.partial: dict[str, str] = {}

    def __call__(self, instance_id: str, data: bytes) -> None:
        if not self.prefix:
            self.out.write(data.decode(errors="replace"))
            self.out.flush()
            return
        text = self.partial.pop(instance_id, "") + data.decode(errors="replace")
        *lines, rest = text.split("\n")
        for line in lines:
            self.out.write(f"{instance_id} | {line}\n")
        if rest:
            self.partial[instance_id] = rest
        self.out.flush()

    def close(self) -> None:
        for instance_id, rest in self.partial.items():
            self.out.write(f"{instance_id} | {rest}\n" if self.prefix else rest)
        self.partial.clear()
        self.out.flush()


def _logs_source(args: argparse.Namespace, command: str = "logs") -> tuple[str, str, str | None, str | None]:
    """(fleet, checkpoint uri, region, endpoint) from --dir, or from FLEET with --checkpoint-uri or its tags."""
    from lightning_srifty.provision import aws
    from lightning_srifty.provision.operations import fleets as ops
    from predictor.exceptions import ConfigError

    if args.dir:
        root = ops.Root.load(args.dir)
        uri = args.checkpoint_uri or root.checkpoint_uri
        if not uri:
            raise ConfigError(
                f"The checkpoint folder of {args.dir} is not known yet: its bucket is created by the module and the "
                "folder holds no terraform state with the output checkpoint_uri. Apply it first (srifty apply --dir), "
                "or give --checkpoint-uri s3://bucket/prefix/.",
                parameter="checkpoint_uri",
                value=None,
            )
        return root.name, uri, args.region or root.region, args.aws_endpoint or root.endpoint
    if not args.fleet:
        raise ConfigError(
            f"srifty {command} needs a fleet: give --dir ROOT (a folder srifty terraform wrote), or the fleet's name "
            "with --checkpoint-uri s3://bucket/prefix/.",
            parameter="fleet",
            value=None,
        )
    region = args.region or _env_region()
    if args.checkpoint_uri:
        return args.fleet, args.checkpoint_uri, region, args.aws_endpoint
    if region is None:
        raise _no_region(command)
    with aws.aws_errors(f"looking up fleet {args.fleet} in {region} (ec2:DescribeInstances)"):
        found = ops.find_fleets(aws.client("ec2", region, args.aws_endpoint), region, [args.fleet])
    uri = next((f.checkpoint_uri for f in found if f.checkpoint_uri), None)
    if uri is None:
        raise ConfigError(
            f"The checkpoint folder of fleet {args.fleet} is not known: "
            + (f"no instance of it in {region} has the tag srifty:checkpoints" if found else f"no instance in {region}")
            + ". Give --checkpoint-uri s3://bucket/prefix/ (the root's output checkpoint_uri) or --dir ROOT.",
            parameter="checkpoint_uri",
            value=None,
        )
    return args.fleet, uri, region, args.aws_endpoint


def cmd_logs(args: argparse.Namespace) -> int:
    from lightning_srifty.provision import aws
    from lightning_srifty.provision.operations import fleets as ops
    from lightning_srifty.provision.operations.logs import FleetLogs, follow
    from predictor.exceptions import ConfigError

    fleet, uri, region, endpoint = _logs_source(args)
    logs = FleetLogs(aws.client("s3", region, endpoint), uri, fleet)
    with aws.aws_errors(f"listing {logs.uri}"):
        found = logs.list()
        if args.list:
            for log in found:
                state = "ended" if logs.finished(log.instance_id) else "running"
                print(f"{log.instance_id}  {log.size:>10,} bytes  {_ago(ops.now() - log.modified_unix)} ago  {state}")
            if not found:
                print(f"No logs under {logs.uri} yet (every node copies its log there every 30 s once it boots).")
            return 0
    if args.instance and not args.follow and args.instance not in {o.instance_id for o in found}:
        raise ConfigError(
            f"There is no log of instance {args.instance} under {logs.uri}: "
            + (f"the logs there are of {', '.join(o.instance_id for o in found)}" if found else "there is none yet")
            + ". Give one of those to --instance, or --follow to wait for it.",
            parameter="instance",
            value=args.instance,
        )
    if not found and not args.follow:
        print(f"No logs under {logs.uri} yet (every node copies its log there every 30 s once it boots).")
        return 0
    if not found or (args.instance and args.instance not in {o.instance_id for o in found}):
        print(f"Waiting for the first log under {logs.uri} (Ctrl-C to stop).", file=sys.stderr)
    write = _Prefixed(sys.stdout, prefix=not args.instance and len(found) != 1)  # one log: as it is
    try:
        with aws.aws_errors(f"reading the logs under {logs.uri}"):
            follow(logs, write, instance=args.instance, keep_going=args.follow, interval_s=args.interval)
    except KeyboardInterrupt:
        write.close()
        return 130
    write.close()
    return 0


def cmd_outputs(args: argparse.Namespace) -> int:
    from lightning_srifty.provision import aws
    from lightning_srifty.provision.operations import fleets as ops
    from lightning_srifty.provision.operations.outputs import FleetOutputs
    from predictor.exceptions import ConfigError

    fleet, uri, region, endpoint = _logs_source(args, "outputs")
    outputs = FleetOutputs(aws.client("s3", region, endpoint), uri, fleet)
    with aws.aws_errors(f"listing {outputs.uri}"):
        found = outputs.list(args.instance)
    if not found:
        print(
            f"No outputs under {outputs.uri}{args.instance + '/' if args.instance else ''} yet: every node copies the "
            "files its job writes in its code folder there every 10 minutes and when the job ends (a fleet with a "
            "code snapshot)."
        )
        return 0
    nodes = sorted({o.instance_id for o in found})
    if args.list:
        for obj in found:
            print(f"{obj.instance_id}/{obj.path}  {obj.size:,} bytes  {_ago(ops.now() - obj.modified_unix)} ago")
        print(f"{len(found)} files of {len(nodes)} node(s) under {outputs.uri}")
        return 0
    to = Path(args.to or Path("srifty-outputs") / fleet)
    try:
        with aws.aws_errors(f"fetching the outputs under {outputs.uri}"):
            written, kept = outputs.fetch(found, to)
    except ValueError as exc:
        raise ConfigError(f"{exc}: the folder {outputs.uri} holds a key srifty did not write.", parameter="to") from exc
    print(
        f"{written} files fetched, {kept} already here, of {len(nodes)} node(s), into {to}/<instance id>/ "
        "(the files each node's job wrote in its code folder)"
    )
    return 0


# --- srifty down ------------------------------------------------------------------------------------------------------


def cmd_down(args: argparse.Namespace) -> int:
    from lightning_srifty.cli._common import load_catalog
    from lightning_srifty.provision import aws
    from lightning_srifty.provision.apply import destroy
    from lightning_srifty.provision.operations import fleets as ops
    from predictor.exceptions import ProvisionError

    root = ops.Root.load(args.dir)
    region = args.region or root.region
    catalog = load_catalog(args)
    fleet = None
    try:  # what ran, before it is gone; the destroy goes on without it
        with aws.aws_errors(f"listing the instances of {root.name} in {region}"):
            found = ops.find_fleets(aws.client("ec2", region, root.endpoint), region, [root.name])
        fleet = found[0] if found else ops.Fleet(root.name, region, ())
    except ProvisionError as exc:
        print(f"WARNING: {exc} The fleet is destroyed all the same; its cost is not summed.", file=sys.stderr)
    destroy(args.dir, yes=args.yes, delete_checkpoints=args.delete_checkpoints)
    try:  # what an apply killed before it saved its state left outside it (the VPC): found by its tag, named
        with aws.aws_errors(f"looking for what {root.name} left outside terraform's state in {region}"):
            for line in ops.leftover_networks(aws.client("ec2", region, root.endpoint), region, root.name):
                print(f"WARNING: {line}", file=sys.stderr)
    except ProvisionError as exc:
        print(f"WARNING: {exc}", file=sys.stderr)
    if fleet is not None:
        at = ops.now()
        print(ops.summary(fleet, fleet.cost(catalog, at), at))
    return 0


ENDPOINT_HELP = "an AWS API endpoint such as moto's (default: --dir's, else $AWS_ENDPOINT_URL, else AWS)"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from lightning_srifty.cli._common import positive

    p = sub.add_parser(
        "status", parents=[common], help="the fleets that are up: instances, market, age, cost so far, heartbeat"
    )
    p.add_argument(
        "--dir", action="append", metavar="ROOT", help="only this root module's fleet (repeatable); default: every one"
    )
    p.add_argument("--region", help="where to look (default: each --dir's region, else $AWS_DEFAULT_REGION)")
    p.add_argument("--json", action="store_true", help="one JSON document, for machines")
    p.add_argument("--aws-endpoint", help=ENDPOINT_HELP)
    p.set_defaults(func=cmd_status)

    q = sub.add_parser("logs", help="the nodes' boot, setup and training output, from beside the checkpoints")
    q.add_argument("fleet", nargs="?", help="the fleet's name (or give --dir)")
    q.add_argument("--dir", metavar="ROOT", help="a root module written by srifty terraform")
    q.add_argument("--checkpoint-uri", metavar="S3_URI", help="the fleet's checkpoint folder (default: from its tags)")
    q.add_argument("--instance", metavar="ID", help="only this node's log")
    q.add_argument("--follow", "-f", action="store_true", help="keep printing new output until the node's job ends")
    q.add_argument("--interval", type=positive, default=5.0, metavar="S", help="seconds between polls with --follow")
    q.add_argument("--list", action="store_true", help="list the logs (node, size, age, running or ended)")
    q.add_argument("--region", help="default: --dir's region, else $AWS_DEFAULT_REGION")
    q.add_argument("--aws-endpoint", help=ENDPOINT_HELP)
    q.set_defaults(func=cmd_logs)

    o = sub.add_parser(
        "outputs",
        help="fetch what each node's job wrote in its code folder (logs, models), from beside the checkpoints",
    )
    o.add_argument("fleet", nargs="?", help="the fleet's name (or give --dir)")
    o.add_argument("--dir", metavar="ROOT", help="a root module written by srifty terraform")
    o.add_argument("--checkpoint-uri", metavar="S3_URI", help="the fleet's checkpoint folder (default: from its tags)")
    o.add_argument("--instance", metavar="ID", help="only this node's outputs")
    o.add_argument("--to", metavar="DIR", help="where to put them (default srifty-outputs/<fleet>), a folder per node")
    o.add_argument("--list", action="store_true", help="list the files (node, path, size, age), fetch nothing")
    o.add_argument("--region", help="default: --dir's region, else $AWS_DEFAULT_REGION")
    o.add_argument("--aws-endpoint", help=ENDPOINT_HELP)
    o.set_defaults(func=cmd_outputs)

    d = sub.add_parser(
        "down", parents=[common], help="terraform destroy a root module, then what its fleet cost at catalog prices"
    )
    d.add_argument("--dir", required=True, metavar="ROOT", help="the folder srifty terraform wrote")
    d.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    d.add_argument(
        "--delete-checkpoints",
        action="store_true",
        help="delete the checkpoint bucket the module created, with every object (default: kept, out of the state)",
    )
    d.add_argument("--region", help="default: the root's region")
    d.set_defaults(func=cmd_down)
