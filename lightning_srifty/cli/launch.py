"""``srifty launch --plan plan.json [--choice N] -- train.py [args]``: run on the plan's fleet, keep it running
through migrations (spot notices; drift and price moves the job asks for).

SIGINT, SIGTERM and SIGHUP release every fleet the launch brought up, print one line and exit 128 + the signal's
number (130, 143, 129), without a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from pathlib import Path
from typing import Any


def check_script(script: list[str]) -> None:
    """Refuse, before any fleet starts, a script that is not there (torchrun would print 30 lines per rank) or a
    command torchrun cannot start (it runs Python itself: ``python train.py`` is its ``train.py``).

    Raises:
        ConfigError: naming the path and where it was looked for, or why torchrun cannot start the command.
    """
    from lightning_srifty.provision.terraform.command import torchrun_argv
    from predictor.exceptions import ConfigError

    words, why = torchrun_argv(shlex.join(script))  # what torchrun starts: "python train.py" is "train.py"
    if why:
        raise ConfigError(
            f"The training command {shlex.join(script)!r} {why} Give the script and its arguments after --, e.g. "
            "srifty launch --plan plan.json -- train.py --epochs 3, or -- python -m pkg.train.",
            parameter="command",
            value=shlex.join(script),
        )
    if words[0] == "-m":
        return  # a module (-m pkg.train) is found by Python on the nodes
    if not Path(words[0]).is_file():
        raise ConfigError(
            f"The training script {words[0]} does not exist (looked in {Path.cwd()}): nothing was started. Run srifty "
            "launch from your project's folder, or give the script's path, e.g. srifty launch --plan plan.json -- "
            "train.py --epochs 3.",
            parameter="command",
            value=words[0],
        )


def _settings(args: argparse.Namespace) -> Any:
    """``srifty launch``'s flags as the launcher's :class:`LauncherSettings` (checked as they are made)."""
    from lightning_srifty.provision.launcher.launch import LauncherSettings

    return LauncherSettings(
        choice=args.choice,
        workdir=args.workdir,
        max_migrations=args.max_migrations,
        simulate_notice_after=args.simulate_notice_after,
        max_local_processes=args.max_local_processes,
        name=args.name,
        heartbeat_s=args.heartbeat_s,
        heartbeat_max_age_s=args.heartbeat_max_age_s,
        max_life_h=args.max_life_h,
        start_timeout_s=args.start_timeout_min * 60 if args.start_timeout_min else None,
        stall_timeout_s=args.stall_timeout_min * 60 if args.stall_timeout_min else None,
        after_fit_timeout_s=args.after_fit_timeout_min * 60,
        spot_policy=args.spot_policy,
        spot_check_s=args.spot_check_s,
        resume=_resume_from(args),
    )


def cmd_launch(args: argparse.Namespace) -> int:
    from lightning_srifty.provision.launcher.launch import launch
    from predictor.documents.plan import check_choice, load_plan
    from predictor.exceptions import ConfigError, LaunchInterrupted

    plan = load_plan(args.plan)
    if args.choice is None:  # the plan's recommendation, as srifty replay and MigrationTriggers take it
        args.choice = plan.chosen
    script = [a for a in args.command if a != "--"]
    if not script:
        raise ConfigError(
            "Give the training script after --, e.g. srifty launch --plan plan.json -- train.py --epochs 3.",
            parameter="command",
        )
    check_script(script)
    check_choice(plan, args.choice)
    from lightning_srifty.provision.terraform.generate import check_plan_model

    # a plan for another model than this project's profiles measured: refused before a process starts (a trial's
    # 7B plan started eight FSDP processes for the digits example)
    check_plan_model(plan, Path(args.code or "."), bool(args.any_model))
    workdir = _workdir(args)
    if args.checkpoint_uri and args.provisioner == "local":
        print(
            f"WARNING: --checkpoint-uri is the terraform provisioner's: the local provisioner keeps the checkpoints "
            f"in {workdir / 'checkpoints'}.",
            file=sys.stderr,
        )
    settings = _settings(args)  # the launcher's own, checked before any code is packed or fleet started
    provisioner = _terraform_provisioner(args, plan, script) if args.provisioner == "terraform" else None
    from lightning_srifty.provision.aws import aws_errors

    where = f"keeping its records and heartbeat in {args.checkpoint_uri}" if args.checkpoint_uri else "starting fleets"
    try:
        with aws_errors(f"srifty launch was {where}"):  # botocore's own errors (no credentials) read as one line
            migrations = launch(plan, script, settings=settings, provisioner=provisioner)
    except LaunchInterrupted as exc:
        released = ", ".join(exc.released) or "none"
        print(
            f"srifty launch: stopped by {exc.signal_name}; released {len(exc.released)} fleet(s) ({released})"
            f"{_move_log(args.workdir)}",
            file=sys.stderr,
        )
        print(_how_to_continue(args), file=sys.stderr)
        return exc.exit_code
    print(f"{len(migrations)} migration(s){_move_log(args.workdir)}")
    return 0


def _move_log(workdir: str) -> str:
    """ "; log: WORKDIR/migrations.jsonl" where a move wrote it ("" before any: a trial was sent to a missing file)."""
    log = Path(workdir) / "migrations.jsonl"
    return f"; log: {log}" if log.exists() else ""


def _workdir(args: argparse.Namespace) -> Path:
    """``--workdir``, made (the migration log, and the local provisioner's checkpoints, go there)."""
    from predictor.exceptions import ConfigError

    workdir = Path(args.workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--workdir {args.workdir} cannot be used ({exc.strerror or exc}): give a folder srifty launch may create "
            "and write (the migration log, and the local provisioner's checkpoints, go there).",
            parameter="workdir",
            value=args.workdir,
        ) from None
    return workdir


def _resume_from(args: argparse.Namespace) -> str:
    """The checkpoint the first fleet resumes from: ``--resume latest`` (the newest sound one of this launch's
    folder), ``--resume PATH`` (vetted), or "" (a fresh start)."""
    from predictor.exceptions import ConfigError

    resume = args.resume or ""
    if resume == "latest":
        from lightning_srifty.migrate.checkpoints import find_checkpoint

        folder = _checkpoint_folder(args)
        found = find_checkpoint(folder) if folder else None
        if found is None:
            raise ConfigError(
                f"--resume: {folder} holds no sound checkpoint to resume from. Leave --resume out to start afresh, "
                "give the checkpoint's path (--resume PATH), or the --workdir / --checkpoint-uri of the launch that "
                "left it.",
                parameter="resume",
                value=args.resume,
            )
        return found
    if resume:
        _vet_resume(resume)
    return resume


def _terraform_provisioner(args: argparse.Namespace, plan: Any, script: list[str]) -> Any:
    """``--provisioner terraform``: the Terraform fleets' provisioner, the code packed once for every fleet."""
    from lightning_srifty.cli._common import code_options
    from lightning_srifty.provision.launcher.terraform_fleet import TerraformProvisioner
    from lightning_srifty.provision.terraform.generate import Options
    from predictor.exceptions import ConfigError

    if not args.checkpoint_uri:
        raise ConfigError(
            "--provisioner terraform needs --checkpoint-uri s3://bucket/prefix (an existing bucket shared by "
            "every fleet of the run).",
            parameter="checkpoint_uri",
        )
    if args.aws_endpoint:
        # one endpoint for every client of this process: terraform's provider, and the launcher's own S3 records
        # and heartbeat, EC2 offerings and Auto Scaling calls (boto3 and s3fs read AWS_ENDPOINT_URL)
        os.environ["AWS_ENDPOINT_URL"] = args.aws_endpoint
    options = Options(
        region=args.region,
        train_command=shlex.join(script),
        setup_command=args.setup_command,
        mode=args.mode,
        ami=args.ami,
        aws_endpoint=args.aws_endpoint,
        **code_options(args),
        code_leave_out=(args.workdir,),
        # the nodes' own watch (the module's bounds: 60 s at least): a hung teardown past the stall limit, and a
        # script silent after its training past this launch's limit after the fit (the launcher sees neither)
        stall_timeout_s=max(60.0, args.stall_timeout_min * 60) if args.stall_timeout_min else None,
        after_fit_timeout_s=max(60.0, args.after_fit_timeout_min * 60),
    )
    provisioner = TerraformProvisioner(args.workdir, args.checkpoint_uri, options)
    if options.code is not None:  # packed once: every fleet of the run gets the same code
        from lightning_srifty.provision.terraform.generate import make_snapshot

        snapshot, notes = make_snapshot(plan, options, Path(args.workdir) / "code", (Path(args.workdir),))
        for note in notes:
            print(f"WARNING: {note}.", file=sys.stderr)
        print(
            f"srifty launch: code {Path(options.code).resolve()} packed: {len(snapshot.files)} files, sha256 "
            f"{snapshot.sha256[:16]}... ({snapshot.path})"
        )
        provisioner.options = dataclasses.replace(provisioner.options, snapshot=str(snapshot.path))
    return provisioner


def _checkpoint_folder(args: argparse.Namespace) -> str:
    """Where this launch keeps its checkpoints: the terraform provisioner's --checkpoint-uri, else the workdir's."""
    if getattr(args, "provisioner", "local") == "terraform":
        return str(args.checkpoint_uri or "")
    return str((Path(args.workdir) / "checkpoints").resolve())


def _vet_resume(path: str) -> None:
    """``--resume PATH`` is checked as ``--resume latest`` checks what it finds: a checkpoint whose recorded digest no
    longer matches resumed with a NaN weight and rc 0 (issue #36 M3).

    Raises:
        ConfigError: it is missing or not sound (named, with why and the fix).
    """
    from lightning_srifty.migrate.checkpoints import vet_checkpoint
    from lightning_srifty.store import filesystem
    from predictor.exceptions import ConfigError

    fs = filesystem(path)
    try:
        if not fs.exists(path):
            raise ValueError("there is no such file or folder")
        vet_checkpoint(fs, path)
    except ValueError as exc:
        raise ConfigError(
            f"--resume {path}: not a sound checkpoint: {exc}. Resume from another one (--resume latest takes the "
            "newest sound one of the folder), or leave --resume out to start afresh.",
            parameter="resume",
            value=path,
        ) from None


def _how_to_continue(args: argparse.Namespace) -> str:
    """After an interrupted launch: the newest sound checkpoint it left, and the command that continues from it."""
    from lightning_srifty.migrate.checkpoints import find_checkpoint

    folder = _checkpoint_folder(args)
    try:
        found = find_checkpoint(folder)
    except Exception as exc:  # noqa: BLE001 - a hint, never a second error
        return f"srifty launch: the checkpoints in {folder} could not be listed ({exc})"
    if found is None:
        return f"srifty launch: no checkpoint was left in {folder}: the same command starts afresh"
    argv = sys.argv[1:]
    if not argv or argv[0] != "launch":  # called from Python, not the console script
        return f"srifty launch: the newest checkpoint is {found}; continue with the same command and --resume latest"
    cut = argv.index("--") if "--" in argv else len(argv)  # the script's own arguments stay as they were
    flags, skip = [], False
    for a in argv[1:cut]:  # without the earlier --resume [CHECKPOINT]
        if skip and not a.startswith("-"):
            skip = False
            continue
        skip = a == "--resume"
        if not skip and not a.startswith("--resume="):
            flags.append(a)
    again = ["launch", "--resume", "latest", *flags, *argv[cut:]]
    return f"srifty launch: the newest checkpoint is {found}; to continue from it: srifty {shlex.join(again)}"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from lightning_srifty.cli._common import add_code_arguments, nonneg_int, positive, positive_int

    p = sub.add_parser("launch", help="run a training script on the plan's fleet and migrate it when it pays")
    p.add_argument("--plan", required=True, help="srifty.plan/v1 JSON")
    p.add_argument(
        "--choice",
        type=nonneg_int,
        default=None,
        help="the ranked fleet to start on (default: the plan's recommendation, its chosen entry: 0 as srifty "
        "recommend writes it)",
    )
    p.add_argument("--workdir", default="srifty/launch", help="the migration log (and local checkpoints) go here")
    p.add_argument("--provisioner", choices=("local", "terraform"), default="local")
    p.add_argument("--name", default="srifty", help="fleet names are <name>-1, <name>-2, ... (terraform resources)")
    p.add_argument("--max-migrations", type=nonneg_int, default=3)
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="CHECKPOINT",
        help="the job resumes from this checkpoint; alone (or 'latest'): the newest sound one an earlier launch of the "
        "same --workdir / --checkpoint-uri left (an interrupted launch says so)",
    )
    p.add_argument("--max-local-processes", type=positive_int, default=8, help="local: at most this many processes")
    _watch_flags(p)
    _timeout_flags(p)
    p.add_argument(
        "--simulate-notice-after", type=positive, metavar="S", help="local: a metadata service, spot notice after S s"
    )
    tf = p.add_argument_group("terraform provisioner")
    tf.add_argument("--checkpoint-uri", help="s3://bucket/prefix shared by every fleet (an existing bucket)")
    tf.add_argument("--region", help="default: the plan's region")
    tf.add_argument("--ami", help="AMI id (default: the Deep Learning AMI from SSM)")
    tf.add_argument("--setup-command", default="", help="what every instance runs before training")
    tf.add_argument("--mode", choices=("asg", "fleet"), default="asg")
    tf.add_argument("--aws-endpoint", help="an AWS API endpoint such as moto's (testing)")
    add_code_arguments(tf)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [args]: what torchrun starts per GPU")
    p.set_defaults(func=cmd_launch)


