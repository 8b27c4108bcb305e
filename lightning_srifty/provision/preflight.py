"""Pre-flight: what must hold before a fleet is paid for, checked in seconds (``srifty check``; ``srifty apply`` and
``srifty launch`` run it first).

- **model**: the fleet was planned for the model this project's own profile measured (``srifty/profile.json`` in
  the code snapshot, else in the folder the check runs in), not another one's plan.
- **script**: the training script is in the code snapshot, and every module it imports resolves in the environment
  the nodes install (the standard library, the code itself, torch / lightning / lightning-srifty and what they
  depend on, the requirements file), and so does every module the project's own modules it imports import in turn
  (:mod:`lightning_srifty.provision.terraform.script_imports`).
- **device**: the script does not pin its Trainer (or Fabric) to the CPU, as a script profiled on a laptop often does
  (``accelerator="cpu"``: the fleet's GPUs would sit idle), nor defaults an ``--accelerator`` flag to it that the
  train command leaves unset.
- **quota**: the account's EC2 vCPU quotas (Service Quotas) for each instance class and market of the fleet leave
  room for it, after what already runs; else the exact increase request to file.
- **offering**: every instance type is offered in the region, and in the availability zone the fleet's subnet is
  in (``describe_instance_type_offerings``); else the zones that offer them all.
- **image**: the AMI given exists and is of the fleet's architecture, else the Deep Learning AMI's public SSM
  parameter of each architecture resolves (an emulator has none: give --ami).
- **bucket**: the checkpoint bucket answers (``head_bucket``), when it exists already; the code upload to the bucket
  the module creates is not refused for want of TLS (an emulator's ``http://`` endpoint: a warning).
- **data**: each folder of ``--data`` / ``--data-copy`` answers with at least one object (one key listed, with the
  operator's credentials: a refusal is a warning, the nodes' role is granted it); the folders the nodes copy fit on the
  disk they go to (the type's instance store, else the root volume less the Deep Learning AMI's own ~80 GB), their
  size summed for at most 10 s of listing.
- **volumes**: an Auto Scaling group's service-linked role may use every KMS key its launches encrypt or restore a
  volume with, as AWS requires of a customer managed key: the root's ``checkpoints.kms_key_arn``, else the account's
  default key for EBS encryption, and the keys of the image's encrypted snapshots, as EC2 restores an image's volumes
  (:func:`~lightning_srifty.provision.aws.launch_volume_keys`); its policy or a grant allows the operations EBS needs
  of each (:func:`~lightning_srifty.provision.aws.volume_key_verdict`); else the policy statements or the grant to
  add.
- **credentials**: the credentials are valid (``sts get-caller-identity``). Whether they may do everything the module
  does is not simulated: ``terraform plan`` reads, ``apply`` writes.

A check that cannot be made (no permission to read quotas, an API the endpoint lacks) is a warning that says so,
never a silent pass.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import json
import math
import os
import posixpath
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lightning_srifty.provision.aws import (
    DEFAULT_KEY_WORDS,
    GRANT_OPERATIONS,
    KEY_POLICY_PAGE,
    LAUNCH_KEY_WORDS,
    NEW_VOLUME,
    PLAIN_HTTP_FIX,
    ZONE_ID,
    KeyUse,
    autoscaling_role_arn,
    aws_unreachable,
    aws_words,
    clients,
    granted_operations,
    key_policy_answers,
    launch_volume_keys,
    merge_key_uses,
    offered_zones,
    plain_http_upload,
    volume_key_verdict,
    why,
)
from lightning_srifty.provision.terraform import cuda
from lightning_srifty.provision.terraform.bootstrap import NODE_EXTRA
from lightning_srifty.provision.terraform.generate import MARKER, PROJECT_PROFILE, TFVARS, tag_value, terraform_root
from lightning_srifty.provision.terraform.glue import cli_configs, command_glue, project_walk, python_sources
from lightning_srifty.provision.terraform.lightning_extras import lightning_uses
from lightning_srifty.provision.terraform.script_imports import (
    CONFIG_KEYS,
    CONFIGURED,
    DEFERRED,
    OPTIONAL,
    RUNS,
    Needed,
    ProjectImports,
)
from lightning_srifty.provision.terraform.snapshot import ENVIRONMENT_FILE, Snapshot, load_snapshot, read_member
from predictor.catalog.catalog import Catalog
from predictor.documents.profile import load_profile
from predictor.exceptions import ConfigError, ProvisionError

Status = Literal["ok", "fail", "warn"]

# Service Quotas names of EC2's vCPU quotas (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-resource-
# limits.html, .../using-spot-limits.html): matched by name, so the codes come from the account's own listing
ON_DEMAND_QUOTA = {
    "standard": "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances",
    "p": "Running On-Demand P instances",
    "g": "Running On-Demand G and VT instances",
    "trn": "Running On-Demand Trn instances",
    "inf": "Running On-Demand Inf instances",
    "dl": "Running On-Demand DL instances",
    "f": "Running On-Demand F instances",
    "x": "Running On-Demand X instances",
}
SPOT_QUOTA = {
    "standard": ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",),
    "p5": ("All P5 Spot Instance Requests", "All P Spot Instance Requests"),
    "p": ("All P4, P3 and P2 Spot Instance Requests", "All P Spot Instance Requests"),
    "g": ("All G and VT Spot Instance Requests",),
    "trn": ("All Trn Spot Instance Requests",),
    "inf": ("All Inf Spot Instance Requests",),
    "dl": ("All DL Spot Instance Requests",),
    "f": ("All F Spot Instance Requests",),
    "x": ("All X Spot Instance Requests",),
}
_CLASS = re.compile(r"^(trn|inf|dl|vt|p|g|f|x)(\d*)", re.I)


@dataclass(frozen=True)
class Finding:
    check: str  # script, imports, device, quota, offering, image, bucket, data, volumes, credentials
    status: Status
    message: str
    fix: str | None = None

    def line(self) -> str:
        mark = {"ok": "ok  ", "fail": "FAIL", "warn": "warn"}[self.status]
        return f"[{mark}] {self.check}: {self.message}" + (f"\n       fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]
    seconds: float
    region: str
    zone: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(f.status != "fail" for f in self.findings)

    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    def text(self) -> str:
        head = f"Pre-flight for {self.region}" + (f" ({self.zone})" if self.zone else "") + f", {self.seconds:.1f} s:"
        verdict = "ready to apply" if self.ok else f"{len(self.failed())} problem(s): nothing was started"
        return "\n".join([head, *(f.line() for f in self.findings), verdict])

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "srifty.preflight/v1",
            "ok": self.ok,
            "region": self.region,
            "zone": self.zone,
            "seconds": round(self.seconds, 3),
            "findings": [f.__dict__ for f in self.findings],
        }


@dataclass(frozen=True)
class Group:
    instance_type: str
    on_demand: int
    spot: int


def quota_class(instance_type: str) -> str:
    """The vCPU quota class of a type: p5 (its own spot quota), p, g (with vt), trn, inf, dl, f, x, or standard."""
    match = _CLASS.match(instance_type.split(".")[0])
    if not match:
        return "standard"
    letters, generation = match.group(1).lower(), match.group(2)
    if letters == "vt":
        return "g"
    if letters == "p" and generation and int(generation) >= 5:
        return "p5"
    return letters


def _on_demand_key(cls: str) -> str:
    return "p" if cls == "p5" else cls


# ---------------------------------------------------------------------------------------------------------------------
# The script and its imports (no AWS)
# ---------------------------------------------------------------------------------------------------------------------


# what a --setup-command that installs packages says (pip install, uv pip, conda, apt-get...): only such a command
# may provide an import the nodes' environment lacks; `true` (the fix for a custom AMI's missing setup) does not
INSTALLS = re.compile(r"\b(pip3?|uv|conda|mamba|micromamba|poetry|pdm|pipenv|pipx|apt(-get)?|yum|dnf|install)\b")


# the keyword that pins a Lightning Trainer / Fabric to a device; these values leave a GPU fleet's GPUs idle
_OFF_GPU = ("cpu", "mps")
_RUNNERS = ("Trainer", "Fabric")
PREFIX = len("--accel")  # the shortest prefix of --accelerator taken for it (--acc could be --accumulate...)


def pinned_off_gpu(source: str, argv: list[str]) -> list[tuple[int, str, bool]]:
    """Where ``source`` keeps a run off the GPUs: ``(line, what, certain)`` for each ``Trainer(accelerator="cpu")`` /
    ``Fabric(...)`` with a literal ``"cpu"`` or ``"mps"``, certain when it is the script's only way to train (no other
    Trainer / Fabric call leaves the device to Lightning or names a GPU, and it is not in an ``if`` / ``try`` branch,
    as a CPU fallback or an export helper is), else likely; each ``add_argument("--accelerator", default="cpu")`` the
    train command does not override (likely: the flag's value usually reaches the Trainer); the train command's own
    ``--accelerator cpu`` (line 0, likely). A value computed at run time (``accelerator=args.accelerator``, ``"cpu" if
    ... else "gpu"``) is not flagged. Not seen: a Trainer built in another module or from a config (``Trainer(**cfg)``,
    LightningCLI's YAML); the nodes' own check stops those (``launch_checks.refuse_idle_gpus``)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def branched(node: ast.AST) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.If, ast.Try, ast.Match, ast.IfExp)):
                return True
        return False

    def given(flag: str) -> bool:  # argparse takes a unique prefix of a long flag (--accel gpu)
        return any(len(a.split("=", 1)[0]) >= PREFIX and flag.startswith(a.split("=", 1)[0]) for a in argv)

    found, pinned, others = [], [], 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if name in _RUNNERS:
            value = keywords.get("accelerator")
            if isinstance(value, ast.Constant) and str(value.value).lower() in _OFF_GPU:
                pinned.append((node, f"{name}(accelerator={value.value!r})"))
            else:
                others += 1
        elif name == "add_argument" and node.args and isinstance(node.args[0], ast.Constant):
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            default = keywords.get("default")
            long = [f for f in flags if f.lstrip("-") == "accelerator"]
            if (
                long
                and isinstance(default, ast.Constant)
                and str(default.value).lower() in _OFF_GPU
                and not any(given(f) for f in flags if f.startswith("--"))
                and not any(a.split("=", 1)[0] in flags for a in argv)
            ):
                found.append((node.lineno, f"{flags[0]} defaults to {default.value!r}", False))
    found += [(node.lineno, what, not others and not branched(node)) for node, what in pinned]
    for i, arg in enumerate(argv):  # the train command's own --accelerator cpu
        flag, _, word = arg.partition("=")
        if flag.startswith("--") and len(flag) >= PREFIX and "--accelerator".startswith(flag):
            word = word or (argv[i + 1] if i + 1 < len(argv) else "")
            if word.lower() in _OFF_GPU:
                found.append((0, f"the train command passes {flag} {word}", False))
    return sorted(found)


