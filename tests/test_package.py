"""The package surface: a small tested __all__, the strategy alias, the torch-free predictor, lint."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

import pytest

import lightning_srifty
from conftest import ROOT


def test_public_surface_is_small_and_resolves() -> None:
    assert sorted(lightning_srifty.__all__) == sorted(
        ["SriftyCallback", "SriftyDDPStrategy", "SriftyError", "__version__", "capture_ops", "load_profile"]
    )
    for name in lightning_srifty.__all__:
        assert getattr(lightning_srifty, name) is not None
    with pytest.raises(AttributeError):
        lightning_srifty.NotAThing  # noqa: B018


def test_version_matches_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert lightning_srifty.__version__ == meta["project"]["version"]


def test_srifty_ddp_is_a_registered_strategy() -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import StrategyRegistry

    from lightning_srifty import SriftyDDPStrategy

    assert "srifty_ddp" in StrategyRegistry and "srifty_ddp_spawn" in StrategyRegistry
    trainer = pl.Trainer(strategy="srifty_ddp", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, SriftyDDPStrategy)


def test_importing_after_lightning_registers_the_strategy(subprocess_env) -> None:
    code = (
        "import lightning.pytorch; import lightning_srifty; "
        "from lightning.pytorch.strategies import StrategyRegistry; print('srifty_ddp' in StrategyRegistry)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env)
    assert result.stdout.strip() == "True", result.stderr


def test_predictor_never_imports_torch_or_lightning() -> None:
    offenders = []
    for path in (ROOT / "predictor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] in ("torch", "lightning", "pytorch_lightning")
            ]
    assert not offenders


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    result = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