def _watch_flags(p: argparse.ArgumentParser) -> None:
    """How the launcher watches a fleet: its heartbeat, each fleet's life cap, the spot guard."""
    from lightning_srifty.cli._common import positive

    p.add_argument(
        "--heartbeat-s",
        type=positive,
        default=30.0,
        metavar="S",
        help="rewrite HEARTBEAT.json beside the checkpoints every S seconds (default 30)",
    )
    p.add_argument(
        "--heartbeat-max-age",
        dest="heartbeat_max_age_s",  # LauncherSettings' field: a refusal of it names this flag
        type=positive,
        default=600.0,
        metavar="S",
        help="a job (and the instances) whose heartbeat is older than S seconds checkpoints and leaves: a launcher "
        "killed outright leaves nothing running for long (default 600)",
    )
    p.add_argument(
        "--max-life-h",
        type=positive,
        metavar="H",
        help="hard cap on each fleet's life: the job checkpoints and leaves after H hours (default: the plan's "
        "predicted time x 1.5 or the time's 99th percentile, the later, + 1 h)",
    )
    p.add_argument(
        "--spot-policy",
        choices=("srifty", "greedy", "uniform", "off"),
        help="against the plan's deadline, when to stay on spot, wait for it, fall back to the same fleet on-demand "
        "or return to spot; never so late that an on-demand finish would miss the deadline (default: srifty for a "
        "spot or mixed entry of a plan with a deadline, else off)",
    )
    p.add_argument(
        "--spot-check-s",
        type=positive,
        default=300.0,
        metavar="S",
        help="the spot policy looks every S seconds (its tick; default 300)",
    )


