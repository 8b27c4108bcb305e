"""What a root module ``srifty terraform`` wrote runs and predicts, in words: the summary it prints (what every node
runs) and the folder's own ``README.md``, which tells a reviewer of the folder (a pull request, an infra team) what
the fleet is, what the plan predicts of it, what to read before applying and how to apply, watch and end it.
Torch-free."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import lightning_srifty
from lightning_srifty.console import fmt_hours, fmt_hours_range, fmt_life, fmt_usd
from lightning_srifty.protocol import VARIABLES
from lightning_srifty.provision.terraform import cuda
from lightning_srifty.provision.terraform.command import torchrun_script, train_argv
from lightning_srifty.provision.terraform.glue import asks_for_the_plan
from lightning_srifty.provision.terraform.snapshot import ENVIRONMENT_FILE, read_member
from predictor.ranking.explain import chance

# how the code snapshot chose its files (provision.snapshot.code_files), in the summary's words
SOURCE_WORDS = {
    "git": "git's files: tracked and untracked, not ignored",
    "walk": "not a git work tree: every file but what its top .gitignore / .sriftyignore leaves out",
}


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _environment_lines(result: Any, options: Any, values: dict[str, Any], snap: Any) -> list[str]:
    """What a node builds its environment from: the packages pinned, the index, the Python, CUDA, and the code."""

    env = json.loads(read_member(snap, ENVIRONMENT_FILE))
    lines: list[str] = []
    pins = ", ".join(env["packages"])
    if env.get("requirements"):
        pins += f", -r {env['requirements']}"
    lines.append(f"  environment  a new virtual environment: {pins}")
    lines.append(
        f"               from {env.get('index_url') or 'PyPI'}"
        + "".join(f" + {u}" for u in env.get("extra_index_urls") or [])
        + f"; lightning-srifty from the code archive ({env['wheel'].rsplit('/', 1)[-1]})"
    )
    profiled_python = (env.get("profiled") or {}).get("python")
    python = "the image's python3" + (f", seeing {env['base_python']}'s packages" if env.get("base_python") else "")
    if profiled_python:
        python += f" (the profile ran Python {profiled_python}; a node whose minor version differs says so in its log)"
    lines.append(f"  python       {python}")
    lines += cuda.summary(env, values["ami"].get("id"), getattr(result, "gpus", ()))
    where = options.snapshot or Path(options.code or ".").resolve()
    lines.append(
        f"  code         {where} ({SOURCE_WORDS.get(snap.source, snap.source)}): {len(snap.files)} files, "
        f"{_size(snap.bytes_in)}, archive {_size(snap.bytes_out)}, sha256 {snap.sha256[:16]}..."
    )
    return lines


def node_summary(result: Any, options: Any) -> str:
    """What every node will run, on one screen: image, environment, code, command, strategy."""

    values, train = result.values, result.values["train"]
    image = values["ami"].get("id") or "the Deep Learning AMI (PyTorch, Ubuntu 22.04) of each architecture"
    lines = ["What every node runs:", f"  image        {image}"]
    snap = result.snapshot
    if train.get("image"):
        lines.append(f"  container    {train['image']} (its Python; the snapshot's lightning-srifty installed in it)")
    if snap is not None and not train.get("image"):
        lines += _environment_lines(result, options, values, snap)
    elif snap is None:
        lines.append("  environment  the image's /opt/pytorch, then --setup-command")
        lines.append("  code         none delivered (--no-code): --setup-command must fetch it")
    if snap is not None and train.get("image"):
        lines.append(
            f"  code         {options.snapshot or Path(options.code or '.').resolve()} "
            f"({SOURCE_WORDS.get(snap.source, snap.source)}): "
            f"{len(snap.files)} files, sha256 {snap.sha256[:16]}..., at /workspace"
        )
    if options.setup_command:
        lines.append(f"  setup        {options.setup_command}")
    argv = " ".join(shlex.quote(a) for a in torchrun_script(list(train["argv"])))
    lines.append(f"  command      torchrun --nnodes={train['nnodes']} --nproc_per_node=<GPUs per node> {argv}")
    strategy = (train.get("env") or {}).get(VARIABLES["strategy"]) or "ddp"
    asks = asks_for_the_plan(snap, options.train_command) if snap is not None else None
    lines.append(
        f"  strategy     {strategy}"
        + (
            f" ({train_argv(options.train_command)[0]} asks for the plan: srifty_auto applies its layout and "
            "per-GPU batch)"
            if asks
            else " (the script builds its Trainer: the plan's layout and batch reach it only through srifty_auto)"
        )
    )
    lines.append(_network_line(values))
    bucket = values["checkpoints"].get("bucket") or "a new bucket (created by the apply)"
    lines.append(f"  checkpoints  {bucket}, prefix {values['checkpoints']['prefix']}")
    lines += _data_lines(values)
    lines.append(
        f"  life cap     the fleet stops itself {fmt_life(values['max_life_h'])} after its first launch (--max-life-h)"
    )
    lines += _hang_lines(values["watchdog"])
    return "\n".join(lines)


def _network_line(values: dict[str, Any]) -> str:
    """Where the fleet runs: a new VPC (its zone, a NAT gateway for several interfaces) or the team's subnets (an EFA
    fleet in the first alone, as the module places it: an infra team's second subnet went unused without a word)."""
    network = values["network"]
    if not network.get("create_vpc"):
        subnets = list(network.get("subnet_ids") or [])
        efa = any(g.get("efa") for g in values["groups"])
        if efa and len(subnets) > 1:
            return (
                f"  network      {network.get('vpc_id')}, subnet {subnets[0]} alone (an EFA fleet: EFA traffic "
                f"does not cross subnets; {', '.join(subnets[1:])} unused), its zone"
            )
        return f"  network      {network.get('vpc_id')}, subnets {', '.join(subnets)}, their zones"
    zone = network.get("availability_zone") or network.get("availability_zone_id")
    where = f"zone {zone} (the plan's spot price)" if zone else "a zone AWS picks"
    nat = any(g["network_interfaces"] > 1 for g in values["groups"])
    return f"  network      a new minimal VPC, {where}" + (NAT_WORDS if nat else "")


