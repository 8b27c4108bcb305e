"""``srifty apply`` / ``srifty destroy``: terraform init, plan, a summary, a confirmation, apply (python-terraform).

Progress streams to the terminal (terraform's own output); the plan summary counts the resources to add, change and
destroy by type before anything is changed. Missing pieces (the terraform binary, AWS credentials, the folder) are
clear errors, not tracebacks. The written values are checked against the catalog first (counts, $/h, the guards in
``limits``: :mod:`lightning_srifty.provision.terraform.money`).

An apply that fails part-way, or is interrupted (Ctrl-C), leaves nothing billing: when the state was empty before (a
new fleet), everything it created is destroyed at once; when it held a fleet already, nothing is destroyed (that fleet
may be training) and the error says how to (``srifty destroy --dir``). An apply that meets a transient AWS error
(rate limits, a lost answer the SDK retried: :data:`TRANSIENT_APPLY_ERRORS`) is planned and applied again first, at most
:data:`APPLY_RETRIES` times.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_srifty.provision import aws
from lightning_srifty.provision.preflight import preflight_root
from lightning_srifty.provision.terraform.generate import MARKER, TFVARS
from lightning_srifty.provision.terraform.money import check_values
from predictor.catalog.catalog import Catalog
from predictor.exceptions import ConfigError, PreflightError, ProvisionError

PLAN_FILE = "srifty.tfplan"

#: AWS errors that say nothing about the configuration: the API's load, or an earlier attempt of the same request
#: that the SDK retried after its answer was lost. An apply that meets one is run again (after a new plan), and
#: terraform replaces what it left half-made (a resource whose create failed is tainted). Real errors (a bad value, a
#: quota, no capacity) are not here: they fail at once.
TRANSIENT_APPLY_ERRORS = (
    "RequestLimitExceeded",  # EC2's API rate limit
    "Throttling",  # ThrottlingException, Throttling: the other services' rate limits
    "InternalError",  # 500s: EC2's own "An internal error has occurred"
    "ServiceUnavailable",
    "connection reset by peer",
    "InvalidPermission.Duplicate",  # a security-group rule authorized twice: the first answer was lost, the SDK retried
    # a rule revoked twice (the provider revokes a new group's default egress rule): the same lost answer; on AWS also
    # a new group's rules not yet visible (eventual consistency). A new plan reads the group as it is.
    "InvalidPermission.NotFound",
    # a create answered "already exists": the module names what it creates with name_prefix (a fresh suffix per
    # attempt), so the only holder of the name is the same request's lost first attempt, which the SDK retried (IAM
    # roles and instance profiles; EC2 launch templates). A new plan creates it under a new name; the lost attempt's
    # object (neither runs nor bills) is outside terraform's state. (moto under load did both in CI.)
    "EntityAlreadyExists",
    "AlreadyExistsException",
    # the role added twice to the instance profile: a profile holds one role and the module adds exactly one, so the
    # second add is the SDK's retry of a lost first answer (IAM answers LimitExceeded; moto under load did, 2026-11-29).
    # The new plan replaces the half-made profile (tainted) and adds the role to the new one.
    "InstanceSessionsPerInstanceProfile",
)
#: Applies after the first one that a transient error may start (see :data:`TRANSIENT_APPLY_ERRORS`). Two: an API under
#: load can lose a second answer in the apply that replaces what the first loss left half-made (moto on a loaded
#: 2-core machine did, 2026-11-28); a third transient error in a row fails the apply, and what it made is destroyed.
APPLY_RETRIES = 2


def transient_error(output: str) -> str | None:
    """The transient AWS error a failed apply's output names (:data:`TRANSIENT_APPLY_ERRORS`), else None."""
    return next((code for code in TRANSIENT_APPLY_ERRORS if code in output), None)