def _timeout_flags(p: argparse.ArgumentParser) -> None:
    """How long the launcher gives a fleet's job: to start, between signs of life, and after its training."""
    from lightning_srifty.cli._common import nonneg, positive

    p.add_argument(
        "--start-timeout-min",
        type=positive,
        help="a remote fleet whose job has not taken its first step (or written any record) after this many minutes "
        "is reported and released: failed boot or setup, OOM, an unreachable checkpoint folder (default 30; local "
        "processes are watched directly)",
    )
    p.add_argument(
        "--stall-timeout-min",
        type=nonneg,
        default=20.0,  # watches.DEFAULT_STALL_TIMEOUT_S (not imported: the parser is built without the launcher)
        metavar="MIN",
        help="a job that trained and then showed no sign of life (no step, validation batch or checkpoint save) for "
        "this many minutes hangs (a GPU that stopped answering, a collective or a read that never returns): its "
        "fleet is released and the job restarts on new machines of the same entry from the newest checkpoint; the "
        "same hang again past the same step ends the launch (default 20, under the process group's 30-minute timeout; "
        "longer where the job's steps need it; 0: not watched)",
    )
    p.add_argument(
        "--after-fit-timeout-min",
        type=positive,
        default=30.0,  # protocol.AFTER_FIT_TIMEOUT_S (not imported: the parser is built without the launcher)
        metavar="MIN",
        help="once the job's training has finished, how long its script may still run on the fleet (a test, an "
        "export, a model's upload after fit()) before the fleet is released anyway and the launch fails; the fleet is "
        "released as soon as the script has ended on every node, and a terraform fleet's nodes end a script silent "
        "this long after its training themselves, unless --stall-timeout-min 0 turns their watch off (default 30)",
    )
