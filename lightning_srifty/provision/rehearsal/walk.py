"""``srifty rehearse``: the fleet of a root module, played on this machine before any money is spent.

The walk: copy the root (``--dir``) into the rehearsal's folder and point it at a local AWS (:class:`.LocalAWS`);
``terraform apply`` it; read back from EC2 what each instance would run (its user_data, byte-for-byte as the launch
template holds it) and from IAM the instance role's policy; turn IAM enforcement on and start the nodes, one after
another (``--stagger-s`` apart: nodes never boot together), each as :class:`.Node`. Then: wait for the job's first
step (``STARTED.json``); post a spot interruption notice to one node; see every node leave with a checkpoint (exit 75,
status records that say "preempted"); terminate the instances as EC2 does, so that the Auto Scaling group starts
replacements; see the replacements boot, meet, and resume from that checkpoint (their first step follows it); post a
second notice, and tear it all down (``terraform destroy``, every process of every node, the local AWS), whatever
happened. Before that second notice, ``--lose-node`` adds a leg whose c10d host is lost without a notice
(:func:`lose_a_node`) and ``--hang-node`` one whose job hangs (:func:`hang_a_node`), each resumed from the newest
periodic checkpoint by the next leg, and ``--finish`` ends the walk with a leg that trains to the job's end
(:func:`finish_the_job`: every node exits 0, its ranks' exit marks, the fleet's life ended, every node out of its
group and nothing replaced). Each check is reported as passed or failed with what was seen; what this
machine cannot check (the real driver and torch build, EFA, capacity and quotas, placement groups) is named with the
reason.

What is changed in the copy for the rehearsal, and only there, is listed in the report (``changed``): the AWS endpoint,
the image (moto has no Deep Learning AMI), the placement group (moto never reports one available), the bucket policy's
TLS rule (moto speaks plain HTTP), a network of the user's own account, the rendezvous port when this machine has it in
use, the node count with ``--nodes``, and with ``--lose-node`` or ``--hang-node`` the job's checkpoint interval and
the watchdog's grace (and the nodes' stall limit, in their environment).
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_srifty import protocol
from lightning_srifty.provision.apply import apply, check_folder, destroy
from lightning_srifty.provision.aws import empty_bucket
from lightning_srifty.provision.base import Interrupts
from lightning_srifty.provision.preflight import ENVIRONMENT_FILE
from lightning_srifty.provision.rehearsal.aws_rules import AwsRulesProxy
from lightning_srifty.provision.rehearsal.local_aws import LocalAWS, free_port, port_free
from lightning_srifty.provision.rehearsal.node import Node, base_python, private_disk
from lightning_srifty.provision.terraform import cuda
from lightning_srifty.provision.terraform.generate import TFVARS
from lightning_srifty.provision.terraform.snapshot import load_snapshot, read_member
from lightning_srifty.store import DIGEST_SUFFIX
from predictor.catalog.catalog import Catalog
from predictor.documents.atomic import atomic_write_json
from predictor.documents.checks import refused
from predictor.exceptions import ConfigError, MissingExtraError, ProvisionError

SCHEMA = "srifty.rehearsal/v1"
MARKER = ".srifty-rehearsal-folder"  # a folder the rehearsal may replace
OWNER = "the rehearsal's Settings (lightning_srifty.provision.rehearsal.walk.Settings)"  # srifty rehearse: its flags
DESTROY_TIMEOUT_S = 300.0  # the local fleet's destroy takes 10-60 s; past this it is stopped (the local AWS goes too)
TOOLS = ("terraform", "aws", "curl", "bash", "sha256sum", "base64", "setsid", "timeout", "tar")
IMAGE_PARAMETERS = "/srifty-rehearsal/deeplearning-ami/{arch}"  # moto keeps /aws/ to itself
NOT_CHECKED = (
    (
        "driver",
        "the NVIDIA driver and torch's CUDA build: the nodes here have no GPU (the real nodes' pick is shown "
        "above; srifty check fails a combination that cannot work)",
    ),
    ("efa", "EFA and NCCL over it: the nodes here talk over loopback TCP"),
    ("capacity", "capacity, quotas and offerings of the real account and zone (srifty check reads them)"),
    ("placement", "the cluster placement group (moto never reports one available: the rehearsal applies without it)"),
    (
        "image",
        "the Deep Learning AMI itself (its Python, packages and driver): the nodes here run this machine's "
        "Python with this environment's packages",
    ),
    ("speed", "speed: the steps here run on this machine's CPU cores"),
    (
        "folders",
        "a callback's state tied to the job's folder: each node here runs from a folder of its own, so a resumed "
        "ModelCheckpoint finds another dirpath and Lightning drops its best score and top-k (its warning 'The "
        "dirpath has changed'); on EC2 every node runs from /opt/srifty/code-<sha> and keeps them",
    ),
    (
        "mix",
        "which mix of types a mixed Auto Scaling group gets: moto fills its capacity units with the first type's "
        "instances only; AWS picks by its allocation strategy and the offers of the day (the nodes train with "
        "whatever mix comes up, the plan's batch split again over it)",
    ),
)


class RehearsalFailed(ProvisionError):
    """A check of the rehearsal failed (the message says which); ``tail``: the end of the node's log."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Rehearsal:
    """What ``srifty rehearse`` saw (``rehearsal.json``, schema ``srifty.rehearsal/v1``)."""

    fleet: str
    folder: str
    mode: str
    nodes_planned: int
    checks: list[Check] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    torch_build: list[str] = field(default_factory=list)
    user_data_bytes: dict[str, int] = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self), "ok": self.ok}

    def text(self) -> str:
        lines = [f"srifty rehearse {self.folder}: fleet {self.fleet}, {self.nodes_planned} node(s), {self.mode} mode"]
        lines += [f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        if self.error:
            lines.append(self.error)
        if self.changed:
            lines.append("changed for the rehearsal (the copy only): " + "; ".join(self.changed))
        lines += self.torch_build
        lines += ["not checked here:"] + [f"  - {n}" for n in self.not_checked]
        lines.append("rehearsal " + ("passed" if self.ok else "FAILED"))
        return "\n".join(lines)


@dataclass
class Settings:
    nodes: int | None = None  # None: the fleet's own count
    notice_after_s: float = 10.0  # after the first step of each leg
    stagger_s: float = 20.0
    timeout_s: float = 1800.0
    work: Path | None = None  # default: <dir>/.srifty-rehearsal
    # NAME=DIR: a local folder uploaded as the sample of the fleet's data folder NAME (--data, --data-copy); a folder
    # without one gets a placeholder file
    data_samples: tuple[str, ...] = ()
    # a third leg: the second leg's c10d host is lost without a notice, its replacements resume from the newest
    # periodic checkpoint (the copy's checkpoint interval: LOSE_EVERY_S)
    lose_node: bool = False
    # a leg whose job hangs: one node's ranks frozen (SIGSTOP), the node itself running, as when a GPU stops
    # answering; the boot script's stall watch (at HANG_STALL_S here) must find it, kill it and leave to be replaced,
    # and the group's replacements resume from the newest periodic checkpoint (after the lost node's leg, with both)
    hang_node: bool = False
    # a last leg after the last notice: the replacements train to the job's end, which must end the fleet (every node
    # exits 0, the fleet's life ends, every node leaves its group, nothing replaces them)
    finish: bool = False


def rehearse(
    folder: str | os.PathLike[str],
    settings: Settings | None = None,
    echo: Callable[[str], None] = print,
    catalog: Any = None,
) -> Rehearsal:
    """Rehearse the root module in ``folder`` (see the module docstring); returns the report, also written to
    ``<work>/rehearsal.json``.

    Raises:
        ConfigError: bad settings, or a root the rehearsal cannot play (named, with the fix).
        ProvisionError: a tool or the local AWS is missing, or terraform failed.
    """

    settings = settings or Settings()
    root = Path(folder).resolve()
    values = check_folder(root)
    _check_settings(settings, values)
    _check_machine()
    work = _work_folder(settings, root)
    report = Rehearsal(
        fleet=values["name"],
        folder=str(root),
        mode=values.get("capacity", {}).get("mode", "asg"),
        nodes_planned=settings.nodes or sum(g["on_demand"] + g["spot"] for g in values["groups"]),
        not_checked=[
            text
            for key, text in NOT_CHECKED
            if key != "mix" or (len(values["groups"]) > 1 and values.get("capacity", {}).get("mode", "asg") == "asg")
        ],
        torch_build=_torch_build_lines(root, values, catalog),
    )
    walk = _Walk(root, work, values, settings, report, echo)
    try:  # SIGTERM or SIGHUP too ends in the walk's teardown: its local AWS, nodes and their jobs never outlive it
        with Interrupts(echo, "srifty rehearse", "still tearing the rehearsal down, please wait"):
            walk.run()
    except RehearsalFailed as exc:
        report.error = exc.tail or str(exc)
    finally:
        report.nodes = [_node_record(n) for n in walk.nodes]
        atomic_write_json(work / "rehearsal.json", report.to_dict())
    return report


def copy_root_module(root: Path, target: Path, work: Path) -> None:
    """The root module copied to ``target`` for the rehearsal's apply, without Terraform's state and plans, nor the
    rehearsal's own folder ``work`` when it sits in the root (its default, or ``--work DIR/x``: copying it into
    itself recursed without end)."""
    inside = [work.name] if work.resolve().parent == root.resolve() else []
    patterns = (".terraform", "terraform.tfstate*", "tfplan", ".srifty-rehearsal", ".plan*", *inside)
    shutil.copytree(root, target, ignore=shutil.ignore_patterns(*patterns))


def _work_folder(settings: Settings, root: Path) -> Path:
    """The rehearsal's folder (``settings.work``, default ``<root>/.srifty-rehearsal``), emptied and marked as the
    rehearsal's; the last rehearsal's report and logs are kept in its ``previous/``.

    Raises:
        ConfigError: it is inside the root module, or holds files that no rehearsal wrote.
    """
    work = (settings.work or root / ".srifty-rehearsal").resolve()
    if work == root or (root in work.parents and work.parent != root):
        raise ConfigError.between(
            "{work} {path} is inside {root}: give a folder of its own (default {root}/.srifty-rehearsal)",
            parameter="work",
            value=str(work),
            path=str(work),
            root=str(root),
        )
    if work.exists() and any(work.iterdir()) and not (work / MARKER).exists():
        raise ConfigError.between(
            "{work} {path} is a folder with files that no rehearsal wrote: give an empty or new folder (a "
            "rehearsal's folder is replaced by the next rehearsal)",
            parameter="work",
            value=str(work),
            path=str(work),
        )
    if work.exists():
        _empty_keeping_logs(work)
    else:
        work.mkdir(parents=True)
    (work / MARKER).write_text(
        f"written by srifty rehearse: the next rehearsal replaces this folder (its logs kept in {PREVIOUS}/)\n"
    )
    return work


PREVIOUS = "previous"  # the last rehearsal's report and logs, inside the new rehearsal's folder (one generation)
KEPT = ("rehearsal.json", "terraform-destroy.log", "node*/*.log", "node*/user_data.sh")
STAGED = ".previous-staged"  # the logs being kept, complete once STAGED/.done is written


def _empty_keeping_logs(work: Path) -> None:
    """Empty ``work`` of the last rehearsal but for its report and logs, kept in ``work/previous``. They are copied
    inside the folder first and nothing is removed before the copy is complete, so a rehearsal interrupted here
    (Ctrl-C while gigabytes of node disks are removed) leaves them to the next one."""
    staged = work / STAGED
    if not (staged / ".done").exists():  # a copy interrupted before it was complete: made again
        if staged.exists():
            shutil.rmtree(staged)
        _keep_logs(work, staged)
        (staged / ".done").write_text("")
    for entry in work.iterdir():
        if entry.name not in (STAGED, MARKER):  # the marker stays: an interrupted folder is still the rehearsal's
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    staged.rename(work / PREVIOUS)


def _keep_logs(old: Path, to: Path) -> None:
    """The report and the logs of the rehearsal in ``old`` (its nodes' disks, environments and the root's copy are
    not kept: gigabytes), copied to ``to``: a rehearsal run again must not take the evidence of the last one."""
    to.mkdir(parents=True, exist_ok=True)
    for pattern in KEPT:
        for path in old.glob(pattern):
            target = to / path.relative_to(old)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def _check_settings(settings: Settings, values: dict[str, Any]) -> None:
    for name in ("notice_after_s", "stagger_s", "timeout_s"):
        value = getattr(settings, name)
        if not value >= 0 or value != value:
            raise refused(
                f"The {name!r} parameter of {OWNER}", "a number of seconds >= 0", value, parameter=name, owner=OWNER
            )
    if settings.nodes is not None:
        if settings.nodes < 1:
            raise refused(
                f"The 'nodes' parameter of {OWNER}",
                "a whole number >= 1",
                settings.nodes,
                parameter="nodes",
                owner=OWNER,
            )
        if len(values["groups"]) != 1:
            raise ConfigError.between(
                "{nodes} {count}: the fleet mixes {types} instance types, and the rehearsal would not know which to "
                "scale: leave {nodes} out (every node of the fleet is rehearsed)",
                parameter="nodes",
                value=settings.nodes,
                count=settings.nodes,
                types=len(values["groups"]),
            )
    _data_samples(settings, values)
    if settings.lose_node:
        nodes = settings.nodes or sum(g["on_demand"] + g["spot"] for g in values["groups"])
        mode = values.get("capacity", {}).get("mode", "asg")
        if nodes < 2 or mode != "asg":
            raise ConfigError.between(
                "{lose_node} needs a fleet of two nodes or more in an Auto Scaling group (capacity mode asg), which "
                "replaces a lost node; this one has {count} node(s), mode {mode}: leave {lose_node} out",
                parameter="lose_node",
                value=True,
                count=nodes,
                mode=mode,
            )
    if settings.hang_node:
        _check_hang(values)
    if settings.finish and values.get("capacity", {}).get("mode", "asg") != "asg":
        raise ConfigError.between(
            "{finish} plays a last leg of the group's replacements to the job's end; a fleet in capacity mode {mode} "
            "is not replaced (srifty launch moves its job), so the walk ends at its first notice: leave {finish} out",
            parameter="finish",
            value=True,
            mode=values.get("capacity", {}).get("mode"),
        )
    if values["train"].get("handover"):
        raise ConfigError(
            "this root waits for srifty launch's handover (train.handover): srifty launch brings it up and hands the "
            "job over; rehearse a root written by srifty terraform"
        )


def _check_hang(values: dict[str, Any]) -> None:
    """``hang_node`` needs what finds and replaces a hung job: the boot script's stall watch (on unless the root
    turned it off, or the launcher watches) and an Auto Scaling group to start the replacements."""
    mode = values.get("capacity", {}).get("mode", "asg")
    watchdog = values.get("watchdog") or {}
    if mode != "asg":
        raise ConfigError.between(
            "{hang_node} needs a fleet in an Auto Scaling group (capacity mode asg), which replaces the node that "
            "left; this one has mode {mode}: leave {hang_node} out",
            parameter="hang_node",
            value=True,
            mode=mode,
        )
    if watchdog.get("heartbeat") or watchdog.get("stall_s", protocol.STALL_TIMEOUT_S) == 0:
        raise ConfigError.between(
            "{hang_node} plays the boot script's hang watch, which this root has off (watchdog.stall_s {stall}, "
            "heartbeat {heartbeat}): write the root again with it on (srifty terraform's stall timeout, 20 minutes by "
            "default, and no handover) or leave {hang_node} out",
            parameter="hang_node",
            value=True,
            stall=watchdog.get("stall_s", protocol.STALL_TIMEOUT_S),
            heartbeat=bool(watchdog.get("heartbeat")),
        )


def _check_machine() -> None:
    if platform.system() != "Linux" or not Path("/proc/self/environ").exists():
        raise ProvisionError(
            "srifty rehearse runs the nodes' user_data, written for the Deep Learning AMI's Ubuntu (bash, GNU "
            "coreutils, /proc): run it on Linux (a Linux machine, WSL 2 or a container)"
        )
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise ProvisionError(
            f"srifty rehearse needs {', '.join(missing)} on PATH, as the nodes have them: install "
            + "; ".join(
                {
                    "terraform": "Terraform >= 1.5 (https://developer.hashicorp.com/terraform/install)",
                    "aws": "the AWS CLI (https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html)",
                }.get(tool, f"{tool} (your distribution's package)")
                for tool in missing
            )
        )

    if importlib.util.find_spec("moto") is None:
        raise MissingExtraError("srifty rehearse", "rehearse", "moto")


def _torch_build_lines(root: Path, values: dict[str, Any], catalog: Any) -> list[str]:
    """What torch build the real nodes would pick (the summary of srifty terraform), for the report."""

    code = values["train"].get("code")
    if not code:
        return []
    try:
        spec = json.loads(read_member(load_snapshot(root / code["source"]), ENVIRONMENT_FILE))
        if catalog is None:
            catalog = Catalog.load()
        groups = [
            (g["instance_type"], catalog.get(g["instance_type"]).gpu)
            for g in values["groups"]
            if g["instance_type"] in catalog
        ]
        lines = cuda.summary(spec, (values.get("ami") or {}).get("id"), cuda.fleet_gpus(groups, catalog))
    except (OSError, ValueError, KeyError) as exc:
        return [f"the nodes' torch build: not read from the code archive ({exc})"]
    return ["on the real nodes:", *lines]


def _node_record(node: Node) -> dict[str, Any]:
    return {
        "instance_id": node.instance_id,
        "group": node.group,
        "leg": node.leg,
        "index": node.index,
        "exit_code": node.exit_code,
        "noticed": node.noticed,
        "marks_s": {k: round(v, 2) for k, v in node.marks.items()},
        "work": str(node.work),
    }


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in os.environ (terraform and boto3 read it), every AWS variable of the user's own taken out;
    restored after."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith("AWS_"):
            del os.environ[key]
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


STAYED = "staying in the Auto Scaling group"  # the node watchdog's line for a preempted node that keeps its place
LEFT = "left Auto Scaling group"  # and for a node whose fleet ends (the job's end, the life cap)
FINISH_SETTLE_S = 15.0  # --finish: how long after the last node's end no new instance of the fleet may appear


class _Walk:
    """The rehearsal's state: the local AWS, the nodes, the clock."""

    def __init__(
        self,
        root: Path,
        work: Path,
        values: dict[str, Any],
        settings: Settings,
        report: Rehearsal,
        echo: Callable[[str], None],
    ) -> None:
        self.root, self.work, self.values, self.settings, self.report = root, work, values, settings, report
        self.echo = echo
        self.nodes: list[Node] = []
        self.t0 = time.monotonic()
        self.deadline = self.t0 + settings.timeout_s
        self.aws: LocalAWS | None = None
        self.infra = work / "infra"
        self.prefix = ""
        self.bucket = ""
        self.group_name: str | None = None
        self.credentials: dict[str, str] = {}
        self.applied = False
        self.preempted: dict[int, Any] = {}  # leg -> its Preempted record
        # the newest checkpoint (its URI, step) after a node was lost or the job hung, for the next leg's resume
        self.lost: tuple[str, int] | None = None

    # --- reporting ---------------------------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.t0
        self.report.events.append((round(elapsed, 1), text))
        self.echo(f"[{elapsed:6.1f}s] {text}")

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.report.checks.append(Check(name, ok, detail))
        self.say(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        return ok

    def fail(self, name: str, detail: str, node: Node | None = None) -> RehearsalFailed:
        self.check(name, False, detail)
        tail = f"--- the last lines of {node.instance_id}'s log ({node.log_path}) ---\n{node.tail()}" if node else ""
        return RehearsalFailed(f"{name}: {detail}", tail)

    # --- the walk ----------------------------------------------------------------------------------------------------

    def run(self) -> None:
        with LocalAWS(self.values["region"]) as aws, _environment(aws.environment()):
            self.aws = aws
            try:
                self._apply()
                self._start_fleet()
                self._leg(1)
                if self.report.mode != "asg":
                    self.say(
                        "capacity mode fleet: nothing replaces an instance that left (srifty launch moves the job; "
                        "an Auto Scaling group, mode asg, replaces it): the resume is not rehearsed"
                    )
                    return
                # the replacements' legs: a node lost (--lose-node), a job that hangs (--hang-node), then a notice
                events = [e for e, on in (("lose", self.settings.lose_node), ("hang", self.settings.hang_node)) if on]
                for leg, event in enumerate([*events, "notice"], start=2):
                    self._replace(leg=leg)
                    self._leg(leg, event=event)
                if self.settings.finish:
                    self._replace(leg=len(events) + 3)
                    finish_the_job(self, len(events) + 3)
            finally:
                self._tear_down()

    def _apply(self) -> None:

        assert self.aws is not None
        copy_root_module(self.root, self.infra, self.work)
        point_at_local_aws(self.infra, self.aws, self.settings, self.report.changed)
        if self.settings.hang_node:
            self.report.changed.append(
                f"the nodes' stall limit {HANG_STALL_S} s, looked at every {HANG_CHECK_S} s (SRIFTY_STALL_S, "
                f"SRIFTY_STALL_CHECK_S in their environment; the module's watchdog.stall_s is "
                f"{self.values.get('watchdog', {}).get('stall_s', protocol.STALL_TIMEOUT_S)} s, looked at every 15 s; "
                "--hang-node: a hang found within a minute)"
            )
        started = time.monotonic()
        self.say(f"terraform apply of {self.infra} against the local AWS at {self.aws.url}")
        outputs = apply(self.infra, yes=True, echo=lambda line: None, check=False)["fleet"]
        self.applied = True
        self.group_name = outputs.get("autoscaling_group_name")
        self.bucket = outputs["checkpoint_bucket"]
        self.prefix = outputs["checkpoint_uri"].split("/", 3)[3]
        self.say(f"applied in {time.monotonic() - started:.1f} s: {len(outputs['instance_ids'])} instance(s)")

    def _start_fleet(self) -> None:
        """The role's credentials, IAM on, the user_data each instance got; then the nodes, ``stagger_s`` apart."""
        assert self.aws is not None
        iam = self.aws.client("iam")
        fleet = self.values["name"]
        roles = [r["RoleName"] for r in iam.list_roles()["Roles"] if r["RoleName"].startswith(f"{fleet[:30]}-node-")]
        if len(roles) != 1:
            raise self.fail("instance role", f"expected one role {fleet[:30]}-node-*, found {roles}")
        (policy_name,) = iam.list_role_policies(RoleName=roles[0])["PolicyNames"]
        document = iam.get_role_policy(RoleName=roles[0], PolicyName=policy_name)["PolicyDocument"]
        policy = document if isinstance(document, str) else json.dumps(document)
        self.credentials = self.aws.principal("srifty-rehearsal-node", policy)
        assert self.aws.proxy is not None
        self.aws.proxy.s3_list_prefixes = _listing_prefixes(policy)
        self.aws.proxy.s3_open_buckets = _open_buckets(policy)
        self.aws.proxy.s3_principal = self.credentials["AWS_ACCESS_KEY_ID"]
        statements = json.loads(policy).get("Statement") or []  # the Auto Scaling rule: decided as IAM does
        self.aws.proxy.asg_statements = [statements] if isinstance(statements, dict) else statements
        self.aws.enforce_iam(True)
        os.environ.update(self.aws.admin)
        self.say(f"IAM enforced: the nodes hold exactly the policy of role {roles[0]}")
        self.say(_disks_note())
        self._start_new(leg=1)

    def _start_new(self, leg: int) -> None:
        """A node for every running instance of the fleet not yet played, the first now, the others later."""

        assert self.aws is not None
        ec2 = self.aws.client("ec2")
        known = {n.instance_id for n in self.nodes}
        fresh = [i for i in fleet_instances(ec2, self.values["name"]) if i["InstanceId"] not in known]
        if not fresh:
            raise self.fail(f"leg {leg} instances", "the fleet has no instance to start")
        markets = {g["instance_type"]: "spot" if g["spot"] else "on-demand" for g in self.values["groups"]}
        for k, instance in enumerate(fresh):
            raw = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
            user_data = base64.b64decode(raw.get("UserData", {}).get("Value", "")).decode()
            self.report.user_data_bytes[instance["InstanceId"]] = len(user_data.encode())
            node = Node(
                instance_id=instance["InstanceId"],
                group=instance["InstanceType"],
                leg=leg,
                index=len(self.nodes) + 1,
                work=self.work / f"node{len(self.nodes) + 1}",
                user_data=user_data,
                market=_market(instance, markets),
                env=_stall_env(self.settings),
            )
            self.nodes.append(node)
            if k:
                self._wait(lambda: False, self.settings.stagger_s, "", quiet=True)
            assert self.aws is not None
            node.start(self.values["region"], self.aws.url, self.credentials, base_python())
            self.say(
                f"node {node.index} ({node.instance_id}, {node.group}, leg {leg}) boots: "
                f"user_data {len(user_data.encode()):,} bytes"
            )
        sizes = self.report.user_data_bytes.values()
        self.check(
            f"user data (leg {leg})",
            max(sizes) <= 16_384,
            f"{max(sizes):,} bytes at most (EC2 takes 16,384; https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/"
            "user-data.html)",
        )

    # --- watching ----------------------------------------------------------------------------------------------------

    def _tick(self) -> None:
        """Marks from the logs; an instance that shut itself down is terminated as EC2 terminates it (its Auto Scaling
        group, if it is still a member, starts a replacement)."""
        assert self.aws is not None
        for node in self.nodes:
            for mark in node.update_marks():
                self.say(f"node {node.index} ({node.instance_id}): {mark} at +{node.marks[mark]:.1f} s")
            node.poll()
            if node.shut_down() and not node.terminated:
                node.power_off()
                node.terminated = True
                terminate_as_ec2_does(self.aws, node, self.say)

    def _wait(
        self,
        done: Callable[[], Any],
        seconds: float | None,
        what: str,
        quiet: bool = False,
        watch: list[Node] | None = None,
    ) -> Any:
        """Tick until ``done()`` is truthy (its value returned), ``seconds`` pass (None), or the rehearsal's deadline;
        a node of ``watch`` that exits first fails the rehearsal."""
        until = min(self.deadline, time.monotonic() + seconds) if seconds is not None else self.deadline
        while True:
            self._tick()
            value = done()
            if value:
                return value
            for node in watch or []:
                if node.exit_code is not None:
                    raise self.fail(what, exited_first(node.index, node.instance_id, node.exit_code), node)
            if time.monotonic() >= until:
                if seconds is not None and until < self.deadline:
                    return None
                if quiet:
                    return None
                raise self.fail(
                    what,
                    f"not seen within the rehearsal's {self.settings.timeout_s:.0f} s (timeout_s; srifty rehearse "
                    "--timeout-s)",
                    next((n for n in reversed(self.nodes) if n.exit_code is None), None),
                )
            time.sleep(0.5)

    def _record(self, cls: Any, after_unix: float, stamp: str) -> Any:
        assert self.aws is not None
        return read_record(self.aws.client("s3"), self.bucket, self.prefix, cls, after_unix, stamp)

    def _leg(self, leg: int, event: str = "notice") -> None:
        """The leg's nodes train, one gets a spot notice, all leave with a checkpoint; with ``event`` "lose" the
        leg's c10d host is lost without a notice instead (:func:`lose_a_node`), with "hang" one node's job hangs
        (:func:`hang_a_node`)."""

        nodes = [n for n in self.nodes if n.leg == leg]
        started = self._first_step(leg, nodes)
        self._wait(lambda: any(n.exit_code is not None for n in nodes), self.settings.notice_after_s, "", quiet=True)
        if any(n.exit_code is not None for n in nodes):
            finished = self._record(protocol.Finished, 0, "step")
            raise self.fail(
                f"leg {leg}: spot notice",
                "the job ended before the notice"
                + (f" (finished at step {finished.step})" if finished else "")
                + ": give it more steps, or a shorter notice_after_s (srifty rehearse --notice-after-s)",
                next(n for n in nodes if n.exit_code is not None),
            )
        if event == "notice":
            self.preempted[leg] = notice_a_node(self, leg, nodes)
        else:
            self.lost = (lose_a_node if event == "lose" else hang_a_node)(self, leg, nodes, started)

    def _first_step(self, leg: int, nodes: list[Node]) -> Any:
        """The leg's first step (``STARTED.json``), trained as the plan says and, after the first leg, resumed where
        the fleet left."""
        since = time.time() - 1
        started = self._wait(
            lambda: self._record(protocol.Started, since, "first_step_unix"),
            None,
            f"leg {leg}: first step",
            watch=nodes,
        )
        self.say(f"leg {leg}: the job took its first step: step {started.step}")
        filled = [n.group for n in nodes]
        as_planned = _as_planned(started, self.values, filled, self.settings.nodes)
        self.check(f"leg {leg}: the job trains as the plan says", *as_planned)
        if leg >= 2:
            self._check_resume(leg, started, nodes)
        return started

    def _replace(self, leg: int = 2) -> None:
        """The group starts replacements for the instances that shut down; the rehearsal plays them."""
        assert self.aws is not None
        group = self.aws.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[self.group_name])
        desired = group["AutoScalingGroups"][0]["DesiredCapacity"]
        self.check(
            "the Auto Scaling group still wants the fleet",
            desired >= 1,
            f"desired capacity {desired} (units) after every node left",
        )
        self._start_new(leg=leg)

    def _check_resume(self, leg: int, started: Any, nodes: list[Node]) -> None:
        logs = [n.log() for n in nodes]
        found = (
            lost_resume_findings(leg, self.lost, started, logs)
            if leg - 1 not in self.preempted
            else resume_findings(leg, self.preempted[leg - 1], started, logs)
        )
        for name, ok, detail in found:
            if name:
                self.check(name, ok, detail)
            else:
                self.say(detail)

    def _tear_down(self) -> None:

        for node in self.nodes:
            node.power_off()
        if self.aws is not None:
            with contextlib.suppress(OSError):
                self.aws.enforce_iam(False)
            for name, ok, detail in local_aws_findings(self.aws.proxy):
                self.check(name, ok, detail)
        if self.applied and self.aws is not None:
            log = self.work / "terraform-destroy.log"
            try:
                with log.open("w") as out:  # terraform's words, for a destroy that fails (bounded: local AWS only)
                    kept = destroy(self.infra, yes=True, echo=lambda line: print(line, file=out, flush=True),
                                   timeout_s=DESTROY_TIMEOUT_S)  # fmt: skip
                self.check("teardown", *_bucket_kept(self.aws.client("s3"), self.bucket, kept))
            except Exception as exc:  # noqa: BLE001 - the local AWS goes with this process anyway
                self.check(
                    "teardown", False, f"terraform destroy in the local AWS failed (its log: {log}): {str(exc)[-600:]}"
                )


def _bucket_kept(s3: Any, bucket: str, kept: str | None) -> tuple[bool, str]:
    """The teardown's check: srifty down keeps a bucket that holds checkpoints, protections and all (then the local
    AWS lets it go)."""
    if kept:
        empty_bucket(s3, kept)
        s3.delete_bucket(Bucket=kept)
    if kept == bucket:
        return True, "terraform destroy of the rehearsal's fleet in the local AWS, its checkpoint bucket kept"
    return False, f"the destroy did not keep the checkpoint bucket {bucket} (kept: {kept})"


def _market(instance: dict[str, Any], markets: dict[str, str]) -> str:
    """A node's market: as launched where EC2 says (a mix's type may be bought both ways), else as the plan buys its
    type."""
    return "spot" if instance.get("InstanceLifecycle") == "spot" else markets.get(instance["InstanceType"], "on-demand")


def _as_planned(
    started: Any, values: dict[str, Any], filled: list[str] | None = None, nodes: int | None = None
) -> tuple[bool, str]:
    """Whether the job's first step (``STARTED.json``) trained as the module's plan says: its world size (one GPU
    type: the nodes times their GPUs) and nothing the job itself found otherwise than the plan (sharded or not, its
    batch, accumulation, resume: ``launch_checks.launch_mismatches``). A DDP job on a sharded plan passed every other
    check (a trial), and would not have fitted the GPUs it was planned for. ``filled``: the instance types the leg's
    nodes are; a mixed group filled otherwise than the plan's counts is said (a trial: "the plan's batch" was reported
    while every node had split the batch again over another mix). ``nodes``: ``--nodes``, the count the rehearsal
    plays instead of the plan's (a trial: a one-node plan rehearsed on 2 nodes failed "2 rank(s) train, the plan has
    1" on every leg, the user's module read in place of the rehearsal's copy)."""
    groups = values["groups"]
    nnodes = values["train"]["nnodes"] if nodes is None else nodes
    ranks = nnodes * groups[0]["gpus_per_instance"] if len(groups) == 1 else None
    found = list(started.mismatches)
    if ranks is not None and started.world_size is not None and started.world_size != ranks:
        whose = "the plan has" if nodes is None else f"the {nodes} node(s) rehearsed (--nodes) have"
        found.append(f"{started.world_size} rank(s) train, {whose} {ranks}")
    if found:
        return False, "; ".join(found)
    planned = {g["instance_type"]: g["on_demand"] + g["spot"] for g in groups} if len(groups) > 1 else {}
    got = {t: filled.count(t) for t in dict.fromkeys(filled)} if filled and planned else planned
    if got != planned:
        words = " + ".join(f"{n} x {t}" for t, n in got.items())
        plan = " + ".join(f"{n} x {t}" for t, n in planned.items())
        return True, (
            f"{started.world_size} rank(s), {started.strategy}; the group was filled as {words}, not the plan's {plan} "
            "(the local AWS fills a group's spot units with its first type; AWS may fill them otherwise too, within "
            "the worst fill srifty terraform checked): the job split the global batch again over the ranks present, "
            "at another step time than the plan's"
        )
    return True, f"{started.world_size} rank(s), {started.strategy}, the plan's batch and accumulation"


def _disks_note() -> str:
    """What the rehearsal says of the nodes' local disks (:func:`.node.private_disk`)."""
    why = private_disk()
    if why is None:
        return "each node has a disk of its own at one path, its TMPDIR (a tmpfs in a mount namespace of its own)"
    return f"the nodes share this machine's TMPDIR ({why}): a job needing a file on another node's disk passes here"


def _listing_prefixes(policy: str) -> tuple[str, ...]:
    """The s3:prefix values a policy's conditioned s3:ListBucket grants."""
    prefixes: list[str] = []
    for statement in json.loads(policy).get("Statement", []):
        actions = statement.get("Action")
        actions = [actions] if isinstance(actions, str) else actions or []
        if "s3:ListBucket" in actions:
            values = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix", [])
            prefixes += [values] if isinstance(values, str) else values
    return tuple(p.rstrip("*") for p in prefixes)


def _data_samples(settings: Settings, values: dict[str, Any]) -> dict[str, Path]:
    """``--data-sample NAME=DIR``, by name: each a data folder of the fleet and a local folder of files.

    Raises:
        ConfigError: a spec without its folder, a name the fleet reads no data as, or a folder that is not one, with
            the fix.
    """
    names = [d["name"] for d in values.get("data") or []]
    out: dict[str, Path] = {}
    for spec in settings.data_samples:
        name, eq, folder = spec.partition("=")
        why = None
        if not eq or not folder.strip():
            why = "NAME=DIR names the local folder of sample files after the ="
        elif name not in names:
            why = f"the fleet reads no data folder named {name!r} ({', '.join(names) or 'it reads none'})"
        elif not Path(folder).is_dir():
            why = f"{folder!r} is not a folder here"
        if why:
            raise ConfigError.between(
                "{data_sample} {spec!r}: {why}. Give NAME=DIR: NAME one of the fleet's data folders, DIR a local "
                "folder of sample files the rehearsal puts where the fleet reads them.",
                parameter="data_sample",
                value=spec,
                spec=spec,
                why=why,
            )
        out[name] = Path(folder)
    return out


def _sample_data(values: dict[str, Any], aws: LocalAWS, samples: dict[str, Path], changed: list[str]) -> None:
    """Every data folder the fleet reads, in the local AWS: its bucket, and the sample given for it
    (``--data-sample``) or a placeholder file, put there as the operator (the nodes may only read it)."""
    s3 = aws.client("s3")
    for entry in values.get("data") or []:
        bucket, _, prefix = entry["uri"][len("s3://") :].partition("/")
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=bucket)
        folder = samples.get(entry["name"])
        if folder is None:
            s3.put_object(
                Bucket=bucket,
                Key=prefix + "srifty-rehearsal-placeholder.txt",
                Body=b"a placeholder of the rehearsal: give --data-sample NAME=DIR for files your script can read\n",
            )
            changed.append(f"data {entry['name']}: {entry['uri']} holds a placeholder file (no --data-sample)")
            continue
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        for path in files:
            s3.upload_file(str(path), bucket, prefix + path.relative_to(folder).as_posix())
        what = f"{len(files)} sample file(s) from {folder}"
        changed.append(f"data {entry['name']}: {entry['uri']} holds {what}")