def check_device(script: str, source: str, argv: list[str]) -> list[Finding]:
    """The script does not pin its training to the CPU (or Apple's MPS) on a fleet paid for its GPUs: a profile made
    on a laptop often says ``accelerator="cpu"``, and torchrun then trains on the nodes' CPUs, quietly and far slower
    than the prediction, until the life cap ends it."""
    findings = []
    for line, what, certain in pinned_off_gpu(source, argv):
        findings.append(
            Finding(
                "device",
                "fail" if certain else "warn",
                f"{f'{script}:{line}: ' if line else ''}{what}: on the fleet's GPUs the training would run on the "
                "CPU, far slower than predicted",
                'use accelerator="auto" (Lightning\'s default: the GPUs where there are some, else the CPU)'
                if certain
                else "give the train command --accelerator auto (or gpu)"
                + ("" if line == 0 else ", or make auto the flag's default"),
            )
        )
    return findings or [Finding("device", "ok", f"{script} does not pin the training to the CPU")]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(lines: Iterable[str]) -> set[str]:
    out = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if match:
            out.add(_normal(match.group(1)))
    return out


def _closure(roots: Iterable[str]) -> tuple[set[str], set[str]]:
    """The distributions ``roots`` pull in (``name`` or ``name[extra,...]``: their Requires-Dist, with those of the
    named extras, transitively), as installed here; and those of them not installed here, whose own dependencies
    are therefore unknown (torch and lightning on a machine with the 'infra' extra only)."""
    seen: set[str] = set()
    unknown: set[str] = set()
    done: set[tuple[str, frozenset[str]]] = set()
    todo = [_requirement(r) for r in roots]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            unknown.add(name)
            continue
        for req in requires:
            spec, _, marker = req.partition(";")
            wanted = {_normal(e) for e in re.findall(r"""extra\s*==\s*["']([^"']+)["']""", marker)}
            if wanted and not wanted & extras:
                continue
            if spec.strip():
                todo.append(_requirement(spec))
    return seen, unknown


def _requirement(text: str) -> tuple[str, frozenset[str]]:
    """(name, extras) of a requirement such as ``aiobotocore[boto3]>=2.13``, names normalised."""
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", text)
    if not match:
        return _normal(text.strip()), frozenset()
    return _normal(match.group(1)), frozenset(_normal(e) for e in (match.group(2) or "").split(",") if e.strip())


def check_model(planned: str | None, snapshot: Snapshot | None, project: Path) -> list[Finding]:
    """The plan's model (the root's ``srifty:model`` tag) against the one this project's own profile measured
    (``srifty/profile.json`` in the code snapshot, else in ``project``, the folder ``srifty check`` runs in): a plan
    for another model went all the way to apply (issue #37 H4; ``srifty terraform`` refuses it too, unless
    ``--any-model``). Nothing to compare: no finding."""

    if not planned or planned == "unknown":
        return []
    where, own = None, None
    try:
        if snapshot is not None:
            try:
                own = load_profile(json.loads(read_member(snapshot, PROJECT_PROFILE))).model.name
                where = f"the code snapshot's {PROJECT_PROFILE}"
            except KeyError:
                pass
        if own is None and (project / PROJECT_PROFILE).is_file():
            own, where = load_profile(project / PROJECT_PROFILE).model.name, str(project / PROJECT_PROFILE)
    except Exception:  # noqa: BLE001 - a profile that does not read is not a mismatch
        return []
    if not own:
        return []
    if tag_value(own) != planned:  # the tag holds the name as AWS takes it ("llama (LoRA)" is "llama _LoRA_")
        return [
            Finding(
                "model",
                "fail",
                f"the fleet was planned for the model {planned!r}, but {where} measured {own!r}",
                f"rank this project's profile (srifty recommend --profile {PROJECT_PROFILE} --out plan.json) and "
                "write the module again from that plan (srifty terraform --any-model if this plan is meant)",
            )
        ]
    return [Finding("model", "ok", f"the plan is for {own!r}, the model {where} measured")]


def check_imports(
    snapshot: Snapshot, argv: list[str], setup_command: str | None = None, image: str | None = None
) -> list[Finding]:
    """Every module the script imports resolves on the nodes (see the module docstring). One that does not fails the
    check, unless what is missing may come another way (a pinned package not installed here, a ``--setup-command``
    that installs packages, the container ``image``: a warning that says so) or the script runs without it (an
    import under ``try: ... except ImportError``: a warning naming what the nodes will run without)."""
    if argv[0] == "-m":
        script = argv[1].replace(".", "/") + ".py"
        if script not in snapshot.files:
            script = argv[1].replace(".", "/") + "/__main__.py"
    else:
        script = os.path.normpath(argv[0])  # ./train.py is train.py
    if script not in snapshot.files:
        return [
            Finding(
                "script",
                "fail" if argv[0] != "-m" else "warn",
                f"{script} is not in the code snapshot ({len(snapshot.files)} files)",
                "run srifty from your project's folder (or give --code) and name the script relative to it",
            )
        ]
    source = python_sources(snapshot).get(script) or read_member(snapshot, script).decode(errors="replace")
    args = argv[2:] if argv[0] == "-m" else argv[1:]
    found = project_walk(snapshot, script, argv[0] == "-m", tuple(cli_configs(args)))
    if script in found.unparsed:
        error = found.unparsed[script][0]
        return [Finding("script", "fail", f"{script} does not parse: {error}", "fix the syntax error before paying")]
    env = json.loads(read_member(snapshot, ENVIRONMENT_FILE))
    lines = read_member(snapshot, env["requirements"]).decode().splitlines() if env.get("requirements") else []
    findings = [
        Finding("script", "ok", f"{script} is in the code snapshot"),
        *_unparsed_findings(script, found),
        *_relative_findings(script, argv[0] == "-m", found),
        *_import_findings(env, lines, script, found, setup_command, image),
        *_from_top_findings(script, found, lines, setup_command, image),
        *_lightning_extra_findings(snapshot, env, lines, found, args, setup_command or image),
    ]
    return [*findings, *_glue_findings(snapshot, argv, script), *check_device(script, source, args)]


