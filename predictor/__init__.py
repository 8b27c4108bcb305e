"""predictor: profiles in, ranked fleets out; never imports torch or lightning.

By concept, each a package (docs/architecture.md draws the arrows; none points up):

- :mod:`~predictor.documents`: the profile, the plan, the request vocabulary, their schemas, atomic I/O, checks;
- :mod:`~predictor.catalog`: GPUs, instance types, prices, fleets;
- :mod:`~predictor.model`: the performance model (time, memory, cost, uncertainty; spot and deadlines);
- :mod:`~predictor.ranking`: candidates under constraints, ranked, as a plan; re-planning; the HTML report;
- :mod:`~predictor.service`: the HTTP service and its client;
- :mod:`~predictor.validation`: the model scored on published measurements (``srifty eval``);
- :mod:`~predictor.recommend` on top (``srifty recommend``), and :mod:`~predictor.exceptions` below everything.

The names below load when first used, so that ``import predictor.exceptions`` stays cheap (``rank`` and
``predict`` are not among them: ``predictor.rank`` and ``predictor.predict`` are 0.2's module paths; import them from
``predictor.ranking`` and ``predictor.model``). Module paths from before
the packages (``predictor.rank``, ``predictor.profile``, ...) still import, with a ``DeprecationWarning``, until 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

_LAZY = {
    "Catalog": "predictor.catalog",
    "Constraints": "predictor.ranking",
    "Plan": "predictor.documents",
    "Prediction": "predictor.model",
    "Profile": "predictor.documents",
    "ServiceClient": "predictor.service",
    "SriftyError": "predictor.exceptions",
    "Work": "predictor.documents",
    "load_plan": "predictor.documents",
    "load_profile": "predictor.documents",
}
__all__ = sorted(_LAZY)

# the module paths before the packages (0.2) -> where they are now; removed in 0.3
MOVED = {
    "_io": "documents.atomic",
    "_schema": "documents.schema",
    "_validation": "documents.checks",
    "profile": "documents.profile",
    "plan": "documents.plan",
    "work": "documents.work",
    "fleet": "catalog.fleet",
    "predict_many": "model.fleets",
    "predict": "model.predict",
    "layout": "model.layout",
    "spot": "runs.spot",
    "startup": "runs.startup",
    "stats": "model.stats",
    "deadline": "runs.deadline",
    # issue #39: what a run pays besides steps left the step model for runs/
    "model.spot": "runs.spot",
    "model.startup": "runs.startup",
    "model.deadline": "runs.deadline",
    # 2026-12-01: what a type can run at all is the catalog's rule, read by the model's predictions and the ranking
    "ranking.feasible": "catalog.feasible",
    "perf": "model",
    **{
        f"perf.{name}": f"model.{name}"
        for name in (
            "artefact",
            "basis",
            "batch",
            "compute",
            "correction",
            "kernels",
            "memory",
            "network",
            "ops",
            "scaling",
            "uncertainty",
        )
    },
    "rank": "ranking",
    "replan": "ranking.replan",
    "report": "ranking.report",
    "service_guard": "service.guard",
    "service_answers": "service.answers",
    "observations": "service.observations",
    "client": "service.client",
    "evaluation": "validation",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'predictor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str, until: str) -> None:
        self.old, self.new, self.until = old, new, until

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there (the old path goes in lightning-srifty "
            f"{self.until})",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system stamped the alias's spec on the real module: put it back


class MovedModules(importlib.abc.MetaPathFinder):
    """``import package.old`` gives the module now at ``package.new`` itself (not a copy, so monkeypatching and
    ``isinstance`` see one thing), with a ``DeprecationWarning``; ``moved`` maps old to new, both under ``package``.
    Used here and by ``lightning_srifty``'s own old paths."""

    def __init__(self, package: str, moved: dict[str, str], until: str = "0.3") -> None:
        self.package, self.moved, self.until = package, moved, until

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        head, _, tail = fullname.partition(".")
        if head != self.package or tail not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _Alias(fullname, f"{self.package}.{self.moved[tail]}", self.until)
        )

    def install(self) -> None:
        # first: an old name under a moved package (predictor.perf.ops) would otherwise be found again through the
        # new package's __path__, and loaded a second time under the old name
        if not any(isinstance(f, MovedModules) and f.package == self.package for f in sys.meta_path):
            sys.meta_path.insert(0, self)


MovedModules(__name__, MOVED).install()
