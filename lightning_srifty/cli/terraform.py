"""``srifty terraform`` (write a root module from a plan), ``srifty apply`` and ``srifty destroy``: torch-free."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any


def cmd_terraform(args: argparse.Namespace) -> int:
    from lightning_srifty.cli._common import load_catalog
    from lightning_srifty.provision.terraform.generate import generate
    from lightning_srifty.provision.terraform.summary import README, node_summary
    from predictor.documents.plan import load_plan

    plan = load_plan(args.plan)
    if args.choice is None:  # the plan's recommendation, as srifty replay and MigrationTriggers take it
        args.choice = plan.chosen
    options = _options(args)
    result = generate(plan, args.out, choice=args.choice, options=options, catalog=load_catalog(args))
    entry = plan.entries[args.choice]
    state = "written" if result.changed else "unchanged (already current)"
    print(f"Root module for {entry.fleet} ({entry.market}, {result.values['region']}) {state} in {result.out}:")
    print(
        f"  {len(result.files)} files; values in {result.out / 'srifty.auto.tfvars.json'}"
        + (f", the fleet's page in {result.out / README}" if README in result.files else "")
    )
    print(node_summary(result, options))
    for note in result.notes:
        print(f"WARNING: {note}.", file=sys.stderr)
    failed = 0
    if result.snapshot is not None:  # the script's offline checks (check and apply: all)
        from lightning_srifty.provision.preflight import check_imports

        train = result.values["train"]
        for finding in check_imports(result.snapshot, train["argv"], train.get("setup_command"), train.get("image")):
            if finding.status != "ok":
                print(finding.line(), file=sys.stderr)
            failed += finding.status == "fail"
    out = shlex.quote(str(result.out))  # a folder with spaces pastes as one word
    if failed:
        # the root is written for review, but a pipeline that goes on to `terraform apply` must stop here: every
        # node would boot, install and fail the same way (srifty apply and srifty check refuse it too)
        print(
            f"srifty terraform: {failed} check(s) of the script failed (above): its nodes would not train. The root "
            "is written for review; fix the script, then run srifty terraform again.",
            file=sys.stderr,
        )
        return 1
    print(f"Review it, then: srifty apply --dir {out}  (or terraform -chdir={out} init/plan/apply)")
    return 0


def _options(args: argparse.Namespace) -> Any:
    """``srifty terraform``'s flags as the generator's :class:`Options` (checked as they are made)."""
    from lightning_srifty.cli._common import code_options
    from lightning_srifty.provision.terraform.generate import Options

    return Options(
        name=args.name,
        region=args.region,
        ssh_cidr=tuple(args.ssh_cidr or ()),
        train_command=args.train_command,
        setup_command=args.setup_command,
        resume_from=args.resume_from,
        mode=args.mode,
        ami=args.ami,
        key_name=args.key_name,
        vpc_id=args.vpc_id,
        subnet_ids=tuple(s for s in (args.subnet_ids or "").split(",") if s),
        bucket=args.bucket,
        root_volume_gb=args.root_volume_gb,
        aws_endpoint=args.aws_endpoint,
        max_life_h=args.max_life_h,
        stall_timeout_s=args.stall_timeout_min * 60 if args.stall_timeout_min else None,
        after_fit_timeout_s=args.after_fit_timeout_min * 60 if args.after_fit_timeout_min else None,
        max_instances=args.max_instances,
        max_hourly_usd=args.max_hourly_usd,
        allow_wide_ssh=args.allow_wide_ssh,
        ssm_session=args.ssm_session,
        secret_env=tuple(args.secret_env or ()),
        secret_kms_keys=tuple(args.secret_kms_key or ()),
        availability_zone=args.availability_zone,
        **code_options(args),
    )


def stall_minutes(text: str) -> float:
    """``--stall-timeout-min`` and ``--after-fit-timeout-min``: 0 (off), or the module's bounds of watchdog.stall_s
    and after_fit_s in minutes (1 to 1440)."""
    from lightning_srifty.cli._common import nonneg

    minutes = nonneg(text)
    if 0 < minutes < 1 or minutes > 1440:
        raise argparse.ArgumentTypeError(f"{text}: 0 (not watched) or from 1 to 1440 minutes")
    return minutes


def cmd_apply(args: argparse.Namespace) -> int:
    from lightning_srifty.cli._common import load_catalog
    from lightning_srifty.provision.apply import apply

    outputs = apply(
        args.dir,
        yes=args.yes,
        catalog=load_catalog(args),
        check=not args.skip_check,
        timeout_s=args.timeout_min * 60,
    )
    if args.json:  # terraform printed the outputs already, for people
        print(json.dumps(outputs, indent=2, default=str))
    else:
        folder = shlex.quote(args.dir)
        print(
            f"Applied. Next: srifty status --dir {folder} (the fleet, its cost so far), srifty logs --dir {folder} "
            f"(the nodes' output), srifty down --dir {folder} (destroy it, and what it cost)"
        )
    return 0


def cmd_destroy(args: argparse.Namespace) -> int:
    from lightning_srifty.provision.apply import destroy

    destroy(args.dir, yes=args.yes, delete_checkpoints=args.delete_checkpoints)
    print("destroyed")
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from lightning_srifty.cli._common import add_code_arguments, nonneg_int

    p = sub.add_parser("terraform", parents=[common], help="write a Terraform root module for a plan's fleet")
    p.add_argument("--plan", required=True, help="srifty.plan/v1 JSON (srifty recommend --out)")
    p.add_argument(
        "--choice",
        type=nonneg_int,
        default=None,
        help="index of the ranked fleet (default: the plan's recommendation, its chosen entry: 0 as srifty recommend "
        "writes it)",
    )
    p.add_argument("--out", required=True, help="folder to write (new, empty, or written by srifty before)")
    p.add_argument(
        "--name",
        help="run name (3-40 of a-z, 0-9, -; at most 38 without --bucket: the bucket is named after it); default from "
        "the model and the plan",
    )
    p.add_argument("--region", help="default: the plan's region for this fleet")
    _access_flags(p)
    p.add_argument(
        "--train-command",
        default="train.py",
        help="what torchrun starts on every node: a script and its arguments ('python train.py ...' and "
        "'python -m pkg ...' are accepted too)",
    )
    p.add_argument(
        "--setup-command",
        default="",
        help="shell command that prepares the node at boot, in the shell that then starts torchrun (cd into your code "
        "here); required with --ami",
    )
    add_code_arguments(p)
    p.add_argument("--resume-from", help="checkpoint URI the training command resumes from")
    p.add_argument("--mode", choices=["asg", "fleet"], default="asg", help="Auto Scaling group or EC2 Fleet")
    _where_flags(p)
    _limit_flags(p)
    p.set_defaults(func=cmd_terraform)

    _apply_and_destroy(sub, common)


def _access_flags(p: argparse.ArgumentParser) -> None:
    """Who may reach the instances, and the secrets they read at boot."""
    p.add_argument("--ssh-cidr", action="append", help="CIDR allowed to SSH (repeatable); default: no SSH port")
    p.add_argument(
        "--allow-wide-ssh",
        action="store_true",
        help="let the --ssh-cidr blocks cover more than a /8 worth of addresses (never all of 0.0.0.0/0)",
    )
    p.add_argument(
        "--ssm-session",
        action="store_true",
        help="let the instances register with SSM Session Manager (default: no SSM permission on the instance role)",
    )
    p.add_argument(
        "--secret-env",
        action="append",
        metavar="NAME=ssm:/param|NAME=secretsmanager:id",
        help="an environment variable the instances read at boot from SSM Parameter Store or Secrets Manager "
        "(repeatable); only the name reaches Terraform, the instance role may read exactly these",
    )
    p.add_argument(
        "--secret-kms-key",
        action="append",
        metavar="KEY_ARN",
        help="a customer-managed KMS key a --secret-env parameter or secret is encrypted with (repeatable; AWS's own "
        "aws/ssm and aws/secretsmanager keys need none): the role may decrypt through SSM and Secrets Manager only",
    )


def _where_flags(p: argparse.ArgumentParser) -> None:
    """The machine image, the network, the bucket and the disk."""
    from lightning_srifty.cli._common import whole

    p.add_argument("--ami", help="AMI id (default: the Deep Learning AMI from its public SSM parameter)")
    p.add_argument("--key-name", help="EC2 key pair for SSH")
    p.add_argument("--vpc-id", help="an existing VPC (with --subnet-ids); default: a minimal VPC is created")
    p.add_argument("--subnet-ids", help="comma-separated subnets of --vpc-id")
    p.add_argument(
        "--availability-zone",
        help="the zone of the subnet srifty creates (default: the zone whose spot price the plan used; AWS picks "
        "for an on-demand fleet); srifty check says which zones offer every type",
    )
    p.add_argument("--bucket", help="an existing checkpoint bucket; default: one is created")
    p.add_argument("--root-volume-gb", type=whole, default=200)
    p.add_argument("--aws-endpoint", help="a local AWS-compatible endpoint (offline tests)")


def _limit_flags(p: argparse.ArgumentParser) -> None:
    """What the module refuses to create (a life past the cap, more instances, more per hour), and the hang watch
    that ends a silent job's machines."""
    from lightning_srifty.cli._common import positive, positive_int

    p.add_argument(
        "--max-life-h",
        type=positive,
        help="the fleet stops itself this many hours after its first launch (default: the later of the predicted "
        "hours x 1.5 and the time's 99th percentile, + 1)",
    )
    p.add_argument(
        "--stall-timeout-min",
        type=stall_minutes,
        default=20.0,  # protocol.STALL_TIMEOUT_S (not imported: the parser starts fast)
        metavar="MIN",
        help="a job that trained and then showed no sign of life (no step, validation batch or checkpoint save) for "
        "this many minutes hangs (a GPU that stopped answering, a collective or a read that never returns): each "
        "node kills it and leaves to be replaced, and the job resumes from the newest checkpoint; a hang again "
        "at an earlier hang's step ends the fleet (default 20, under the process group's 30-minute "
        "timeout; longer where the job's steps or saves need it; 0: not watched; under srifty launch its own flag)",
    )
    p.add_argument(
        "--after-fit-timeout-min",
        type=stall_minutes,
        default=30.0,  # protocol.AFTER_FIT_TIMEOUT_S (not imported: the parser starts fast)
        metavar="MIN",
        help="once the job's training has finished, a script that shows no sign of life for this many minutes (a "
        "test, an export, an upload after fit() that never ends) is killed and the fleet ends, its training done "
        "and kept in its checkpoints (default 30; 0: no limit; with the hang watch only; under srifty launch its "
        "own flag)",
    )
    p.add_argument(
        "--max-instances",
        type=positive_int,
        help="refuse a fleet of more instances (default: the plan's max_instances)",
    )
    p.add_argument(
        "--max-hourly",
        type=positive,
        dest="max_hourly_usd",  # the option's own name: a refusal of it names this flag
        metavar="USD",
        help="refuse a fleet that costs more per hour at catalog prices (default: the plan's max_hourly_usd, if any)",
    )


