"""``srifty terraform``: a root module for the chosen fleet of a plan.

What is written (``--out infra/``):

    infra/
      versions.tf, main.tf, variables.tf, outputs.tf   copied verbatim from terraform/root (no templating)
      modules/training_fleet/                           a copy of the reviewed module, pinned with the root
      srifty.auto.tfvars.json                           every value, from the plan (sorted keys: diffable)
      .srifty.json                                      what generated the folder (plan hash, choice, files)
      README.md                                         the fleet, its prediction, what every node runs, warnings,
                                                        the commands (provision.terraform.summary.root_readme)

Python never writes HCL: the generated files are JSON and the README. Re-running with the same inputs writes the
same bytes; a folder that exists, is not empty, and was not written by this generator is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from lightning_srifty import protocol
from lightning_srifty.console import fmt_hours, fmt_life
from lightning_srifty.provision.aws import ZONE_ID, plain_http_upload  # ZONE_ID: use1-az1
from lightning_srifty.provision.terraform import cuda
from lightning_srifty.provision.terraform.command import (
    OPTIONS_OWNER,
    ROOT_VOLUME_GB,
    check_ami,
    check_bucket_name,
    check_data,
    check_key_name,
    check_kms_keys,
    check_prefix,
    check_resume_from,
    check_secret_env,
    check_secret_kms_keys,
    train_argv,
)
from lightning_srifty.provision.terraform.glue import command_glue, unregistered_strategy_note
from lightning_srifty.provision.terraform.money import check_entry, check_limits, fleet_spot_prices, group_usd_per_hour
from lightning_srifty.provision.terraform.run_length import run_length_notes
from lightning_srifty.provision.terraform.snapshot import (
    DEFAULT_MAX_MB,
    ENVIRONMENT_FILE,
    GENERATED_MARKER,
    Snapshot,
    build_snapshot,
    environment_spec,
    load_snapshot,
    read_member,
)
from lightning_srifty.provision.terraform.summary import README, root_readme
from predictor.catalog import torch_builds
from predictor.catalog.catalog import Catalog
from predictor.catalog.zones import group_spot_prices
from predictor.documents.atomic import atomic_write_bytes, atomic_write_text
from predictor.documents.checks import Setting, check_settings, suggest
from predictor.documents.plan import Plan, PlanEntry, check_choice
from predictor.documents.profile import Profile, load_profile
from predictor.exceptions import ConfigError, ProvisionError, did_you_mean
from predictor.runs.deadline import planned_interval_s
from predictor.runs.spot import shutdown_grace_s

MARKER = GENERATED_MARKER
CODE_DIR = "code"  # the snapshot's folder in the root module
TFVARS = "srifty.auto.tfvars.json"
MAX_LIFE_H = 720.0  # the module's upper bound for max_life_h (30 days)
MAX_WEIGHT = 999  # an Auto Scaling group's largest weighted_capacity
# families whose instances support cluster placement groups (current-generation GPU types all do)
# SSH: the union of --ssh-cidr blocks may cover at most a /8 worth of IPv4 addresses without --allow-wide-ssh
SSH_MAX_ADDRESSES = 2**24
# AWS tags (letters, digits, spaces, _ . : / = + - @): https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html
TAG_KEY_MAX, TAG_VALUE_MAX = 128, 256
CLUSTER_FAMILIES = re.compile(r"^(p3|p3dn|p4d|p4de|p5|p5e|p5en|p6|g4dn|g5|g6|g6e|gr6|g4ad|g5g|trn1|trn2|inf2|dl1)\.")


def terraform_root() -> Path:
    """The reviewed Terraform (``root/`` and ``modules/training_fleet``): the copy an installed wheel carries
    (``lightning_srifty/provision/_terraform``, written by setup.py at build time), else the checkout's
    ``terraform/`` (source tree, editable install)."""
    provision = Path(__file__).resolve().parents[1]  # lightning_srifty/provision
    candidates = (provision / "_terraform", provision.parents[1] / "terraform")
    for root in candidates:
        if (root / "modules" / "training_fleet" / "main.tf").is_file() and (root / "root" / "main.tf").is_file():
            return root
    raise ProvisionError(
        f"The Terraform module is in neither {candidates[0]} (an installed package) nor {candidates[1]} (a "
        "checkout): this installation is incomplete. Reinstall lightning-srifty (pip install --force-reinstall "
        "lightning-srifty) or install it from a checkout (pip install -e .)."
    )


@dataclass(frozen=True)
class Options:
    name: str | None = None
    region: str | None = None
    ssh_cidr: tuple[str, ...] = ()
    train_command: str = "train.py"  # what torchrun starts; "python train.py" and "python -m pkg" are accepted
    setup_command: str = ""
    resume_from: str | None = None
    mode: str = "asg"
    ami: str | None = None
    key_name: str | None = None
    vpc_id: str | None = None
    subnet_ids: tuple[str, ...] = ()
    bucket: str | None = None
    root_volume_gb: int = 200
    aws_endpoint: str | None = None
    checkpoint_prefix: str | None = None  # default checkpoints/<name>/; srifty launch shares one across fleets
    handover: bool = False  # instances wait for HANDOVER-<name>.json (srifty launch); the watchdog reads HEARTBEAT.json
    max_life_h: float | None = None  # the fleet's life cap; default: default_max_life_h
    # a job that shows no sign of life this long after its first step hangs: the node kills it and leaves to be
    # replaced (the module's watchdog.stall_s; None: off; under srifty launch the launcher watches instead)
    stall_timeout_s: float | None = protocol.STALL_TIMEOUT_S
    # once the job's training has finished, a script silent this long (a test, an export, an upload that never ends) is
    # killed and the fleet ends (the module's watchdog.after_fit_s, in the same watch; None: no limit)
    after_fit_timeout_s: float | None = protocol.AFTER_FIT_TIMEOUT_S
    max_instances: int | None = None  # guard; default: the plan's constraints.max_instances
    max_hourly_usd: float | None = None  # guard; default: the plan's constraints.max_hourly_usd (None: no limit)
    allow_wide_ssh: bool = False  # let --ssh-cidr blocks cover more than a /8 worth of addresses (never 0.0.0.0/0)
    ssm_session: bool = False  # let the instances register with SSM Session Manager (off: no SSM permission at all)
    secret_env: tuple[str, ...] = ()  # NAME=ssm:/param or NAME=secretsmanager:id, read by the instances at boot
    secret_kms_keys: tuple[str, ...] = ()  # the customer-managed KMS keys those are encrypted with
    # training data the instances read, read-only: NAME=s3://bucket/prefix/ the job reads from S3 (data) or every node
    # copies to its disk first (data_copy), and the KMS keys of those buckets
    data: tuple[str, ...] = ()
    data_copy: tuple[str, ...] = ()
    data_kms_keys: tuple[str, ...] = ()
    # the code and environment the nodes run (issue #22): the folder snapshotted (None: nothing is delivered, the
    # setup command must), its requirements file (relative; default requirements.txt when there is one), the package
    # index and extra indexes pip uses on the nodes, an interpreter of the image whose packages the node's
    # environment may reuse, and the snapshot's size bound
    code: str | None = None
    image: str | None = None  # a container image the job runs in (docker run with the GPUs and EFA), not a venv
    requirements: str | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    base_python: str | None = None
    max_code_mb: float = DEFAULT_MAX_MB
    include_secrets: tuple[str, ...] = ()  # credential files (.env, keys) packed all the same, by path in the code
    any_model: bool = False  # the plan's model may differ from the one the code's own profile measured
    code_leave_out: tuple[str, ...] = ()  # folders inside code never packed (srifty launch's workdir)
    aws_max_retries: int | None = None  # the AWS SDK's retries of a failed call (None: the provider's 25)
    availability_zone: str | None = None  # the subnet's zone (default: the zone of the plan's spot price)
    snapshot: str | None = None  # a snapshot packed before (srifty launch: once for every fleet of the run)

    # the numbers and choices, declared once (predictor.documents.checks.Setting), checked when the options are made:
    # the module's own bounds (variables.tf), and srifty terraform names their flags
    SETTINGS: ClassVar[dict[str, Setting]] = {
        "mode": Setting("choice", choices=("asg", "fleet")),
        "root_volume_gb": Setting(
            "int",
            minimum=ROOT_VOLUME_GB[0],
            maximum=ROOT_VOLUME_GB[1],
            fix="The default, 200, holds the Deep Learning AMI (75 GiB) and a training environment.",
        ),
        "max_life_h": Setting("number", minimum=0.25, maximum=MAX_LIFE_H, optional=True),
        "stall_timeout_s": Setting("number", minimum=60, maximum=86400, optional=True),
        "after_fit_timeout_s": Setting("number", minimum=60, maximum=86400, optional=True),
        "max_instances": Setting("int", minimum=1, optional=True),
        "max_hourly_usd": Setting("number", minimum=0, exclusive=True, optional=True),
        "max_code_mb": Setting("number", minimum=0, exclusive=True),
        "aws_max_retries": Setting("int", minimum=0, optional=True),
    }

    def __post_init__(self) -> None:
        check_settings(OPTIONS_OWNER, self.SETTINGS, {f.name: getattr(self, f.name) for f in fields(self)})


_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$")
# the checkpoint bucket the module creates is "<name>-checkpoints-<12-digit account id>", and "bucket names must be
# between 3 (min) and 63 (max) characters long" (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
NAME_MAX = 40
BUCKET_SUFFIX = len("-checkpoints-") + 12
NAME_MAX_OWN_BUCKET = 63 - BUCKET_SUFFIX


def default_name(plan: Plan, choice: int, most: int = NAME_MAX) -> str:
    """``srifty-<model>-<choice>-<the plan's digest>``, the model cut to keep it within ``most`` characters."""
    digest = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()[:6]
    tail = f"-{choice}-{digest}"
    room = max(1, most - len("srifty-") - len(tail))
    base = re.sub(r"[^a-z0-9-]+", "-", (plan.model or "run").lower()).strip("-")[:room] or "run"
    return f"srifty-{base}{tail}"


