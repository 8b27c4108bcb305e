"""Old module paths (before the sub-packages) keep working for one release, with a ``DeprecationWarning``.

``import lightning_srifty.callback`` gives the module now at ``lightning_srifty.profiling.callback`` itself (not a
copy), so monkeypatching and ``isinstance`` see one thing. Installed by ``lightning_srifty/__init__.py``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old -> new (under lightning_srifty); removed in 0.3
MOVED = {
    "callback": "profiling.callback",
    "recorder": "profiling.recorder",
    "clock": "timing",
    "profiling.clock": "timing",  # 0.2's home: shared by profiling and ddp now, so neither imports the other for it
    "assemble": "profiling.assemble",
    "flops": "profiling.flops",
    "model_info": "profiling.model_info",
    "hardware": "profiling.hardware",
    "capture": "profiling.capture",
    "ops_capture": "profiling.ops_capture",
    "cuda_autocast": "profiling.cuda_autocast",
    "strategy": "ddp.strategy",
    "comm": "ddp.comm",
    "hetero": "ddp.hetero",
    "preemption": "migrate.preemption",
    "spot_watcher": "migrate.spot_watcher",
    "triggers": "migrate.triggers",
    "imds": "migrate.imds",
    "markers": "protocol",
    "imds_sim": "provision.imds_sim",
    "launch": "provision.launch",
    "report": "console",
    "cli_capture": "cli.capture",
    "cli_catalog": "cli.catalog",
    "cli_eval": "cli.eval",
    "cli_launch": "cli.launch",
    "cli_predict": "cli.predict",
    "cli_recommend": "cli.recommend",
    "cli_serve": "cli.serve",
    "cli_terraform": "cli.terraform",
}
PACKAGE = "lightning_srifty"


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{self.old} moved to {self.new}; import it from there (the old path goes in lightning-srifty 0.3)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the import system stamped the alias's spec on the real module: put it back


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        head, _, tail = fullname.partition(".")
        if head != PACKAGE or tail not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, f"{PACKAGE}.{MOVED[tail]}"))


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