def _open_buckets(policy: str) -> tuple[str, ...]:
    """The buckets a policy's unconditioned s3:ListBucket grants (a whole bucket of training data)."""
    buckets: list[str] = []
    for statement in json.loads(policy).get("Statement", []):
        actions = statement.get("Action")
        actions = [actions] if isinstance(actions, str) else actions or []
        if "s3:ListBucket" in actions and not statement.get("Condition"):
            resources = statement.get("Resource")
            resources = [resources] if isinstance(resources, str) else resources or []
            buckets += [r.rsplit(":", 1)[-1] for r in resources if r.startswith("arn:") and ":s3:::" in r]
    return tuple(buckets)


def point_at_local_aws(infra: Path, aws: LocalAWS, settings: Settings, changed: list[str]) -> None:
    """The copy's values (``infra``), changed where the rehearsal must, each change named in ``changed``."""

    path = infra / TFVARS
    values = json.loads(path.read_text())
    values["aws_endpoint"] = aws.url
    changed.append("aws_endpoint: the local AWS")
    ec2, ssm = aws.client("ec2"), aws.client("ssm")
    arches = sorted({g.get("arch", "x86_64") for g in values["groups"]})
    images = {
        arch: ec2.describe_images(Owners=["amazon"], Filters=[{"Name": "architecture", "Values": [arch]}])["Images"][0][
            "ImageId"
        ]
        for arch in ("x86_64", "arm64")
    }
    if (values.get("ami") or {}).get("id"):
        changed.append(f"ami.id {values['ami']['id']}: {images[arches[0]]}, an image moto has")
        values["ami"] = {"id": images[arches[0]]}
    else:
        for arch, image in images.items():
            ssm.put_parameter(Name=IMAGE_PARAMETERS.format(arch=arch), Value=image, Type="String")
        values["ami"] = {"ssm_parameters": {a: IMAGE_PARAMETERS.format(arch=a) for a in images}}
        changed.append("ami: the Deep Learning AMI's SSM parameters, copied into the local AWS")
    capacity = values.setdefault("capacity", {})
    if capacity.get("placement_group"):
        capacity["placement_group"] = False
        changed.append("capacity.placement_group: off")
    checkpoints = values["checkpoints"]
    if checkpoints.get("tls_only", True):
        checkpoints["tls_only"] = False
        changed.append("checkpoints.tls_only: off (the local AWS speaks HTTP)")
    if checkpoints.get("bucket"):  # the user's own bucket: the module writes to it, never creates it
        aws.client("s3").create_bucket(Bucket=checkpoints["bucket"])
        changed.append(f"bucket {checkpoints['bucket']}: created in the local AWS")
    _local_network(values, ec2, changed)
    _placeholder_secrets(values, aws, changed)
    _sample_data(values, aws, _data_samples(settings, values), changed)
    train = values["train"]
    changed += _train_here(train, settings)
    if settings.lose_node or settings.hang_node:
        changed.append(_shorter_grace(values, settings))
    if settings.nodes is not None:
        (group,) = values["groups"]
        planned = group["on_demand"] + group["spot"]
        if planned != settings.nodes:
            market = "spot" if group["spot"] else "on_demand"
            group["on_demand"], group["spot"] = 0, 0
            group[market] = settings.nodes
            train["nnodes"] = settings.nodes
            values.setdefault("limits", {})["max_instances"] = max(
                settings.nodes, values.get("limits", {}).get("max_instances", 0)
            )
            predicted = values.get("predicted") or {}
            for key in ("usd_per_hour", "throughput_samples_s"):  # the prices apply checks, for this count
                if predicted.get(key) is not None:
                    predicted[key] = predicted[key] * settings.nodes / planned
            changed.append(f"nodes: {settings.nodes} of the fleet's {planned} (--nodes)")
            changed += _fleet_for_nodes(train, settings.nodes)
            changed += _batch_for_nodes(train, settings.nodes * group["gpus_per_instance"])
    path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")