def default_max_life_h(entry: PlanEntry) -> float:
    """The life cap for a fleet (:meth:`~predictor.documents.plan.PlanEntry.life_cap_h`: the later of the predicted
    hours x 1.5 and the time's 99th percentile, + 1 h), rounded up to a minute, within the module's 0.25-720."""
    hours = entry.life_cap_h()
    hours = hours if math.isfinite(hours) else MAX_LIFE_H
    return min(MAX_LIFE_H, max(0.25, math.ceil(hours * 60) / 60))


LONG_CAP = 4.0  # a default life cap this many times the predicted time (and 2 h over it) is said, with its worst case


def _life_cap_notes(entry: PlanEntry, options: Options, values: dict[str, Any]) -> list[str]:
    """The default life cap, where the prediction's wide interval makes it many times the predicted time: an infra
    team's 22-minute fleet ($1.37) was capped at 90 h ($340 at its price, should its job never end), from a CPU
    profile's interval. Said with the bound's worst case and the flag that sets it; a cap the user gave is theirs."""
    cap, time_h = float(values["max_life_h"]), entry.time_h
    if options.max_life_h is not None or not time_h or cap < max(LONG_CAP * time_h, time_h + 2.0):
        return []
    lo, hi = entry.time_range_h()
    return [
        f"the fleet's life cap is {fmt_life(cap)}, {cap / time_h:,.0f} times the predicted {fmt_hours(time_h)}, "
        f"because the prediction's 80% interval is wide ({fmt_hours(lo)} to {fmt_hours(hi)}; the cap is its 99th "
        f"percentile, + 1 h): a job that never ends would bill up to ${cap * entry.usd_per_hour:,.0f} at "
        f"${entry.usd_per_hour:,.2f}/h. Set --max-life-h to bound it (e.g. --max-life-h "
        f"{max(math.ceil(hi * 1.5 + 1), 1)}), or profile on a GPU for a narrower interval"
    ]


_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:@-]{0,254}$", re.I)


def check_container_image(image: str) -> str:
    """``image`` when it reads as a container image reference (``registry/name:tag`` or ``name@sha256:...``).

    Raises:
        ConfigError: naming the value and the form expected.
    """
    if not isinstance(image, str) or not _IMAGE.match(image) or ".." in image or "//" in image:
        raise ConfigError.between(
            "{image} {given!r} is not a container image reference: give registry/name:tag or name@sha256:digest, "
            "e.g. nvcr.io/nvidia/pytorch:25.01-py3.",
            parameter="image",
            value=image,
            given=image,
        )
    return image


def priced_zone(catalog: Catalog, entry: PlanEntry, region: str) -> str | None:
    """The availability zone whose spot prices the plan used (:mod:`predictor.catalog.zones`: the zone where the
    fleet's spot instances cost least), so that the subnet is where the price is. None for an on-demand fleet (one
    price per region) or spot prices measured in no zone."""
    groups = [g for g in entry.groups if g.instance_type in catalog]
    if not any(g.spot for g in groups):
        return None
    zone, _ = group_spot_prices([catalog.get(g.instance_type) for g in groups], [g.spot for g in groups], region)
    return zone


def _worst_fill(
    groups: list[dict[str, Any]], catalog: Catalog, region: str, spot_units: float
) -> tuple[int, str, float]:
    """(instances, type, $/h) of the most instances a mixed group's spot units may take (all of the type of the
    smallest weight), and the dearest fill, each type at its price in the fleet's zone, the one its spot part was
    priced in (:mod:`predictor.catalog.zones`; a type not offered there at its cheapest zone's)."""
    fills = [(math.ceil(spot_units / g["weighted_capacity"]), g["instance_type"]) for g in groups]
    most, most_type = max(fills)
    in_zone = fleet_spot_prices(catalog, [(g["instance_type"], g["spot"]) for g in groups], region)
    dearest = max(
        group_usd_per_hour(catalog, t, region, 0, n, "region", usd if usd == usd else None)  # nan: not there
        for (n, t), usd in zip(fills, in_zone)
    )
    return most, most_type, dearest


def weights(entry: PlanEntry) -> tuple[list[int], float]:
    """Integer weighted capacities (1..999) proportional to each group's predicted throughput per instance, and the
    samples/s one unit stands for."""
    per_instance = [g.throughput_samples_s / g.count for g in entry.groups]
    unit = max(min(per_instance) / 100.0, max(per_instance) / MAX_WEIGHT)
    return [max(1, min(MAX_WEIGHT, round(t / unit))) for t in per_instance], unit


def tfvars(
    plan: Plan, choice: int, options: Options, catalog: Catalog | None = None, code: Snapshot | None = None
) -> dict[str, Any]:
    """The values of the root module for ``plan.entries[choice]`` (``code``: the snapshot the nodes run).

    The steps, each refusing what it cannot use with the fix: the fleet and the run's name (:func:`_chosen`), what
    reaches the instances' shell and network (:func:`_checked_access`), the guards on money and life
    (:func:`_guards`), the Auto Scaling groups (:func:`_groups`), the network and its zone (:func:`_network`), the
    checkpoints (:func:`_checkpoints`) and the training job (:func:`_train`); then the values, with the predicted
    figures and the tags (:func:`_tags`).
    """
    entry, name = _chosen(plan, choice, options)
    ssh_cidr, secrets, argv = _checked_access(options)
    catalog = catalog or Catalog.load()
    if plan.constraints.transport == "tcp":  # ranked for a cluster without EFA: built without it, as priced
        catalog = catalog.over_tcp()
    check_entry(plan, choice, catalog)  # the plan's counts, markets and $/h are the catalog's, or it is refused
    region = _region(options, entry, choice, catalog)
    usd_per_hour, max_instances, max_hourly, max_life_h = _guards(plan, entry, options, catalog, region)
    groups, unit = _groups(entry, options, catalog)
    if options.mode == "asg" and on_demand_mix(entry):  # one group would buy its first type alone: exact counts
        options = dataclasses.replace(options, mode="fleet")
    if options.mode == "asg" and len(groups) > 1:  # a mix the group's units may fill otherwise than planned
        check_mixed_group(entry, groups, catalog, region, max_instances, max_hourly)
    network = _network(entry, options, catalog, region)
    prefix, checkpoints = _checkpoints(options, name)
    values: dict[str, Any] = {
        "region": region,
        "name": name,
        "network": network,
        "ssh_cidr_blocks": ssh_cidr,
        "allow_wide_ssh": options.allow_wide_ssh,
        "enable_ssm": options.ssm_session,
        "secrets": secrets,
        **({"secret_kms_key_arns": keys} if (keys := check_secret_kms_keys(options.secret_kms_keys, secrets)) else {}),
        **_data(options, secrets),
        "groups": groups,
        "capacity": _capacity(entry, options, groups),
        "ami": {"id": options.ami} if options.ami else {},
        "root_volume_gb": options.root_volume_gb,
        "checkpoints": checkpoints,
        "train": _train(entry, options, argv, code, planned_interval_s(plan, choice)),
        "max_life_h": max_life_h,
        "watchdog": _watchdog(plan, options),
        "limits": {"max_instances": max_instances, "max_hourly_usd": max_hourly},
        "predicted": _predicted(entry, usd_per_hour, unit),
        "tags": _tags(plan, choice, entry, options, prefix, max_life_h),
    }
    if options.key_name:
        values["key_name"] = options.key_name
    if options.aws_endpoint:
        values["aws_endpoint"] = options.aws_endpoint
    if options.aws_max_retries is not None:
        values["aws_max_retries"] = options.aws_max_retries
    return values