def _lightning_extra_findings(
    snapshot: Snapshot, env: dict[str, Any], lines: list[str], found: ProjectImports, args: list[str], other_way: Any
) -> list[Finding]:
    """A Lightning class the job uses that runs on a package neither lightning nor the requirements file installs
    (:mod:`~lightning_srifty.provision.terraform.lightning_extras`): LightningCLI without jsonargparse failed every
    node at start-up after the import check passed (a trial). A warning where it may come another way (a setup
    command or an image, a pinned package not installed here), else a failure."""
    configs = {}
    for path in cli_configs(args):
        try:
            configs[path] = read_member(snapshot, path).decode(errors="replace")
        except (KeyError, OSError):
            continue
    findings = []
    for extra, where in lightning_uses(python_sources(snapshot), found.modules, configs, args).items():
        results = [_missing(env, lines, {m: Needed(RUNS, where, (where,))}) for m in extra.modules]
        if not all(missing for missing, _, _ in results):
            continue  # one of its modules is there
        blind, fix = results[0][1], results[0][2]
        try:
            pin = f">={importlib.metadata.version(extra.modules[0])}"  # at least this machine's, which ran it
        except importlib.metadata.PackageNotFoundError:
            pin = ""
        findings.append(
            Finding(
                "imports",
                "warn" if blind or other_way else "fail",
                f"{where} uses {extra.what}, which Lightning runs only with {extra.requirement} installed (its "
                f"requirement, checked when the class is built): neither lightning, lightning-srifty nor the "
                f"requirements file installs it, and every node fails at the job's start"
                + (" (unless the setup command or the image provides it)" if other_way else ""),
                fix.replace("the package(s)", f"{extra.requirement}{pin}", 1),
            )
        )
    return findings


# import names whose distribution is named otherwise, from each project's own install instructions: what an
# uninstalled requirement of that name is taken to bring (its name, its first word and a py- or python- prefix are read
# too: flash-attn's flash_attn, hydra-core's hydra, PyYAML's yaml, python-dateutil's dateutil)
IMPORT_NAMES = {
    "PIL": ("pillow",),
    "sklearn": ("scikit-learn",),
    "skimage": ("scikit-image",),
    "cv2": ("opencv-python", "opencv-python-headless", "opencv-contrib-python", "opencv-contrib-python-headless"),
    "bs4": ("beautifulsoup4",),
    "attr": ("attrs",),
    "google": ("protobuf",),
    "jwt": ("pyjwt",),
    "git": ("gitpython",),
    "fitz": ("pymupdf",),
    "Crypto": ("pycryptodome",),
}


def _named_by(name: str, requirement: str) -> bool:
    """Whether ``requirement`` (normalised) is by its name the distribution that brings the module ``name``."""
    n = _normal(name)
    return (
        n == requirement
        or requirement in (f"py{n}", f"python-{n}")
        or requirement.startswith(f"{n}-")
        or requirement in IMPORT_NAMES.get(name, ())
    )


def _import_findings(
    env: dict[str, Any],
    lines: list[str],
    script: str,
    found: ProjectImports,
    setup_command: str | None,
    image: str | None,
) -> list[Finding]:
    """The ``imports`` findings of :func:`check_imports`: what of the names ``found`` needs the nodes lack (``env``:
    the snapshot's environment, ``lines``: its requirements file's)."""
    names = found.needed
    missing, blind, fix = _missing(env, lines, names)
    findings = []
    if required := [n for n in missing if names[n].level == RUNS]:
        unless = [f"{' or '.join(blind)} brings it: not installed here, its dependencies unknown"] if blind else []
        unless += ["the --setup-command installs it"] if setup_command and INSTALLS.search(setup_command) else []
        unless += [f"the container image {image} provides it"] if image else []
        findings.append(
            Finding(
                "imports",
                "warn" if unless else "fail",
                _who_imports(script, required, names)
                + "neither the code, the standard library, torch, lightning, lightning-srifty nor the requirements "
                "file provides" + (f" (unless {'; or '.join(unless)})" if unless else ""),
                fix,
            )
        )
    else:
        needed = sum(n.level == RUNS for n in names.values())
        imported = len(found.modules) - 1 - found.from_configs
        parts = [f"the {imported} project modules it imports"] * (imported > 0)
        parts += [f"the {found.from_configs} its config files name"] * (found.from_configs > 0)
        through = f", with those of {' and '.join(parts)}" if parts else ""
        findings.append(
            Finding("imports", "ok", f"its {needed} required imports resolve in the nodes' environment{through}")
        )
    for level, then, unless_so in (
        (DEFERRED, "a node fails when the job calls {it}", " if the job calls it"),
        (CONFIGURED, "a node fails if the job's config names {it}", " if a config the job uses names it"),
        (OPTIONAL, "the nodes will train without {it}", " if the nodes should have it"),
    ):
        if these := [n for n in missing if names[n].level == level]:
            it = "it" if len(these) == 1 else "them"
            said = _who_imports(script, these, names, level)
            then_said = then.format(it=it)
            findings.append(
                Finding(
                    "imports",
                    "warn",
                    f"{said}the nodes' environment does not provide {it}: {then_said}",
                    fix + unless_so,
                )
            )
    return findings


def _missing(env: dict[str, Any], lines: list[str], names: dict[str, Needed]) -> tuple[list[str], list[str], str]:
    """Of ``names``, those the nodes' environment does not provide; the pinned packages not installed here (torch
    and lightning on a machine with the 'infra' extra only: what they bring is not known); and the fix to say."""
    requirements = _requirement_names(lines)
    pinned = {_normal(p.split("==")[0]) for p in env.get("packages", [])}
    dists, unknown = _closure([*pinned, f"lightning-srifty[{NODE_EXTRA}]", *requirements])
    absent = sorted(unknown & requirements)  # requirements not installed here: each taken to bring its own name
    providers = importlib.metadata.packages_distributions()
    missing = []
    for name in sorted(names):
        if name in sys.stdlib_module_names or name in ("lightning_srifty", "predictor", "__future__"):
            continue
        provided = {_normal(d) for d in providers.get(name, [])} or {_normal(name)}
        if not provided & dists and not any(_named_by(name, r) for r in absent):
            missing.append(name)
    fix = f"add the package(s) to {env.get('requirements') or 'a requirements.txt in the code folder'}"
    if absent:
        listed = ", ".join(absent[:4]) + (f" and {len(absent) - 4} more" if len(absent) > 4 else "")
        fix += f", or install the requirements here ({listed} not installed) so that the check sees what they bring"
    return missing, sorted(unknown & pinned), fix


def _from_top_findings(
    script: str, found: ProjectImports, lines: list[str], setup_command: str | None, image: str | None
) -> list[Finding]:
    """A script run from a subfolder (``python scripts/train.py``) whose imports are found only at the code folder's
    top: Python looks in the script's folder (``sys.path[0]``), and the nodes set no PYTHONPATH, so they resolve
    only if the job puts the top on the path itself (a module on the way names sys.path or rootutils) or installs
    the project (``-e .`` or ``.`` in the requirements, a setup command, an image). A warning: the check cannot see
    what the script does at run time."""
    installs = any(re.fullmatch(r"(-e\s+)?\.(\[[^\]]*\])?/?", line.split("#", 1)[0].strip()) for line in lines)
    if (
        not found.from_top
        or found.adjusts_path
        or installs
        or image
        or (setup_command and INSTALLS.search(setup_command))
    ):
        return []
    where = posixpath.dirname(script)
    said = "; ".join(
        f"{importer}{_chain(via, importer == script or via == (importer,))} imports {name}"
        for name, (importer, via) in sorted(found.from_top.items())
    )
    module = script[: -len(".py")].replace("/", ".")
    it = "it" if len(found.from_top) == 1 else "them"
    return [
        Finding(
            "imports",
            "warn",
            f"{said}, found at the code folder's top, not in {where}/ where Python looks for {script}'s imports: the "
            f"nodes fail importing {it} unless the job adds the top to sys.path or installs the project",
            f"run it as a module from the top (--train-command 'python -m {module}'), or add '-e .' to the "
            "requirements with the project's pyproject.toml",
        )
    ]


def _chain(via: tuple[str, ...], mute: bool = False) -> str:
    """How the script reaches a file, for a finding: " (train.py -> models/net.py)"; "" where ``mute``."""
    return "" if mute else f" ({' -> '.join(via)})"


def _unparsed_findings(script: str, found: ProjectImports) -> list[Finding]:
    """A project module the script imports that does not parse with this machine's Python: the nodes fail
    importing it if theirs cannot either, but they may run a newer Python (a warning naming both)."""
    here = ".".join(map(str, sys.version_info[:2]))
    return [
        Finding(
            "imports",
            "warn",
            f"{path}{_chain(via)} does not parse with this machine's Python {here}: {error}. The nodes run "
            "the image's Python: if it cannot parse it either, every node fails importing it",
            "fix the syntax error, or check it with the nodes' Python version",
        )
        for path, (error, via, _level) in found.unparsed.items()
        if path != script
    ]


