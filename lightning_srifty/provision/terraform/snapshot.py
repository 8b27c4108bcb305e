"""The user's code and the profiled environment, as one content-addressed archive every node fetches and checks.

``srifty terraform`` (and ``srifty launch``) pack the working directory into ``code/<sha256>.tar.gz`` inside the
root module it writes; Terraform uploads it to the run's S3 prefix (``aws_s3_object``) and every node downloads it,
checks the sha256 baked into its user_data, unpacks it and runs torchrun from it:

    <sha256>.tar.gz
      train.py, pkg/..., requirements.txt      the working directory: git's view of it (tracked + untracked, not
                                               ignored) in a git work tree; else every file not matched by
                                               .gitignore / .sriftyignore
      .srifty/environment.json                 what the node installs (torch, lightning at the profiled versions,
                                               this lightning-srifty, the user's requirements file, the index)
      .srifty/wheels/lightning_srifty-*.whl    this installation of lightning-srifty, repacked as a wheel

The archive is reproducible: the same files give the same bytes (sorted members, no times, no owners, modes
normalised, gzip without a time stamp), so its sha256 names the code exactly and an unchanged directory re-uploads
nothing. It is bounded in size; what makes it too big is named.
"""

from __future__ import annotations

import base64
import fnmatch
import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import re
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import lightning_srifty
import predictor
from lightning_srifty.provision.terraform import cuda
from predictor.catalog import torch_builds
from predictor.documents.atomic import atomic_write_bytes
from predictor.exceptions import ConfigError

DEFAULT_MAX_MB = 200.0  # uncompressed; datasets belong in S3, not in the code snapshot
ALWAYS_LEFT_OUT = (".git", "__pycache__", ".terraform", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".ruff_cache")
# folders of the project's top level that hold run outputs, never code: srifty's own (profiles, reports, a local
# launch's checkpoints) and Lightning's default logs and checkpoints
OUTPUT_FOLDERS = ("srifty", "lightning_logs")
LEFT_OUT_SUFFIXES = (".pyc", ".tfstate", ".tfstate.backup")
IGNORE_FILES = (".gitignore", ".sriftyignore")
# files that hold credentials, left out of every snapshot unless named with --include-secret (issue #35 M2): an
# untracked .env went to S3 and into the root module folder a team may commit. Names (exact), name patterns, folders
SECRET_NAMES = (
    ".env", ".netrc", "_netrc", ".pypirc", ".npmrc", ".git-credentials", ".htpasswd", "credentials",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519",
)  # fmt: skip
SECRET_PATTERNS = ("*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", ".env.*")
SECRET_KEPT = (".example", ".sample", ".template", ".dist")  # .env.example names variables, not values
SECRET_FOLDERS = (".aws", ".ssh", ".gnupg", ".docker", ".kube", ".azure")
SRIFTY_DIR = ".srifty"
GENERATED_MARKER = ".srifty.json"  # provision.generate.MARKER: a folder srifty terraform wrote
ENVIRONMENT_FILE = f"{SRIFTY_DIR}/environment.json"
ENVIRONMENT_SCHEMA = "srifty.environment/v1"


@dataclass(frozen=True)
class Snapshot:
    path: Path  # the archive, named <sha256>.tar.gz
    sha256: str
    files: tuple[str, ...]  # the working directory's files in it (relative, POSIX)
    bytes_in: int  # their size, uncompressed
    bytes_out: int  # the archive's size
    source: str  # "git" or "walk"
    secrets_left_out: tuple[str, ...] = ()  # credential files the snapshot left out (SECRET_*; --include-secret)
    uncommitted: tuple[str, ...] = ()  # files in it that git has as untracked or changed since the last commit
    secrets_inside: tuple[str, ...] = ()  # "path:line (what)" of packed text that reads as a credential (scan_secrets)


def is_secret(rel: str) -> bool:
    """Whether ``rel`` (a POSIX path inside the code folder) looks like a credential file: SECRET_NAMES,
    SECRET_PATTERNS (less SECRET_KEPT's examples) or anything under a SECRET_FOLDERS folder."""
    parts = PurePosixPath(rel).parts
    name = parts[-1]
    if any(p in SECRET_FOLDERS for p in parts[:-1]) or name in SECRET_NAMES:
        return True
    if name.endswith(SECRET_KEPT):
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_PATTERNS)