def _train_here(train: dict[str, Any], settings: Settings) -> list[str]:
    """The job's settings changed for this machine: another rendezvous port where this one is in use, and with
    ``lose_node`` or ``hang_node`` a periodic checkpoint every few steps, for the replacements to resume from. What
    changed, for the report."""
    changed = []
    port = int(train.get("rdzv_port") or 29400)
    if not port_free(port):
        train["rdzv_port"] = free_port()
        changed.append(f"train.rdzv_port {port} (in use here): {train['rdzv_port']}")
    if settings.lose_node or settings.hang_node:
        every = protocol.VARIABLES["checkpoint_every_s"]
        was = (train.get("env") or {}).get(every, "none")
        train.setdefault("env", {})[every] = str(LOSE_EVERY_S)
        why = _flags(settings)
        changed.append(f"train.env {every} {was}: {LOSE_EVERY_S} ({why}: a periodic checkpoint to resume from)")
    return changed


def _shorter_grace(values: dict[str, Any], settings: Settings) -> str:
    """``lose_node`` or ``hang_node``: the watchdog's grace (the job's, after a SIGTERM) at LOSE_GRACE_S, so that a
    job stuck on a lost node or on a hung peer is killed within a minute here; what changed, for the report."""
    watchdog = values.setdefault("watchdog", {})
    was = watchdog.get("grace_s", 120)
    watchdog["grace_s"] = min(int(was), LOSE_GRACE_S)
    return (
        f"watchdog.grace_s {was}: {watchdog['grace_s']} ({_flags(settings)}: a job stuck on a lost node or a hung "
        "peer is killed sooner)"
    )


