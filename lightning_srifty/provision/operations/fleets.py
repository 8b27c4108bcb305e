"""The fleets that are up, from the cloud alone (torch-free): ``srifty status`` and ``srifty down``.

Every instance of a fleet carries the tag ``srifty:fleet`` = its name (the module's launch templates put it there),
and, from ``srifty terraform``, ``srifty:max-life-h`` (its life cap) and ``srifty:checkpoints`` (the checkpoint
folder, when the bucket was given). One ``DescribeInstances`` call per region finds them; what they cost so far is the
bundled catalog's $/h of each instance, in its market (``InstanceLifecycle``: spot or on-demand), times the hours since
its ``LaunchTime`` (until the end time EC2 gives a terminated one): the catalog's figures, not the bill.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lightning_srifty import protocol
from lightning_srifty.provision.apply import check_folder
from lightning_srifty.provision.apply import outputs as terraform_outputs
from lightning_srifty.provision.aws import split_s3
from lightning_srifty.provision.terraform.money import group_usd_per_hour
from predictor.exceptions import ConfigError, ProvisionError

TAG_FLEET = "srifty:fleet"
TAG_CHECKPOINTS = "srifty:checkpoints"
TAG_MAX_LIFE = "srifty:max-life-h"
LIVE = ("pending", "running", "shutting-down", "stopping")  # billing now (stopped and terminated ones are not)
# "User initiated (2025-01-01 12:00:00 GMT)"; moto writes UTC
_ENDED = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def now() -> float:
    """The clock of every age and cost (unix seconds; tests replace it)."""
    return time.time()


def _unix(value: Any) -> float:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Instance:
    id: str
    type: str
    state: str
    market: str  # "spot" or "on-demand"
    launched_unix: float
    ended_unix: float | None = None  # a terminated instance: when EC2 says it ended (None: still up, or unknown)
    tags: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_ec2(cls, data: Mapping[str, Any]) -> Instance:
        """One instance of a ``DescribeInstances`` answer."""
        state = data.get("State", {}).get("Name", "unknown")
        ended = None
        if state == "terminated":
            match = _ENDED.search(data.get("StateTransitionReason") or "")
            if match:
                ended = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
        return cls(
            id=data["InstanceId"],
            type=data.get("InstanceType", "?"),
            state=state,
            market="spot" if data.get("InstanceLifecycle") == "spot" else "on-demand",
            launched_unix=_unix(data["LaunchTime"]),
            ended_unix=ended,
            tags={t["Key"]: t["Value"] for t in data.get("Tags") or ()},
        )

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def hours(self, at: float) -> float:
        """Hours it has run (billed) by ``at``: 0 for a terminated one whose end EC2 no longer says."""
        if self.live:
            end = at
        elif self.ended_unix is not None:
            end = min(at, self.ended_unix)
        else:
            return 0.0
        return max(0.0, end - self.launched_unix) / 3600


@dataclass(frozen=True)
class Cost:
    usd: float  # so far, at catalog prices
    usd_per_hour: float  # of the instances billing now
    unpriced: tuple[str, ...] = ()  # "p5.48xlarge (spot)": no catalog price, left out of both figures


def usd_per_hour(catalog: Any, instance: Instance, region: str) -> float | None:
    """The catalog's $/h of ``instance`` in its market and ``region`` (None: the catalog has no such price)."""

    spot = instance.market == "spot"
    try:
        return group_usd_per_hour(catalog, instance.type, region, on_demand=int(not spot), spot=int(spot))
    except ConfigError:
        return None


@dataclass(frozen=True)
class Fleet:
    name: str
    region: str
    instances: tuple[Instance, ...]

    def _tag(self, key: str) -> str | None:
        return next((i.tags[key] for i in self.instances if i.tags.get(key)), None)

    @property
    def checkpoint_uri(self) -> str | None:
        return self._tag(TAG_CHECKPOINTS)

    @property
    def max_life_h(self) -> float | None:
        try:
            return float(self._tag(TAG_MAX_LIFE) or "")
        except ValueError:
            return None

    @property
    def live(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.live)

    def states(self) -> Counter[str]:
        return Counter(i.state for i in self.instances)

    def types(self, live_only: bool = True) -> Counter[str]:
        return Counter(i.type for i in (self.live if live_only else self.instances))

    def markets(self, live_only: bool = True) -> Counter[str]:
        return Counter(i.market for i in (self.live if live_only else self.instances))

    def age_h(self, at: float) -> float:
        return max(0.0, at - min(i.launched_unix for i in self.instances)) / 3600 if self.instances else 0.0

    def life_ends_unix(self, cap: float | None = None, born_unix: float | None = None) -> float | None:
        """When the fleet stops itself: its life's start (``born_unix``, the nodes' record of the fleet's first launch,
        else the first live instance's launch) + the life cap (its tag, else ``cap``); None: no cap known."""
        cap = self.max_life_h if self.max_life_h is not None else cap
        if cap is None or not self.live:
            return None
        first = min(i.launched_unix for i in self.live)
        return (first if born_unix is None else min(first, born_unix)) + cap * 3600

    def cost(self, catalog: Any, at: float) -> Cost:
        usd = hourly = 0.0
        unpriced: list[str] = []
        for instance in self.instances:
            price = usd_per_hour(catalog, instance, self.region)
            if price is None:
                unpriced.append(f"{instance.type} ({instance.market})")
                continue
            usd += price * instance.hours(at)
            hourly += price if instance.live else 0.0
        return Cost(usd, hourly, tuple(sorted(set(unpriced))))