# what a credential's value reads as inside a packed file (an infra team's env.sh exporting AWS_SECRET_ACCESS_KEY was
# packed: the archive goes to S3, to every node and into the root module's code/ folder). AWS's access key IDs are
# AKIA (long-term) or ASIA (temporary) and 16 base-32 characters, a secret key 40 characters beside its name
# (https://docs.aws.amazon.com/IAM/latest/UserGuide/security-creds.html); a PEM private key has its BEGIN line
CREDENTIAL_VALUES = (
    ("an AWS access key ID", re.compile(r"\b(AKIA|ASIA)[A-Z2-7]{16}\b")),
    ("an AWS secret access key", re.compile(r"(?i)aws_secret_access_key\W{0,3}[=:]\s*[\"']?[A-Za-z0-9/+]{40}\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
)
AWS_EXAMPLES = ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")  # AWS's documentation's own
SCAN_MAX_BYTES = 2**20  # larger files (data, weights) are not read for it


def scan_secrets(root: Path, files: list[str]) -> list[str]:
    """``path:line (what)`` for each packed text file (at most :data:`SCAN_MAX_BYTES`) whose line reads as a
    credential's value (:data:`CREDENTIAL_VALUES`; AWS's documented example keys excepted), the first a file."""
    found = []
    for rel in files:
        path = root / rel
        try:
            if path.stat().st_size > SCAN_MAX_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:8192]:  # binary
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            what = next((w for w, rx in CREDENTIAL_VALUES if rx.search(line)), None)
            if what and not any(example in line for example in AWS_EXAMPLES):
                found.append(f"{rel}:{number} ({what})")
                break
    return found


def uncommitted_files(root: Path, files: list[str]) -> list[str]:
    """Of ``files``, those git reports as untracked or changed against HEAD (``git status --porcelain``); [] outside
    a git work tree."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "-z", "--untracked-files=all", "--", "."],
            capture_output=True,
            timeout=120,
            check=True,
        ).stdout.decode("utf-8", "surrogateescape")
        prefix = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-prefix"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    changed = set()
    for entry in out.split("\0"):
        if len(entry) > 3 and entry[2] == " ":
            path = entry[3:]
            changed.add(path[len(prefix) :] if prefix and path.startswith(prefix) else path)
    return [rel for rel in files if rel in changed]


def code_files(workdir: Path, leave_out: tuple[Path, ...] = ()) -> tuple[list[str], str]:
    """The files of ``workdir`` the snapshot carries and how they were chosen ("git" or "walk").

    In a git work tree: what ``git ls-files --cached --others --exclude-standard`` lists (git's own reading of every
    .gitignore, .git/info/exclude and the global excludes), less deleted files. Elsewhere: a walk that leaves out
    what the top-level .gitignore and .sriftyignore match (gitignore patterns). Both leave out ALWAYS_LEFT_OUT
    folders, LEFT_OUT_SUFFIXES, symlinks that lead outside ``workdir``, ``leave_out`` (the root module being
    written, when it lies inside), the root modules srifty terraform wrote, and the folders a ``srifty launch``
    wrote (``--workdir``: its move log and its checkpoints).
    """
    root = workdir.resolve()
    skip = tuple(p.resolve() for p in leave_out)
    listed = _git_files(root)
    source = "git" if listed is not None else "walk"
    if listed is None:
        listed = _walked_files(root)
    files = []
    for rel in sorted(set(listed)):
        parts = PurePosixPath(rel).parts
        if any(p in ALWAYS_LEFT_OUT for p in parts[:-1]) or rel.endswith(LEFT_OUT_SUFFIXES):
            continue
        if len(parts) > 1 and parts[0] in OUTPUT_FOLDERS:
            continue
        path = root / rel
        resolved = path.resolve()
        if not path.is_file() or (resolved != root and root not in resolved.parents):
            continue  # deleted, a folder (a submodule), or a link out of the directory
        if any(resolved == s or s in resolved.parents for s in skip) or _in_generated_root(root, parts):
            continue
        if _in_launch_output(root, parts):
            continue
        files.append(rel)
    return files, source


def _in_generated_root(root: Path, parts: tuple[str, ...]) -> bool:
    """Whether a file lies in a root module ``srifty terraform`` wrote (its marker file beside it or above): those
    hold code archives and Terraform state, never the job's code."""
    return any((root.joinpath(*parts[:i]) / GENERATED_MARKER).is_file() for i in range(len(parts)))


# what a `srifty launch --workdir FOLDER` leaves in its folder (the move log; the checkpoint folder's heartbeat): run
# output, never code (a trial's archive carried 12.6 MiB of a local launch's checkpoints)
LAUNCH_OUTPUT_MARKERS = ("migrations.jsonl", "HEARTBEAT.json")


def _in_launch_output(root: Path, parts: tuple[str, ...]) -> bool:
    """Whether a file lies in a folder below ``root`` that a ``srifty launch`` wrote (its move log or its checkpoint
    folder's heartbeat in it or above; ``root`` itself is the project, whatever it holds)."""
    return any((root.joinpath(*parts[:i]) / m).is_file() for i in range(1, len(parts)) for m in LAUNCH_OUTPUT_MARKERS)


def _git_files(root: Path) -> list[str] | None:
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True, timeout=30
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            capture_output=True,
            timeout=120,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _walked_files(root: Path) -> list[str]:
    import pathspec

    lines: list[str] = []
    for name in IGNORE_FILES:
        if (root / name).is_file():
            lines += (root / name).read_text(errors="replace").splitlines()
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    out = []
    for folder, dirs, names in os.walk(root):
        rel_dir = Path(folder).relative_to(root)
        dirs[:] = sorted(
            d for d in dirs if d not in ALWAYS_LEFT_OUT and not spec.match_file((rel_dir / d).as_posix() + "/")
        )
        for name in names:
            rel = (rel_dir / name).as_posix()
            if not spec.match_file(rel):
                out.append(rel)
    return out


# pyproject.toml's entry points, for an installation whose own are unreadable
ENTRY_POINTS = (
    "[console_scripts]\nsrifty = lightning_srifty.cli:main\n\n"
    "[lightning.pytorch.callbacks_factory]\nlightning_srifty = lightning_srifty.migrate.preemption:launch_callbacks\n"
)


def repacked_wheel() -> tuple[str, bytes]:
    """This installation of lightning-srifty as a wheel (name, bytes): the installed packages (``lightning_srifty``,
    ``predictor``, their data) and the installed METADATA, so ``pip install`` on a node pulls the same declared
    dependencies. Reproducible: sorted members, a fixed time."""

    try:
        dist = importlib.metadata.distribution("lightning-srifty")
        # a .dist-info has METADATA; a source tree's .egg-info (setuptools' develop) has the same as PKG-INFO
        version, metadata = dist.version, dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            "lightning-srifty is not installed (imported from a source tree), so its wheel cannot be repacked for the "
            "nodes: install it (pip install -e . in the checkout, or pip install lightning-srifty).",
            parameter="code",
            value=None,
        ) from None
    if "Requires-Dist:" not in metadata:
        raise ConfigError(
            f"The installed lightning-srifty {version} has no readable metadata (its dependencies), so its wheel "
            "cannot be repacked for the nodes: reinstall it (pip install --force-reinstall -e . in the checkout).",
            parameter="code",
            value=None,
        )
    tag = "py3-none-any"
    dist_info = f"lightning_srifty-{version}.dist-info"
    members: dict[str, bytes] = {}
    for package in (lightning_srifty, predictor):
        base = Path(str(package.__file__)).resolve().parent
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
                members[f"{base.name}/{rel.as_posix()}"] = path.read_bytes()
    members[f"{dist_info}/METADATA"] = metadata.encode()
    members[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: lightning-srifty (repacked)\nRoot-Is-Purelib: true\nTag: {tag}\n"
    ).encode()
    # the installed entry points whole: the console script and Lightning's callbacks_factory, through which every
    # Trainer on a fleet gets SpotPreemption (a trial: the repack wrote the console script alone, and a plain script
    # on a fleet srifty terraform wrote trained through a spot notice)
    members[f"{dist_info}/entry_points.txt"] = (dist.read_text("entry_points.txt") or ENTRY_POINTS).encode()
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in sorted(members.items())
    ]
    members[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in sorted(members.items()):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return f"lightning_srifty-{version}-{tag}.whl", buffer.getvalue()


def environment_spec(
    software: Any | None,
    *,
    requirements: str | None = None,
    index_url: str | None = None,
    extra_index_urls: tuple[str, ...] = (),
    base_python: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """What a node installs (``.srifty/environment.json``, without the wheel's name) and the notes a user must read:
    torch and lightning pinned to the profiled versions (``software``, a plan's
    :class:`~predictor.documents.profile.Software`; None: the versions installed here), the user's requirements file,
    the package index.

    A local build tag is dropped from the pin (``2.13.0+cpu`` -> ``torch==2.13.0``): a GPU node installs the CUDA build
    of that release chosen for its driver (``torch_cuda``: the builds PyTorch publishes it with, from
    ``cuda_builds.json``), the profiled one (``+cu128``) when the driver supports it; the user's own index, when given,
    serves torch as it is.
    """
    notes: list[str] = []
    profiled = _profiled_versions(software, notes)
    packages, torch_cuda = _pins(profiled, notes)
    extra = list(extra_index_urls)
    here = _installed_srifty()
    if profiled.get("lightning_srifty") and here and profiled["lightning_srifty"] != here:
        notes.append(
            f"the profile was measured with lightning-srifty {profiled['lightning_srifty']}; the nodes get "
            f"this installation's {here}"
        )
    spec: dict[str, Any] = {
        "packages": packages,
        "requirements": requirements,
        "index_url": index_url,
        "extra_index_urls": extra,
        "base_python": base_python,
        "profiled": {k: v for k, v in profiled.items() if v is not None},
    }
    if torch_cuda:  # GPU nodes choose torch's CUDA build for their driver among these (bootstrap.torch_index)
        spec["torch_cuda"] = torch_cuda
    return spec, notes


def _profiled_versions(software: Any | None, notes: list[str]) -> dict[str, Any]:
    """The versions the plan was profiled with; without a record, torch's and lightning's installed here (said in
    ``notes``)."""
    profiled = {k: getattr(software, k, None) for k in ("python", "torch", "lightning", "cuda", "lightning_srifty")}
    if software is None:
        notes.append(
            "the plan records no profiled versions (a plan made before lightning-srifty recorded them): torch and "
            "lightning are pinned to the versions installed here"
        )
        for name in ("torch", "lightning"):
            try:
                profiled[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                profiled[name] = None
    return profiled


def _pins(profiled: dict[str, Any], notes: list[str]) -> tuple[list[str], Any]:
    """torch's and lightning's pins (the release, without a local build tag) and torch's CUDA builds to choose from
    on the node (None: not a release the table knows), with the notes a user must read appended to ``notes``."""
    packages, torch_cuda = [], None
    for name in ("torch", "lightning"):
        version = profiled.get(name)
        if not version:
            notes.append(f"{name}: no version recorded, the index's newest is installed")
            packages.append(name)
            continue
        release, _, build = str(version).partition("+")
        packages.append(f"{name}=={release}")
        if name == "torch":
            torch_cuda, cuda_notes = cuda.torch_cuda(str(version))
            notes += cuda_notes
        if name == "torch" and build and not build.startswith("cu"):
            notes.append(
                f"torch was profiled as the {build} build ({version}): GPU nodes install a CUDA build of "
                f"torch=={release} chosen for their driver (the summary's 'torch build')"
            )
    return packages, torch_cuda


def _installed_srifty() -> str | None:
    try:
        return importlib.metadata.version("lightning-srifty")
    except importlib.metadata.PackageNotFoundError:
        return None


def build_snapshot(
    workdir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    environment: dict[str, Any],
    *,
    max_mb: float = DEFAULT_MAX_MB,
    leave_out: tuple[Path, ...] = (),
    include_secrets: tuple[str, ...] = (),
) -> Snapshot:
    """Pack ``workdir`` with ``environment`` (see the module docstring) into ``out_dir/<sha256>.tar.gz``.

    Raises:
        ConfigError: ``workdir`` is not a folder, or its files add up to more than ``max_mb`` (the largest named).
    """
    root = Path(workdir)
    files, source, secrets, total = _code_to_pack(root, leave_out, include_secrets, max_mb)
    extra = _srifty_folder(root, files, environment)
    packed = _archive(root, files, extra)
    digest = hashlib.sha256(packed).hexdigest()
    target = Path(out_dir) / f"{digest}.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not (target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == digest):
        atomic_write_bytes(target, packed)
    uncommitted = tuple(uncommitted_files(root, files)) if source == "git" else ()
    inside = tuple(scan_secrets(root, files))
    return Snapshot(target, digest, tuple(files), total, len(packed), source, tuple(secrets), uncommitted, inside)


def _code_to_pack(
    root: Path, leave_out: tuple[Path, ...], include_secrets: tuple[str, ...], max_mb: float
) -> tuple[list[str], str, list[str], int]:
    """The code's files to pack (secrets left out unless included by name), how they were listed, the secrets left
    out and the files' total bytes.

    Raises:
        ConfigError: ``root`` is not a folder, an included secret is not among its files, or the files add up to
            more than ``max_mb`` (the largest named).
    """
    if not root.is_dir():
        raise ConfigError.between(
            "The code folder {root} is not a folder: give {code} the directory your training script runs from, or "
            "no code if the image already has it (code=None; srifty terraform --no-code).",
            parameter="code",
            value=str(root),
            root=str(root),
        )
    files, source = code_files(root, leave_out)
    wanted = {PurePosixPath(p).as_posix() for p in include_secrets}
    unknown = sorted(wanted - set(files))
    if unknown:
        raise ConfigError.between(
            "{include_secrets} {path} is not among the code's files in {root} (give it relative to the code folder, "
            "as the summary names it).",
            parameter="include_secrets",
            value=unknown[0],
            path=unknown[0],
            root=str(root),
        )
    secrets = [rel for rel in files if is_secret(rel) and rel not in wanted]
    files = [rel for rel in files if rel not in secrets]
    sizes = {rel: (root / rel).stat().st_size for rel in files}
    total = sum(sizes.values())
    if total > max_mb * 2**20:
        largest = ", ".join(
            f"{rel} ({size / 2**20:.1f} MiB)" for rel, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
        )
        raise ConfigError.between(
            "The code in {root} is {mib:.1f} MiB, over the snapshot's limit of {limit:g} MiB; the largest files: "
            "{largest}. Leave data and checkpoints out ({ignore}; in a git work tree, what git ignores is left out), "
            "keep datasets in S3, or raise {max_code_mb}.",
            parameter="max_code_mb",
            value=round(total / 2**20, 1),
            root=str(root),
            mib=total / 2**20,
            limit=max_mb,
            largest=largest,
            ignore=" or ".join(IGNORE_FILES),
        )
    return files, source, secrets, total


def _srifty_folder(root: Path, files: list[str], environment: dict[str, Any]) -> dict[str, bytes]:
    """What srifty adds under ``.srifty/``: the node's bootstrap, the CUDA builds' table it imports, the environment
    and this installation's wheel.

    Raises:
        ConfigError: the requirements file is not among the code's files, or the code has a ``.srifty/`` folder.
    """
    wheel_name, wheel = repacked_wheel()
    environment = {**environment, "wheel": f"{SRIFTY_DIR}/wheels/{wheel_name}"}
    if environment.get("requirements") and environment["requirements"] not in files:
        raise ConfigError.between(
            "The requirements file {path} is not among the code's files in {root} (missing, or ignored): give "
            "{requirements} a file inside the code folder, relative to it.",
            parameter="requirements",
            value=environment["requirements"],
            path=environment["requirements"],
            root=str(root),
        )
    if environment.get("requirements"):
        text = (root / environment["requirements"]).read_text(errors="replace")
        check_requirement_pins(text, environment["requirements"], environment.get("packages") or [])
    clash = [rel for rel in files if rel.split("/", 1)[0] == SRIFTY_DIR]
    if clash:
        raise ConfigError(
            f"The code in {root} has a {SRIFTY_DIR}/ folder ({clash[0]}), where srifty puts the environment it "
            f"installs: rename it, or list it in .sriftyignore.",
            parameter="code",
            value=clash[0],
        )
    return {
        f"{SRIFTY_DIR}/bootstrap.py": (Path(__file__).parent / "bootstrap.py").read_bytes(),
        # which build runs which GPU: the one rule, carried beside bootstrap.py, which imports it on the node
        f"{SRIFTY_DIR}/torch_builds.py": Path(torch_builds.__file__).read_bytes(),
        ENVIRONMENT_FILE: (
            json.dumps({"schema": ENVIRONMENT_SCHEMA, **environment}, indent=1, sort_keys=True) + "\n"
        ).encode(),
        f"{SRIFTY_DIR}/wheels/{wheel_name}": wheel,
    }


def _companion_releases(torch: str) -> dict[str, list[str]]:
    """The releases of torch's companion libraries built for torch ``torch`` (2.x): torchvision 0.(x+15) and torchaudio
    2.x, each with its patch releases (PyTorch's compatibility tables: pytorch/vision's README, torch 2.13 with
    torchvision 0.28; pytorch/audio's, torchaudio's releases follow torch's); {} for another major release."""
    parts = torch.split(".")
    if len(parts) < 2 or parts[0] != "2" or not parts[1].isdigit():
        return {}
    minor = int(parts[1])
    return {
        "torchvision": [f"0.{minor + 15}.{p}" for p in range(10)],
        "torchaudio": [f"2.{minor}.{p}" for p in range(10)],
    }


def check_requirement_pins(text: str, path: str, packages: list[str]) -> None:
    """Refuse a requirements file that pins torch or lightning otherwise than the environment the nodes install
    (``packages``: the profiled ``torch==X``, ``lightning==Y``), or a torchvision / torchaudio built for another torch:
    pip on every node would find no version that satisfies both and stop at boot (``ResolutionImpossible``, a trial's
    ``torch==2.5.1`` beside the profiled 2.13.0), after the fleet was paid for. A line with an environment marker that
    does not hold on a Linux node, an option line (``-r``, ``--index-url``) or one pip would not parse is left to pip.

    Raises:
        ConfigError: naming the file, the line, the pin and the fix.
    """
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    fixed: dict[str, str] = {str(canonicalize_name(n)): v for n, _, v in (p.partition("==") for p in packages) if v}
    allowed: dict[str, list[str]] = {name: [version] for name, version in fixed.items()}
    allowed.update(_companion_releases(fixed.get("torch", "")))
    node: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    node.update(sys_platform="linux", platform_system="Linux")  # every node runs Linux, whatever runs this
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        name = str(canonicalize_name(req.name))
        if name not in allowed or not req.specifier or (req.marker is not None and not req.marker.evaluate(node)):
            continue
        if any(req.specifier.contains(v, prereleases=True) for v in allowed[name]):
            continue
        profiled = f"torch {fixed['torch']}" if name not in fixed else f"{name} {fixed[name]}"
        raise ConfigError.between(
            "{path} line {number} asks for {line!r}, but every node installs the profiled {profiled}"
            + (" (with the CUDA build its driver runs)" if name == "torch" else "")
            + (", and this release of {name} is built for another torch" if name not in fixed else "")
            + ": pip would find nothing that satisfies both and stop the node at boot. Remove the pin from {path} "
            + (
                "(or leave it unversioned: the nodes take the release built for that torch), "
                if name not in fixed
                else ""
            )
            + "or profile again under the release you want.",
            parameter="requirements",
            value=line,
            path=path,
            number=number,
            line=line,
            profiled=profiled,
            name=name,
        )


def _archive(root: Path, files: list[str], extra: dict[str, bytes]) -> bytes:
    """The code's files and srifty's as a reproducible gzipped tar (no mtimes, sorted extras)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            path = root / rel
            executable = os.access(path, os.X_OK)
            _add(tar, rel, path.read_bytes(), 0o755 if executable else 0o644)
        for rel, data in sorted(extra.items()):
            _add(tar, rel, data, 0o644)
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """A snapshot built earlier (``srifty launch`` packs the code once, every fleet of the run gets the same).

    Raises:
        ConfigError: the file is not named ``<sha256>.tar.gz`` by its own digest, or is not a snapshot.
    """
    archive = Path(path)
    data = archive.read_bytes() if archive.is_file() else b""
    digest = hashlib.sha256(data).hexdigest()
    if archive.name != f"{digest}.tar.gz":
        raise ConfigError(
            f"The code snapshot {archive} is missing or not named by its sha256 ({digest}.tar.gz): it was changed "
            "after srifty packed it. Delete it and pack the code again.",
            parameter="snapshot",
            value=str(archive),
        )
    with tarfile.open(archive, "r:gz") as tar:
        infos = [m for m in tar.getmembers() if m.isfile()]
    names = [m.name for m in infos]
    if ENVIRONMENT_FILE not in names:
        raise ConfigError(
            f"{archive} has no {ENVIRONMENT_FILE}: it is not a srifty code snapshot.",
            parameter="snapshot",
            value=str(archive),
        )
    files = tuple(n for n in names if n.split("/", 1)[0] != SRIFTY_DIR)
    size = sum(m.size for m in infos if m.name in files)
    return Snapshot(archive, digest, files, size, len(data), "snapshot")


def read_member(snapshot: Snapshot, name: str) -> bytes:
    """One file of a snapshot (``train.py``, ``.srifty/environment.json``)."""
    with tarfile.open(snapshot.path, "r:gz") as tar:
        member = tar.extractfile(name)
        if member is None:
            raise KeyError(name)
        return member.read()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))