def _hang_lines(watchdog: dict[str, Any]) -> list[str]:
    """The hang watch's line, and with it on a fleet without a launcher, what becomes of a script that hangs after its
    training (the module's watchdog.after_fit_s)."""
    lines = [_hang_line(watchdog)]
    if (watchdog.get("stall_s") or 0) > 0 and not watchdog.get("heartbeat"):
        after = watchdog.get("after_fit_s", 0)
        lines.append(
            f"  after fit    a script silent {after / 60:g} min after its training (a test, an export, an upload) is "
            "killed and the fleet ends (--after-fit-timeout-min)"
            if after
            else "  after fit    no limit (--after-fit-timeout-min 0): a script that hangs after its training bills "
            "until the life cap"
        )
    return lines


def _hang_line(watchdog: dict[str, Any]) -> str:
    """What becomes of a job that hangs on the fleet (the module's watchdog.stall_s)."""
    stall = max(watchdog.get("stall_s") or 0, watchdog.get("grace_s") or 0) if watchdog.get("stall_s") else 0
    if watchdog.get("heartbeat"):
        return "  hang watch   srifty launch's (--stall-timeout-min)"
    if stall:
        return (
            f"  hang watch   a job silent {stall / 60:g} min after its first step (no step, validation batch or save) "
            "is killed, its node replaced, the job resumed (--stall-timeout-min)"
        )
    return "  hang watch   off (--stall-timeout-min 0): a hung job bills until the life cap"


def _data_lines(values: dict[str, Any]) -> list[str]:
    """The training data the nodes read (read-only; the copied folders are whole before a node is ready)."""
    lines = []
    for entry in values.get("data") or []:
        how = "copied to each node's disk before it is ready" if entry["copy"] else "read by the job from S3"
        lines.append(f"  data         {entry['name']}={entry['uri']} (read-only, {how})")
    for key in values.get("data_kms_key_arns") or []:
        lines.append(f"  data key     {key} (kms:Decrypt through S3 only)")
    for key in values.get("secret_kms_key_arns") or []:
        lines.append(f"  secret key   {key} (kms:Decrypt through SSM and Secrets Manager only)")
    return lines