def _region(options: Options, entry: PlanEntry, choice: int, catalog: Catalog) -> str:
    """The fleet's region: the entry's, which its prices and times are of. Another ``--region`` is refused by name
    (an unknown one with the catalog's, one the plan was not ranked in with the way to rank it there): a trial's
    read "the plan is stale or was edited"."""
    if not options.region or options.region == entry.region:
        return entry.region
    catalog.check_region(options.region, "region")
    raise ConfigError.between(
        "The plan's entry {choice} was ranked in {ranked} ({region} is {given!r}): its prices, times and capacity are "
        "that region's. Rank the plan again with {given} among its regions, or leave {region} out.",
        parameter="region",
        value=options.region,
        choice=choice,
        ranked=entry.region,
        given=options.region,
    )


def _capacity(entry: PlanEntry, options: Options, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """How the Auto Scaling groups fill: the mode, spot by price and capacity, the planned on-demand instances as the
    base, and a cluster placement group for a multi-node fleet of one type of a family that supports it."""
    placement = (
        entry.nodes > 1 and len(entry.groups) == 1 and bool(CLUSTER_FAMILIES.match(entry.groups[0].instance_type))
    )
    return {
        "mode": options.mode,
        "spot_allocation_strategy": "price-capacity-optimized",
        "on_demand_base_capacity": sum(g["on_demand"] * g["weighted_capacity"] for g in groups),
        "on_demand_percentage_above_base": 0,
        "placement_group": placement,
    }


def on_demand_mix(entry: PlanEntry) -> bool:
    """A fleet of two or more types all on demand: an Auto Scaling group would give its whole base to its first type,
    and nothing needs replacing, so it is written as EC2 Fleets of the exact counts (``capacity.mode`` fleet)."""
    return len(entry.groups) > 1 and all(g.spot == 0 for g in entry.groups)


def check_mixed_group(
    entry: PlanEntry,
    groups: list[dict[str, Any]],
    catalog: Catalog,
    region: str,
    max_instances: int | None,
    max_hourly: float | None,
) -> None:
    """Refuse a mix one Auto Scaling group cannot buy as planned, or may fill past the guards. Its on-demand base goes
    to its first type ("prioritized", AWS's Auto Scaling user guide, "Allocation strategies for multiple instance
    types"; a trial: 3 x g6.xlarge for g6.xlarge + g5.xlarge on demand); its spot units to any of its types, up to
    ceil(spot units / the smallest weight) instances, which must fit the guards (a trial: 10 x g6.4xlarge, guard 3).

    Raises:
        ConfigError: on-demand instances of more than one type, or a worst fill past a guard, with the fixes.
    """
    od_types = [g["instance_type"] for g in groups if g["on_demand"]]
    if len(od_types) > 1:
        raise ConfigError.between(
            "Fleet {fleet} buys on-demand instances of {types}, but an Auto Scaling group gives its on-demand base "
            "to its first type (AWS's prioritized allocation): it would launch {first} alone for all of it, another "
            "fleet at another price. Choose an entry whose on-demand part is one type, or {mode} (EC2 Fleet: the "
            "exact counts, but no replacement after a spot interruption).",
            parameter="mode",
            value="asg",
            fleet=entry.fleet,
            types=" and ".join(od_types),
            first=od_types[0],
            mode="--mode fleet",
        )
    spot_units = sum(g["spot"] * g["weighted_capacity"] for g in groups)
    if not spot_units:
        return
    od = [(g["instance_type"], g["on_demand"]) for g in groups if g["on_demand"]]
    od_usd = sum(group_usd_per_hour(catalog, t, region, n, 0, "region") for t, n in od)
    most, most_type, fill_usd = _worst_fill(groups, catalog, region, spot_units)
    worst_usd = od_usd + fill_usd
    worst_nodes = sum(n for _, n in od) + most
    too_many = max_instances is not None and worst_nodes > max_instances
    if too_many or (max_hourly is not None and worst_usd > max_hourly + 1e-9):
        raise ConfigError.between(
            "Fleet {fleet} is one Auto Scaling group whose {spot} spot capacity units AWS may fill with any of its "
            "types: at worst {most} x {most_type} ({nodes} instances in all, ${usd:,.2f}/h), past the guards "
            "({max_instances} = {limit_n}, {max_hourly_usd} = {limit_usd}). Raise the guard, choose a fleet of one "
            "type, or {mode} (EC2 Fleet: the exact counts, but no replacement after a spot interruption).",
            parameter="max_instances" if too_many else "max_hourly_usd",
            value=worst_nodes,
            fleet=entry.fleet,
            spot=spot_units,
            most=most,
            most_type=most_type,
            nodes=worst_nodes,
            usd=worst_usd,
            limit_n=max_instances,
            limit_usd="none" if max_hourly is None else f"${max_hourly:,.2f}/h",
            mode="--mode fleet",
        )


def _predicted(entry: PlanEntry, usd_per_hour: float, unit: float) -> dict[str, float]:
    """The plan's figures for the fleet, as the module's outputs and tags carry them."""
    return {
        "throughput_samples_s": round(entry.throughput_samples_s, 6),
        "usd_per_hour": round(usd_per_hour, 6),  # the catalog's, in the region bought
        "time_h": round(entry.time_h, 6),
        "cost_usd": round(entry.cost_usd, 6),
        "samples_per_capacity_unit": round(unit, 6),
    }


def _chosen(plan: Plan, choice: int, options: Options) -> tuple[PlanEntry, str]:
    """The plan's entry ``choice`` and the run's name (``--name``, else :func:`default_name`).

    Raises:
        ConfigError: a choice out of the plan's range, or a name that cannot be part of a bucket name.
    """
    check_choice(plan, choice)
    most = NAME_MAX if options.bucket else NAME_MAX_OWN_BUCKET
    name = options.name or default_name(plan, choice, most)
    if not _NAME.match(name):
        raise ConfigError.between(
            "The run name {given!r} ({name}) must be 3 to 40 characters of lower-case letters, digits and hyphens (it "
            "becomes part of a bucket name), e.g. resnet-run-1.",
            parameter="name",
            value=name,
            given=name,
        )
    if len(name) > most:
        raise ConfigError.between(
            "The run name {given!r} ({name}) is {length} characters, but the checkpoint bucket the fleet creates is "
            "named {given}-checkpoints-<account id>, {bucket_length} characters, and S3 bucket names are at most 63: "
            "give a name of at most {most} characters, or an existing bucket ({bucket}).",
            parameter="name",
            value=name,
            given=name,
            length=len(name),
            bucket_length=len(name) + BUCKET_SUFFIX,
            most=most,
        )
    return plan.entries[choice], name


def _checked_access(options: Options) -> tuple[list[str], list[dict[str, str]], list[str]]:
    """(the SSH CIDR blocks, the secrets, the training command's argv), after refusing what would reach the
    instances' launch template and shell unchecked (issue #23 item 12): the mode, a half-given network, a bad AMI,
    key name, resume URI or root volume, and a custom AMI without a setup command.

    Raises:
        ConfigError: naming the option and the fix.
    """
    ssh_cidr = ssh_cidr_blocks(options.ssh_cidr, options.allow_wide_ssh)
    secrets = check_secret_env(options.secret_env)
    if bool(options.vpc_id) != bool(options.subnet_ids):
        raise ConfigError.between(
            "Give both {vpc_id} and {subnet_ids} (an existing network), or neither (a minimal VPC is created).",
            parameter="vpc_id",
            value=options.vpc_id,
        )
    check_network_ids(options.vpc_id, options.subnet_ids)
    argv = train_argv(options.train_command)
    for value, check in (
        (options.ami, check_ami),
        (options.key_name, check_key_name),
        (options.resume_from, check_resume_from),
    ):
        if value is not None:
            check(value)
    if options.ami and not options.setup_command.strip():
        raise ConfigError.between(
            "{ami} {given} is a custom image: srifty cannot know that it has PyTorch and torchrun (the default Deep "
            "Learning AMI with PyTorch does). Give {setup_command} true if the image has Python 3 and the NVIDIA "
            "driver (the code snapshot installs the profiled torch and lightning), or a command that prepares it.",
            parameter="setup_command",
            value=options.setup_command,
            given=options.ami,
        )
    return ssh_cidr, secrets, argv


def _data(options: Options, secrets: list[dict[str, str]]) -> dict[str, Any]:
    """The module's ``data`` and ``data_kms_key_arns`` values (none when no data is read), checked.

    Raises:
        ConfigError: a bad folder, name or key (:func:`check_data`, :func:`check_kms_keys`).
    """
    data = check_data(options.data, options.data_copy, taken=tuple(s["name"] for s in secrets))
    keys = check_kms_keys(options.data_kms_keys, data)
    return {"data": data, "data_kms_key_arns": keys} if data else {}


def _guards(
    plan: Plan, entry: PlanEntry, options: Options, catalog: Catalog, region: str
) -> tuple[float, Any, Any, float]:
    """(the fleet's $/h in ``region``, max_instances, max_hourly_usd, max_life_h): the guards the module enforces,
    from the options or else the plan's constraints (the life cap: :func:`default_max_life_h`), checked against the
    fleet (:func:`check_limits`).

    Raises:
        ConfigError: a guard that is not a positive (whole, for instances) number, a life cap out of range.
        ProvisionError / ConfigError: as :func:`check_limits` and :func:`group_usd_per_hour` do.
    """
    usd_per_hour = sum(
        group_usd_per_hour(catalog, g.instance_type, region, g.on_demand, g.spot, "region") for g in entry.groups
    )
    max_instances = options.max_instances if options.max_instances is not None else plan.constraints.max_instances
    max_hourly = options.max_hourly_usd if options.max_hourly_usd is not None else plan.constraints.max_hourly_usd
    check_limits(entry.nodes, usd_per_hour, max_instances, max_hourly)
    max_life_h = options.max_life_h if options.max_life_h is not None else default_max_life_h(entry)
    return usd_per_hour, max_instances, max_hourly, max_life_h


def _groups(entry: PlanEntry, options: Options, catalog: Catalog) -> tuple[list[dict[str, Any]], float]:
    """The module's groups (one per instance type, weighted by predicted throughput: :func:`weights`, with EFA and
    one network interface per card on multi-node fleets), and the samples/s one capacity unit stands for.

    Raises:
        ConfigError: --ami given for a fleet that mixes architectures.
    """
    w, unit = weights(entry)
    groups = []
    multi_node = entry.nodes > 1
    # NCCL needs one transport across the fleet: EFA only where every node has it (a mix with a type without EFA is
    # priced over sockets, and a node on EFA beside nodes on sockets would not meet them, a trial)
    all_efa = multi_node and all(g.instance_type in catalog and catalog.get(g.instance_type).efa for g in entry.groups)
    for g, weight in zip(entry.groups, w):
        it = catalog.get(g.instance_type) if g.instance_type in catalog else None
        efa = bool(it and it.efa and all_efa)
        groups.append(
            {
                "instance_type": g.instance_type,
                "on_demand": g.on_demand,
                "spot": g.spot,
                "gpus_per_instance": g.gpus_per_instance,
                "weighted_capacity": weight,
                "arch": it.arch if it else "x86_64",
                "efa": efa,
                # one EFA interface per network card: the bandwidth the predictor's inter-node link assumes
                "network_interfaces": it.network_interfaces(efa) if it else 1,
            }
        )
    # AWS fills an Auto Scaling group's on-demand base with its first override ("prioritized"): the type that carries
    # the plan's on-demand instances goes first (check_mixed_group refuses a base over two types)
    groups.sort(key=lambda group: group["on_demand"] == 0)
    arches = sorted({str(g["arch"]) for g in groups})
    if options.ami and len(arches) > 1:
        raise ConfigError.between(
            "{ami} {given} is one image, but fleet {fleet} mixes {arches} instance types: leave {ami} out (each "
            "architecture gets its Deep Learning AMI) or choose a fleet of one architecture.",
            parameter="ami",
            value=options.ami,
            given=options.ami,
            fleet=entry.fleet,
            arches=" and ".join(arches),
        )
    return groups, unit


# EC2's resource IDs: the prefix and 8 or 17 hexadecimal characters (EC2 User Guide, "Resource IDs":
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html); the module checks the same
_RESOURCE_ID = {"vpc_id": re.compile(r"^vpc-([0-9a-f]{8}|[0-9a-f]{17})$"),
                "subnet_ids": re.compile(r"^subnet-([0-9a-f]{8}|[0-9a-f]{17})$")}  # fmt: skip