def _relative_findings(script: str, as_module: bool, found: ProjectImports) -> list[Finding]:
    """A relative import Python refuses where it runs (:class:`Relative`): the script's own, run by its path (it
    has no package), or a module's above the top package it was imported in. Every node fails there with an
    ImportError: a failure where it runs on import, a warning in a project module's function (if the job calls it).
    Not where the module's import may come another way: a module on the way changes sys.path (a warning then)."""
    out = []
    for path, bad in found.relative.items():
        ran = f"{path}{_chain(bad.via, path == script)}"
        if path == script and not as_module:
            why = f"python runs {script} by its path, as a script in no package"
            folders = script.split("/")[:-1]
            module = script[: -len(".py")].replace("/", ".")
            absolute = (
                "import " + bad.statement.removeprefix("from . import ")
                if bad.statement.startswith("from . import ")
                else bad.statement.replace("from .", "from ", 1)
            )
            fix = (
                f"run it as a module from the top (--train-command 'python -m {module}'), or import absolutely"
                if len(folders) >= bad.dots
                else f"import absolutely ('{absolute}': the script's folder is on the path)"
                if bad.dots == 1
                else "import absolutely"
            )
        elif bad.depth == 0:
            why = "it is imported as a top-level module, in no package"
            fix = "import absolutely, or import the module as part of its package (a folder with __init__.py)"
        else:
            why = f"it goes above the top package it is imported in ({bad.depth} package(s) deep)"
            fix = "import absolutely (from the code folder's top)"
        error = "with no known parent package" if bad.depth == 0 else "beyond top-level package"
        sure = bad.level == RUNS and (path == script or not found.adjusts_path)
        then = {
            RUNS: "every node fails" if sure else "the nodes fail, unless the job's sys.path imports it otherwise,",
            DEFERRED: "a node fails if the job calls the function that makes it",
            CONFIGURED: "a node fails if the job's config names it",
        }.get(bad.level, "a node fails")
        out.append(
            Finding(
                "imports",
                "fail" if sure else "warn",
                f"{ran} runs '{bad.statement}', a relative import, but {why}: {then} with 'ImportError: attempted "
                f"relative import {error}'",
                fix,
            )
        )
    return out


def _who_imports(script: str, missing: list[str], names: dict[str, Needed], level: int = RUNS) -> str:
    """The start of an imports finding: which file imports which of ``missing``, reached how from ``script``
    ("train.py imports wandb, which " / "models/net.py (train.py -> models/__init__.py -> models/net.py) imports
    timm, which "; a clause a file, the script's first), and at ``level`` how it is imported."""
    by_file: dict[str, list[str]] = {}
    for name in missing:
        by_file.setdefault(names[name].where, []).append(name)
    clauses = []
    for where, these in sorted(by_file.items(), key=lambda item: (item[0] != script, item[0])):
        via = names[these[0]].via
        clauses.append(f"{where}{_chain(via, where == script or via == (where,))} imports {', '.join(these)}")
    on_the_way = "" if set(by_file) == {script} else " (there, or on the way to it)"
    if level == OPTIONAL:
        guards = "try/except ImportError, an if asking whether it is installed, or a branch on the Python version"
        return f"{'; '.join(clauses)} only under {guards}{on_the_way}, and "
    if level == CONFIGURED:
        return f"{'; '.join(clauses)} only through a config file's {CONFIG_KEYS}{on_the_way}, and "
    if level == DEFERRED:
        return f"{'; '.join(clauses)} only in a function's body{on_the_way}, which runs when it is called, and "
    return f"{'; '.join(clauses)}, which " if len(clauses) == 1 else f"{'; '.join(clauses)}: what "


def _glue_findings(snapshot: Snapshot, argv: list[str], script: str) -> list[Finding]:
    """What the script's glue warns of: a srifty strategy nothing registers, a Fabric script (no Trainer)."""
    glue = command_glue(snapshot, argv)
    out = []
    if glue is not None and (unregistered := glue.unregistered_note(script)) is not None:
        out.append(Finding("imports", "warn", unregistered, f"add `import lightning_srifty` to {script}"))
    if glue is not None and glue.fabric_unguarded and (fabric := glue.fabric_note(script)) is not None:
        out.append(Finding("script", "warn", fabric, "wrap the loop in FabricPreemption (docs/launch.md)"))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# AWS: quotas, offerings, bucket, credentials
# ---------------------------------------------------------------------------------------------------------------------


def required_vcpus(groups: Iterable[Group], vcpus: Callable[[str], int]) -> dict[tuple[str, str], int]:
    """vCPUs the fleet needs per (quota class, market)."""
    need: dict[tuple[str, str], int] = {}
    for g in groups:
        cls = quota_class(g.instance_type)
        if g.on_demand:
            key = (_on_demand_key(cls), "on-demand")
            need[key] = need.get(key, 0) + g.on_demand * vcpus(g.instance_type)
        if g.spot:
            key = (cls, "spot")
            need[key] = need.get(key, 0) + g.spot * vcpus(g.instance_type)
    return need


def _quota_listing(client: Any) -> dict[str, dict[str, Any]]:
    """EC2's quotas by name; an entry without a name, a code or a numeric value >= 0 is left out (a quota server that
    answered a string was a traceback: such a quota is "not checked", as a missing one is)."""
    out = {}
    for page in client.get_paginator("list_service_quotas").paginate(ServiceCode="ec2"):
        for q in page.get("Quotas", []) if isinstance(page, dict) else ():
            value = q.get("Value") if isinstance(q, dict) else None
            if (
                isinstance(q, dict)
                and isinstance(q.get("QuotaName"), str)
                and isinstance(q.get("QuotaCode"), str)
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0
            ):
                out[q["QuotaName"]] = q
    return out


def _running_vcpus(ec2: Any, vcpus: Callable[[str], int]) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = {}
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for r in page.get("Reservations", []):
            for i in r.get("Instances", []):
                itype = i["InstanceType"]
                cpu = i.get("CpuOptions") or {}
                n = cpu.get("CoreCount", 0) * cpu.get("ThreadsPerCore", 0) or vcpus(itype)
                cls = quota_class(itype)
                key = (cls, "spot") if i.get("InstanceLifecycle") == "spot" else (_on_demand_key(cls), "on-demand")
                used[key] = used.get(key, 0) + n
    return used


def check_quotas(
    quotas: Any, ec2: Any, region: str, need: dict[tuple[str, str], int], vcpus: Callable
) -> list[Finding]:
    try:
        listing = _quota_listing(quotas)
    except Exception as exc:  # noqa: BLE001 - any failure: the check could not be made, say why
        return [
            Finding(
                "quota",
                "warn",
                f"the vCPU quotas could not be read ({why(exc)}): the apply may fail with VcpuLimitExceeded",
                "allow servicequotas:ListServiceQuotas, or check them in the Service Quotas console"
                if "AccessDenied" in why(exc)
                else "check the network (the Service Quotas endpoint could not be reached), or check them in the "
                "Service Quotas console"
                if aws_unreachable(exc)
                else "check them in the Service Quotas console (this endpoint does not serve EC2's quotas)",
            )
        ]
    used = _running_vcpus(ec2, vcpus)
    findings = []
    for (cls, market), vcpu in sorted(need.items()):
        names = (ON_DEMAND_QUOTA[cls],) if market == "on-demand" else SPOT_QUOTA[cls]
        quota = next((listing[n] for n in names if n in listing), None)
        if quota is None:
            findings.append(
                Finding("quota", "warn", f"no quota named {names[0]!r} in {region}'s listing: not checked", None)
            )
            continue
        limit, running = float(quota["Value"]), used.get((cls, market), 0)
        label = f"{quota['QuotaName']} ({quota['QuotaCode']})"
        if running + vcpu <= limit:
            findings.append(
                Finding("quota", "ok", f"{label}: {vcpu} vCPUs needed, {limit:g} allowed, {running} in use")
            )
            continue
        desired = math.ceil(running + vcpu)
        findings.append(
            Finding(
                "quota",
                "fail",
                f"{label}: the fleet needs {vcpu} vCPUs, the quota is {limit:g} with {running} in use",
                f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
                f"{quota['QuotaCode']} --desired-value {desired} --region {region}  (or srifty recommend "
                "--launchable for a fleet this account can start now)",
            )
        )
    return findings