# the minimal VPC of a fleet whose instances have several network interfaces (EFA): EC2 gives them no public IP, so
# they run in a private subnet behind a NAT gateway, which the module creates and the plan's cost does not price
NAT_WORDS = (
    ", its instances in a private subnet behind a NAT gateway (several EFA interfaces get no public IP; billed by "
    "the hour and the GB, not in the plan's cost; S3 goes through a gateway endpoint, free)"
)


README = "README.md"  # the root module's own page, for whoever reviews the folder


# the page's last sections: the commands, and which files are srifty's
COMMANDS = (
    "## Check, rehearse, apply, watch, end",
    "",
    "From this folder (or give its path to `--dir`):",
    "",
    "```bash",
    "srifty check --dir .      # pre-flight: the script, vCPU quotas, the zone's types, the bucket, keys, credentials",
    "srifty rehearse --dir .   # the fleet played on this machine against a local AWS, the instance role's policy "
    "enforced",
    "srifty apply --dir .      # terraform init and plan, a summary (resources, $/h), then apply on your yes",
    "srifty status --dir .     # instances, market, age, cost so far, life cap, heartbeat",
    "srifty logs --dir . -f    # every node's boot, setup and training output",
    "srifty outputs --dir .    # what each node's job wrote",
    "srifty down --dir .       # destroy, then what the fleet cost",
    "```",
    "",
    "It is a plain root module: `terraform init`, `terraform plan` and `terraform apply` work as well (the "
    "instances stop themselves at the life cap whatever runs them). End it with `srifty down`: it keeps a checkpoint "
    "bucket that holds the run's checkpoints and logs as it is, out of the state (`--delete-checkpoints` deletes "
    "it); a plain `terraform destroy` of a fleet that ran removes the bucket's encryption, versioning and access "
    "block, then fails on the objects in it (BucketNotEmpty). A file of your own may set anything but what the "
    "fleet buys (the region, the groups' types and counts, the capacity's markets): `srifty apply` refuses a plan "
    "whose fleet is not the one it priced.",
    "",
    "## Files",
    "",
    "`srifty terraform` wrote the files `.srifty.json` lists, this one included, and rewrites them when it runs "
    "again; it leaves any other file alone. Your own values go in a file of your own that sorts after `srifty.`, "
    "e.g. `team.auto.tfvars` (the package's `terraform/README.md` lists what you may set there). `code/` holds "
    "your code's archive: `.gitignore` keeps it, Terraform's state and plan files out of git.",
    "",
)


def root_readme(plan: Any, choice: int, result: Any, options: Any, plan_sha256: str) -> str:
    """The root module's ``README.md``: the fleet, what the plan predicts of it, what every node runs (the summary
    ``srifty terraform`` prints), what to read before applying (its warnings), and how to check, rehearse, apply,
    watch and end it. Written with the folder, from the same inputs: the same inputs write the same bytes (no date,
    nothing of the machine but the code folder's path)."""
    entry = plan.entries[choice]
    values = result.values
    recommended = (
        "the plan's recommendation"
        if choice == plan.chosen
        else f"not the plan's recommendation, which is entry {plan.chosen} ({plan.entries[plan.chosen].fleet})"
    )
    lines = [
        f"# {values['name']}: {entry.fleet} ({entry.market}, {values['region']})",
        "",
        "A Terraform root module for a PyTorch Lightning training fleet, written by `srifty terraform` "
        f"(lightning-srifty {lightning_srifty.__version__}) from entry {choice} of a plan of {len(plan.entries)} "
        f"({recommended}; the plan's sha256 {plan_sha256[:16]}... is in `.srifty.json`). It calls the fleet module in "
        "`modules/training_fleet/` (its [README](modules/training_fleet/README.md): what it creates, the instance "
        "role's permissions, the checkpoint bucket, the boot) with every value in `srifty.auto.tfvars.json`.",
        "",
        "## The fleet, and what the plan predicts",
        "",
        *_prediction_table(plan, entry, values),
        "",
        "## What every node runs",
        "",
        "```text",
        *node_summary(result, options).splitlines()[1:],
        "```",
        "",
        "## Before you apply",
        "",
        *_warnings(result.notes),
        "",
        *COMMANDS,
    ]
    return "\n".join(lines)


