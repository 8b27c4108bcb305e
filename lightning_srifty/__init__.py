"""lightning-srifty: profile a Lightning run, then choose, provision and move to the right cloud GPUs.

    from lightning_srifty import SriftyCallback
    trainer = Trainer(callbacks=[SriftyCallback()], strategy="srifty_ddp")

Where things live (docs/architecture.md draws it): ``profiling/`` the callback and what it measures, ``strategies/``
every strategy (``srifty_ddp``, ``srifty_fsdp``, ``srifty_auto``), ``migrate/`` what moves a running job (spot
notices, triggers, checkpoints), ``protocol`` what the job and the launcher exchange, ``store`` the checkpoint folder,
``provision/`` the torch-free launcher and Terraform, ``cli/`` the ``srifty`` commands, ``console`` the tables they
print. The torch-free predictor is the ``predictor`` package.

Attributes load lazily so that the torch-free parts (``srifty recommend``, the service) start fast; importing this
package, before or after ``lightning``, registers the ``"srifty_ddp"``, ``"srifty_fsdp"`` and ``"srifty_auto"``
strategies with Lightning (once ``lightning.pytorch`` is loaded: :class:`_AfterLightning`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Any

from lightning_srifty import _compat
from lightning_srifty._version import __version__ as __version__

# what the README and docs/ teach users to import from here (tests/house/test_package.py checks each one resolves)
_LAZY = {
    "SriftyCallback": "lightning_srifty.profiling.callback",
    "SriftyDDPStrategy": "lightning_srifty.strategies.ddp",
    "SriftyFSDPStrategy": "lightning_srifty.strategies.fsdp",
    "plan_strategy": "lightning_srifty.strategies.plan_strategy",
    "launch_settings": "lightning_srifty.strategies.plan_strategy",
    "SpotPreemption": "lightning_srifty.migrate.preemption",
    "FabricPreemption": "lightning_srifty.migrate.fabric",
    "FabricProfiler": "lightning_srifty.profiling.fabric",
    "MigrationTriggers": "lightning_srifty.migrate.triggers",
    "find_checkpoint": "lightning_srifty.migrate.preemption",
    "resume_checkpoint": "lightning_srifty.migrate.checkpoints",
    "GlobalBatchSampler": "lightning_srifty.strategies.hetero",
    "capture_ops": "lightning_srifty.profiling.capture",
    "Constraints": "predictor.ranking.constraints",
    "ServiceClient": "predictor.service.client",
    "load_profile": "predictor.documents.profile",
    "load_plan": "predictor.documents.plan",
    "SriftyError": "predictor.exceptions",
}
__all__ = sorted([*_LAZY, "__version__"])

_compat.install()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            module = importlib.import_module(_LAZY[name])
        except ImportError as exc:  # SriftyCallback and the strategies need the 'train' extra (torch, lightning)
            from predictor.exceptions import MissingExtraError

            missing = MissingExtraError.of(exc, f"lightning_srifty.{name}")
            if missing is None:
                raise
            raise missing from None  # the message says it all
        value = getattr(module, name)
        globals()[name] = value
        if "lightning.pytorch" in sys.modules:  # that import loaded lightning: register the strategies now
            importlib.import_module("lightning_srifty.strategies.planned")
        return value
    raise AttributeError(f"module 'lightning_srifty' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _AfterLightning(importlib.abc.MetaPathFinder):
    """Registers the srifty strategies (``srifty_ddp``, ``srifty_fsdp``, ``srifty_auto``) as soon as
    ``lightning.pytorch`` has loaded, when this package was imported first: ``import lightning_srifty`` and then
    ``Trainer(strategy="srifty_auto")`` work in either order, and this package stays torch-free until then.
    Lightning checks a strategy's name in ``Trainer()``, before it loads any entry point (``callbacks_factory``): a
    script that names ``srifty_auto`` must import this package (a trial's script without it stopped on every node)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "lightning.pytorch":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loaded = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            loaded(module)
            try:
                importlib.import_module("lightning_srifty.strategies.planned")
            except Exception as exc:  # noqa: BLE001 - never break the user's import of lightning
                warnings.warn(f"lightning-srifty could not register its strategies: {exc}", stacklevel=2)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if "lightning.pytorch" in sys.modules:  # lightning is loaded anyway: make strategy="srifty_ddp" work right away
    importlib.import_module("lightning_srifty.strategies.planned")  # srifty_ddp and srifty_auto
elif not any(isinstance(finder, _AfterLightning) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterLightning())