def _stall_env(settings: Settings) -> dict[str, str]:
    """The nodes' stall limit and its look's period with ``hang_node`` (the boot script's overrides for tests): a
    hang found within a minute, not the module's 20."""
    if not settings.hang_node:
        return {}
    return {"SRIFTY_STALL_S": str(HANG_STALL_S), "SRIFTY_STALL_CHECK_S": str(HANG_CHECK_S)}


def _flags(settings: Settings) -> str:
    """The flags that asked for a change of the copy, as the report names them."""
    return " and ".join(f for f, on in (("--lose-node", settings.lose_node), ("--hang-node", settings.hang_node)) if on)


def _fleet_for_nodes(train: dict[str, Any], nodes: int) -> list[str]:
    """The job's fleet (``LaunchEnv.fleet``, what its move requests and logs name) at ``nodes`` of the one type
    (``--nodes``): it named the plan's count while another trained. What changed, for the report."""
    env = train.get("env") or {}
    name = protocol.VARIABLES["fleet"]
    fleet = str(env.get(name) or "").strip()
    if not fleet or "," in fleet:  # --nodes takes a fleet of one type only
        return []
    was, env[name] = env[name], f"{fleet.partition(':')[0].strip()}:{nodes}"  # "type" alone is one node of it
    return [f"{name} {was}: {env[name]}"]


