"""Install the profiled environment on a node: ``python3 .srifty/bootstrap.py <venv>`` from the unpacked snapshot.

Standard library only (it runs on the image's own Python before anything is installed); the snapshot carries a copy
of this file as ``.srifty/bootstrap.py``. It reads ``.srifty/environment.json`` (written by ``srifty terraform``),
creates a virtual environment, installs the pinned packages (torch and lightning at the profiled versions), this
snapshot's lightning-srifty wheel and the user's requirements file from the named index, then checks what was
installed against the pins and exits non-zero, naming the package, when they differ. With ``base_python`` set (an
image that has torch already), that interpreter's packages are visible in the new environment, so pins it already
satisfies are not downloaded again. ``$SRIFTY_BOOTSTRAP_BASE_PYTHON`` names such an interpreter from outside the
snapshot: ``srifty rehearse`` sets it to its own, so that the rehearsal's nodes install nothing its environment has.

On a GPU node (``nvidia-smi`` answers) torch comes from PyTorch's index of the CUDA build chosen for the node's
driver (:func:`choose_torch_build`, over the builds of the pinned torch release that ``environment.json`` carries from
``cuda_builds.json``), unless the user named a package index (``--index-url`` / ``--extra-index-url``): theirs wins.

Exit codes: 0 installed and checked; 2 bad environment.json; 3 pip failed; 4 installed versions differ from the pins;
5 a GPU node whose installed torch cannot use its GPUs (a CUDA build the driver does not support, or a CPU build);
6 a GPU node whose driver or GPU runs none of the CUDA builds the pinned torch is published with (before anything
is installed).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

if __package__:  # imported from the installed package (srifty terraform on the workstation, the tests)
    from predictor.catalog.torch_builds import runs
else:  # run as a script on a node: the snapshot's copy beside this file (.srifty/torch_builds.py)
    from torch_builds import runs  # type: ignore[no-redef,import-not-found]

HERE = Path(__file__).resolve().parent  # <code>/.srifty
# the extra of lightning-srifty a node installs with the wheel: what the job runs (s3fs for s3:// checkpoints, ...);
# templates/user_data.sh.tftpl names it too (an image's Python), and the pre-flight reads the closure through it
NODE_EXTRA = "train"
CHECK = r"""
import importlib.metadata as m, json, sys
names = json.loads(sys.argv[1])
out = {}
for n in names:
    try:
        out[n] = m.version(n)
    except m.PackageNotFoundError:
        out[n] = None
out["python"] = "%d.%d.%d" % sys.version_info[:3]
import lightning_srifty
out["lightning_srifty_file"] = lightning_srifty.__file__
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
except Exception as exc:  # noqa: BLE001 - reported, not raised
    out["torch_error"] = repr(exc)
