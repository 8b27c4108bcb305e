"""``srifty terraform``: a root module for the chosen fleet of a plan.

What is written (``--out infra/``):

    infra/
      versions.tf, main.tf, variables.tf, outputs.tf   copied verbatim from terraform/root (no templating)
      modules/training_fleet/                           a copy of the reviewed module, pinned with the root
      srifty.auto.tfvars.json                           every value, from the plan (sorted keys: diffable)
      .srifty.json                                      what generated the folder (plan hash, choice, files)

Python never writes HCL: the only generated file is JSON. Re-running with the same inputs writes the same bytes;
a folder that exists, is not empty, and was not written by this generator is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_srifty.provision.command import check_bucket, check_prefix, train_argv
from lightning_srifty.provision.money import check_entry, check_limits, group_usd_per_hour
from predictor._io import atomic_write_text
from predictor.catalog.catalog import Catalog
from predictor.exceptions import ConfigError, ProvisionError
from predictor.plan import Plan, PlanEntry
from predictor.spot import shutdown_grace_s

MARKER = ".srifty.json"
TFVARS = "srifty.auto.tfvars.json"
MAX_LIFE_H = 720.0  # the module's upper bound for max_life_h (30 days)
MAX_WEIGHT = 999  # an Auto Scaling group's largest weighted_capacity
# families whose instances support cluster placement groups (current-generation GPU types all do)
CLUSTER_FAMILIES = re.compile(r"^(p3|p3dn|p4d|p4de|p5|p5e|p5en|p6|g4dn|g5|g6|g6e|gr6|g4ad|g5g|trn1|trn2|inf2|dl1)\.")


def terraform_root() -> Path:
    """The reviewed Terraform (``root/`` and ``modules/training_fleet``): the copy an installed wheel carries
    (``lightning_srifty/provision/_terraform``, written by setup.py at build time), else the checkout's
    ``terraform/`` (source tree, editable install)."""
    here = Path(__file__).resolve()
    candidates = (here.parent / "_terraform", here.parents[2] / "terraform")
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
    max_life_h: float | None = None  # every instance's life cap; default: predicted hours x 1.5 + 1
    max_instances: int | None = None  # guard; default: the plan's constraints.max_instances
    max_hourly_usd: float | None = None  # guard; default: the plan's constraints.max_hourly_usd (None: no limit)


_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,38}[a-z0-9]$")


def default_name(plan: Plan, choice: int) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", (plan.model or "run").lower()).strip("-")[:24] or "run"
    digest = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()[:6]
    return f"srifty-{base}-{choice}-{digest}"


def default_max_life_h(entry: PlanEntry) -> float:
    """The life cap for a fleet: the predicted hours x 1.5 + 1, rounded up to a minute, within the module's 0.25-720."""
    hours = entry.time_h * 1.5 + 1 if math.isfinite(entry.time_h) else MAX_LIFE_H
    return min(MAX_LIFE_H, max(0.25, math.ceil(hours * 60) / 60))


def weights(entry: PlanEntry) -> tuple[list[int], float]:
    """Integer weighted capacities (1..999) proportional to each group's predicted throughput per instance, and the
    samples/s one unit stands for."""
    per_instance = [g.throughput_samples_s / g.count for g in entry.groups]
    unit = max(min(per_instance) / 100.0, max(per_instance) / MAX_WEIGHT)
    return [max(1, min(MAX_WEIGHT, round(t / unit))) for t in per_instance], unit