def check_offerings(ec2: Any, region: str, types: list[str], zone: str | None) -> list[Finding]:
    try:
        zones = offered_zones(ec2, types, by_id=bool(zone and ZONE_ID.match(zone)))
    except Exception as exc:  # noqa: BLE001
        return [Finding("offering", "warn", f"the offerings could not be read ({why(exc)})", None)]
    nowhere = [t for t in types if not zones.get(t)]
    if nowhere:
        return [
            Finding(
                "offering",
                "fail",
                f"{', '.join(nowhere)} is offered in no availability zone of {region}",
                "choose another region (srifty recommend --region) or another entry of the plan (--choice)",
            )
        ]
    common = sorted(set.intersection(*(zones[t] for t in types)))
    if zone:
        absent = [t for t in types if zone not in zones[t]]
        if absent:
            return [
                Finding(
                    "offering",
                    "fail",
                    f"{', '.join(absent)} is not offered in {zone}, the fleet's subnet's zone",
                    f"srifty terraform --availability-zone {common[0]}" if common else "split the fleet by type",
                )
            ]
        return [Finding("offering", "ok", f"every type is offered in {zone}")]
    if not common:
        return [
            Finding(
                "offering",
                "warn",
                f"no zone of {region} offers every type of the fleet ({', '.join(types)}): give subnets in "
                "several zones (--vpc-id/--subnet-ids)",
                None,
            )
        ]
    return [Finding("offering", "ok", f"every type is offered in {', '.join(common)}")]


def _offerings(
    ec2: Any, region: str, types: list[str], zone: str | None, subnet_ids: list[str] | None, efa: bool
) -> list[Finding]:
    """The offering check of the fleet's network: the team's subnets', else the zone's (or the region's)."""
    if subnet_ids:
        return check_subnet_offerings(ec2, region, types, list(subnet_ids), efa)
    return check_offerings(ec2, region, types, zone)


def check_subnet_offerings(ec2: Any, region: str, types: list[str], subnet_ids: list[str], efa: bool) -> list[Finding]:
    """The offering check of a fleet in the team's own subnets: the subnets exist here, and each type is offered in
    the zone of one of them (an Auto Scaling group launches a type only in a subnet whose zone offers it; an EFA
    fleet runs in the first subnet alone, whose zone must offer every type). An infra team's subnet in a zone without
    the fleet's type passed as "offered in us-east-1a...f": on AWS the group would never launch while the apply
    reported success."""
    try:
        described = ec2.describe_subnets(SubnetIds=list(subnet_ids))["Subnets"]
    except Exception as exc:  # noqa: BLE001
        return [
            Finding(
                "offering",
                "fail",
                f"the subnets {', '.join(subnet_ids)} could not be read in {region} ({why(exc)})",
                "give subnets of the fleet's region (aws ec2 describe-subnets), or another --region",
            )
        ]
    zone_of = {s["SubnetId"]: s["AvailabilityZone"] for s in described}
    if efa:  # the module puts an EFA fleet in the first subnet only (EFA traffic does not cross subnets)
        return check_offerings(ec2, region, types, zone_of.get(subnet_ids[0]))
    try:
        zones = offered_zones(ec2, types)
    except Exception as exc:  # noqa: BLE001
        return [Finding("offering", "warn", f"the offerings could not be read ({why(exc)})", None)]
    mine = set(zone_of.values())
    absent = [t for t in types if not zones.get(t, set()) & mine]
    if absent:
        elsewhere = sorted(set().union(*(zones.get(t, set()) for t in absent)) - mine)
        return [
            Finding(
                "offering",
                "fail",
                f"{', '.join(absent)} is offered in none of the subnets' zones ({', '.join(sorted(mine))})",
                f"add a subnet in {', '.join(elsewhere)}" if elsewhere else "choose another entry of the plan",
            )
        ]
    return [Finding("offering", "ok", f"every type is offered in a zone of the subnets ({', '.join(sorted(mine))})")]


def default_image_parameters() -> dict[str, str]:
    """The module's default public SSM parameters of the Deep Learning AMI per architecture, read from its
    variables.tf (declared there once)."""

    text = (terraform_root() / "modules" / "training_fleet" / "variables.tf").read_text()
    return dict(re.findall(r'(x86_64|arm64)\s*=\s*"(/aws/service/[^"]+)"', text))


def image_parameters(ami: dict[str, Any]) -> dict[str, str]:
    """The SSM parameter naming each architecture's image, as the module reads it: the root's, else the default."""
    return {**default_image_parameters(), **(ami.get("ssm_parameters") or {})}


def check_machine_image(ec2: Any, ssm: Any, ami: dict[str, Any], arches: list[str]) -> list[Finding]:
    """The machine image the instances boot exists here: the AMI id given (and its architecture), else the SSM
    parameter of each architecture's Deep Learning AMI."""
    try:
        if ami.get("id"):
            images = ec2.describe_images(ImageIds=[ami["id"]])["Images"]
            arch = images[0].get("Architecture") if images else None
            if not images:
                raise LookupError(f"no image {ami['id']}")
            if arch not in arches:
                return [
                    Finding(
                        "image",
                        "fail",
                        f"the AMI {ami['id']} is {arch}, the fleet's types are {', '.join(arches)}",
                        "give an AMI of the fleet's architecture, or leave --ami out",
                    )
                ]
            return [Finding("image", "ok", f"the AMI {ami['id']} ({arch}) exists")]
        names = image_parameters(ami)
        for arch in arches:
            ssm.get_parameter(Name=names[arch])
    except Exception as exc:  # noqa: BLE001
        if aws_unreachable(exc):
            return [Finding("image", "warn", f"the image could not be looked up ({why(exc)})", None)]
        return [
            Finding(
                "image",
                "fail",
                f"the machine image cannot be found here ({why(exc)})",
                "give --ami with an image id of this region (and --setup-command true when it has Python 3 and the "
                "NVIDIA driver); an emulator such as moto has no Deep Learning AMI parameters",
            )
        ]
    return [Finding("image", "ok", f"the Deep Learning AMI of {', '.join(arches)} is published here")]


def check_torch_build(
    spec: dict[str, Any] | None, ami: dict[str, Any], gpus: list[tuple[str, str | None]]
) -> list[Finding]:
    """Whether the nodes can install a torch that runs: the profiled release in srifty's table of PyTorch's CUDA
    builds, and on the default image (its driver known) a published build of it for every GPU of the fleet. The
    user's own index or AMI: their driver and builds are theirs (an index: ok; an AMI: a warning)."""
    if spec is None:
        return []
    torch = next((p.split("==", 1)[1] for p in spec.get("packages", []) if p.startswith("torch==")), None)
    if spec.get("index_url") or spec.get("extra_index_urls"):
        return [Finding("torch", "ok", "torch comes from your package index (--index-url/--extra-index-url)")]
    if not spec.get("torch_cuda"):
        what = f"torch {torch} is not in srifty's table of PyTorch's CUDA builds" if torch else "torch is not pinned"
        return [
            Finding(
                "torch",
                "fail",
                f"{what}: the nodes would install the index's default build, whatever their driver and GPU",
                "srifty terraform again with --extra-index-url or --image, or upgrade lightning-srifty",
            )
        ]
    if ami.get("id"):
        return [
            Finding(
                "torch",
                "warn",
                f"torch {torch}: the AMI {ami['id']} is yours and its NVIDIA driver unknown here; each node picks a "
                "build for its driver and GPU at boot and stops (exit 6) if none runs",
                None,
            )
        ]
    stop = cuda.image_note(spec, None, gpus)
    if stop:
        return [
            Finding(
                "torch",
                "fail",
                stop,
                "choose a fleet of another GPU, an image with a newer driver (--ami), or a torch with a build for it",
            )
        ]
    name, driver = cuda.default_image()
    where = f"on {name} (NVIDIA driver {driver})"
    return [Finding("torch", "ok", f"torch {torch} has a build for every GPU of the fleet {where}")]


def check_bucket_answers(
    s3: Any, bucket: str | None, endpoint: str | None = None, uploads: bool = False
) -> list[Finding]:
    refused = plain_http_upload(bucket, endpoint, uploads)
    if refused:
        return [Finding("bucket", "warn", refused, f"srifty terraform again: {PLAIN_HTTP_FIX}")]
    if not bucket:
        return [Finding("bucket", "ok", "the module creates the checkpoint bucket")]
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001
        return [
            Finding(
                "bucket",
                "fail",
                f"the checkpoint bucket {bucket} does not answer ({why(exc)})",
                "create it, fix its name (--bucket), or leave --bucket out to have the module create one",
            )
        ]
    return [Finding("bucket", "ok", f"the checkpoint bucket {bucket} answers")]


DATA_LIST_BOUND_S = 10.0  # how long srifty check lists a folder to copy for its size
DLAMI_ROOT_GB = 80  # what the Deep Learning AMI and the node's environment take of the root volume (it needs >= 75)