def check_network_ids(vpc_id: str | None, subnet_ids: tuple[str, ...] | list[str]) -> None:
    """An existing network's IDs as EC2 writes them (an infra team's --vpc-id myvpc and --subnet-ids subnet_bad went
    through srifty terraform, the module and terraform plan, to fail at the apply's first call).

    Raises:
        ConfigError: the first ID that is not one, with an example and where to find them.
    """
    given = [("vpc_id", vpc_id)] if vpc_id else []
    for parameter, value in [*given, *(("subnet_ids", s) for s in subnet_ids)]:
        if not _RESOURCE_ID[parameter].match(value):
            kind, example = (
                ("a VPC ID", "vpc-0a1b2c3d4e5f67890")
                if parameter == "vpc_id"
                else ("subnet IDs", "subnet-0a1b2c3d4e5f67890")
            )
            raise ConfigError.between(
                "{" + parameter + "} {given!r} is not " + kind + " (the prefix and 8 or 17 hexadecimal characters, "
                "e.g. {example}): the AWS console's VPC and Subnets pages list them, or aws ec2 describe-subnets.",
                parameter=parameter,
                value=value,
                given=value,
                example=example,
            )


def _network(entry: PlanEntry, options: Options, catalog: Catalog, region: str) -> dict[str, Any]:
    """The network: the VPC and subnets given, or a minimal VPC whose subnet is in --availability-zone, else in the
    zone of the plan's spot price (:func:`priced_zone`).

    Raises:
        ConfigError: a zone with --vpc-id, or a zone that is neither of the region nor a zone ID.
    """
    network: dict[str, Any] = (
        {"create_vpc": False, "vpc_id": options.vpc_id, "subnet_ids": list(options.subnet_ids)}
        if options.vpc_id
        else {"create_vpc": True}
    )
    zone = options.availability_zone or (None if options.vpc_id else priced_zone(catalog, entry, region))
    if zone and options.vpc_id:
        raise ConfigError.between(
            "{availability_zone} places the subnet srifty creates; with {vpc_id}/{subnet_ids} the zone is the one "
            "your subnets are in: leave {availability_zone} out.",
            parameter="availability_zone",
            value=zone,
        )
    if zone:
        if ZONE_ID.match(zone):
            network["availability_zone_id"] = zone
        elif zone.startswith(region) and re.match(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$", zone):
            network["availability_zone"] = zone
        else:
            raise ConfigError.between(
                "{availability_zone} {zone} is neither a zone of the fleet's region {region} (e.g. {region}a) nor a "
                "zone ID (e.g. use1-az1).",
                parameter="availability_zone",
                value=zone,
                zone=zone,
                region=region,
            )
    return network


def _checkpoints(options: Options, name: str) -> tuple[str, dict[str, Any]]:
    """(the checkpoint prefix, the module's checkpoints value): --checkpoint-prefix (default checkpoints/<name>/),
    in --bucket when given, else in a bucket the module creates.

    Raises:
        ConfigError: a prefix or bucket name that could reach a shell (:func:`check_prefix`, :func:`check_bucket_name`).
    """
    prefix = check_prefix(options.checkpoint_prefix or f"checkpoints/{name}/")
    checkpoints: dict[str, Any] = {"prefix": prefix}
    if options.bucket:
        checkpoints.update(create_bucket=False, bucket=check_bucket_name(options.bucket))
    elif plain_http_upload(None, options.aws_endpoint, uploads=True):
        # an emulator over plain http: the new bucket's TLS-only policy would refuse the apply's own uploads (the
        # boot scripts, the code); every AWS endpoint is https, where the policy stays
        checkpoints["tls_only"] = False
    return prefix, checkpoints


def _watchdog(plan: Plan, options: Options) -> dict[str, Any]:
    """The module's watchdog: the launcher's heartbeat (srifty launch), the job's grace after SIGTERM, from the
    watchdog and from torchrun alike (the plan's checkpoint save x 2 + 30 s, so that a leaving save is never cut by
    SIGKILL), the nodes' hang watch and their limit after training (0: off)."""
    return {
        "heartbeat": options.handover,
        "grace_s": shutdown_grace_s(plan.checkpoint_s),
        "stall_s": 0 if options.stall_timeout_s is None else round(options.stall_timeout_s),
        "after_fit_s": 0 if options.after_fit_timeout_s is None else round(options.after_fit_timeout_s),
    }


def _train(
    entry: PlanEntry, options: Options, argv: list[str], code: Snapshot | None, interval_s: float | None
) -> dict[str, Any]:
    """The training job every instance runs: torchrun's argv over the fleet's nodes, the setup command, and where
    given the checkpoint to resume from, the code snapshot, the container image, the handover, and the layout's
    Lightning strategy (exported on every instance; srifty launch's handover carries it too).

    Raises:
        ConfigError: an image that is not a container image reference (:func:`check_container_image`).
    """
    train: dict[str, Any] = {
        "argv": argv,
        "setup_command": options.setup_command,
        "nnodes": entry.nodes,
    }
    if options.resume_from:
        train["resume_from"] = options.resume_from
    if code is not None:
        train["code"] = {"source": f"{CODE_DIR}/{code.path.name}", "sha256": code.sha256}
    if options.image:
        train["image"] = check_container_image(options.image)
    if options.handover:
        train["handover"] = True
    env: dict[str, str] = {}
    if entry.layout is not None and (entry.layout.strategy != "ddp" or entry.layout.lightning_args):
        env[protocol.VARIABLES["strategy"]] = protocol.entry_strategy(entry)
    if not options.handover:  # srifty launch's handover carries its own
        env.update(planned_batches(entry))
        if interval_s:  # the periodic checkpoint (spot or on-demand): SpotPreemption every_s
            env[protocol.VARIABLES["checkpoint_every_s"]] = f"{max(1.0, interval_s):.0f}"
    if env:
        train["env"] = env
    return train


def planned_batches(entry: PlanEntry) -> dict[str, str]:
    """The variables that give a ``srifty terraform`` fleet's job the plan's per-rank batch and accumulation, which
    srifty_auto applies (the same training as profiled); {} for a plan that does not record them.

    On one GPU type (or a mix whose ranks all take the same batch) that is the per-rank list
    (``LaunchEnv.batch_sizes``): any rank order gives every rank a batch its GPU was planned for. On a mix whose
    ranks take different batches the order matters, and torchrun numbers ranks in the order the nodes join its
    rendezvous: the plan's groups go instead (``LaunchEnv.batch_groups``, keyed by instance type), each node's boot
    script exports its own group (``LaunchEnv.node_group``), and the strategies gather every rank's group at set-up
    (:class:`lightning_srifty.strategies.hetero.RankBatches`)."""
    sizes = entry.rank_batches()
    if sizes is None:
        return {}
    sizes_or_groups = protocol.rank_batch_fields(entry, sizes)
    batches = (
        {protocol.VARIABLES["batch_groups"]: protocol.batch_groups_text(sizes_or_groups["batch_groups"])}
        if "batch_groups" in sizes_or_groups
        else {protocol.VARIABLES["batch_sizes"]: ",".join(str(b) for b in sizes)}
    )
    return {
        **batches,
        protocol.VARIABLES["accumulate_grad_batches"]: str(entry.accumulate_grad_batches),
        protocol.VARIABLES["fleet"]: entry.fleet,
    }


def _tags(
    plan: Plan, choice: int, entry: PlanEntry, options: Options, prefix: str, max_life_h: float
) -> dict[str, str]:
    """The tags of every resource (:func:`sanitize_tags`): the plan's choice, fleet, market and model, and for
    `srifty status` without the root folder the life cap and the checkpoint folder when the bucket is given (one the
    module creates is named after the account: the root's output checkpoint_uri)."""
    return sanitize_tags(
        {
            "srifty:plan-choice": str(choice),
            "srifty:fleet-spec": entry.fleet.replace(",", " "),
            "srifty:market": entry.market,
            "srifty:model": plan.model or "unknown",
            "srifty:max-life-h": f"{max_life_h:g}",
            **(
                {"srifty:checkpoints": f"s3://{options.bucket}/{prefix}"}
                if options.bucket and len(f"s3://{options.bucket}/{prefix}") <= TAG_VALUE_MAX
                else {}
            ),
        }
    )


def ssh_cidr_blocks(blocks: tuple[str, ...] | list[str], allow_wide: bool = False) -> list[str]:
    """The --ssh-cidr blocks, parsed strictly as IPv4 networks and collapsed to their canonical union.

    The rule: the union may cover at most a /8 worth of addresses (2**24) unless ``allow_wide`` (--allow-wide-ssh);
    it may never cover every IPv4 address (0.0.0.0/0, or 0.0.0.0/1 + 128.0.0.0/1), whatever the flag.

    Raises:
        ConfigError: naming the block, the rule and the fix.
    """
    networks = []
    for cidr in blocks:
        text = cidr.strip() if isinstance(cidr, str) else cidr
        try:
            if not isinstance(text, str) or "/" not in text:
                raise ValueError("no /prefix length")
            net = ipaddress.IPv4Network(text, strict=True)
        except ValueError as exc:
            raise ConfigError.between(
                "{ssh_cidr} {cidr!r} is not an IPv4 CIDR block with no host bits set ({why}): give the network "
                "address and prefix length, e.g. 203.0.113.7/32 for one address or 203.0.113.0/24.",
                parameter="ssh_cidr",
                value=cidr,
                cidr=cidr,
                why=str(exc),
            ) from None
        networks.append(net)
    union = list(ipaddress.collapse_addresses(networks))
    total = sum(n.num_addresses for n in union)
    if total >= 2**32:
        raise ConfigError.between(
            "{ssh_cidr} {blocks} together cover every IPv4 address (0.0.0.0/0): SSH would be open to the internet. "
            "Give your own networks, e.g. 203.0.113.7/32, or leave {ssh_cidr} out and use {ssm_session}.",
            parameter="ssh_cidr",
            value=list(blocks),
            blocks=", ".join(blocks),
        )
    if total > SSH_MAX_ADDRESSES and not allow_wide:
        raise ConfigError.between(
            "{ssh_cidr} {blocks} together cover {total} IPv4 addresses, more than a /8 ({most}): narrow them to your "
            "own networks (e.g. 203.0.113.7/32), or give {allow_wide_ssh} if that is intended.",
            parameter="ssh_cidr",
            value=list(blocks),
            blocks=", ".join(blocks),
            total=total,
            most=SSH_MAX_ADDRESSES,
        )
    return [str(n) for n in union]


def _tag_text(text: str) -> str:
    return "".join(c if c.isalnum() or c in " _.:/=+-@" else "_" for c in text)


def tag_value(text: str) -> str:
    """``text`` as a tag value AWS accepts (:func:`sanitize_tags`): what a tag read back holds for it."""
    return _tag_text(str(text))[:TAG_VALUE_MAX]


def sanitize_tags(tags: dict[str, str]) -> dict[str, str]:
    """Tags that AWS accepts: keys and values of letters, digits, spaces and ``_ . : / = + - @`` (anything else
    becomes ``_``), keys of 1-128 characters not starting with ``aws:``, values of at most 256."""
    out: dict[str, str] = {}
    for key, value in tags.items():
        k = _tag_text(str(key))[:TAG_KEY_MAX]
        while k.lower().startswith("aws:"):
            k = k[4:]
        if k:
            out[k] = tag_value(str(value))
    return out


@dataclass(frozen=True)
class Generated:
    out: Path
    files: tuple[str, ...]
    values: dict[str, Any]
    changed: bool
    snapshot: Snapshot | None = None
    notes: tuple[str, ...] = ()  # what a user must read before applying (mismatches, missing glue)
    gpus: tuple[tuple[str, str | None], ...] = ()  # each group's GPU: its label and compute capability


def generate(
    plan: Plan,
    out: str | os.PathLike[str],
    *,
    choice: int | None = None,
    options: Options = Options(),
    catalog: Catalog | None = None,
) -> Generated:
    """Write the root module for ``plan.entries[choice]`` (default: the plan's recommendation, ``plan.chosen``) into
    ``out`` (see the module docstring)."""
    choice = plan.chosen if choice is None else choice
    target = Path(out)
    catalog = catalog or Catalog.load()
    tfvars(plan, choice, options, catalog)  # every option checked before any file is packed or written
    gpus = cuda.fleet_gpus([(g.instance_type, g.gpu) for g in plan.entries[choice].groups], catalog)
    notes: list[str] = []
    snapshot = None
    with tempfile.TemporaryDirectory(prefix="srifty-code-") as staging:
        if options.code is not None or options.snapshot is not None:
            snapshot, notes = _snapshot(plan, choice, options, staging, target, gpus)
        else:
            notes = _no_code_notes(options)
        if plain_http_upload(options.bucket, options.aws_endpoint, uploads=True):
            notes.append(
                f"the endpoint {options.aws_endpoint} is plain http (an emulator): the checkpoint bucket the apply "
                "creates is not made TLS-only, which would refuse the apply's own uploads; on AWS (https) it is"
            )
        values = tfvars(plan, choice, options, catalog, code=snapshot)
        entry = plan.entries[choice]
        groups = values.get("groups", [])
        if options.mode == "asg" and values["capacity"]["mode"] == "fleet":
            notes.append(
                f"{entry.fleet} is a mix all on demand: written as EC2 Fleets of the plan's exact counts (mode fleet), "
                "since one Auto Scaling group gives its whole on-demand base to its first type, and on-demand "
                "instances need no replacement"
            )
        if options.ami and groups and all(g.get("efa") for g in groups):  # priced on EFA (a group on TCP: sockets)
            notes.append(
                f"--ami {options.ami} on an EFA fleet: the plan priced its nodes meeting over EFA, through NCCL's "
                "aws-ofi-nccl plugin (the Deep Learning AMI has it); an image without it runs NCCL over TCP sockets, "
                "slower than the plan says (srifty status reports 'EFA assumed by the prediction, not in use')"
            )
        notes += _life_cap_notes(entry, options, values)
        if not options.handover and not planned_batches(entry):
            notes.append(
                f"the plan's per-rank batches ({entry.batch_per_gpu()} per GPU on {entry.fleet}) are not passed to "
                "the job: the plan does not record them (a plan made before they were), so each rank takes the "
                "script's own batch: make the plan again with srifty recommend"
            )
        readme = _page(plan, choice, Generated(target, (), values, False, snapshot, tuple(notes), tuple(gpus)), options)
        written = _write_root(plan, choice, target, values, snapshot, readme)
        notes += [] if readme is not None else [_TEAMS_PAGE.format(page=target / README)]
    if snapshot is not None:
        snapshot = dataclasses.replace(snapshot, path=target / CODE_DIR / snapshot.path.name)  # staging is gone
    return Generated(target, written.files, values, written.changed, snapshot, tuple(notes), tuple(gpus))


def make_snapshot(
    plan: Plan, options: Options, out_dir: str | os.PathLike[str], leave_out: tuple[Path, ...] = ()
) -> tuple[Snapshot, list[str]]:
    """Pack ``options.code`` with the environment the plan was profiled in (``build_snapshot``) into ``out_dir``,
    and the notes on the environment; the requirements file defaults to the code's requirements.txt."""
    code = Path(options.code or ".")
    requirements = options.requirements
    if requirements is None and (code / "requirements.txt").is_file():
        requirements = "requirements.txt"
    spec, notes = environment_spec(
        plan.software,
        requirements=requirements,
        index_url=options.index_url,
        extra_index_urls=options.extra_index_urls,
        base_python=options.base_python,
    )
    leave = (*leave_out, *(Path(p) for p in options.code_leave_out))
    snapshot = build_snapshot(
        code, out_dir, spec, max_mb=options.max_code_mb, leave_out=leave, include_secrets=options.include_secrets
    )
    if snapshot.secrets_left_out:
        notes.append(
            f"left out of the code archive as credentials: {', '.join(snapshot.secrets_left_out)} (they would go to S3 "
            "and into this root module's folder; pass secrets with --secret-env, or pack one with --include-secret "
            "PATH)"
        )
    if snapshot.secrets_inside:
        notes.append(
            f"the code archive carries what reads as credentials: {', '.join(snapshot.secrets_inside[:5])} (it goes "
            "to S3, onto every node and into this root module's code/ folder): pass secrets with --secret-env "
            "NAME=ssm:... or secretsmanager:..., or leave the file out (.sriftyignore, or git's ignore)"
        )
    if snapshot.uncommitted:
        shown = ", ".join(snapshot.uncommitted[:10]) + (
            f" and {len(snapshot.uncommitted) - 10} more" if len(snapshot.uncommitted) > 10 else ""
        )
        notes.append(f"the archive carries files git has as untracked or uncommitted: {shown}")
    return snapshot, notes


PROJECT_PROFILE = "srifty/profile.json"  # where SriftyCallback (and srifty demo) write the profile by default


def check_plan_model(plan: Plan, code: Path, any_model: bool = False) -> None:
    """Refuse a plan made for another model than the ones this code's own profiles measured (``srifty/profile.json``
    in the code folder, SriftyCallback's default output, and the profiles a script wrote beside it, as
    ``srifty/NAME.json``: the plan must be for one of them): the 7B plan (2 x g6e.24xlarge spot) went from an MLP
    project all the way to apply, and the mismatch showed only when the job started (issue #37 H4); ``srifty launch``
    started a 7B plan's eight processes for the digits example, whose script writes ``srifty/digits-profile.json``
    (a new user's trial). Nothing to compare (no profile there, or a plan without its model's name) passes.

    Raises:
        ConfigError: the names differ (``any_model``: allowed).
    """

    if any_model or not plan.model:
        return
    own = _project_models(code)
    if own and plan.model not in own:
        path, name = next(iter(own.values())), next(iter(own))
        others = "".join(f", {n!r} ({p})" for n, p in list(own.items())[1:])
        raise ConfigError.between(
            "the plan was made for the model {planned!r}, but this project's profile ({path}) measured {own!r}"
            "{others}: rank this project's profile (srifty recommend --profile {profile} --out plan.json) and write "
            "that plan, or pass {any_model} if the plan is meant for this code",
            parameter="plan",
            value=plan.model,
            planned=plan.model,
            path=str(path),
            own=name,
            others=others,
            profile=path.relative_to(code) if path.is_relative_to(code) else path,
        )


def _project_models(code: Path) -> dict[str, Path]:
    """The model names this project's own profiles measured, with a profile of each: every ``srifty/*.json`` that
    reads as a profile, ``srifty/profile.json`` first (those that do not read are not compared). All of them: a
    ``srifty demo`` leaves its CNN's profile at ``srifty/profile.json`` beside the user's own (a review)."""
    folder = (code / PROJECT_PROFILE).parent
    default = code / PROJECT_PROFILE
    others = sorted(p for p in folder.glob("*.json") if p != default) if folder.is_dir() else []
    candidates = ([default] if default.is_file() else []) + others
    own: dict[str, Path] = {}
    for path in candidates:
        try:
            text = path.read_text(errors="replace")
            if '"srifty.profile/' not in text[:4096]:
                continue
            name = load_profile(path).model.name
        except Exception:  # noqa: BLE001 - a profile that does not read is the pre-flight's business, not a mismatch
            continue
        if name:
            own.setdefault(name, path)
    return own


def _snapshot(
    plan: Plan, choice: int, options: Options, staging: str, target: Path, gpus: list[tuple[str, str | None]]
) -> tuple[Snapshot, list[str]]:
    """The code snapshot (``options.snapshot``, packed before; else ``options.code``, packed now) and the notes on
    it: the environment's mismatches, a script that is not in it, a sharded plan whose script never applies the
    plan's strategy.

    Raises:
        ConfigError: the nodes could not install a torch that runs: a torch release srifty's table of PyTorch's CUDA
            builds does not know, or, on the default image, no published build of it runs one of the fleet's GPUs
            on that image's driver (unless the user's package index or container image provides torch).
    """
    torch_version = _torch_release(plan, options)
    snapshot, notes = _pack(plan, options, staging, target)
    env = json.loads(read_member(snapshot, ENVIRONMENT_FILE))
    if not options.image:
        stop = cuda.image_note(env, options.ami, gpus)
        if stop:
            raise ConfigError(
                f"Every such node would stop at boot, before training: {stop}",
                parameter="torch",
                value=torch_version,
            )
    notes += _driver_notes(plan, options)
    return snapshot, notes + _script_notes(plan.entries[choice], options, snapshot, env, plan.constraints.work_samples)


def _driver_notes(plan: Plan, options: Options) -> list[str]:
    """Where the plan was ranked for an image of another NVIDIA driver (``srifty recommend --driver``) and the module
    boots the default one (no --ami, no --image): the GPUs it kept may need the driver it was given."""
    ranked = plan.constraints.driver
    name, default = torch_builds.default_image()
    if not ranked or ranked == default or options.ami or options.image:
        return []
    return [
        f"the plan was ranked for an image with NVIDIA driver {ranked} (--driver), but without --ami the nodes boot "
        f"{name} (driver {default}): give srifty terraform --ami the image the plan was ranked for"
    ]


def _torch_release(plan: Plan, options: Options) -> str:
    """The plan's torch release ("" if unrecorded).

    Raises:
        ConfigError: a release srifty's table of PyTorch's CUDA builds does not know, unless the user's package
            index or container image provides torch.
    """
    torch_version = (plan.software.torch if plan.software else None) or ""
    own_torch = bool(options.image or options.index_url or options.extra_index_urls)
    unknown = torch_builds.unknown_release(torch_version) if torch_version else None
    if unknown and not own_torch:
        raise ConfigError.between(
            "{unknown}. Upgrade lightning-srifty (its table lists the newest releases), profile with a listed torch, "
            "or name where torch comes from: {extra_index_urls} https://download.pytorch.org/whl/cu<NNN> (a build "
            "your nodes' driver and GPUs run) or {image} a container that brings its own torch.",
            parameter="torch",
            value=torch_version,
            unknown=unknown,
        )
    return torch_version


def _pack(plan: Plan, options: Options, staging: str, target: Path) -> tuple[Snapshot, list[str]]:
    """The snapshot packed before (``options.snapshot``), else ``options.code`` packed now, and the notes on it.

    Raises:
        ConfigError: the module's own folder (``--out``) is, or holds, the code folder.
    """
    if options.snapshot:
        return load_snapshot(options.snapshot), []
    check_plan_model(plan, Path(options.code or "."), options.any_model)
    code = Path(options.code or ".").resolve()
    if code == target.resolve() or code.is_relative_to(target.resolve()):
        # the module's folder is left out of the code it packs: here that would be all of it (a new user's
        # `--out .` was told that a tracked requirements.txt was missing)
        raise ConfigError.between(
            "{out} {target} {verb} the code folder {folder}: the root module gets a folder of its own (its state, "
            "the code archive), left out of the code it packs. Give one, e.g. {out} infra.",
            parameter="out",
            value=str(target),
            target=str(target),
            verb="is" if code == target.resolve() else "holds",
            folder=str(code),
        )
    return make_snapshot(plan, options, staging, leave_out=(target,))


def _script_notes(
    entry: PlanEntry, options: Options, snapshot: Snapshot, env: dict[str, Any], work_samples: float
) -> list[str]:
    """Notes on the training command against the snapshot: a module that must come from the requirements, the
    requirements file beside the script, a sharded plan whose script never applies the plan's strategy, a run of
    another length or accumulation than the plan's (:func:`~.run_length.run_length_notes`).

    Raises:
        ConfigError: the script is an absolute path inside the code folder, or is not in the snapshot.
    """
    where = options.snapshot or Path(options.code or ".").resolve()
    argv = train_argv(options.train_command)
    if argv[0] == "-m":
        module = argv[1].replace(".", "/")
        if not {f"{module}.py", f"{module}/__main__.py"} & set(snapshot.files):
            return [
                f"the module {argv[1]} is not in the code snapshot of {where} ({module}.py or {module}/__main__.py): "
                "it must come from the requirements file"
            ]
        unregistered = unregistered_strategy_note(snapshot, options.train_command)
        return [unregistered] if unregistered else []
    script = os.path.normpath(argv[0])
    _check_script_in(snapshot, options, script, argv[0], where)
    notes = _requirements_beside_the_script(snapshot, env, script)
    glue = command_glue(snapshot, argv)  # read once: in the snapshot (checked above)
    if glue is not None and (unregistered := glue.unregistered_note(argv[0])) is not None:
        notes.append(unregistered)
    if glue is not None and (fabric := glue.fabric_note(argv[0])) is not None:
        return [*notes, fabric]  # no Trainer: the plan's strategy and batch notes speak of one
    plan_batches = glue is not None and glue.asks_for_the_plan
    profile = _project_profile(options)  # read once, for every note
    notes += _validation_notes(entry, profile, argv[0], plan_batches)
    cap = (lambda _: float(options.max_life_h)) if options.max_life_h is not None else default_max_life_h
    if not options.handover:  # under srifty launch a move's plan prices the rest of the run: the job checks its own
        notes += run_length_notes(entry, work_samples, snapshot, argv, profile, cap, plan_batches)
    if plan_batches:
        return notes
    if entry.layout is not None and entry.layout.strategy != "ddp":
        notes.append(
            f"the plan trains with {protocol.entry_strategy(entry)}, but {argv[0]} never asks for the plan's "
            "strategy: the Trainer starts with the script's own (plain DDP holds the whole model on every GPU). "
            'Pass Trainer(strategy="srifty_auto") (docs/launch.md)'
        )
    return notes + _batch_notes(entry, profile, argv[0])


def _project_profile(options: Options) -> Profile | None:
    """The code folder's own profile (``srifty/profile.json``), which the script notes compare the plan with; None
    without one, for a snapshot given whole, or where it does not read (the pre-flight's business)."""
    path = Path(options.code or ".") / PROJECT_PROFILE
    if options.snapshot or not path.is_file():
        return None
    try:
        return load_profile(path)
    except Exception:  # noqa: BLE001 - a profile that does not read is the pre-flight's business
        return None


def _validation_notes(entry: PlanEntry, profile: Profile | None, script: str, plan_batches: bool) -> list[str]:
    """A validation every N training batches (an int ``val_check_interval``, validating each epoch) that is more than
    the batches each rank trains an epoch on this fleet: Lightning refuses it at the first step
    (``_FitLoop.setup_data``: "`val_check_interval` (50) must be less than or equal to the number of the training
    batches (32)"). A trial's script validating every 50 of its 64 batches on one GPU ran on the plan's two at 32 a
    rank, and only the rehearsal found it. The epoch is the profiled one's samples (its batches x the samples of a
    batch over all ranks) over the fleet's batch (the plan's, where the script asks for it, else the script's own on
    every GPU)."""
    if profile is None:
        return []
    v, batch = profile.validation, profile.batch
    if v is None or not v.every_batches or v.every_epochs is None or v.every_epoch_fraction is not None or v.every_s:
        return []
    sizes = entry.rank_batches() if plan_batches else None
    per_batch = sum(sizes) if sizes else batch.per_device * entry.gpus
    if not v.epoch_batches or not batch.all_devices or per_batch <= 0:
        return []
    samples = v.epoch_batches * batch.all_devices  # at most: the profiled epoch's last batch may have been short
    if sizes:  # srifty_auto's GlobalBatchSampler: whole global batches, each the plan's micro-steps
        accumulation = entry.accumulate_grad_batches
        epoch = math.floor(samples / (per_batch * accumulation) + 1e-9) * accumulation
    else:  # the script's DataLoader over a DistributedSampler: the last part a batch of its own
        epoch = math.ceil(samples / per_batch - 1e-9)
    if v.every_batches <= epoch:
        return []
    return [
        f"the profiled run validated every {v.every_batches:,} training batches of an epoch (val_check_interval="
        f"{v.every_batches}), more than the {epoch:,} batches a rank trains an epoch on this fleet ({entry.gpus} GPUs, "
        f"{per_batch:g} samples a batch over them): where {script} does so here, Lightning refuses it at the first "
        "step (ValueError). Give val_check_interval as a share of the epoch (e.g. 1.0, at its end), or "
        "check_val_every_n_epoch=None to count the batches over the run"
    ]


def _batch_notes(entry: PlanEntry, profile: Profile | None, script: str) -> list[str]:
    """Where the plan splits the profiled global batch otherwise than the profiled run did (another GPU count, an
    accumulation) and the script never asks for the plan (srifty_auto applies its per-rank batch): the script's
    DataLoader keeps its own batch, and the fleet trains another global batch. A trial's 16 GPUs at 16 a GPU for the
    profiled 256 ran its script's 32 a GPU, 512 a step, and the summary said nothing. The profile is the code
    folder's own (``srifty/profile.json``); without it, nothing to compare."""
    sizes = entry.rank_batches()
    if profile is None or sizes is None:
        return []
    batch = profile.batch
    own, accumulation = batch.per_device, int(batch.accumulate_grad_batches or 1)
    if all(b == own for b in sizes) and entry.accumulate_grad_batches == accumulation:
        return []
    planned = f"{entry.batch_per_gpu()} a GPU on {entry.gpus} GPUs"
    return [
        f"the plan trains {planned} (the profiled global batch), but {script} never asks for the plan "
        f'(Trainer(strategy="srifty_auto")): its DataLoader keeps the batch it was profiled with ({own:g} a GPU'
        + (f", {accumulation} accumulated" if accumulation > 1 else "")
        + f"), {own * accumulation * entry.gpus:g} samples a step on this fleet: another training than the one "
        'ranked. Pass Trainer(strategy="srifty_auto") (docs/launch.md), or set '
        + " and ".join(
            f"the {what} from {protocol.VARIABLES[name]}"
            for what, name, differs in (
                ("batch", "batch_sizes", any(b != own for b in sizes)),
                ("accumulation", "accumulate_grad_batches", entry.accumulate_grad_batches != accumulation),
            )
            if differs
        )
    ]


def _check_script_in(snapshot: Snapshot, options: Options, script: str, given: str, where: object) -> None:
    """Refuse a training script every node could not start from the snapshot's top folder.

    Raises:
        ConfigError: an absolute path inside the code folder (with the relative one), or a script not in the
            snapshot (with the closest names).
    """
    if os.path.isabs(script) and options.code and not options.snapshot:
        inside = os.path.relpath(script, Path(options.code).resolve())
        if not inside.startswith(".."):
            raise ConfigError.between(
                "The training script {given} is an absolute path: every node runs the code from its own folder. "
                "Give it relative to the code folder: {train_command} {inside!r}.",
                parameter="train_command",
                value=options.train_command,
                given=given,
                inside=inside,
            )
    if script not in snapshot.files:
        close = suggest(script, [f for f in snapshot.files if f.endswith(".py")], n=2)
        mean = f"{did_you_mean(close)} " if close else ""
        raise ConfigError.between(
            "The training script {given} is not in the code snapshot of {where} ({count} files): every node runs "
            "torchrun from the snapshot's top folder, so it would end in \"can't open file\". {mean}Run srifty from "
            "your project's folder (or give {code}), and give the script's path relative to it; a file git ignores is "
            "left out.",
            parameter="train_command",
            value=options.train_command,
            given=given,
            where=str(where),
            count=len(snapshot.files),
            mean=mean,
        )


def _requirements_beside_the_script(snapshot: Snapshot, env: dict[str, Any], script: str) -> list[str]:
    """A note when the environment (``env``, the snapshot's) installs no requirements file but one lies beside the
    training script in a subfolder (srifty run from above the project): that file would not be installed."""
    folder = os.path.dirname(script)
    beside = f"{folder}/requirements.txt" if folder else ""
    if env.get("requirements") or not beside or beside not in snapshot.files:
        return []
    return [
        f"{beside} lies beside the training script but is not installed on the nodes (the requirements file is read "
        f"at the code folder's top): give --requirements {beside}, or run srifty from {folder}/ with the script's "
        "path relative to it"
    ]


def _no_code_notes(options: Options) -> list[str]:
    if options.setup_command.strip():
        return []
    return [
        "no --code and no --setup-command: nothing delivers your code or installs lightning to the nodes, which "
        "start torchrun in / with the image's PyTorch. Run srifty terraform from your project's folder with --code "
        ". (the default of the command line), or give --setup-command"
    ]


ROOT_GITIGNORE = """# written by srifty terraform: commit the reviewed Terraform, not these
code/
.terraform/
*.tfstate
*.tfstate.*
tfplan
*.tfplan
.terraform.tfstate.lock.info
crash.log
.srifty-rehearsal/
"""


@dataclass(frozen=True)
class _Written:
    files: tuple[str, ...]
    changed: bool


def plan_sha256(plan: Plan) -> str:
    """The plan's sha256, as ``.srifty.json`` records it (its JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()


def _write_root(
    plan: Plan, choice: int, target: Path, values: dict[str, Any], snapshot: Snapshot | None, readme: str | None
) -> _Written:
    marker_path = _check_target(target)
    source = terraform_root()
    files: dict[str, str] = {}
    for path in sorted((source / "root").glob("*.tf")):
        files[path.name] = path.read_text()
    module = source / "modules" / "training_fleet"
    for path in sorted(p for p in module.rglob("*") if p.is_file() and not _ignored(p.relative_to(module))):
        files[f"modules/training_fleet/{path.relative_to(module).as_posix()}"] = path.read_text()
    files[TFVARS] = json.dumps(values, indent=2, sort_keys=True) + "\n"
    # a team commits the reviewed Terraform, never the code archive (the user's code), state or plans
    files[".gitignore"] = ROOT_GITIGNORE
    binary: dict[str, Path] = {}
    if snapshot is not None:
        binary[f"{CODE_DIR}/{snapshot.path.name}"] = snapshot.path
    if readme is not None:
        files[README] = readme
    old = _manifest_files(marker_path) if marker_path.is_file() else []
    marker = {
        "generator": "lightning-srifty",
        "plan_sha256": plan_sha256(plan),
        "choice": choice,
        "fleet": plan.entries[choice].fleet,
        "files": sorted([*files, *binary]),
    }
    files[MARKER] = json.dumps(marker, indent=2, sort_keys=True) + "\n"
    changed = False
    inside = {rel: _inside(target, rel, MARKER) for rel in set(old) | set(files) | set(binary)}  # checked first
    for stale in sorted(set(old) - set(files) - set(binary)):  # a file the module no longer has
        if inside[stale].is_file() or inside[stale].is_symlink():
            inside[stale].unlink()
        changed = True
    for rel, text in files.items():
        path = inside[rel]
        if path.is_file() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        changed = True
    for rel, source in binary.items():  # content-addressed: a file of that name holds those bytes already
        path = inside[rel]
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == path.name.split(".")[0]:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, source.read_bytes())
        changed = True
    return _Written(tuple(sorted([*files, *binary])), changed)


def _check_target(target: Path) -> Path:
    """The path of ``target``'s manifest, once ``target`` is a folder srifty terraform may write: new, empty, or
    written by it before.

    Raises:
        ConfigError: ``target`` is a file.
        ProvisionError: a folder not empty that srifty terraform did not write.
    """
    marker_path = target / MARKER
    if target.exists() and not target.is_dir():
        raise ConfigError.between(
            "{target} exists and is not a folder: give {out} a folder to write the root module in.",
            parameter="out",
            value=str(target),
            target=str(target),
        )
    if target.is_dir() and any(target.iterdir()) and not marker_path.is_file():
        raise ProvisionError(
            f"{target} is not empty and was not written by `srifty terraform` (no {MARKER}): refusing to overwrite it. "
            "Give a new or empty folder."
        )
    return marker_path


_TEAMS_PAGE = (
    "{page} is not one srifty terraform wrote (.srifty.json does not list it): it is left as it is, and the fleet's "
    "page is not written (what every node runs is printed above)"
)


def _page(plan: Plan, choice: int, made: Generated, options: Options) -> str | None:
    """The folder's README.md (:func:`~.summary.root_readme`); None where the folder, written by srifty terraform
    before it wrote one, holds a README.md of the team's own, which it must not overwrite."""
    marker_path = made.out / MARKER
    if marker_path.is_file() and (made.out / README).exists() and README not in _manifest_files(marker_path):
        return None
    return root_readme(plan, choice, made, options, plan_sha256(plan))


def _manifest_files(marker_path: Path) -> list[str]:
    try:
        files = json.loads(marker_path.read_text()).get("files", [])
    except (ValueError, AttributeError):
        files = None
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        raise ProvisionError(
            f"{marker_path} is not a manifest `srifty terraform` wrote (its files must be a list of relative paths): "
            "nothing was deleted. Remove it, or give a new or empty folder."
        )
    return files


def _inside(target: Path, rel: str, where: str) -> Path:
    """``target / rel`` when it is a relative path that stays inside ``target`` after resolving symlinks."""
    root = target.resolve()
    path = target / rel
    resolved = path.resolve()
    if Path(rel).is_absolute() or resolved == root or root not in resolved.parents:
        raise ProvisionError(
            f"The manifest {target / where} lists {rel!r}, which is not inside {target} (an absolute path, '..', or a "
            "symlink out of the folder): refusing to delete or write it, and nothing was deleted. Remove the manifest, "
            "or give a new or empty folder."
        )
    return path


def _ignored(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts) or rel.suffix in (".tfstate", ".backup")


def copy_module(dest: str | os.PathLike[str]) -> Path:
    """Copy the module alone (for `terraform validate` of the module itself)."""
    target = Path(dest)
    shutil.copytree(terraform_root() / "modules" / "training_fleet", target, dirs_exist_ok=True)
    return target