def tfvars(plan: Plan, choice: int, options: Options, catalog: Catalog | None = None) -> dict[str, Any]:
    """The values of the root module for ``plan.entries[choice]``."""
    if not 0 <= choice < len(plan.entries):
        raise ConfigError(
            f"The plan has {len(plan.entries)} ranked fleets: --choice must be between 0 and {len(plan.entries) - 1}. "
            f"Got {choice}.",
            parameter="choice",
            value=choice,
        )
    entry = plan.entries[choice]
    name = options.name or default_name(plan, choice)
    if not _NAME.match(name):
        raise ConfigError(
            f"The run name {name!r} must be 3 to 40 characters of lower-case letters, digits and hyphens (it becomes "
            "part of a bucket name), e.g. --name resnet-run-1.",
            parameter="name",
            value=name,
        )
    if options.mode not in ("asg", "fleet"):
        raise ConfigError(f"--mode must be asg or fleet. Got {options.mode!r}.", parameter="mode", value=options.mode)
    for cidr in options.ssh_cidr:
        if not re.match(r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$", cidr) or cidr == "0.0.0.0/0":
            raise ConfigError(
                f"--ssh-cidr {cidr!r} must be an IPv4 CIDR block narrower than 0.0.0.0/0, e.g. 203.0.113.7/32.",
                parameter="ssh_cidr",
                value=cidr,
            )
    if bool(options.vpc_id) != bool(options.subnet_ids):
        raise ConfigError(
            "Give both --vpc-id and --subnet-ids (an existing network), or neither (a minimal VPC is created).",
            parameter="vpc_id",
            value=options.vpc_id,
        )
    argv = train_argv(options.train_command)
    if options.ami and not options.setup_command.strip():
        raise ConfigError(
            f"--ami {options.ami} is a custom image: srifty cannot know that it has PyTorch and torchrun (the default "
            "Deep Learning AMI with PyTorch does). Give --setup-command to install them, e.g. --setup-command "
            "'pip install torch lightning', or --setup-command true if the image has them.",
            parameter="setup_command",
            value=options.setup_command,
        )
    catalog = catalog or Catalog.load()
    check_entry(plan, choice, catalog)  # the plan's counts, markets and $/h are the catalog's, or it is refused
    region = options.region or entry.region
    usd_per_hour = sum(
        group_usd_per_hour(catalog, g.instance_type, region, g.on_demand, g.spot, f"--region {region}")
        for g in entry.groups
    )
    max_instances = options.max_instances if options.max_instances is not None else plan.constraints.max_instances
    max_hourly = options.max_hourly_usd if options.max_hourly_usd is not None else plan.constraints.max_hourly_usd
    for field, value, low in (("max_instances", max_instances, 1), ("max_hourly_usd", max_hourly, 0)):
        if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low - 1):
            raise ConfigError(
                f"--{field.replace('_usd', '').replace('_', '-')} must be a positive number. Got {value!r}.",
                parameter=field,
                value=value,
            )
    if max_instances is not None and int(max_instances) != max_instances:
        raise ConfigError(f"--max-instances must be whole. Got {max_instances!r}.", "max_instances", max_instances)
    check_limits(entry.nodes, usd_per_hour, max_instances, max_hourly)
    max_life_h = options.max_life_h if options.max_life_h is not None else default_max_life_h(entry)
    if not isinstance(max_life_h, (int, float)) or not 0.25 <= max_life_h <= MAX_LIFE_H:
        raise ConfigError(
            f"--max-life-h must be between 0.25 and {MAX_LIFE_H:g} hours. Got {max_life_h!r}.",
            parameter="max_life_h",
            value=max_life_h,
        )
    w, unit = weights(entry)
    groups = []
    multi_node = entry.nodes > 1
    for g, weight in zip(entry.groups, w):
        it = catalog.get(g.instance_type) if g.instance_type in catalog else None
        efa = bool(it and it.efa and multi_node)
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
                "network_interfaces": it.network_interfaces(multi_node) if it else 1,
            }
        )
    arches = sorted({g["arch"] for g in groups})
    if options.ami and len(arches) > 1:
        raise ConfigError(
            f"--ami {options.ami} is one image, but fleet {entry.fleet} mixes {' and '.join(arches)} instance types: "
            "leave --ami out (each architecture gets its Deep Learning AMI) or choose a fleet of one architecture.",
            parameter="ami",
            value=options.ami,
        )
    on_demand_units = sum(g["on_demand"] * g["weighted_capacity"] for g in groups)
    placement = (
        entry.nodes > 1 and len(entry.groups) == 1 and bool(CLUSTER_FAMILIES.match(entry.groups[0].instance_type))
    )
    network: dict[str, Any] = (
        {"create_vpc": False, "vpc_id": options.vpc_id, "subnet_ids": list(options.subnet_ids)}
        if options.vpc_id
        else {"create_vpc": True}
    )
    prefix = check_prefix(options.checkpoint_prefix or f"checkpoints/{name}/")
    checkpoints: dict[str, Any] = {"prefix": prefix}
    if options.bucket:
        checkpoints.update(create_bucket=False, bucket=check_bucket(options.bucket))
    train: dict[str, Any] = {
        "argv": argv,
        "setup_command": options.setup_command,
        "nnodes": entry.nodes,
    }
    if options.resume_from:
        train["resume_from"] = options.resume_from
    if options.handover:
        train["handover"] = True
    values: dict[str, Any] = {
        "region": region,
        "name": name,
        "network": network,
        "ssh_cidr_blocks": list(options.ssh_cidr),
        "groups": groups,
        "capacity": {
            "mode": options.mode,
            "spot_allocation_strategy": "price-capacity-optimized",
            "on_demand_base_capacity": on_demand_units,
            "on_demand_percentage_above_base": 0,
            "placement_group": placement,
        },
        "ami": {"id": options.ami} if options.ami else {},
        "root_volume_gb": options.root_volume_gb,
        "checkpoints": checkpoints,
        "train": train,
        "max_life_h": max_life_h,
        # the job's grace after SIGTERM, from the watchdog and from torchrun alike: the plan's checkpoint save x 2
        # + 30 s, so that a leaving save is never cut by SIGKILL
        "watchdog": {"heartbeat": options.handover, "grace_s": shutdown_grace_s(plan.checkpoint_s)},
        "limits": {"max_instances": max_instances, "max_hourly_usd": max_hourly},
        "predicted": {
            "throughput_samples_s": round(entry.throughput_samples_s, 6),
            "usd_per_hour": round(usd_per_hour, 6),  # the catalog's, in the region bought
            "time_h": round(entry.time_h, 6),
            "cost_usd": round(entry.cost_usd, 6),
            "samples_per_capacity_unit": round(unit, 6),
        },
        "tags": {
            "srifty:plan-choice": str(choice),
            "srifty:fleet-spec": entry.fleet,
            "srifty:market": entry.market,
            "srifty:model": (plan.model or "unknown")[:200],
        },
    }
    if options.key_name:
        values["key_name"] = options.key_name
    if options.aws_endpoint:
        values["aws_endpoint"] = options.aws_endpoint
    return values