def _apply_and_destroy(sub: Any, common: argparse.ArgumentParser) -> None:
    """``srifty apply`` and ``srifty destroy`` of a folder ``srifty terraform`` wrote."""
    from lightning_srifty.cli._common import positive

    for name, func, text in (
        ("apply", cmd_apply, "terraform init/plan/apply a root module written by srifty terraform"),
        ("destroy", cmd_destroy, "terraform destroy a root module written by srifty terraform"),
    ):
        q = sub.add_parser(name, parents=[common] if func is cmd_apply else [], help=text)
        q.add_argument("--dir", required=True, help="the folder srifty terraform wrote")
        q.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        if func is cmd_destroy:
            q.add_argument(
                "--delete-checkpoints",
                action="store_true",
                help="delete the checkpoint bucket the module created, with every object (default: kept, out of the "
                "state)",
            )
        if func is cmd_apply:
            q.add_argument(
                "--skip-check", action="store_true", help="apply without the pre-flight (srifty check) first"
            )
            q.add_argument("--json", action="store_true", help="then print the root's outputs as one JSON document")
            q.add_argument(
                "--timeout-min",
                type=positive,
                default=30.0,
                metavar="MIN",
                help="stop the apply after this long (a group that never fills) and destroy what it created (30)",
            )
        q.set_defaults(func=func)