def _batch_for_nodes(train: dict[str, Any], ranks: int) -> list[str]:
    """The plan's per-rank batches split again over ``ranks`` (``--nodes``): the same global batch, as srifty_auto
    takes it; the job (and the check that it trains as the plan says) would else see the plan's list for another
    world size. What changed, for the report."""
    env = train.get("env") or {}
    name = protocol.VARIABLES["batch_sizes"]
    if not env.get(name):
        return []
    total = sum(int(b) for b in env[name].split(","))
    if total < ranks:
        del env[name]
        return [f"{name}: left out ({total} samples a micro-step for {ranks} ranks)"]
    sizes = [total // ranks + (1 if r < total % ranks else 0) for r in range(ranks)]
    env[name] = ",".join(map(str, sizes))
    return [f"{name}: the plan's {total} samples a micro-step over {ranks} rank(s): {env[name]}"]


def _local_network(values: dict[str, Any], ec2: Any, changed: list[str]) -> None:
    """A VPC and subnets of the local AWS for a fleet in the user's own network."""
    network = values["network"]
    if network.get("create_vpc"):
        return
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{i}.0/24")["Subnet"]["SubnetId"]
        for i in range(max(1, len(network.get("subnet_ids") or [])))
    ]
    changed.append(f"network {network.get('vpc_id')}: a VPC of the local AWS ({vpc})")
    network.update(vpc_id=vpc, subnet_ids=subnets)