@dataclass(frozen=True)
class Generated:
    out: Path
    files: tuple[str, ...]
    values: dict[str, Any]
    changed: bool


def generate(
    plan: Plan,
    out: str | os.PathLike[str],
    *,
    choice: int = 0,
    options: Options = Options(),
    catalog: Catalog | None = None,
) -> Generated:
    """Write the root module for ``plan.entries[choice]`` into ``out`` (see the module docstring)."""
    target = Path(out)
    values = tfvars(plan, choice, options, catalog)
    marker_path = target / MARKER
    if target.exists() and not target.is_dir():
        raise ProvisionError(f"{target} exists and is not a folder: give --out a folder to write the root module in.")
    if target.is_dir() and any(target.iterdir()) and not marker_path.is_file():
        raise ProvisionError(
            f"{target} is not empty and was not written by `srifty terraform` (no {MARKER}): refusing to overwrite it. "
            "Give a new or empty folder."
        )
    source = terraform_root()
    files: dict[str, str] = {}
    for path in sorted((source / "root").glob("*.tf")):
        files[path.name] = path.read_text()
    module = source / "modules" / "training_fleet"
    for path in sorted(p for p in module.rglob("*") if p.is_file() and not _ignored(p.relative_to(module))):
        files[f"modules/training_fleet/{path.relative_to(module).as_posix()}"] = path.read_text()
    files[TFVARS] = json.dumps(values, indent=2, sort_keys=True) + "\n"
    plan_hash = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
    marker = {
        "generator": "lightning-srifty",
        "plan_sha256": plan_hash,
        "choice": choice,
        "fleet": plan.entries[choice].fleet,
        "files": sorted(files),
    }
    files[MARKER] = json.dumps(marker, indent=2, sort_keys=True) + "\n"
    changed = False
    old = json.loads(marker_path.read_text()).get("files", []) if marker_path.is_file() else []
    for stale in set(old) - set(files):  # a file the module no longer has
        (target / stale).unlink(missing_ok=True)
        changed = True
    for rel, text in files.items():
        path = target / rel
        if path.is_file() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        changed = True
    return Generated(target, tuple(sorted(files)), values, changed)


def _ignored(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts) or rel.suffix in (".tfstate", ".backup")


def copy_module(dest: str | os.PathLike[str]) -> Path:
    """Copy the module alone (for `terraform validate` of the module itself)."""
    target = Path(dest)
    shutil.copytree(terraform_root() / "modules" / "training_fleet", target, dirs_exist_ok=True)
    return target