def find_fleets(ec2: Any, region: str, names: Iterable[str] | None = None) -> list[Fleet]:
    """The fleets in ``region`` (every instance tagged ``srifty:fleet``; ``names``: only these), by name.

    Args:
        ec2: a boto3 EC2 client of ``region``.
    """
    wanted = sorted(set(names or ()))
    flt = [{"Name": f"tag:{TAG_FLEET}", "Values": wanted}] if wanted else [{"Name": "tag-key", "Values": [TAG_FLEET]}]
    by_name: dict[str, list[Instance]] = {}
    for page in ec2.get_paginator("describe_instances").paginate(Filters=flt):
        for reservation in page.get("Reservations", []):
            for data in reservation.get("Instances", []):
                instance = Instance.from_ec2(data)
                by_name.setdefault(instance.tags.get(TAG_FLEET, "?"), []).append(instance)
    return [
        Fleet(name, region, tuple(sorted(found, key=lambda i: (i.launched_unix, i.id))))
        for name, found in sorted(by_name.items())
    ]


def leftover_networks(ec2: Any, region: str, name: str) -> list[str]:
    """What of fleet ``name`` is still in ``region`` after its destroy, outside terraform's state (an apply killed
    with SIGKILL before it saved the state: its VPC stayed, and every such VPC counts against the region's quota of
    five): the VPCs tagged ``srifty:fleet = name``, each as a line with the commands that delete it."""
    lines = []
    flt = [{"Name": f"tag:{TAG_FLEET}", "Values": [name]}]
    for vpc in ec2.describe_vpcs(Filters=flt).get("Vpcs", []):
        vpc_id = vpc["VpcId"]
        lines.append(
            f"VPC {vpc_id} of fleet {name} is still in {region}, outside terraform's state (an apply stopped before it "
            f"saved it). Delete what is in it, then it: aws ec2 describe-subnets --filters Name=vpc-id,Values={vpc_id} "
            f"--region {region} (delete-subnet each; detach-internet-gateway and delete-internet-gateway; "
            f"delete-security-group but the default), then aws ec2 delete-vpc --vpc-id {vpc_id} --region {region}"
        )
    return lines