def data_room_gb(groups: Iterable[dict[str, Any]], root_volume_gb: float, catalog: Any) -> float:
    """The disk the nodes copy data to, in GB, on the smallest node: its instance store (95 % usable; the boot
    copies there when it is mounted at /opt/dlami/nvme, as on the Deep Learning AMIs users run, and falls back to the
    root volume otherwise, which this estimate then overstates), else the root volume less :data:`DLAMI_ROOT_GB`."""
    rooms = []
    for g in groups:
        nvme = catalog.get(g["instance_type"]).local_nvme_gb if g["instance_type"] in catalog else 0.0
        rooms.append(nvme * 0.95 if nvme > 0 else root_volume_gb - DLAMI_ROOT_GB)
    return min(rooms) if rooms else root_volume_gb - DLAMI_ROOT_GB


def check_data_folders(
    s3: Any, data: list[dict[str, Any]], room_gb: float, clock: Callable[[], float] = time.monotonic
) -> list[Finding]:
    """Each data folder answers with an object; the copied ones fit in ``room_gb`` (see the module docstring)."""
    findings: list[Finding] = []
    copied_gb, whole = 0.0, True
    for entry in data:
        name, uri = entry["name"], entry["uri"]
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        try:
            first = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except Exception as exc:  # noqa: BLE001
            denied = "AccessDenied" in str(exc)
            findings.append(_data_unread(name, uri, exc, denied))
            continue
        if not first.get("KeyCount"):
            fix = f"is the folder right? (aws s3 ls {uri}: the nodes would stop at boot, finding nothing to train on)"
            findings.append(Finding("data", "fail", f"{name}: no objects under {uri}", fix))
            continue
        if not entry.get("copy"):
            findings.append(Finding("data", "ok", f"{name}: {uri} answers (the job reads it from S3)"))
            continue
        size, count, done = _folder_size(s3, bucket, prefix, clock)
        copied_gb += size / 1e9
        whole = whole and done
        findings.append(
            Finding("data", "ok", f"{name}: {'' if done else 'at least '}{size / 1e9:,.1f} GB in {count:,} objects")
        )
    if copied_gb > room_gb:
        findings.append(
            Finding(
                "data",
                "fail",
                f"the copied folders hold {'at least ' if not whole else ''}{copied_gb:,.1f} GB, more than the "
                f"{room_gb:,.0f} GB the nodes have for them",
                "a larger root volume (srifty terraform --root-volume-gb), a type with more instance store, or read "
                "the folder from S3 (--data) instead of copying it",
            )
        )
    return findings


def _data_unread(name: str, uri: str, exc: Exception, denied: bool) -> Finding:
    if denied:  # the operator's credentials, not the nodes' role: which is granted the folder by the module
        return Finding("data", "warn", f"{name}: your credentials may not list {uri} ({why(exc)}): not checked", None)
    return Finding(
        "data",
        "fail",
        f"{name}: {uri} does not answer ({why(exc)})",
        "check the bucket's name, and that it exists (a bucket of another account must grant the nodes' role)",
    )


def _folder_size(s3: Any, bucket: str, prefix: str, clock: Callable[[], float]) -> tuple[int, int, bool]:
    """(bytes, objects, whether the listing finished) under the folder, listed for at most DATA_LIST_BOUND_S."""
    size = count = 0
    until = clock() + DATA_LIST_BOUND_S
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            size += obj["Size"]
            count += 1
        if clock() > until:
            return size, count, not page.get("IsTruncated")
    return size, count, True


def check_volume_key(
    aws: dict[str, Any],
    region: str,
    mode: str,
    key: str | None,
    identity: dict[str, Any] | None = None,
    ami: dict[str, Any] | None = None,
    arches: Iterable[str] = (),
) -> list[Finding]:
    """An Auto Scaling group's launches may use every KMS key they encrypt or restore a volume with: the root's
    ``checkpoints.kms_key_arn`` (``key``), else the account's default key for EBS encryption, and the keys of the
    image's encrypted snapshots, as EC2 restores them (:func:`~lightning_srifty.provision.aws.launch_volume_keys`; the
    rule: :func:`~lightning_srifty.provision.aws.volume_key_verdict`); one finding a key. ``identity``: the caller's,
    as :func:`check_credentials` read it (None: read here); ``ami``, ``arches``: the images the fleet boots (None: not
    read, the root volumes judged as restored from an unencrypted snapshot)."""
    if mode != "asg":
        return []  # an instant EC2 Fleet launches with terraform's own credentials, not a service-linked role
    try:
        who = identity or aws["sts"].get_caller_identity()
        partition, account = who["Arn"].split(":")[1], who["Account"]
    except Exception as exc:  # noqa: BLE001
        return [Finding("volumes", "warn", f"the account could not be read ({why(exc)}): the keys not checked", None)]
    uses, findings, unread = _launch_key_uses(aws, key, ami, list(arches), account)
    if any(u.key is None and u.unread is None for u in uses):  # the account's default key: read once, one finding
        try:
            default = aws["ec2"].get_ebs_default_kms_key_id().get("KmsKeyId") or "alias/aws/ebs"
        except Exception as exc:  # noqa: BLE001 - any failure: not checked, said with the rule
            said = f"{DEFAULT_KEY_WORDS} could not be read ({why(exc)}): not checked"
            findings.append(Finding("volumes", "warn", said, _key_rule()))
            default = None
        uses = merge_key_uses(
            dataclasses.replace(u, key=default) if u.key is None and u.unread is None else u
            for u in uses
            if default or u.key or u.unread
        )
    role = autoscaling_role_arn(partition, account)
    return findings + [_judge_key_use(aws, use, role, account, region, unread) for use in uses]


def _launch_key_uses(
    aws: dict[str, Any], key: str | None, ami: dict[str, Any] | None, arches: list[str], account: str
) -> tuple[list[KeyUse], list[Finding], dict[str, str]]:
    """The keys the launches use, of the images the fleet boots; a warning for what could not be read (an image
    unread: its root volumes judged as restored from an unencrypted snapshot, as before any image is given); why each
    snapshot that could not be read was not (one at a time: a snapshot shared with its image is seldom readable)."""
    assumed = [KeyUse(key, "the root volumes are encrypted with", LAUNCH_KEY_WORDS if key else DEFAULT_KEY_WORDS,
                      *NEW_VOLUME)]  # fmt: skip
    if ami is None or not arches:
        return assumed, [], {}
    try:
        if ami.get("id"):
            ids = [ami["id"]]
        else:
            names = image_parameters(ami)
            ids = sorted({aws["ssm"].get_parameter(Name=names[a])["Parameter"]["Value"] for a in arches})
        images = aws["ec2"].describe_images(ImageIds=ids)["Images"]
    except Exception as exc:  # noqa: BLE001
        said = f"the image could not be read ({why(exc)}): the keys of its snapshots not checked"
        return assumed, [Finding("volumes", "warn", said, None)], {}
    volumes = [(i, m) for i in images for m in i.get("BlockDeviceMappings") or [] if m.get("Ebs")]
    ebs = [m["Ebs"] for _, m in volumes]
    notes, snapshots, unread = [], {}, {}
    for sid in sorted({e["SnapshotId"] for e in ebs if e.get("SnapshotId") and e.get("Encrypted") is not False}):
        try:
            snapshots.update(
                {s["SnapshotId"]: s for s in aws["ec2"].describe_snapshots(SnapshotIds=[sid])["Snapshots"]}
            )
        except Exception as exc:  # noqa: BLE001
            unread[sid] = why(exc)
        if sid not in snapshots:
            unread.setdefault(sid, "not listed")
    by_default = False  # read only for an image with other volumes not restored under a key of their own
    if any(
        m.get("DeviceName") != i.get("RootDeviceName")
        and not snapshots.get(m["Ebs"].get("SnapshotId") or "", {}).get("Encrypted")
        for i, m in volumes
    ):
        try:
            by_default = bool(aws["ec2"].get_ebs_encryption_by_default().get("EbsEncryptionByDefault"))
        except Exception as exc:  # noqa: BLE001
            said = f"whether EBS encryption by default is on could not be read ({why(exc)}): the image's other volumes"
            notes.append(Finding("volumes", "warn", f"{said} not checked", None))
    return launch_volume_keys(key, images, snapshots, account, by_default), notes, unread