def _placeholder_secrets(values: dict[str, Any], aws: LocalAWS, changed: list[str]) -> None:
    """A placeholder for every secret the fleet reads, where it reads it."""
    for secret in values.get("secrets") or []:
        if secret["source"] == "ssm":
            aws.client("ssm").put_parameter(Name=secret["id"], Value="rehearsal", Type="SecureString")
        else:
            aws.client("secretsmanager").create_secret(Name=secret["id"], SecretString="rehearsal")
        changed.append(f"secret {secret['name']}: a placeholder at {secret['source']}:{secret['id']}")


def read_record(s3: Any, bucket: str, prefix: str, cls: Any, after_unix: float, stamp: str) -> Any:
    """The ``cls`` record beside the checkpoints, if one was written after ``after_unix`` (by its ``stamp``)."""
    key = f"{prefix}{cls.FILE}"
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        record = protocol.parse(cls, json.loads(body), f"s3://{bucket}/{key}", None)
    except Exception:  # noqa: BLE001 - not there yet, or being replaced
        return None
    when = getattr(record, stamp, None)
    return record if when is not None and when >= after_unix else None


def fleet_instances(ec2: Any, fleet: str) -> list[dict[str, Any]]:
    """The fleet's pending and running instances (its ``srifty:fleet`` tag), by ID."""
    pages = ec2.describe_instances(
        Filters=[
            {"Name": "tag:srifty:fleet", "Values": [fleet]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    return sorted((i for r in pages["Reservations"] for i in r["Instances"]), key=lambda i: i["InstanceId"])


def terminate_as_ec2_does(aws: LocalAWS, node: Node, say: Callable[[str], None]) -> None:
    """A node that shut itself down is terminated, as EC2 terminates it; still in its Auto Scaling group, the group
    replaces it."""
    asg = aws.client("autoscaling")
    member = asg.describe_auto_scaling_instances(InstanceIds=[node.instance_id])["AutoScalingInstances"]
    if member:
        # an instance that shuts down while in its group is replaced by the group (desired capacity unchanged)
        asg.terminate_instance_in_auto_scaling_group(InstanceId=node.instance_id, ShouldDecrementDesiredCapacity=False)
        say(f"node {node.index} ({node.instance_id}) shut down: terminated, still in its Auto Scaling group")
    else:
        aws.client("ec2").terminate_instances(InstanceIds=[node.instance_id])
        say(f"node {node.index} ({node.instance_id}) shut down: terminated")


def wrong_status_records(s3: Any, bucket: str, prefix: str, fleet: str, nodes: list[Node], code: int = 75) -> list[str]:
    """What is wrong with each node's status record beside the checkpoints (it must say exit ``code``, and preempted
    for 75 only)."""
    wrong = []
    for node in nodes:
        key = f"{prefix}status/{fleet}-{node.instance_id}.json"
        try:
            status = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as exc:  # noqa: BLE001
            wrong.append(f"{node.instance_id}: no status record ({exc})")
            continue
        if status.get("exit_code") != code or status.get("preempted") is not (code == 75):
            wrong.append(f"{node.instance_id}: {status}")
    return wrong


def check_left(walk: _Walk, leg: int, nodes: list[Node], who: str = "every node") -> None:
    """The checks of a leg's end: every node left with 75 and its status record says so, the jobs' outputs went
    beside the checkpoints, the watchdog kept each node in its group."""
    codes = {n.instance_id: n.exit_code for n in nodes}
    walk.check(
        f"leg {leg}: {who} left with exit 75",
        set(codes.values()) == {75},
        ", ".join(f"{i}: {c}" for i, c in codes.items()),
    )
    assert walk.aws is not None
    s3 = walk.aws.client("s3")
    wrong = wrong_status_records(s3, walk.bucket, walk.prefix, walk.values["name"], nodes)
    walk.check(
        f"leg {leg}: status records say 75, preempted",
        not wrong,
        "; ".join(wrong) or f"{len(nodes)} record(s) at s3://{walk.bucket}/{walk.prefix}status/",
    )
    walk._wait(lambda: all(n.terminated for n in nodes), 60, "")
    missing, shipped = outputs_missing(s3, walk.bucket, walk.prefix, walk.values["name"], nodes)
    where = f"s3://{walk.bucket}/{walk.prefix}outputs/"
    walk.check(
        f"leg {leg}: the jobs' outputs are beside the checkpoints",
        not missing,
        "; ".join(missing)[:600] or f"{shipped} file(s) the jobs wrote in their folders, at {where}",
    )
    if walk.report.mode == "asg":
        stayed = [n for n in nodes if STAYED in (n.work / "watchdog.log").read_text(errors="replace")]
        walk.check(
            f"leg {leg}: the watchdog kept every node in its Auto Scaling group",
            len(stayed) == len(nodes),
            f"{len(stayed)} of {len(nodes)} stayed (a preempted node leaves its place to a replacement)",
        )


def notice_a_node(walk: _Walk, leg: int, nodes: list[Node]) -> Any:
    """A spot interruption notice to the leg's last node: the job must write its checkpoint (``PREEMPTED.json``,
    durable) and every node leave with 75, kept in its group (:func:`check_left`). Returns the job's record."""
    target = nodes[-1]  # not the first ready: the notice reaches the others through the job
    noticed = time.time()
    target.notice()
    walk.say(f"leg {leg}: spot interruption notice to node {target.index} ({target.instance_id})")
    preempted = walk._wait(
        lambda: (
            walk._record(protocol.Preempted, noticed - 1, "durable_unix") or walk._record(protocol.Finished, 0, "step")
        ),
        300,
        f"leg {leg}: the checkpoint on the notice",
    )
    if isinstance(preempted, protocol.Finished):  # its last steps outran the notice's watcher (a new user's walk)
        raise walk.fail(
            f"leg {leg}: checkpoint on the notice",
            f"the job finished (step {preempted.step}) before it acted on the notice: give it more steps (the "
            "train command's own option), or a shorter notice_after_s (srifty rehearse --notice-after-s)",
            target,
        )
    if preempted is None:
        raise walk.fail(f"leg {leg}: checkpoint on the notice", "no PREEMPTED.json within 300 s", target)
    walk.check(
        f"leg {leg}: checkpoint on the notice",
        bool(preempted.checkpoint) and preempted.stored == "durable",
        f"step {preempted.step}, {preempted.checkpoint}, durable {preempted.notice_to_durable_s:.2f} s after "
        f"the notice ({preempted.stored})",
    )
    walk._wait(lambda: all(n.exit_code is not None for n in nodes), 300, f"leg {leg}: the nodes leave")
    check_left(walk, leg, nodes)
    return preempted


def finish_the_job(walk: _Walk, leg: int) -> None:
    """The last leg trains to the job's end, no notice: the job's ``FINISHED.json``; every node exits 0 and its
    status record says so; every rank of each node marked its script's end (``exit.<local rank>``: what tells a job
    that finished and then died in its teardown from one that failed); the fleet's life record ended by the job; and,
    with no launcher to do it, every node's watchdog took its instance out of its Auto Scaling group, so that the
    group replaces nothing and wants no capacity (a group that kept replacing a finished job's nodes would bill until
    someone destroyed the fleet)."""
    assert walk.aws is not None
    nodes = [n for n in walk.nodes if n.leg == leg]
    started = walk._first_step(leg, nodes)
    walk._wait(lambda: all(n.exit_code is not None for n in nodes), None, f"leg {leg}: the job's end")
    finished = walk._record(protocol.Finished, 0, "step")
    codes = {n.instance_id: n.exit_code for n in nodes}
    walk.check(
        f"leg {leg}: the job trained to its end",
        finished is not None and finished.step > started.step and set(codes.values()) == {0},
        (f"FINISHED.json at step {finished.step}" if finished else "no FINISHED.json")
        + "; the nodes' exits "
        + ", ".join(f"{i}: {c}" for i, c in codes.items()),
    )
    s3 = walk.aws.client("s3")
    wrong = wrong_status_records(s3, walk.bucket, walk.prefix, walk.values["name"], nodes, code=0)
    walk.check(f"leg {leg}: status records say 0", not wrong, "; ".join(wrong) or f"{len(nodes)} record(s)")
    marks = {n.index: _exit_marks(n) for n in nodes}
    walk.check(
        f"leg {leg}: every rank marked its script's end",
        all(have == want and want > 0 for have, want in marks.values()),
        ", ".join(f"node {i}: {have} of {want} rank(s)" for i, (have, want) in marks.items())
        + " (exit.<local rank> in the node's state folder)",
    )
    check_life_ended(walk, leg, nodes, s3)
    _check_left_the_group(walk, leg, nodes)
    missing, shipped = outputs_missing(s3, walk.bucket, walk.prefix, walk.values["name"], nodes)
    walk.check(
        f"leg {leg}: the jobs' outputs are beside the checkpoints",
        not missing,
        "; ".join(missing)[:600] or f"{shipped} file(s) at s3://{walk.bucket}/{walk.prefix}outputs/",
    )


def check_life_ended(walk: _Walk, leg: int, nodes: list[Node], s3: Any) -> None:
    """The fleet's life record ended by the job's end. Each node's watchdog ends it once its boot script says the job
    exited, beside the script's own last words (its log, outputs and status record): the record may land after the
    status records (it did, in the fifty-first session's rehearsal), never after the watchdog's shutdown. So it is
    waited for, until every node is terminated or 180 s."""
    key = f"{walk.prefix}life/{walk.values['name']}.json"
    life: dict[str, Any] = {}

    def ended() -> bool:  # each look's record kept: the last one is the one checked (read after the nodes' end)
        life.clear()
        life.update(read_json(s3, walk.bucket, key) or {})
        return life.get("ended_unix") is not None or all(n.terminated for n in nodes)

    walk._wait(ended, 180, f"leg {leg}: the fleet's life record")
    walk.check(
        f"leg {leg}: the job's end ended the fleet's life",
        life.get("ended_unix") is not None and "exited with 0" in str(life.get("why")),
        f"life/{walk.values['name']}.json: ended {life.get('ended_unix')}, why {life.get('why')!r}",
    )


def _check_left_the_group(walk: _Walk, leg: int, nodes: list[Node]) -> None:
    """Once the finished leg's nodes are gone: each left its Auto Scaling group, which holds no instance and launches
    nothing more, and no new instance of the fleet appears."""
    assert walk.aws is not None
    walk._wait(lambda: all(n.terminated for n in nodes), 180, f"leg {leg}: the nodes shut down")
    walk._wait(lambda: False, FINISH_SETTLE_S, "", quiet=True)  # a replacement the group starts would show by now
    left = [n for n in nodes if LEFT in (n.work / "watchdog.log").read_text(errors="replace")]
    known = {n.instance_id for n in walk.nodes}
    new = [i["InstanceId"] for i in fleet_instances(walk.aws.client("ec2"), walk.values["name"]) if i["InstanceId"]
           not in known]  # fmt: skip
    (group,) = walk.aws.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[walk.group_name])[
        "AutoScalingGroups"
    ]
    # the group launches nothing more: its launches suspended (the watchdog's first call: a weighted group keeps
    # desired units after its last instance's detach decrements one), or nothing wanted
    suspended = sorted(p["ProcessName"] for p in group.get("SuspendedProcesses", []))
    idle = "Launch" in suspended or group["DesiredCapacity"] == 0
    decided = sorted(set(walk.aws.proxy.asg_decided)) if walk.aws.proxy is not None else []
    walk.check(
        f"leg {leg}: every node left its Auto Scaling group and nothing replaced them",
        len(left) == len(nodes) and not new and idle and not group.get("Instances"),
        f"{len(left)} of {len(nodes)} left; the group: {len(group.get('Instances', []))} instance(s), desired "
        f"capacity {group['DesiredCapacity']}, suspended {', '.join(suspended) or 'nothing'}; "
        + (f"new instance(s) {', '.join(new)}" if new else f"no new instance {FINISH_SETTLE_S:.0f} s after the last")
        + (f"; the role's calls, as IAM decides them: {'; '.join(decided)}" if decided else ""),
    )


def _exit_marks(node: Node) -> tuple[int, int]:
    """(the exit marks the node's ranks wrote, its ranks: torchrun's --nproc_per_node in the boot script it ran)."""
    state = node.work / "run-srifty"
    ranks = 0
    for boot in state.glob("boot-*.sh"):
        found = re.search(r"--nproc_per_node=(\d+)", boot.read_text(errors="replace"))
        ranks = int(found.group(1)) if found else ranks
    return sum(1 for r in range(ranks) if (state / f"{protocol.EXIT_MARK}.{r}").is_file()), ranks


def read_json(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except Exception:  # noqa: BLE001 - not there
        return None


def periodic_checkpoint(walk: _Walk, leg: int, nodes: list[Node], started: Any) -> tuple[str, int]:
    """The leg's first periodic checkpoint past its first step (its URI, step), waited for (at most 120 s): what the
    next leg resumes from when no notice's checkpoint comes."""
    assert walk.aws is not None
    s3 = walk.aws.client("s3")
    what = f"leg {leg}: a periodic checkpoint"
    newest = walk._wait(lambda: newest_checkpoint(s3, walk.bucket, walk.prefix, started.step), 120, what, watch=nodes)
    if newest is None:
        raise walk.fail(what, f"none after step {started.step} within 120 s (every {LOSE_EVERY_S} s here)", nodes[0])
    return newest


def lose_a_node(walk: _Walk, leg: int, nodes: list[Node], started: Any) -> tuple[str, int]:
    """The leg's c10d host (its first ready node) is lost without a notice, once a periodic checkpoint of this leg is
    in the bucket: every process of it frozen (SIGSTOP: its connections stay open, as a vanished machine's, so the
    others' collectives and torchrun's store wait on it instead of failing), its instance terminated (its group
    replaces it). The other nodes must see it gone and leave as on a notice (exit 75, kept in the group), so that the
    group's replacements resume from the newest checkpoint. Returns it (its URI, step), read once they have left."""
    assert walk.aws is not None
    s3 = walk.aws.client("s3")
    newest = periodic_checkpoint(walk, leg, nodes, started)
    host = c10d_host(nodes)
    host.freeze()
    host.terminated = True
    asg = walk.aws.client("autoscaling")  # a vanished instance: EC2 terminates it, its group replaces it
    asg.terminate_instance_in_auto_scaling_group(InstanceId=host.instance_id, ShouldDecrementDesiredCapacity=False)
    walk.say(
        f"leg {leg}: node {host.index} ({host.instance_id}), the c10d host, lost without a notice: every process "
        f"frozen (its connections left open, as a vanished machine's), the instance terminated"
    )
    others = [n for n in nodes if n is not host]
    walk._wait(lambda: all(n.exit_code is not None for n in others), 420, f"leg {leg}: the other nodes leave")
    host.power_off()
    newest = newest_checkpoint(s3, walk.bucket, walk.prefix, None) or newest  # one the others finished counts too
    saw = [n for n in others if f"the fleet lost {host.instance_id} without a notice" in n.log()]
    walk.check(
        f"leg {leg}: the other nodes saw a node lost without a notice",
        len(saw) == len(others),
        f"{len(saw)} of {len(others)} said that the fleet lost {host.instance_id} (their logs)",
    )
    check_left(walk, leg, others, who="the other nodes")
    return newest


LOSE_EVERY_S = 5  # the rehearsal copy's checkpoint interval with lose_node: a periodic checkpoint every few steps
LOSE_GRACE_S = 20  # and its watchdog's grace: the kill of a job stuck on the lost node comes after it and 30 s
HANG_STALL_S = 30  # with hang_node, the nodes' stall limit (the module's is 20 min) and the period of its looks
HANG_CHECK_S = 2
HANG_LEAVE_S = 300  # the hang's leg: the limit, a peer's grace and the nodes' verdicts, well within this


def hang_a_node(walk: _Walk, leg: int, nodes: list[Node], started: Any) -> tuple[str, int]:
    """One node's job hangs once a periodic checkpoint of this leg is in the bucket: the ranks of its last node
    frozen (SIGSTOP), the node itself (its boot script, watches and torchrun's agent) running, as when a GPU stops
    answering with no fault the driver logs. The others' ranks wait in the step's collective. The boot script's
    stall watch must find it (on that node, or on a peer whose own job stopped with it), kill the job, and every node
    leave as on a notice (exit 75, kept in the group), its exit record saying where the job hung; the group's
    replacements resume from the newest checkpoint. Returns it (its URI, step), read once the nodes have left."""
    assert walk.aws is not None
    s3 = walk.aws.client("s3")
    newest = periodic_checkpoint(walk, leg, nodes, started)
    target = nodes[-1]
    ranks = target.freeze_job()
    frozen = time.monotonic()
    if not ranks:
        raise walk.fail(f"leg {leg}: a job that hangs", f"node {target.index} runs no rank of the job to hang", target)
    walk.say(
        f"leg {leg}: node {target.index} ({target.instance_id})'s job hangs: its {len(ranks)} rank process(es) frozen "
        "(SIGSTOP), the node, its watches and torchrun's agent running, as when a GPU stops answering"
    )
    walk._wait(lambda: all(n.exit_code is not None for n in nodes), HANG_LEAVE_S, f"leg {leg}: the nodes leave")
    left = [pid for pid in ranks if _alive(pid)]
    found = {n.index: n.started + n.marks["hung"] - frozen for n in nodes if "hung" in n.marks}
    walk.check(
        f"leg {leg}: the fleet found the hung job and killed it",
        bool(found) and not left,
        (
            ", ".join(f"node {i} found it {t:.1f} s after the freeze" for i, t in sorted(found.items()))
            + f" (its limit {HANG_STALL_S} s from the last sign of life, looked at every {HANG_CHECK_S} s); "
            + (f"frozen rank(s) {left} still running" if left else f"the {len(ranks)} frozen rank(s) killed")
        )
        if found
        else 'no node said the job hangs ("it hangs; killing it" in none of the logs)',
    )
    records = exit_records(s3, walk.bucket, walk.prefix, walk.values["name"], nodes)
    hung = {i: r.get("hung_step") for i, r in records.items() if r.get("hung_step") is not None}
    steps = ", ".join(sorted({str(v) for v in hung.values()}, key=lambda v: (len(v), v)))
    walk.check(
        f"leg {leg}: the exit records say where the job hung",
        bool(hung) and all(isinstance(v, int) and v >= started.step for v in hung.values()),
        f"hung_step {steps or 'none'} in {len(hung)} of {len(nodes)} record(s) (the last step the job's alive file "
        f"recorded; the leg's first step was {started.step}, its newest checkpoint step {newest[1]})",
    )
    check_left(walk, leg, nodes)
    return newest_checkpoint(s3, walk.bucket, walk.prefix, None) or newest


def exit_records(s3: Any, bucket: str, prefix: str, fleet: str, nodes: list[Node]) -> dict[str, dict[str, Any]]:
    """Each node's exit record (``exited/<fleet>/<instance id>.json`` beside the checkpoints), by instance id; a
    node without one is left out."""
    found = {}
    for node in nodes:
        with contextlib.suppress(Exception):
            body = s3.get_object(Bucket=bucket, Key=f"{prefix}exited/{fleet}/{node.instance_id}.json")["Body"].read()
            found[node.instance_id] = json.loads(body)
    return found


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, reaped by no one yet, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def newest_checkpoint(s3: Any, bucket: str, prefix: str, after_step: int | None) -> tuple[str, int] | None:
    """The checkpoint written last under ``prefix`` (its URI and step) if its step is past ``after_step``, else None:
    a file ``<reason>-step=<N>.ckpt`` (or a sharded checkpoint's folder of that name) with its ``.sha256`` digest,
    which SpotPreemption writes before it publishes the checkpoint."""
    written: dict[str, float] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            written[o["Key"]] = o["LastModified"].timestamp()
    found = []
    for key, when in written.items():
        name = key.split(".ckpt/", 1)[0] + ".ckpt" if ".ckpt/" in key else key
        match = re.search(r"step=(\d+)\.ckpt$", name)
        if match and name + DIGEST_SUFFIX in written:
            found.append((when, int(match.group(1)), name))
    if not found:
        return None
    _, step, newest = max(found)
    return (f"s3://{bucket}/{newest}", step) if after_step is None or step > after_step else None


def c10d_host(nodes: list[Node]) -> Node:
    """The node the others met at, as the boot script named it in every node's log ("the c10d host is <ip> (<instance
    id>, the first ready)"); the first node when no log says."""
    said = {m.group(1) for n in nodes for m in re.finditer(r"the c10d host is \S+ \((i-[0-9a-f]+), the first", n.log())}
    return next((n for n in nodes if n.instance_id in said), nodes[0])


def lost_resume_findings(
    leg: int, lost: tuple[str, int] | None, started: Any, logs: list[str]
) -> list[tuple[str, bool, str]]:
    """The checks of a leg's start after a node was lost without a notice: the replacements resumed from the newest
    checkpoint at the time (``lost``: its URI and step), the periodic one, and where it left."""
    uri, step = lost or ("(none)", None)
    first = started.step
    ok = step is not None and first is not None and step <= first <= step + 1
    named = started.resumed_from == uri or any(uri in text for text in logs)
    return [
        (f"leg {leg}: the replacements resumed from the last periodic checkpoint", ok and named,
         f"first step {first} after {uri} (step {step}), the newest once the nodes had left"),
    ]  # fmt: skip


def outputs_missing(s3: Any, bucket: str, prefix: str, fleet: str, nodes: list[Node]) -> tuple[list[str], int]:
    """(what each node's job wrote in its code folder that is not under ``outputs/<fleet>/<instance id>/`` beside the
    checkpoints, how many files are there): the node copies them when its job ends (the module's user_data)."""
    missing: list[str] = []
    shipped = 0
    for node in nodes:
        since = node.work / "run-srifty" / "outputs.since"
        if not since.exists():
            continue
        wrote = {
            path.relative_to(code).as_posix()
            for code in (node.work / "opt-srifty").glob("code-*")
            if code.is_dir() and not code.name.endswith((".partial", ".tar.gz"))
            for path in code.rglob("*")
            if path.is_file()
            and path.stat().st_mtime > since.stat().st_mtime
            and not {".srifty", "__pycache__"} & set(path.relative_to(code).parts)
            and path.suffix != ".pyc"
        }
        where = f"{prefix}outputs/{fleet}/{node.instance_id}/"
        listed = set()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=where):
            listed |= {o["Key"][len(where) :] for o in page.get("Contents", [])}
        shipped += len(listed)
        missing += [f"{node.instance_id}: {path} not at s3://{bucket}/{where}" for path in sorted(wrote - listed)]
    return missing, shipped


def local_aws_findings(proxy: AwsRulesProxy | None) -> list[tuple[str, bool, str]]:
    """A failed check where the local AWS could not keep a rule of real AWS's that the rehearsal relies on (none
    when it kept them all): an Auto Scaling group's mixed instances policy that moto dropped and the proxy could not
    put back leaves a fleet that launches what AWS would not."""
    if proxy is None or not proxy.policy_failures:
        return []
    detail = (
        "the local AWS could not put back an Auto Scaling group's mixed instances policy after an update that named "
        "none (AWS keeps it; moto drops it): what the group launched afterwards is not what AWS would launch ("
        + "; ".join(proxy.policy_failures)[-600:]
        + ")"
    )
    return [("local AWS", False, detail)]


def exited_first(index: int, instance_id: str, code: int) -> str:
    """Why a node that left before the rehearsal's next event fails it; a job that finished (exit 0) ran fewer steps
    than a rehearsal takes (a walk ran the demo's 2,000-step script and read only "exited with 0 first")."""
    why = f"node {index} ({instance_id}) exited with {code} first"
    if code == 0:
        why += (
            ": the training finished before the rehearsal's spot notice; rehearse a script that runs longer than the "
            "rehearsal (more steps: a max_steps the notices end)"
        )
    return why


def resume_findings(leg: int, before: Any, started: Any, logs: list[str]) -> list[tuple[str, bool, str]]:
    """The checks of a leg's start against the previous leg's notice checkpoint (``before``): it resumed where the
    fleet left and from that checkpoint; a note (no name) when the job's DataLoader is not resumable."""
    first, k = started.step, max(1, math.ceil(float(getattr(started, "steps_per_batch", 1) or 1) - 1e-6))
    # a batch's global steps: one, or a manual loop's optimizers (a trial's GAN resumed exactly at 148 -> 150)
    ok = before.step is not None and first is not None and before.step <= first <= before.step + k
    named = any(before.checkpoint in text for text in logs)
    where = f"first step {first} after the checkpoint of step {before.step}"
    which = f"{before.checkpoint} {'named' if named else 'not named'} in the replacements' logs"
    found = [
        (f"leg {leg}: the replacements resumed where the fleet left", ok, where),
        (f"leg {leg}: resumed from the notice's checkpoint", named, which),
    ]
    if any(SAMPLE_EXACT in text for text in logs):  # srifty_auto carried the epoch's position: the warning is moot
        found.append((
            "", True, "note: the resume was sample-exact: srifty_auto restored the position in the epoch, so "
            "Lightning's warning that the DataLoader is not resumable does not apply (the nodes' logs say so)",
        ))  # fmt: skip
    elif any(ITERABLE_RESTARTED in text for text in logs):
        found.append((
            "", True, "note: the job's training dataset is iterable and keeps no position: each resumed leg streams "
            "from its first sample again, training those samples twice (the nodes' logs say so, with the way out)",
        ))  # fmt: skip
    elif any(LIGHTNING_NOT_RESUMABLE in text for text in logs):
        found.append((
            "", True, "note: the job's DataLoader is not resumable: the resumed run sees its samples again from the "
            "start of the epoch (Lightning's warning, in the nodes' logs)",
        ))  # fmt: skip
    return found


# what srifty_auto logs on a resume it made sample-exact (lightning_srifty/strategies/planned.py), and Lightning's
# warning on a resume from the middle of an epoch with a loader that has no state (training_epoch_loop.py): the
# strategy's own sentence quotes the warning, so the two are told apart by these, not by "not resumable" alone
SAMPLE_EXACT = "srifty_auto: the resume is sample-exact"
LIGHTNING_NOT_RESUMABLE = "your dataloader is not resumable"
# what SpotPreemption logs on a resume whose training data is an iterable without a position (migrate/preemption.py's
# ITERABLE_RESTARTS begins so), which Lightning's own warning never covers (an iterable has no epoch length)
ITERABLE_RESTARTED = "its training dataset is iterable and keeps no position of its own"