@dataclass(frozen=True)
class PlanSummary:
    add: int
    change: int
    destroy: int
    by_type: dict[str, Counter[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"Terraform will add {self.add}, change {self.change} and destroy {self.destroy} resources:"]
        for rtype, actions in sorted(self.by_type.items()):
            out.append(f"  {rtype}: " + ", ".join(f"{n} to {a}" for a, n in sorted(actions.items())))
        return out


def _terraform(folder: Path) -> Any:
    binary = shutil.which("terraform")
    if binary is None:
        raise ProvisionError(
            "The terraform binary is not on PATH. Install Terraform >= 1.5 "
            "(https://developer.hashicorp.com/terraform/install) and try again."
        )
    from python_terraform import Terraform

    return Terraform(working_dir=str(folder), terraform_bin_path=binary)


def check_folder(folder: Path) -> dict[str, Any]:
    """The root module's tfvars, after checking that ``folder`` is one ``srifty terraform`` wrote.

    Raises:
        ProvisionError: it is not.
    """
    if not folder.exists():  # a trial read "is not a root module" for a folder that is not there
        raise ProvisionError(
            f"{folder} does not exist: give the folder `srifty terraform --plan plan.json --out DIR` wrote (it holds "
            f"{TFVARS})."
        )
    if not (folder / TFVARS).is_file() or not (folder / MARKER).is_file():
        raise ProvisionError(
            f"{folder} is not a root module written by `srifty terraform` (no {TFVARS}). Write one with "
            "`srifty terraform --plan plan.json --out DIR`."
        )
    return json.loads((folder / TFVARS).read_text())


def _check_credentials(values: dict[str, Any]) -> None:
    if values.get("aws_endpoint"):
        return  # a local endpoint (moto) takes any credentials
    import boto3

    if boto3.Session().get_credentials() is None:
        raise ProvisionError(
            "No AWS credentials found. Set AWS_PROFILE (after `aws sso login` or `aws configure`), or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and try again."
        )


def _keep_checkpoint_bucket(
    tf: Any, root: Path, values: dict[str, Any], echo: Callable[[str], None], delete: bool
) -> str | None:
    """Before a destroy (see :func:`destroy`): the module's checkpoint bucket out of the state when it holds
    anything (its name), or emptied when ``delete``; None when there is none, it is empty, or its force_destroy is
    on (terraform empties it)."""
    if (values.get("checkpoints") or {}).get("force_destroy"):
        return None
    code, listed, _ = _run(tf, "state list", stream=False)
    addresses = [a for a in listed.split() if _bucket_part(a)]
    if code != 0 or not addresses:
        return None
    try:
        bucket = (outputs(root).get("fleet") or {}).get("checkpoint_bucket")
    except (ProvisionError, ValueError, AttributeError):
        bucket = None
    if not bucket:
        return None
    s3 = aws.client("s3", values.get("region"), values.get("aws_endpoint"))
    try:  # a bucket that cannot be looked into never holds the fleet's destroy up: it is kept, as if it held some
        with aws.aws_errors(f"looking into the checkpoint bucket {bucket}"):
            if not _holds_the_runs(s3, str(bucket), _module_objects(tf)):
                return None
            if delete:
                echo(f"Deleting every object (and old version) of the checkpoint bucket {bucket}.")
                aws.empty_bucket(s3, bucket)
                return None
    except ProvisionError as exc:
        echo(f"WARNING: {exc} The bucket is kept out of the destroy.")
    for address in addresses:
        code, _, err = _run(tf, "state rm", address, stream=False)
        if code != 0:
            raise ProvisionError(f"Could not keep the checkpoint bucket {bucket} out of the destroy: {err.strip()}")
    return str(bucket)


def _module_objects(tf: Any) -> set[str]:
    """The keys of the S3 objects in the state (the module's boot scripts and code archive), which the destroy
    deletes with every version (an infra team's down kept an empty bucket, out of the state, for these alone, and the
    next apply of the same name failed on BucketAlreadyExists). None found: an empty set (every object counts)."""
    code, out, _ = _run(tf, "show", json=True, stream=False)
    try:
        state = json.loads(out) if code == 0 and out.strip() else {}
    except ValueError:
        return set()
    keys: set[str] = set()
    modules = [(state.get("values") or {}).get("root_module") or {}]
    while modules:
        module = modules.pop()
        modules += module.get("child_modules") or []
        for resource in module.get("resources") or []:
            if resource.get("type") == "aws_s3_object" and resource.get("mode") == "managed":
                keys.add(str((resource.get("values") or {}).get("key")))
    return keys


def _holds_the_runs(s3: Any, bucket: str, module_keys: set[str]) -> bool:
    """Whether ``bucket`` holds an object version or delete marker that is not one of the module's own objects (what
    the run wrote: checkpoints, records, logs, outputs)."""
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for item in page.get("Versions", []) + page.get("DeleteMarkers", []):
            if item["Key"] not in module_keys:
                return True
    return False


def _bucket_part(address: str) -> bool:
    """Whether a state address is the checkpoint bucket or one of its settings (``aws_s3_bucket*.checkpoints``)."""
    parts = address.rsplit(".", 2)
    return len(parts) >= 2 and parts[-2].startswith("aws_s3_bucket") and parts[-1].split("[")[0] == "checkpoints"


def _run(tf: Any, *args: str, stream: bool = True, critical: bool = False, **options: Any) -> tuple[int, str, str]:
    """terraform ``args`` with python-terraform's flags (``options``), in a session of its own: an interruption of
    this process (Ctrl-C, the launcher's SIGTERM/SIGHUP) gives it one SIGINT and at most a minute to end, then kills
    it, so that neither it nor its AWS provider (0.55-0.6 GB) outlives srifty (issue #36 L2: a signal during
    ``terraform plan`` left the provider running up to 11 min). ``stream``: its output goes to this terminal.
    ``critical`` (a clean-up's destroy): an interruption waits for terraform to end, then is raised (stopped half-way
    the destroy would leave the fleet billing)."""

    from python_terraform import IsFlagged

    opts = {k: (IsFlagged if v is True else v) for k, v in options.items()}
    command = tf.generate_cmd_string(*args, no_color=IsFlagged, **opts)
    pipe = None if stream else subprocess.PIPE
    proc, pending = _spawn(
        command, cwd=tf.working_dir or None, stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _redeliver(pending)  # a signal that came while terraform was being started is acted on here, proc known
        out, err = proc.communicate()
    except BaseException:
        if critical:
            while True:  # every further interruption waits too: the destroy goes on to its end
                try:
                    proc.wait()
                    break
                except BaseException:  # noqa: BLE001 - deferred: the first one is raised below
                    pass
            raise
        _signal(proc, signal.SIGINT)
        _wait_or_kill(proc, 60)
        raise
    decode = lambda b: b.decode("utf-8", "replace") if b else ""  # noqa: E731
    return proc.returncode, decode(out), decode(err)


def _spawn(*args: Any, **kwargs: Any) -> tuple[Any, int | None]:
    """``subprocess.Popen(*args, **kwargs)`` with the interrupting signals held while it runs: one that arrived
    inside Popen (after the fork, before the object was returned) raised there, and the terraform it had started,
    in a session of its own, ran on unknown to srifty with the state's lock (bench/launcher_signals.py: 2 processes
    left in one run of ten when SIGTERM met `terraform plan`'s start). Returns the process and the signal that came
    meanwhile, for :func:`_redeliver` inside the caller's ``try``. Only signals whose handler is Python's (the
    launcher's, KeyboardInterrupt's) are held; in another thread nothing is (handlers belong to the main thread)."""

    pending: list[int] = []
    held: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if callable(signal.getsignal(sig)):
                held[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        proc = subprocess.Popen(*args, **kwargs)
    finally:
        for number, handler in held.items():
            signal.signal(number, handler)
    return proc, (pending[0] if pending else None)


def _redeliver(signum: int | None) -> None:
    """Raise a signal :func:`_spawn` held, so that its handler acts now (inside the caller's ``try``)."""
    if signum is not None:
        signal.raise_signal(signum)


def _wait_or_kill(proc: Any, seconds: float) -> None:
    """Wait up to ``seconds`` for terraform to end, then kill it and its group (:func:`_signal`)."""

    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()


def _signal(proc: Any, sig: int) -> None:
    """``sig`` to terraform: a SIGINT or SIGTERM to its process alone (terraform stops its providers and provisioners
    itself; one SIGINT more, to its whole group, reached a `local-exec` provisioner and its providers directly and
    ended the apply without its state, found by ``test_an_interrupted_apply_stops_terraform_once...`` in CI); a
    SIGKILL to its whole group (it runs in a session of its own), so that no provider outlives it."""

    try:
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(OSError):
            proc.send_signal(sig)


# how long an interrupted terraform gets to finish what it is creating, save its state and release its lock
GRACE_S = 600.0


def _run_shown(
    tf: Any,
    args: list[str],
    echo: Callable[[str], None],
    keep: int = 60,
    critical: str | None = None,
    timeout_s: float | None = None,
    kill_after_s: float = 60.0,
) -> tuple[int, str]:
    """Run terraform with its output shown line by line as it comes (``echo``) and its last ``keep`` lines kept, so
    that a failure's message can say what terraform said (an EC2 error code: srifty launch fails over on some).

    Terraform runs in a session of its own, so a terminal's Ctrl-C reaches it once, from here: when this process is
    interrupted (KeyboardInterrupt, the launcher's SIGTERM/SIGHUP), terraform gets one SIGINT, finishes the calls in
    flight, writes its state and releases its lock (within :data:`GRACE_S`, else it is stopped), and only then is
    the interruption raised, so that the clean-up's destroy sees the state and is not refused the lock. (A second
    SIGINT would make terraform exit at once and lose what it had created.)

    ``critical`` (a teardown: the command that finishes it by hand, ``srifty down --dir ...``): an interruption is
    deferred, not passed on. A destroy stopped half-way leaves instances and their Auto Scaling group billing (issue
    #36: a signal 4 s into the start-timeout's destroy left them running), so terraform goes on to the end; every
    signal meanwhile is answered with a line naming what is still being destroyed and the command, and the first
    interruption is raised once terraform has finished. Even a SIGKILL of this process does not stop the destroy:
    terraform runs in its own session.

    ``timeout_s`` (a rehearsal's destroy in its local AWS, which goes with it; ``srifty apply --timeout-min``):
    terraform gets one SIGINT after that long, and is killed ``kill_after_s`` later if it has not ended."""

    tail: collections.deque[str] = collections.deque(maxlen=keep)
    proc, pending = _spawn(
        [tf.terraform_bin_path, *args],
        cwd=tf.working_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    assert proc.stdout is not None
    timers = _time_limit(proc, timeout_s, kill_after_s) if timeout_s is not None else []
    try:
        code, deferred = _show_until_exit(proc, pending, echo, tail, critical)
    finally:
        proc.stdout.close()
        for timer in timers:
            timer.cancel()
    if deferred is not None:
        raise deferred
    return code, "\n".join(tail) if code else ""


def _time_limit(proc: Any, timeout_s: float, kill_after_s: float) -> list[threading.Timer]:
    """Started timers that give ``proc`` one SIGINT after ``timeout_s`` and a SIGKILL ``kill_after_s`` later, if it
    is still running then (cancel them once it has ended)."""

    def stop(sig: int) -> None:
        if proc.poll() is None:
            _signal(proc, sig)

    timers = [
        threading.Timer(timeout_s, stop, (signal.SIGINT,)),
        threading.Timer(timeout_s + kill_after_s, stop, (signal.SIGKILL,)),
    ]
    for timer in timers:
        timer.daemon = True
        timer.start()
    return timers


def _show_until_exit(
    proc: Any, pending: int | None, echo: Callable[[str], None], tail: collections.deque[str], critical: str | None
) -> tuple[int, BaseException | None]:
    """Echo terraform's output line by line (keeping the last lines in ``tail``) until it exits: its exit code, and
    the interruption deferred while a ``critical`` teardown went on (see :func:`_run_shown`). Without ``critical``
    an interruption stops terraform gracefully and is raised at once."""
    deferred: BaseException | None = None
    while True:
        try:
            _redeliver(pending)  # once: a signal that came while terraform was being started
            pending = None
            for line in proc.stdout:
                echo(line.rstrip("\n"))
                tail.append(line.rstrip("\n"))
            return proc.wait(), deferred
        except BaseException as exc:
            if critical is None:
                _stop_gracefully(proc, echo)
                raise
            deferred = deferred or exc
            # nothing said here may end the teardown: a closed terminal, another Ctrl-C while it prints
            with contextlib.suppress(BaseException):
                echo(
                    "Interrupted during the teardown: terraform goes on destroying (stopped half-way it would "
                    f"leave the fleet billing); this ends once it has. To finish it by hand: {critical}"
                )


def _stop_gracefully(proc: Any, echo: Callable[[str], None], grace_s: float | None = None) -> None:
    """One SIGINT to an interrupted terraform, its remaining output shown, and a bounded wait for it to exit."""

    if proc.poll() is not None:
        return
    echo("Interrupted: terraform finishes what it is creating, saves its state and releases its lock (one SIGINT).")
    _signal(proc, signal.SIGINT)

    def drain() -> None:
        try:
            for line in proc.stdout:
                echo(line.rstrip("\n"))
        except (OSError, ValueError):
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=GRACE_S if grace_s is None else grace_s)
    except subprocess.TimeoutExpired:
        echo(f"terraform did not stop within {GRACE_S if grace_s is None else grace_s:.0f} s: stopping it.")
        _signal(proc, signal.SIGTERM)
        _wait_or_kill(proc, 30)
    reader.join(timeout=5)


def summarize(plan_json: dict[str, Any]) -> PlanSummary:
    by_type: dict[str, Counter[str]] = {}
    totals: Counter[str] = Counter()
    for change in plan_json.get("resource_changes", []):
        actions = change.get("change", {}).get("actions", [])
        if actions in (["no-op"], ["read"]):
            continue
        kind = "replace" if set(actions) == {"create", "delete"} else actions[0]
        by_type.setdefault(change["type"], Counter())[kind] += 1
        if kind == "replace":
            totals["create"] += 1
            totals["delete"] += 1
        else:
            totals[kind] += 1
    return PlanSummary(totals["create"], totals["update"], totals["delete"], by_type)


def _confirm(question: str, yes: bool, ask: Callable[[str], str] | None) -> None:
    if yes:
        return
    if ask is None:
        if not sys.stdin.isatty():
            raise ProvisionError.named(
                "Not confirmed: there is no terminal to ask on ({question}): nothing was changed. Give {yes} to go "
                "ahead.",
                question=question,
            )
        ask = input
    if ask(question + " Type 'yes' to go on: ").strip().lower() != "yes":
        raise ProvisionError("Cancelled: nothing was changed.")


def apply(
    folder: str | os.PathLike[str],
    *,
    yes: bool = False,
    ask: Callable[[str], str] | None = None,
    echo: Callable[[str], None] = print,
    catalog: Any = None,
    check: bool = True,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """check the values against the catalog, run the pre-flight (``check``; see :mod:`.preflight`), init, plan, show
    the summary, confirm, apply; returns the root module's outputs. ``timeout_s``: the apply (its retries included)
    gets one SIGINT after that long, and what it created of a new fleet is destroyed (issue #37 L: an apply whose Auto
    Scaling group never filled waited on terraform's own timeouts, 15 min and more, with nothing said).

    Raises:
        ConfigError: the values disagree with the catalog or break a guard (nothing is run).
        PreflightError: the pre-flight found a problem (quota, offering, bucket, credentials, script): nothing is run.
        ProvisionError: a terraform step failed; after a failed or interrupted apply of a new fleet, what it created
            has been destroyed (the message says whether that worked).
    """
    root = Path(folder)
    values = check_folder(root)
    if catalog is None:
        catalog = Catalog.load()
    check_values(values, catalog)
    tf = _terraform(root)
    _check_credentials(values)
    if check:
        _preflight_or_refuse(root, catalog, echo)
    summary = _plan(tf, root, echo, values)
    for line in summary.lines():
        echo(line)
    predicted = values.get("predicted") or {}
    if predicted:
        echo(
            f"Predicted: {predicted['throughput_samples_s']:,.1f} samples/s at ${predicted['usd_per_hour']:,.2f}/h; "
            f"{predicted['time_h']:,.2f} h and ${predicted['cost_usd']:,.2f} for the planned work."
        )
    if summary.add + summary.change + summary.destroy == 0:
        echo("Nothing to change.")
    else:
        _confirm("Apply this plan?", yes, ask)
        _apply_or_clean_up(tf, root, values, echo, timeout_s)
    (root / PLAN_FILE).unlink(missing_ok=True)
    return outputs(root)


def _preflight_or_refuse(root: Path, catalog: Any, echo: Callable[[str], None]) -> None:
    """Run the pre-flight of the root module and say its report.

    Raises:
        PreflightError: it found a problem; nothing was started.
    """
    report = preflight_root(root, catalog)
    for line in report.text().splitlines():
        echo(line)
    if not report.ok:
        raise PreflightError(
            f"The pre-flight of {root} failed, nothing was started:\n" + "\n".join(f.line() for f in report.failed()),
            report=report.to_dict(),
        )


def _plan(tf: Any, root: Path, echo: Callable[[str], None], values: dict[str, Any]) -> PlanSummary:
    """terraform init, plan (saved as :data:`PLAN_FILE`) and show: what the apply would do, once the fleet it buys is
    the one ``values`` (srifty terraform's) describe (:func:`check_purchase`).

    Raises:
        ProvisionError: a step failed, with terraform's own words.
        ConfigError: a file of the team's own changes what the fleet buys.
    """
    echo(f"terraform init in {root}")
    code, _, err = _run(tf, "init", input=False, stream=False)
    if code != 0:
        raise ProvisionError(f"terraform init failed in {root}:\n{err.strip()}")
    echo("terraform plan")
    code, _, err = _run(tf, "plan", input=False, out=PLAN_FILE, detailed_exitcode=True, stream=False)
    if code not in (0, 2):
        raise ProvisionError(f"terraform plan failed in {root}:\n{err.strip()}")
    code, out, err = _run(tf, "show", PLAN_FILE, json=True, stream=False)
    if code != 0:
        raise ProvisionError(f"terraform show failed in {root}:\n{err.strip()}")
    planned = json.loads(out)
    check_purchase(root, planned, values)
    return summarize(planned)


# what the fleet buys, by root variable (None: the whole value): srifty apply prices, checks the quotas of and guards
# the fleet srifty.auto.tfvars.json describes, so a file of the team's own may set anything but these
PURCHASE: dict[str, tuple[str, ...] | None] = {
    "region": None,
    "groups": ("instance_type", "on_demand", "spot", "weighted_capacity", "gpus_per_instance"),
    "capacity": ("mode", "on_demand_base_capacity", "on_demand_percentage_above_base"),
}


def check_purchase(root: Path, planned: dict[str, Any], values: dict[str, Any]) -> None:
    """Refuse a plan whose variables (``planned``: terraform show -json of it) buy another fleet than ``values``.

    The docs invite a file of the team's own beside the generated values (a capacity block with
    ``capacity_rebalance``, the metadata hop limit); an infra team's ``team.auto.tfvars.json`` there set
    ``capacity.on_demand_base_capacity`` 300, and srifty apply showed the plan's spot $5.66/h and checked spot quotas
    for a fleet terraform would buy on demand at $13.8/h ("the fleet shown is the fleet paid for", docs/security.md).

    Raises:
        ConfigError: a purchase field differs, naming it, both values, the files that may set it, and the fixes.
    """
    variables = planned.get("variables") or {}
    changed = []
    for name, fields in PURCHASE.items():
        if name not in variables:
            continue
        ours, theirs = values.get(name), (variables[name] or {}).get("value")
        if fields is not None:
            ours, theirs = (_fields_of(v, fields) for v in (ours, theirs))
        if ours != theirs:
            changed.append((name, ours, theirs))
    if not changed:
        return
    name, ours, theirs = changed[0]
    files = [f.name for f in sorted(root.iterdir()) if _sets_variables(f, [n for n, _, _ in changed])]
    raise ConfigError.between(
        "{changed} in {root} differ from srifty terraform's values ({tfvars}): {name} is {theirs}, where srifty wrote "
        "{ours}. That is another fleet than the one srifty apply prices, checks the quotas of and guards, from "
        "{files}. Make the change through srifty terraform (another entry of the plan, or a plan made for another "
        "market, size or region), or keep it and apply with terraform itself, which is then yours to price.",
        parameter=name,
        value=theirs,
        changed=", ".join(n for n, _, _ in changed),
        root=str(root),
        tfvars=TFVARS,
        name=name,
        theirs=json.dumps(theirs),
        ours=json.dumps(ours),
        files=", ".join(files) or "a -var or TF_VAR_ value",
    )


def _fields_of(value: Any, fields: tuple[str, ...]) -> Any:
    """``fields`` of an object, or of each object of a list (the rest of them the team's to set)."""
    if isinstance(value, list):
        return [_fields_of(v, fields) for v in value]
    if isinstance(value, dict):
        return {f: value.get(f) for f in fields}
    return value


def _sets_variables(path: Path, names: list[str]) -> bool:
    """Whether ``path`` is a variables file terraform reads on its own, not srifty's, that names one of ``names``."""
    own = path.name.endswith((".auto.tfvars", ".auto.tfvars.json")) or path.name in (
        "terraform.tfvars",
        "terraform.tfvars.json",
    )
    if not own or path.name == TFVARS or not path.is_file():
        return False
    text = path.read_text(errors="replace")
    return any(re.search(rf'(^|[\s{{,"]){re.escape(n)}"?\s*[=:]', text, re.M) for n in names)


def _apply_or_clean_up(
    tf: Any, root: Path, values: dict[str, Any], echo: Callable[[str], None], timeout_s: float | None
) -> None:
    """Apply the saved plan; after a failed, late or interrupted apply of a new fleet, destroy what it created.

    Raises:
        ProvisionError: the apply failed or ran past ``timeout_s`` (the message says what the clean-up did).
    """
    fresh = not _state_resources(tf)
    started = time.monotonic()
    try:
        code, err = _apply_plan(tf, echo, None if timeout_s is None else started + timeout_s)
    except BaseException:  # Ctrl-C, or the launcher's SIGTERM/SIGHUP: terraform has stopped and saved its state
        echo("Interrupted during terraform apply: " + _clean_up(tf, root, values, fresh, echo))
        raise
    if code == 0:
        return
    late = timeout_s is not None and time.monotonic() - started >= timeout_s
    left = _clean_up(tf, root, values, fresh, echo)
    if late and timeout_s is not None:
        raise ProvisionError(
            f"terraform apply did not finish within {timeout_s / 60:,.0f} min in {root} (an Auto Scaling "
            "group that never filled: capacity, a quota, a placement group): it was stopped; "
            f"{left} Raise the limit (timeout_s; `srifty apply --timeout-min`) if the fleet really takes longer.\n"
            f"{err.strip()}"
        )
    raise ProvisionError(f"terraform apply failed in {root} (see the output above); {left}\n{err.strip()}")


def _apply_plan(tf: Any, echo: Callable[[str], None], deadline: float | None = None) -> tuple[int, str]:
    """Apply the saved plan; after a transient AWS error (:func:`transient_error`), plan again and apply that, at most
    :data:`APPLY_RETRIES` times. The configuration is the one confirmed: only the state differs (what the failed
    apply made). Returns the last apply's exit code and its output's tail (empty on success). ``deadline``
    (monotonic): terraform gets one SIGINT then (:func:`_run_shown`'s ``timeout_s``)."""
    retries = 0
    while True:
        left = None if deadline is None else max(1.0, deadline - time.monotonic())
        # after the deadline's SIGINT terraform finishes what it is creating and saves its state: killed only after
        # GRACE_S, as an interrupted apply is (a kill sooner could leave resources outside the state, billing)
        code, err = _run_shown(
            tf, ["apply", "-input=false", "-no-color", PLAN_FILE], echo, timeout_s=left, kill_after_s=GRACE_S
        )
        why = transient_error(err) if code != 0 else None
        if why is None or retries >= APPLY_RETRIES:
            return code, err
        retries += 1
        echo(
            f"terraform apply met a transient AWS error ({why}): planning and applying again (terraform replaces "
            f"what the failed apply left half-made; retry {retries} of {APPLY_RETRIES})."
        )
        code, _, plan_err = _run(tf, "plan", input=False, out=PLAN_FILE, detailed_exitcode=True, stream=False)
        if code not in (0, 2):
            return code, f"{err}\nterraform plan, after it, failed too:\n{plan_err.strip()}"
        code, out, _ = _run(tf, "show", PLAN_FILE, json=True, stream=False)
        if code == 0:  # what the second apply does: the tainted resources replaced, the rest created
            for line in summarize(json.loads(out)).lines():
                echo(line)


# a data source's address: "data." as one of its parts before any index ("module.fleet.data.aws_ami.image[...]")
_DATA_SOURCE = re.compile(r"(^|\.)data\.")


def _state_resources(tf: Any) -> list[str]:
    """The resources terraform's state holds now that it made (empty before a new fleet's first apply). The data
    sources it read are left out: they bill nothing and are not destroyed, and counted they made a failed apply that
    had read only them "the resources the apply created", and the next apply's failure one over a standing fleet, left
    in place (a review)."""

    # not through python-terraform: it puts its -no-color between `state` and `list`, which terraform refuses
    # (usage text, exit 1), so a failed apply looked as if it had created nothing
    run = subprocess.run(
        [tf.terraform_bin_path, "state", "list", "-no-color"],
        cwd=tf.working_dir,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    if run.returncode == 0:
        listed = (line.strip() for line in run.stdout.splitlines())
        return [a for a in listed if a and not _DATA_SOURCE.search(a.split("[", 1)[0])]
    if "No state file was found" in run.stderr:
        return []
    # unknown: say resources may exist (nothing is destroyed on a guess, and a new fleet is not assumed)
    return [f"(terraform state list failed: {(run.stderr.strip().splitlines() or ['no output'])[-1]})"]


def _clean_up(tf: Any, root: Path, values: dict[str, Any], fresh: bool, echo: Callable[[str], None]) -> str:
    """After a failed or interrupted apply: destroy what it created when the fleet is new (``fresh``: the state was
    empty before); returns a sentence saying what is left."""
    left = _state_resources(tf)
    if not left:
        return "nothing was created."
    if not fresh:
        return (
            f"the folder held fleet {values.get('name')} before this apply, so nothing was destroyed ({len(left)} "
            f"resources in the state, which may be billing): fix the cause and apply again, or run `srifty destroy "
            f"--dir {shlex.quote(str(root))}`."
        )
    echo(f"Destroying the {len(left)} resources the apply created, so that nothing is left billing.")
    for attempt in range(2):  # a second pass: what the first found already gone (an answer lost and retried, EC2's
        # eventual consistency) is read as gone on its refresh and dropped from the state
        code, _, err = _run(
            tf, "destroy", input=False, auto_approve=True, lock_timeout="300s", stream=True, critical=True
        )
        remaining = _state_resources(tf)
        if code == 0 and not remaining:
            break
        if attempt == 0:
            echo(f"Destroying failed with {len(remaining)} resources still in the state: once more.")
    if code != 0 or remaining:
        return (
            f"destroying what it created failed too ({len(remaining)} resources still in the state, which may be "
            f"billing): run `srifty destroy --dir {shlex.quote(str(root))}` until it succeeds. {err.strip()}"
        )
    return "everything it had created was destroyed; nothing is left billing."


def outputs(folder: str | os.PathLike[str]) -> dict[str, Any]:
    tf = _terraform(Path(folder))
    code, out, err = _run(tf, "output", json=True, stream=False)
    if code != 0:
        raise ProvisionError(f"terraform output failed in {folder}:\n{err.strip()}")
    return {k: v.get("value") for k, v in json.loads(out or "{}").items()}


def destroy(
    folder: str | os.PathLike[str],
    *,
    yes: bool = False,
    ask: Callable[[str], str] | None = None,
    echo: Callable[[str], None] = print,
    timeout_s: float | None = None,
    delete_checkpoints: bool = False,
) -> str | None:
    """Destroy everything the root module created, after a confirmation (``timeout_s``: see :func:`_run_shown`).

    A checkpoint bucket the module created that holds anything (checkpoints, the nodes' logs and status records:
    every fleet that ran) is kept as it is, its protections with it, and leaves terraform's state; its name is
    returned (None: nothing kept). Terraform's own destroy of it fails (no force_destroy: BucketNotEmpty) after it
    removed the bucket's public access block, lifecycle, versioning and TLS-only policy, which left a bucket of
    checkpoints unprotected and the destroy failed (a trial). ``delete_checkpoints`` empties it (every version) and
    destroys it with the rest."""
    root = Path(folder)
    values = check_folder(root)
    tf = _terraform(root)
    _check_credentials(values)
    code, _, err = _run(tf, "init", input=False, stream=False)
    if code != 0:
        never = (
            ""
            if (root / "terraform.tfstate").exists() or (root / ".terraform").exists()
            else " It holds no local state and was never initialised here: if it was never applied, nothing was "
            "created and there is nothing to destroy (a state kept in a remote backend is read only after init)."
        )
        raise ProvisionError(f"terraform init failed in {root}:\n{err.strip()}{never}")
    echo(f"Destroying fleet {values.get('name')} ({root}).")
    _confirm(f"Destroy every resource of {values.get('name')}?", yes, ask)
    kept = _keep_checkpoint_bucket(tf, root, values, echo, delete=delete_checkpoints)
    # a teardown: an interruption waits for it to end (_run_shown's critical), terraform in a session of its own;
    # a failed pass is run once more within the time given: what it found already gone (an answer lost and retried,
    # EC2's eventual consistency) is dropped from the state by the second pass's refresh
    started = time.monotonic()
    for attempt in range(2):
        left = None if timeout_s is None else timeout_s - (time.monotonic() - started)
        if attempt and left is not None and left <= 0:  # the first pass always runs (and sets code)
            break
        argv = ["destroy", "-input=false", "-no-color", "-auto-approve"]
        code, err = _run_shown(tf, argv, echo, critical=f"srifty down --dir {shlex.quote(str(root))}", timeout_s=left)
        if code == 0:
            break
        if attempt == 0:
            echo("terraform destroy failed: once more (a resource found already gone is dropped on the second pass).")
    if code != 0:
        also = f" The checkpoint bucket {kept} was kept, out of the state." if kept else ""
        raise ProvisionError(f"terraform destroy failed in {root} (see the output above).{also} {err.strip()[-2000:]}")
    if kept:
        echo(
            f"Kept the checkpoint bucket s3://{kept}: it holds the run's checkpoints and logs, encrypted, versioned "
            "and private as it was, and is no longer in this folder's terraform state. When its checkpoints are no "
            "longer needed, delete every object version and then the bucket (the S3 console's Empty and Delete); "
            "`srifty down --delete-checkpoints` deletes it with the fleet."
        )
    return kept