def read_network(s3: Any, checkpoint_uri: str, fleet: str) -> list[dict[str, Any]]:
    """The EFA nodes' records of the network NCCL chose (``network/<fleet>-<instance>.json``, written by user_data
    once training runs): ``instance_id``, ``efa_expected``, ``efa_in_use``, ``nccl_network``, ``note``. A record that
    does not read is left out."""

    bucket, prefix = split_s3(checkpoint_uri)
    folder = f"{prefix}network/{fleet}-"
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
        for item in page.get("Contents", []):
            try:
                record = json.loads(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
            except (ValueError, s3.exceptions.NoSuchKey):
                continue
            if isinstance(record, dict) and isinstance(record.get("efa_in_use"), bool):
                out.append(record)
    return out


def network_note(records: list[dict[str, Any]]) -> str | None:
    """``srifty status``'s line on EFA: None when every EFA node's NCCL uses it (or no record says otherwise)."""
    off = [r for r in records if r.get("efa_expected") and not r.get("efa_in_use")]
    if not off:
        return None
    why = sorted({str(r.get("note") or f"NCCL chose {r.get('nccl_network') or 'another network'}") for r in off})
    return (
        f"EFA assumed by the prediction, not in use on {len(off)} of {len(records)} node(s): {'; '.join(why)} "
        "(the predicted time assumed EFA's bandwidth: expect slower steps)"
    )


def read_heartbeat(s3: Any, checkpoint_uri: str) -> Any:
    """The launcher's ``HEARTBEAT.json`` in the checkpoint folder (a :class:`~lightning_srifty.protocol.Heartbeat`),
    or None when there is none; a record that cannot be read is None too (``srifty status`` says "unreadable")."""

    bucket, prefix = split_s3(checkpoint_uri)
    try:
        body = s3.get_object(Bucket=bucket, Key=prefix + protocol.HEARTBEAT)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer fields: the age is all that is shown
        return protocol.parse(protocol.Heartbeat, json.loads(body), f"{checkpoint_uri}{protocol.HEARTBEAT}")


LIFE = "life/{name}.json"  # the nodes' record of the fleet's life (the module's user_data and watchdog write it)


def read_life_born(s3: Any, checkpoint_uri: str, name: str) -> float | None:
    """When the fleet's life began (``born_unix`` of its nodes' record ``life/<name>.json``, which the life cap counts
    from), or None: no record, one that has ended (instances up now belong to a later life) or one that cannot be
    read."""
    bucket, prefix = split_s3(checkpoint_uri)
    try:
        record = json.loads(s3.get_object(Bucket=bucket, Key=prefix + LIFE.format(name=name))["Body"].read())
        born = float(record["born_unix"])
    except s3.exceptions.NoSuchKey:
        return None
    except (ValueError, KeyError, TypeError):
        return None
    return born if record.get("ended_unix") is None and math.isfinite(born) else None


def summary(fleet: Fleet, cost: Cost, at: float) -> str:
    """One line on what a fleet cost, for ``srifty down``."""
    if not fleet.instances:
        return f"Fleet {fleet.name}: no instances found in {fleet.region}, so no cost to report."
    kinds = ", ".join(f"{n} x {t}" for t, n in sorted(fleet.types(live_only=False).items()))
    markets = ", ".join(f"{n} {m}" for m, n in sorted(fleet.markets(live_only=False).items()))
    unpriced = f"; not priced (not in the catalog): {', '.join(cost.unpriced)}" if cost.unpriced else ""
    ran = sum(i.hours(at) for i in fleet.instances)  # billed time, not the time since the first launch (#37 L)
    return (
        f"Fleet {fleet.name} cost about ${cost.usd:,.2f} at catalog prices: {kinds} ({markets}) in {fleet.region}, "
        f"{_duration(ran)} of instance time in all (the first launched {_duration(fleet.age_h(at))} ago){unpriced}."
    )


def _duration(hours: float) -> str:
    return f"{hours:.2f} h" if hours >= 1 else f"{hours * 60:.1f} min"


# --- a root module written by srifty terraform, and the AWS clients ---------------------------------------------------


@dataclass(frozen=True)
class Root:
    """What ``srifty status`` / ``logs`` / ``down`` read from a root module folder (``--dir``)."""

    path: str
    name: str
    region: str
    endpoint: str | None  # aws_endpoint (a local endpoint such as moto's)
    checkpoint_uri: str | None  # None: the module creates the bucket and nothing was applied yet
    max_life_h: float | None = None

    @classmethod
    def load(cls, folder: str) -> Root:
        """Read ``folder``'s values; the checkpoint folder from its bucket, else from the outputs of its state.

        Raises:
            ProvisionError: ``folder`` was not written by ``srifty terraform``.
        """

        values = check_folder(Path(folder))
        checkpoints = values.get("checkpoints") or {}
        uri = None
        if checkpoints.get("bucket") and not checkpoints.get("create_bucket", False):
            uri = f"s3://{checkpoints['bucket']}/{checkpoints.get('prefix', '')}"
        where = uri or _state_uri(Path(folder))
        return cls(
            str(folder), values["name"], values["region"], values.get("aws_endpoint"), where, values.get("max_life_h")
        )


def _state_uri(folder: Any) -> str | None:
    """The root's output ``fleet.checkpoint_uri`` from its local state file, else from `terraform output` (a remote
    backend); None when neither has it (nothing applied, no terraform)."""

    try:
        outputs = json.loads((folder / "terraform.tfstate").read_text()).get("outputs", {})
        uri = (outputs.get("fleet", {}).get("value") or {}).get("checkpoint_uri")
        if uri:
            return str(uri)
    except (OSError, ValueError, AttributeError):
        pass
    if shutil.which("terraform") is None or not (folder / ".terraform").is_dir():
        return None

    try:
        return (terraform_outputs(folder).get("fleet") or {}).get("checkpoint_uri")
    except (ProvisionError, ValueError):
        return None