def _prediction_table(plan: Any, entry: Any, values: dict[str, Any]) -> list[str]:
    """The plan's figures for this entry, as a two-column table."""

    groups = ", ".join(
        f"{g.count} x {g.instance_type} ({g.gpus_per_instance} x {g.gpu} each"
        + (f"; {g.on_demand} on demand, {g.spot} spot" if g.on_demand and g.spot else "")
        + ")"
        for g in entry.groups
    )
    market = entry.market if entry.market != "mixed" else f"mixed ({entry.spot_share:.0%} of the instances on spot)"
    c = plan.constraints
    lo, hi = entry.time_range_h()
    cost_lo, cost_hi = entry.cost_interval_usd
    step_lo, step_hi = entry.iteration_time_interval_s
    rows = [
        ("instances", f"{groups}: {_count(entry.gpus, 'GPU')} on {_count(entry.nodes, 'node')}"),
        ("market, region", f"{market}, {values['region']}"),
        ("model", (plan.model or "unnamed") + (f" (profiled on {plan.profile_gpu})" if plan.profile_gpu else "")),
        ("work", _work(c.work_samples, entry.global_batch or c.global_batch)),
        ("layout, batch per GPU", f"{entry.layout.name if entry.layout else 'ddp'}, {entry.batch_per_gpu()}"),
        ("step", f"{entry.iteration_time_s:.3g} s (80% interval {step_lo:.3g}-{step_hi:.3g} s)"),
        ("time", f"{fmt_hours(entry.time_h)} (80% interval {fmt_hours_range(lo, hi)}), start-up included"),
        (
            "cost",
            f"{fmt_usd(entry.cost_usd)} (80% interval {fmt_usd(cost_lo)}-{fmt_usd(cost_hi)}) at "
            f"${entry.usd_per_hour:,.2f}/h, catalog prices of {plan.catalog_snapshot}",
        ),
    ]
    if c.deadline_h is not None and entry.deadline_probability is not None:
        asked = f"{c.confidence:.0%}" if c.confidence is not None else "-"
        rows.append(
            (
                "deadline",
                f"{fmt_hours(c.deadline_h)}, met with probability {chance(entry.deadline_probability)} "
                f"(asked: {asked})",
            )
        )
    if entry.market != "on-demand":
        rows.append(("spot", f"{entry.expected_interruptions:.2f} interruptions expected ({entry.risk} risk)"))
    if entry.checkpoint_interval_s:
        rows.append(("checkpoints", f"every {fmt_hours(entry.checkpoint_interval_s / 3600)}, and on a spot notice"))
    rows.append(("life cap", f"the fleet stops itself {fmt_life(values['max_life_h'])} after its first launch"))
    chosen = entry is plan.entries[plan.chosen]
    # plan.why is the recommendation's: another entry's folder said so of a fleet it does not run (a trial's --choice 3)
    why = plan.why if chosen else f"chosen over the plan's recommendation; the plan's words for that one: {plan.why}"
    rows.append(("why this fleet", why.replace("|", "\\|")))
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("s" if n != 1 else "")


def _work(samples: float, global_batch: int | None) -> str:
    """The work in samples, and in optimizer steps where the global batch is known."""
    if not global_batch:
        return f"{samples:,.0f} samples"
    return f"{samples:,.0f} samples: {samples / global_batch:,.0f} optimizer steps of a global batch of {global_batch}"


def _warnings(notes: tuple[str, ...] | list[str]) -> list[str]:
    """``srifty terraform``'s warnings as a list (what it also printed), or that it had none."""
    if not notes:
        return ["`srifty terraform` had no warning for this fleet."]
    return ["`srifty terraform` warned (it printed these too):", "", *(f"- {n.rstrip('.')}." for n in notes)]