def _judge_key_use(
    aws: dict[str, Any], use: KeyUse, role: str, account: str, region: str, unread: dict[str, str]
) -> Finding:
    """One key's finding: whether the key's policy or a grant lets the Auto Scaling role do what ``use`` needs, and
    what it may also ask (a lack of which is a warning)."""
    if use.unread is not None:
        words = f"{use.what} {use.whose}, whose key could not be read here ({unread.get(use.unread, 'unread')})"
        fix = f"aws ec2 describe-snapshots --snapshot-ids {use.unread}, in the account that owns it, names the key; "
        words += ": whether Auto Scaling's service-linked role may use it could not be told"
        return Finding("volumes", "warn", words, fix + _key_rule("<that key's ARN>", role, region))
    found = _usable_key(aws, use)
    if isinstance(found, Finding):
        return found
    operations = (*use.needs, *use.may)
    answers = grants = None
    try:
        policy = aws["kms"].get_key_policy(KeyId=found, PolicyName="default")["Policy"]
        answers = key_policy_answers(policy, role, account, region, found, operations)
    except Exception:  # noqa: BLE001 - unread (another account's key, a caller not let read it): grants may still say
        pass
    try:
        pages = aws["kms"].get_paginator("list_grants").paginate(KeyId=found)
        grants = granted_operations([g for page in pages for g in page["Grants"]], role, operations)
    except Exception:  # noqa: BLE001
        pass
    said, may = volume_key_verdict(answers, grants, use.needs), volume_key_verdict(answers, grants, use.may)
    what, fix = f"{use.what} {use.whose}, {found}", _key_rule(found, role, region)
    if said.answer == "allowed" and may.answer == "allowed":
        return Finding("volumes", "ok", f"{what}; {said.how} lets Auto Scaling's service-linked role use it")
    if said.answer == "allowed":
        return Finding("volumes", "warn", f"{what}; {said.how} lets Auto Scaling's service-linked role do what EBS is "
                       f"documented to ask, but not {', '.join(may.lacking)}, which the page's statements grant and "
                       "this use of the key may ask: whether every launch succeeds could not be told", fix)  # fmt: skip
    if said.answer == "unknown":
        return Finding("volumes", "warn", f"{what}; whether Auto Scaling's service-linked role may use it could not be "
                       "told", fix)  # fmt: skip
    verb = "denies" if said.answer == "denied" else "neither its policy nor a grant allows"
    what += f", and {verb} Auto Scaling's service-linked role {', '.join(said.lacking)}: every launch would fail"
    return Finding("volumes", "fail", what, fix)


def _usable_key(aws: dict[str, Any], use: KeyUse) -> str | Finding:
    """The key's ARN to judge by its policy and grants, or the finding: the AWS managed key for EBS (``aws/ebs``:
    "Amazon EC2 Auto Scaling does not need additional authorization" for it, the page says), a key EBS cannot use
    (disabled, pending deletion, asymmetric: a launch under it fails whoever may use it), or unread."""
    key_id = use.key or "alias/aws/ebs"
    aws_ebs = Finding("volumes", "ok", f"{use.what} the AWS managed key aws/ebs: Auto Scaling needs no grant")
    if key_id.rsplit(":", 1)[-1] == "alias/aws/ebs":
        return aws_ebs
    try:
        described = aws["kms"].describe_key(KeyId=key_id)["KeyMetadata"]
        arn = described.get("Arn") or key_id
        if described.get("KeyManager") == "AWS":
            aliases = aws["kms"].list_aliases(KeyId=described.get("KeyId") or key_id).get("Aliases", [])
            if any(a.get("AliasName") == "alias/aws/ebs" for a in aliases):
                return aws_ebs
    except Exception as exc:  # noqa: BLE001
        return Finding(
            "volumes", "warn", f"{use.whose}, {key_id}, could not be described ({why(exc)}): not checked", _key_rule()
        )
    state, spec = described.get("KeyState", "Enabled"), described.get("KeySpec", "SYMMETRIC_DEFAULT")
    if state != "Enabled" or spec != "SYMMETRIC_DEFAULT":
        why_not = f"is {state}" if state != "Enabled" else f"is {spec}: EBS takes symmetric keys only"
        said = f"{use.what} {use.whose}, {arn}, which {why_not}: every launch fails"
        return Finding(
            "volumes", "fail", said,
            "enable the key (aws kms enable-key; cancel-key-deletion first if it is pending deletion), or encrypt with "
            "another (checkpoints.kms_key_arn; aws ec2 modify-ebs-default-kms-key-id for the account's default)",
        )  # fmt: skip
    return arn


def _key_rule(key_id: str | None = None, role: str | None = None, region: str | None = None) -> str:
    """The rule and, for a key, its fix: the AWS page's key policy statements, or a grant made from this account."""
    rule = (
        "an Auto Scaling group launches with its service-linked role, which may use no customer managed key unless the "
        f"key lets it ({KEY_POLICY_PAGE})"
    )
    if key_id is None:
        return f"{rule}: aws ec2 get-ebs-default-kms-key-id names the key the volumes get"
    return (
        f"{rule}: add that page's two statements, principal {role}, to the key's policy, or grant it from this "
        f"account: aws kms create-grant --region {region} --key-id {key_id} --grantee-principal {role} --operations "
        f"{GRANT_OPERATIONS} (a new account creates the role first: aws iam create-service-linked-role "
        "--aws-service-name autoscaling.amazonaws.com)"
    )


def check_credentials(sts: Any, seen: dict[str, Any] | None = None) -> list[Finding]:
    """``sts get-caller-identity``; what it answered goes into ``seen`` (for the checks after it)."""
    try:
        who = sts.get_caller_identity()
        if seen is not None:
            seen.update(who)
    except Exception as exc:  # noqa: BLE001
        if aws_unreachable(exc):
            return [
                Finding(
                    "credentials",
                    "fail",
                    f"AWS could not be reached ({why(exc)})",
                    "check the network (a proxy, a VPN, AWS_ENDPOINT_URL), then try again",
                )
            ]
        return [
            Finding(
                "credentials",
                "fail",
                f"the AWS credentials do not work ({why(exc)})",
                aws_words(exc) or "aws configure (or AWS_PROFILE / AWS_ACCESS_KEY_ID), then try again",
            )
        ]
    return [Finding("credentials", "ok", f"account {who.get('Account')} as {who.get('Arn')}")]


# ---------------------------------------------------------------------------------------------------------------------
# The whole pre-flight
# ---------------------------------------------------------------------------------------------------------------------


def preflight(
    *,
    region: str,
    groups: list[Group],
    vcpus: Callable[[str], int],
    bucket: str | None = None,
    zone: str | None = None,
    snapshot: Snapshot | None = None,
    argv: list[str] | None = None,
    setup_command: str | None = None,
    image: str | None = None,
    ami: dict[str, Any] | None = None,
    arches: list[str] | None = None,
    aws: dict[str, Any] | None = None,
    endpoint: str | None = None,
    gpus: list[tuple[str, str | None]] | None = None,
    tls_only: bool = True,
    model: str | None = None,
    project: Path | None = None,
    data: list[dict[str, Any]] | None = None,
    data_room_gb: float = math.inf,
    mode: str = "asg",
    volume_kms_key: str | None = None,
    subnet_ids: list[str] | None = None,
    efa: bool = False,
) -> Report:
    """Every check of the module docstring; ``aws``: clients (default :func:`clients` of ``region``); ``endpoint``:
    the root's AWS endpoint (an emulator's), for what its scheme means to the upload; ``setup_command`` and
    ``image``: what the nodes run before the script and the container it runs in (either may provide what the
    script imports)."""
    started = time.perf_counter()
    findings: list[Finding] = check_model(model, snapshot, project or Path.cwd())
    if snapshot is not None and argv:
        findings += check_imports(snapshot, argv, setup_command, image)
    if snapshot is not None:
        findings += check_torch_build(json.loads(read_member(snapshot, ENVIRONMENT_FILE)), ami or {}, gpus or [])
    aws = aws or clients(region)
    identity: dict[str, Any] = {}
    credentials = check_credentials(aws["sts"], identity)
    findings += credentials
    need = required_vcpus(groups, vcpus)
    if credentials[0].status == "fail":  # every other call would fail the same way: one cause, said once (#37 L)
        skipped = ["quota", "offering", *(["image"] if ami is not None and arches else []), "bucket"]
        skipped += ["data"] if data else []
        skipped += ["volumes"] if mode == "asg" else []
        findings += [Finding(c, "warn", "not checked: no working AWS credentials (above)") for c in skipped]
        return Report(tuple(findings), time.perf_counter() - started, region, zone, {"need_vcpus": need})
    findings += check_quotas(aws["quotas"], aws["ec2"], region, need, vcpus)
    findings += _offerings(aws["ec2"], region, sorted({g.instance_type for g in groups}), zone, subnet_ids, efa)
    if ami is not None and arches:
        findings += check_machine_image(aws["ec2"], aws["ssm"], ami, arches)
    findings += check_bucket_answers(aws["s3"], bucket, endpoint, uploads=tls_only)  # the boot scripts always upload
    if data:
        findings += check_data_folders(aws["s3"], data, data_room_gb)
    image_read = not any(f.check == "image" and f.status == "fail" for f in findings)  # else said there, once
    findings += check_volume_key(aws, region, mode, volume_kms_key, identity, ami if image_read else None, arches or [])
    return Report(tuple(findings), time.perf_counter() - started, region, zone, {"need_vcpus": need})