print(json.dumps(out))
"""


def log(message: str) -> None:
    print(f"srifty bootstrap: {message}", flush=True)


def _pin(spec: str) -> tuple[str, str]:
    name, _, version = spec.partition("==")
    return name.strip(), version.strip()


def version_numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def cuda_release(build: str) -> str:
    """``cu128`` -> ``12.8``."""
    return f"{build[2:-1]}.{build[-1]}"


def choose_torch_build(driver: str, torch_cuda: dict, cc: str | None = None) -> tuple[str | None, str]:
    """The CUDA build of torch for an NVIDIA driver (``570.133.20``) and a GPU of compute capability ``cc`` (``"8.6"``;
    None: not known, every build counts), and why; (None, why none runs).

    ``torch_cuda`` is environment.json's: ``{"torch": release, "profiled": build or None, "builds": {build: {"driver":
    the CUDA release's own minimum driver, "compat_driver": the minimum for CUDA minor version compatibility,
    "arches": the compute capabilities it carries code for (None: not recorded)}}}``. Only builds that run the GPU
    count (torch 2.13's cu130 has no Volta code, its cu126 no Blackwell). In order: the profiled build when the driver
    supports its CUDA release; else the newest build the driver supports; else the newest it runs through minor
    version compatibility (no PTX JIT); else none.
    """
    have = version_numbers(driver)
    every = sorted(torch_cuda["builds"].items(), key=lambda kv: version_numbers(cuda_release(kv[0])), reverse=True)
    release = torch_cuda["torch"]
    builds = [(b, need) for b, need in every if cc is None or need.get("arches") is None or runs(cc, need["arches"])]
    if not builds:
        carried = "; ".join(f"{b}: {', '.join(need['arches'])}" for b, need in reversed(every))
        return None, (
            f"no CUDA build of torch {release} runs this GPU (compute capability {cc}): its builds carry code for "
            f"{carried}. Train this GPU with a torch release that has a build for it, or choose another GPU "
            "(srifty recommend leaves such GPUs out for the profiled torch)"
        )
    full = [b for b, need in builds if have >= version_numbers(need["driver"])]
    profiled = torch_cuda.get("profiled")
    for build, what in ((profiled, "the profiled build"), (full[0] if full else None, "the newest build it supports")):
        if build in full:
            need = torch_cuda["builds"][build]["driver"]
            return build, f"{what}: CUDA {cuda_release(str(build))} needs driver >= {need}"
    compat = [b for b, need in builds if have >= version_numbers(need["compat_driver"])]
    if compat:
        need = torch_cuda["builds"][compat[0]]
        return compat[0], (
            f"older than CUDA {cuda_release(compat[0])}'s {need['driver']}, but CUDA minor version compatibility runs "
            f"it from {need['compat_driver']} (no PTX JIT)"
        )
    lowest = min((need["compat_driver"] for _, need in builds), key=version_numbers)
    names = ", ".join(b for b, _ in reversed(builds))
    gpu = f" that run this GPU (compute capability {cc})" if cc is not None and len(builds) < len(every) else ""
    return None, (
        f"NVIDIA driver {driver} runs none of the CUDA builds torch {release} is published with{gpu} ({names}): "
        f"the oldest needs driver >= {lowest} (CUDA minor version compatibility). Use an image whose NVIDIA driver is "
        f">= {lowest}, or give srifty terraform --index-url/--extra-index-url an index "
        f"with a torch {release} build for this driver, or --image a container that brings its own torch"
    )


def _query(smi: str, field: str, pattern: str) -> str | None:
    """The first GPU's ``field`` as ``nvidia-smi --query-gpu`` reports it, when it matches ``pattern``; else None."""
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.strip().splitlines()
    return lines[0].strip() if lines and re.fullmatch(pattern, lines[0].strip()) else None


def driver_version(smi: str) -> str | None:
    """The NVIDIA driver's version as ``nvidia-smi`` reports it (the first GPU's), or None when it names none."""
    return _query(smi, "driver_version", r"\d+(\.\d+)+")


def compute_capability(smi: str) -> str | None:
    """The first GPU's compute capability as ``nvidia-smi`` reports it (``"8.6"``; drivers since 510 answer
    ``--query-gpu=compute_cap``), or None when it names none."""
    return _query(smi, "compute_cap", r"\d+\.\d+")


def torch_index(spec: dict, driver: str | None, cc: str | None = None) -> tuple[list[str] | None, str | None]:
    """The pip arguments of torch's CUDA build for this node (``[--extra-index-url, url]``, or none) and what to log;
    (None, why) when no published build runs on this driver and GPU: the message names them, the minimum and the fix."""
    cuda = spec.get("torch_cuda")
    if driver is None or not cuda:
        return [], None
    if spec.get("index_url") or spec.get("extra_index_urls"):
        return [], (
            f"NVIDIA driver {driver}: torch's CUDA build is the one your package index serves (--index-url / "
            "--extra-index-url win; srifty does not choose it)"
        )
    build, why = choose_torch_build(driver, cuda, cc)
    if build is None:
        return None, why
    url = cuda["index"] + build
    gpu = f", compute capability {cc}" if cc else ""
    return ["--extra-index-url", url], f"NVIDIA driver {driver}{gpu}: torch {cuda['torch']} {build} from {url} ({why})"


def _check(python: Path, pins: dict[str, str]) -> subprocess.CompletedProcess:
    names = json.dumps([*pins, "lightning-srifty"])
    return subprocess.run([str(python), "-c", CHECK, names], capture_output=True, text=True, cwd="/")


# --- the fleet's wheelhouse: the environment's wheels, downloaded once per code archive and build --------------------
#
# user_data syncs ``<checkpoints>/wheelhouse/<code sha256>/`` from the bucket into $SRIFTY_WHEELHOUSE before this runs,
# and uploads a folder built here (marked BUILT_HERE) after it, the wheels first and MANIFEST.json last: a node that
# boots later (a replacement, a restart, the next apply of the same code) installs from the bucket, in the region, not
# from PyPI (2.7 GB for torch 2.13's CUDA build). One folder per torch build (cu126, cu130, "default"): nodes of
# different drivers in one fleet each get theirs. A folder is used only when every file its manifest names is there
# with that sha256; anything else is ignored and built again.

MANIFEST = "MANIFEST.json"
BUILT_HERE = "BUILT_HERE"


def wheelhouse_key(cuda_index: list[str]) -> str:
    """The folder of this node's torch build: ``cu126`` for ``--extra-index-url .../whl/cu126``, else ``default``."""
    return cuda_index[-1].rstrip("/").rsplit("/", 1)[-1] if cuda_index else "default"


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheelhouse_files(folder: Path) -> dict[str, str] | None:
    """The files of a complete wheelhouse folder (name -> sha256, as its manifest says and the files agree), or None
    when there is no manifest, it does not read, or a file is missing or differs."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        ok = (
            isinstance(files, dict)
            and files
            and all(isinstance(n, str) and "/" not in n and n not in (".", "..") for n in files)
        )
        if ok and all((folder / n).is_file() and _sha256(folder / n) == sha for n, sha in files.items()):
            return files
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def install_with_wheelhouse(
    root: Path, cuda_index: list[str], pip: list[str], indexes: list[str], wanted: list[str]
) -> bool:
    """Install ``wanted`` from the wheelhouse of this node's build under ``root``: from a complete one (no index), or
    by building it (``pip download`` from the indexes, then the install from it, then the manifest). False when
    neither worked: the caller installs from the indexes as before."""
    import shutil
    import time

    key = wheelhouse_key(cuda_index)
    folder = root / key
    offline = [*pip, "--no-index", "--find-links", str(folder), *wanted]
    files = wheelhouse_files(folder)
    if files is not None:
        size = sum((folder / n).stat().st_size for n in files) / 1e9
        log(f"wheelhouse {key}: installing from it ({len(files)} files, {size:.2f} GB, built by an earlier node)")
        if subprocess.run(offline, cwd=HERE.parent).returncode == 0:
            return True
        log(f"wheelhouse {key}: the install from it failed (above): from the package index instead")
        return False
    if (folder / MANIFEST).exists():
        log(f"wheelhouse {key}: its files do not match its manifest: ignored, built again")
    partial = root / f"{key}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    download = [pip[0], "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "-d", str(partial)]
    if subprocess.run([*download, *indexes, *cuda_index, *wanted], cwd=HERE.parent).returncode:
        log(f"wheelhouse {key}: pip download failed (above): installing from the package index, no wheelhouse")
        shutil.rmtree(partial, ignore_errors=True)
        return False
    files = {p.name: _sha256(p) for p in sorted(partial.iterdir()) if p.is_file()}
    (partial / MANIFEST).write_text(json.dumps({"key": key, "files": files}, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    size = sum((folder / n).stat().st_size for n in files) / 1e9
    log(f"wheelhouse {key}: downloaded {len(files)} files, {size:.2f} GB in {time.monotonic() - started:.0f} s")
    if subprocess.run(offline, cwd=HERE.parent).returncode:
        log(f"wheelhouse {key}: the install from it failed (above): from the package index instead")
        return False
    (folder / BUILT_HERE).write_text("the fleet's next nodes install from this wheelhouse once user_data uploads it\n")
    return True


def main(argv: list[str]) -> int:
    """Build the profiled environment in ``argv[1]``; the exit status says where it stopped (2: usage or an unreadable
    environment.json, 3: pip, 4: the environment is not the pinned one, 5: torch cannot use this node's GPUs, 6: no
    published torch build runs on this driver)."""
    if len(argv) != 2:
        print("usage: python3 .srifty/bootstrap.py <venv folder>", file=sys.stderr)
        return 2
    target = Path(argv[1])
    try:
        spec = json.loads((HERE / "environment.json").read_text())
        packages = [str(p) for p in spec["packages"]]
        wheel = HERE.parent / spec["wheel"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"srifty bootstrap: {HERE / 'environment.json'} does not read ({exc})", file=sys.stderr)
        return 2
    wanted_python = (spec.get("profiled") or {}).get("python")
    here_python = platform.python_version()
    if wanted_python and wanted_python.split(".")[:2] != here_python.split(".")[:2]:
        log(f"NOTE: the profile ran on Python {wanted_python}; this node's python3 is {here_python}")
    smi = shutil.which("nvidia-smi")
    driver = driver_version(smi) if smi else None
    if smi and driver is None:
        log("nvidia-smi answers but names no driver version: torch's build is the index's default")
    cc = compute_capability(smi) if smi and driver else None
    cuda_index, why = torch_index(spec, driver, cc)
    if cuda_index is None:  # no published build runs on this driver: stop before anything is installed
        print(f"srifty bootstrap: {why}", file=sys.stderr)
        return 6
    if why:
        log(why)
    log(f"creating {target} (Python {here_python})")
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    python = target / "bin" / "python"
    base = spec.get("base_python") or os.environ.get("SRIFTY_BOOTSTRAP_BASE_PYTHON")
    if base:
        _see_base_python(base, python)
    if not _install(spec, packages, wheel, python, base, cuda_index):
        print(
            "srifty bootstrap: pip install failed (see above): the environment is not the profiled one", file=sys.stderr
        )
        return 3
    return _verify(python, packages, wheel, target, bool(smi), driver)


def _see_base_python(base: str, python: Path) -> None:
    """Make the packages of the interpreter ``base`` (an image's) visible to the new environment's ``python``, after
    its own site-packages: what pip installs there wins over the image's copy."""
    paths = subprocess.run(
        [base, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
        capture_output=True,
        text=True,
        check=True,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "srifty-base-python.pth").write_text("\n".join(json.loads(paths.stdout)) + "\n")
    log(f"the packages of {base} are visible (pins they satisfy are not downloaded)")


def _install(
    spec: dict, packages: list[str], wheel: Path, python: Path, base: str | None, cuda_index: list[str]
) -> bool:
    """pip install the pins, the snapshot's wheel and the user's requirements (from the fleet's wheelhouse when
    there is one and no base interpreter); False when pip failed."""
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    indexes = ["--index-url", spec["index_url"]] if spec.get("index_url") else []
    for url in spec.get("extra_index_urls") or []:
        indexes += ["--extra-index-url", url]
    wanted = [*packages, f"{wheel}[{NODE_EXTRA}]"]
    if spec.get("requirements"):
        wanted += ["-r", str(HERE.parent / spec["requirements"])]
    requirements = [f"-r {spec['requirements']}"] if spec.get("requirements") else []
    log("installing " + " ".join([*packages, f"{wheel.name}[{NODE_EXTRA}]", *requirements]))
    house = None if base else os.environ.get("SRIFTY_WHEELHOUSE")
    if base and os.environ.get("SRIFTY_WHEELHOUSE"):
        log("no wheelhouse: the packages of the base interpreter are reused instead")
    housed = bool(house) and install_with_wheelhouse(Path(str(house)), cuda_index, pip, indexes, wanted)
    return housed or subprocess.run([*pip, *indexes, *cuda_index, *wanted], cwd=HERE.parent).returncode == 0


def _verify(python: Path, packages: list[str], wheel: Path, target: Path, gpu: bool, driver: str | None) -> int:
    """Check what was installed against the pins (and, on a GPU node, that torch can use the GPUs), reinstall the
    snapshot's lightning-srifty over an image's copy of the same version, and write ``srifty-environment.json``;
    the exit status (:func:`main`)."""
    pins = dict(_pin(p) for p in packages if "==" in p)
    check = _check(python, pins)
    if check.returncode == 0 and not json.loads(check.stdout)["lightning_srifty_file"].startswith(str(target)):
        # pip counted an installed lightning-srifty of the same version (the image's, through base_python) as the
        # wheel: this snapshot's copy is the one that must run
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        if subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], cwd=HERE.parent).returncode:
            print("srifty bootstrap: installing the snapshot's lightning-srifty failed", file=sys.stderr)
            return 3
        check = _check(python, pins)
    if check.returncode != 0:
        print(f"srifty bootstrap: the environment does not import lightning_srifty:\n{check.stderr}", file=sys.stderr)
        return 4
    got = json.loads(check.stdout)
    wrong = [f"{n} {got.get(n)} (pinned {v})" for n, v in pins.items() if (got.get(n) or "").split("+")[0] != v]
    if wrong:
        print("srifty bootstrap: installed versions differ from the pins: " + ", ".join(wrong), file=sys.stderr)
        return 4
    if gpu and not got.get("cuda_available"):  # a GPU node whose torch cannot use its GPUs: stop before training
        print(
            f"srifty bootstrap: torch {got.get('torch')} (CUDA build {got.get('torch_cuda') or 'none: a CPU build'}) "
            f"cannot use this node's GPUs (NVIDIA driver {driver or 'unknown'}): install a torch build "
            "for this driver (--extra-index-url https://download.pytorch.org/whl/cu<version>) or an image whose "
            "driver supports this build",
            file=sys.stderr,
        )
        return 5
    report = {"python": got["python"], **{n: got[n] for n in [*pins, "lightning-srifty"]}}
    report["lightning_srifty_file"] = got["lightning_srifty_file"]
    (target / "srifty-environment.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    log("ready: " + ", ".join(f"{k} {v}" for k, v in report.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
