"""Installs that fit each user (issue #24 item 7): the extras of pyproject.toml bring every module the code imports,
and a command whose extra is missing names it with the pip command instead of a traceback. Each extra installed from
the wheel into a fresh venv and used is .ci/extras (CI runs it)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from lightning_srifty.cli import main
from lightning_srifty.provision.preflight import _closure
from predictor.exceptions import EXTRA_OF_MODULE, MissingExtraError

tomllib = pytest.importorskip("tomllib")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
AUDIENCES = ("train", "infra", "serve", "report")


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)


def _provided(requirements: list[str]) -> set[str]:
    """The top-level modules the installed distributions of ``requirements`` (and what they pull in) provide here."""
    dists, _ = _closure(requirements)
    modules = importlib.metadata.packages_distributions()
    return {m for m, names in modules.items() if any(re.sub(r"[-_.]+", "-", n).lower() in dists for n in names)}


def _third_party_imports() -> set[str]:
    """Top-level names of every absolute import in lightning_srifty/ and predictor/, inside functions too (not those
    under ``if TYPE_CHECKING:``, which only a type checker reads)."""
    names = set()
    for folder in ("lightning_srifty", "predictor"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            typing_only = {
                id(inner)
                for node in ast.walk(tree)
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for child in node.body
                for inner in ast.walk(child)
            }
            for node in ast.walk(tree):
                if id(node) in typing_only:
                    continue
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    # torch_builds: on a node, bootstrap.py imports the snapshot's copy of predictor/catalog/torch_builds.py beside it
    return names - set(sys.stdlib_module_names) - {"lightning_srifty", "predictor", "__future__", "torch_builds"}


def _self_extras(requirements: list[str]) -> set[str]:
    """The extras of lightning-srifty itself that ``requirements`` name (``lightning-srifty[train,infra]``)."""
    out: set[str] = set()
    for requirement in requirements:
        match = re.match(r"lightning-srifty\[([^\]]*)\]", requirement.replace(" ", ""))
        if match:
            out |= set(match.group(1).split(","))
    return out


def test_the_extras_are_the_audiences_and_dev_installs_all_of_them() -> None:
    extras = PROJECT["optional-dependencies"]
    assert set(extras) == {*AUDIENCES, "all", "dev", "bench", "rehearse"}
    assert _self_extras(extras["all"]) == set(AUDIENCES)
    # the README's one install command, pip install torch==2.13.0 -e ".[dev]", installs everything, as before: every
    # requirement of every audience's extra, listed flat (a self-reference sent pip 26.3 into a failing backtrack)
    assert not _self_extras(extras["dev"])
    flat = {r.replace(" ", "") for r in extras["dev"]}
    missing = {r for audience in (*AUDIENCES, "rehearse") for r in extras[audience] if r.replace(" ", "") not in flat}
    assert not missing, f"the dev extra lacks what these audiences' extras require: {sorted(missing)}"
    assert {_name(r).lower() for r in PROJECT["dependencies"]} == {"numpy", "pyyaml", "rich", "typing_extensions"}


def test_every_module_the_code_imports_comes_with_the_base_or_the_extra_that_names_it() -> None:
    """A module missing from both is one a user of some extra would meet as a traceback (typing_extensions was: it
    came with torch and pydantic, never declared); a module of EXTRA_OF_MODULE must come with the extra it names."""
    base = _provided(PROJECT["dependencies"])
    unmapped = sorted(m for m in _third_party_imports() if m not in base and m not in EXTRA_OF_MODULE)
    assert not unmapped, f"imported, but neither a base dependency nor in EXTRA_OF_MODULE: {unmapped}"
    for module, extra in sorted(EXTRA_OF_MODULE.items()):
        assert extra in (*AUDIENCES, "rehearse"), (module, extra)
        assert module not in base, f"{module} comes with the base install: drop it from EXTRA_OF_MODULE"
        assert module in _provided(PROJECT["optional-dependencies"][extra]), f"the {extra!r} extra brings no {module}"


def test_a_command_whose_extra_is_missing_names_it_and_the_pip_command(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn: ModuleNotFoundError, as when not installed
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "srifty: error: srifty serve needs the 'serve' extra (uvicorn is not installed): "
        "pip install 'lightning-srifty[serve]'\n"
    )
    monkeypatch.setitem(sys.modules, "boto3", None)
    assert main(["catalog", "refresh", "--regions", "us-east-1"]) == 2
    assert "srifty catalog refresh needs the 'infra' extra (boto3" in capsys.readouterr().err


def test_an_installed_module_that_fails_to_import_is_not_blamed_on_an_extra() -> None:
    """torch is installed here: an ImportError naming it (a version without the name asked) is a real error."""
    assert MissingExtraError.of(ImportError("cannot import name 'x' from 'torch'", name="torch"), "srifty x") is None
    assert MissingExtraError.of(ModuleNotFoundError("No module named 'wandb'", name="wandb"), "srifty x") is None
    error = MissingExtraError("srifty demo", "train", "torch")
    assert isinstance(error, ImportError) and MissingExtraError.of(error, "elsewhere") is error


def test_the_job_side_names_need_the_train_extra(subprocess_env) -> None:
    """Without torch and lightning, import lightning_srifty and the torch-free names work; SriftyCallback is an
    ImportError naming the 'train' extra."""
    code = (
        "import sys; sys.modules.update(torch=None, lightning=None)\n"
        "import lightning_srifty\n"
        "from lightning_srifty import Constraints, load_profile\n"
        "try:\n"
        "    from lightning_srifty import SriftyCallback\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "MissingExtraError lightning_srifty.SriftyCallback needs the 'train' extra (lightning is not installed): "
        "pip install 'lightning-srifty[train]'"
    )


def test_the_preflight_closure_follows_the_extras_named(tmp_path, monkeypatch) -> None:
    """The nodes install lightning-srifty[train]: the pre-flight's closure of a requirement takes its extras' own
    requirements (and a requirement's extras, aiobotocore[boto3]) and leaves the others out."""
    info = tmp_path / "srifty_fake-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: srifty-fake\nVersion: 1.0\n"
        "Requires-Dist: numpy>=1.24\n"
        'Requires-Dist: srifty-fake-a>=1; extra == "train"\n'
        'Requires-Dist: srifty-fake-b[more]; extra == "serve"\n'
        'Requires-Dist: srifty-fake-c; extra == "train" and python_version >= "3.10"\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plain, _ = _closure(["srifty-fake"])
    assert "numpy" in plain and not {"srifty-fake-a", "srifty-fake-b", "srifty-fake-c"} & plain
    train, unknown = _closure(["srifty_fake[train]"])
    assert {"srifty-fake-a", "srifty-fake-c"} <= train and "srifty-fake-b" not in train
    assert {"srifty-fake-a", "srifty-fake-c"} <= unknown  # not installed: what they need is not known here


def test_the_smoke_script_tries_every_audience_and_ci_runs_it() -> None:
    script = ROOT / ".ci" / "extras"
    text = script.read_text()
    assert "audiences=(base infra serve report train)" in text and script.stat().st_mode & 0o111
    for audience in ("base", *AUDIENCES):
        assert f"smoke_{audience}() {{" in text
    assert "\n.ci/extras " in (ROOT / ".ci" / "run").read_text()


def test_a_module_two_audiences_share_names_the_askers_extra(monkeypatch) -> None:
    """s3fs comes with infra (the launcher's records) and train (the job's s3:// checkpoints): the job side is told
    'train', the launcher's commands 'infra'."""
    monkeypatch.setitem(sys.modules, "s3fs", None)
    try:
        import s3fs  # noqa: F401
    except ImportError as exc:
        missing = exc
    job = MissingExtraError.of(missing, "lightning_srifty.SpotPreemption")
    launcher = MissingExtraError.of(missing, "srifty launch")
    if job is None:  # s3fs is installed here: find_spec sees it, so nothing is blamed on an extra
        pytest.skip("s3fs is installed; the mapping is what is tested")
    assert (job.extra, launcher.extra) == ("train", "infra")