def preflight_root(folder: str | Path, catalog: Any = None, aws: dict[str, Any] | None = None) -> Report:
    """The pre-flight of a root module ``srifty terraform`` wrote: its values, its code snapshot.

    Raises:
        ProvisionError: ``folder`` is not such a root module.
    """

    root = Path(folder)
    if not (root / TFVARS).is_file() or not (root / MARKER).is_file():
        raise ProvisionError(
            f"{root} is not a root module written by `srifty terraform` (no {TFVARS}). Write one with "
            "`srifty terraform --plan plan.json --out DIR`, then `srifty check --dir DIR`."
        )
    values = json.loads((root / TFVARS).read_text())
    code = values["train"].get("code")
    snapshot = load_snapshot(root / code["source"]) if code else None
    groups = [Group(g["instance_type"], g["on_demand"], g["spot"]) for g in values["groups"]]
    if catalog is None:
        catalog = Catalog.load()
    endpoint = values.get("aws_endpoint")
    return preflight(
        region=values["region"],
        groups=groups,
        vcpus=lambda t: catalog.get(t).vcpus,
        bucket=values["checkpoints"].get("bucket"),
        tls_only=values["checkpoints"].get("tls_only", True),
        model=(values.get("tags") or {}).get("srifty:model"),
        zone=values["network"].get("availability_zone") or values["network"].get("availability_zone_id"),
        snapshot=snapshot,
        argv=values["train"]["argv"],
        setup_command=values["train"].get("setup_command"),
        image=values["train"].get("image"),
        ami=values.get("ami") or {},
        arches=sorted({g.get("arch", "x86_64") for g in values["groups"]}),
        aws=aws or clients(values["region"], endpoint),
        endpoint=endpoint,
        data=values.get("data") or [],
        data_room_gb=data_room_gb(values["groups"], values.get("root_volume_gb", 200), catalog),
        mode=(values.get("capacity") or {}).get("mode", "asg"),
        volume_kms_key=values["checkpoints"].get("kms_key_arn"),
        subnet_ids=[] if values["network"].get("create_vpc") else values["network"].get("subnet_ids") or [],
        efa=any(g.get("efa") for g in values["groups"]),
        gpus=cuda.fleet_gpus(
            [
                (g["instance_type"], catalog.get(g["instance_type"]).gpu if g["instance_type"] in catalog else None)
                for g in values["groups"]
            ],
            catalog,
        ),
    )


# ---------------------------------------------------------------------------------------------------------------------
# What this account can start now: srifty recommend --launchable
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccountLimits:
    """One region's vCPU headroom per (quota class, market) (None: the quotas could not be read) and the types offered
    in some zone of it."""

    region: str
    headroom: dict[tuple[str, str], float] | None
    offered: frozenset[str]
    codes: dict[tuple[str, str], tuple[str, str, float]]  # (class, market) -> (quota name, code, limit)


def account_limits(region: str, types: list[str], vcpus: Callable[[str], int], aws: dict[str, Any]) -> AccountLimits:
    """Read ``region``'s quotas, what runs there, and which of ``types`` it offers.

    Raises:
        ProvisionError: AWS cannot be reached or refuses the credentials (naming the fix).
    """

    try:
        offered = frozenset(t for t, zones in offered_zones(aws["ec2"], types).items() if zones)
    except Exception as exc:  # noqa: BLE001 - every botocore failure becomes one line with its fix
        fix = (
            "check the network (a proxy, a VPN, AWS_ENDPOINT_URL)"
            if aws_unreachable(exc)
            else "set AWS credentials (aws configure, AWS_PROFILE)"
        )
        raise ProvisionError(
            f"--launchable needs to read this account's EC2 offerings and quotas in {region}, and could not "
            f"({why(exc)}): {fix}, or rank without --launchable."
        ) from None
    try:
        listing = _quota_listing(aws["quotas"])
    except Exception:  # noqa: BLE001 - unknown quotas: every fleet stays, the plan says so
        return AccountLimits(region, None, offered, {})
    used = _running_vcpus(aws["ec2"], vcpus)
    headroom, codes = {}, {}
    for cls, name in ON_DEMAND_QUOTA.items():
        if name in listing:
            q = listing[name]
            headroom[(cls, "on-demand")] = float(q["Value"]) - used.get((cls, "on-demand"), 0)
            codes[(cls, "on-demand")] = (name, q["QuotaCode"], float(q["Value"]))
    for cls, names in SPOT_QUOTA.items():
        found = next((listing[n] for n in names if n in listing), None)
        if found is not None:
            headroom[(cls, "spot")] = float(found["Value"]) - used.get((cls, "spot"), 0)
            codes[(cls, "spot")] = (found["QuotaName"], found["QuotaCode"], float(found["Value"]))
    return AccountLimits(region, headroom, offered, codes)


def blockers(entry: Any, limits: AccountLimits, vcpus: Callable[[str], int]) -> list[str]:
    """Why this account cannot start the plan entry now (empty: it can, as far as quotas and offerings tell)."""
    out = [
        f"{g.instance_type} is not offered in {limits.region}"
        for g in entry.groups
        if g.instance_type not in limits.offered
    ]
    if limits.headroom is None:
        return out
    groups = [Group(g.instance_type, g.on_demand, g.spot) for g in entry.groups]
    for key, need in sorted(required_vcpus(groups, vcpus).items()):
        room = limits.headroom.get(key)
        if room is not None and need > room:
            name, code, limit = limits.codes[key]
            used = limit - room
            out.append(
                f"{name} ({code}) {limit:g} vCPUs with {used:g} in use, {need} needed: request "
                f"--quota-code {code} --desired-value {math.ceil(used + need)}"
            )
    return out


def launchable_plan(plan: Any, limits: dict[str, AccountLimits], vcpus: Callable[[str], int], top: int) -> Any:
    """``plan`` with only the fleets this account can start now (at most ``top``), and a note of what a quota
    increase would buy: the best fleet left out, its time and cost next to the best launchable one.

    Raises:
        ConfigError: none of the ranked fleets can start now (naming what the best one needs).
    """

    why = {id(e): blockers(e, limits[e.region], vcpus) for e in [*plan.entries, *plan.pareto]}
    entries = [e for e in plan.entries if not why[id(e)]][:top]
    unknown = sorted(r for r, lim in limits.items() if lim.headroom is None)
    if not entries:
        best = plan.entries[0]
        raise ConfigError.between(
            "None of the {count} ranked fleets can start in this account now; the best, {fleet} ({bought}, "
            "{region}), needs: {needs}. File the quota request (aws service-quotas request-service-quota-increase "
            "--service-code ec2 ... --region {region}), or widen {allow} / {regions}.",
            parameter="launchable",
            value=best.fleet,
            count=len(plan.entries),
            fleet=best.fleet,
            bought=best.market,
            region=best.region,
            needs="; ".join(why[id(best)]),
        )
    notes = list(plan.notes or [])
    left_out = [e for e in plan.entries if why[id(e)]]
    first = entries[0]
    line = (
        f"--launchable: {len(plan.entries) - len(left_out)} of the {len(plan.entries)} ranked fleets can start in "
        "this account now"
    )
    if left_out and left_out[0] is plan.entries[0]:
        best = left_out[0]
        line += (
            f"; a quota increase would buy {best.fleet} ({best.market}): {best.time_h:.2f} h and ${best.cost_usd:,.2f} "
            f"against {first.fleet}'s {first.time_h:.2f} h and ${first.cost_usd:,.2f} ({'; '.join(why[id(best)])})"
        )
    if unknown:
        line += f"; quotas unread in {', '.join(unknown)}: fleets there were kept"
    notes.append(line)
    pareto = [e for e in plan.pareto if not why[id(e)]]
    reason = plan.why
    if entries[0] is not plan.entries[0]:
        reason = f"{plan.why} The best fleet this account can start now is {first.fleet} ({first.market})."
    return dataclasses.replace(
        plan, entries=tuple(entries), pareto=tuple(pareto), chosen=0, notes=tuple(notes), why=reason
    )
