"""The fleet's wheelhouse (issue #35 item 9): the first node downloads the environment's wheels once per code archive
and torch build, user_data keeps them beside the checkpoints, and every later node installs from them, not from
PyPI (2.7 GB for torch 2.13's CUDA build). bootstrap.py run as a node runs it, on a tiny environment (six and a
stand-in lightning-srifty wheel) so that nothing large is downloaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lightning_srifty.provision.terraform import bootstrap

ROOT = Path(__file__).resolve().parents[2]


def stand_in_wheel(folder: Path) -> Path:
    """A wheel named lightning_srifty 0.0.1 with an empty package: what the bootstrap imports and checks."""
    path = folder / "lightning_srifty-0.0.1-py3-none-any.whl"
    info = "lightning_srifty-0.0.1.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("lightning_srifty/__init__.py", "")
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: lightning-srifty\nVersion: 0.0.1\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


def snapshot(folder: Path) -> Path:
    """An unpacked code snapshot's .srifty folder: bootstrap.py, torch_builds.py, environment.json, the wheel."""
    srifty = folder / ".srifty"
    (srifty / "wheels").mkdir(parents=True)
    shutil.copy(ROOT / "lightning_srifty" / "provision" / "terraform" / "bootstrap.py", srifty / "bootstrap.py")
    shutil.copy(ROOT / "predictor" / "catalog" / "torch_builds.py", srifty / "torch_builds.py")
    wheel = stand_in_wheel(srifty / "wheels")
    spec = {"packages": ["six==1.17.0"], "wheel": f".srifty/wheels/{wheel.name}"}
    (srifty / "environment.json").write_text(json.dumps(spec))
    return srifty


def boot(srifty: Path, venv: Path, house: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(venv.parent), "SRIFTY_WHEELHOUSE": str(house)}
    return subprocess.run(
        [sys.executable, str(srifty / "bootstrap.py"), str(venv)], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow  # three virtual environments and a pip download
def test_the_first_node_builds_the_wheelhouse_and_the_next_installs_from_it(tmp_path) -> None:
    srifty = snapshot(tmp_path / "code")
    house = tmp_path / "wheelhouse"
    first = boot(srifty, tmp_path / "env1", house)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "wheelhouse default: downloaded 2 files" in first.stdout
    folder = house / "default"
    files = json.loads((folder / bootstrap.MANIFEST).read_text())["files"]
    assert set(files) == {"six-1.17.0-py2.py3-none-any.whl", "lightning_srifty-0.0.1-py3-none-any.whl"}
    assert (folder / bootstrap.BUILT_HERE).exists()  # user_data uploads it: the wheels first, the manifest last
    (folder / bootstrap.BUILT_HERE).unlink()  # what the next node syncs from the bucket has no marker

    second = boot(srifty, tmp_path / "env2", house)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "wheelhouse default: installing from it (2 files" in second.stdout
    assert "downloaded" not in second.stdout and not (folder / bootstrap.BUILT_HERE).exists()

    (folder / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"not the wheel")  # a damaged or tampered copy
    third = boot(srifty, tmp_path / "env3", house)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "its files do not match its manifest: ignored, built again" in third.stdout
    assert bootstrap.wheelhouse_files(folder) is not None  # rebuilt whole


def test_a_wheelhouse_is_used_only_when_its_manifest_and_files_agree(tmp_path) -> None:
    folder = tmp_path / "cu126"
    folder.mkdir()
    assert bootstrap.wheelhouse_files(folder) is None  # no manifest: a sync in progress, or nothing yet
    (folder / "a.whl").write_bytes(b"a")
    digest = bootstrap._sha256(folder / "a.whl")
    (folder / bootstrap.MANIFEST).write_text(json.dumps({"files": {"a.whl": digest}}))
    assert bootstrap.wheelhouse_files(folder) == {"a.whl": digest}
    (folder / bootstrap.MANIFEST).write_text(json.dumps({"files": {"a.whl": digest, "b.whl": digest}}))
    assert bootstrap.wheelhouse_files(folder) is None  # a file the manifest names is missing
    (folder / bootstrap.MANIFEST).write_text(json.dumps({"files": {"../a.whl": digest}}))
    assert bootstrap.wheelhouse_files(folder) is None  # never a path out of the folder
    assert bootstrap.wheelhouse_key(["--extra-index-url", "https://download.pytorch.org/whl/cu126"]) == "cu126"
    assert bootstrap.wheelhouse_key([]) == "default"
