"""What Lightning needs beyond its own install for a class a script or its config uses.

``lightning`` installs without the packages some of its classes run on: it imports them when the class is built and
raises there (``LightningCLI``: ``ModuleNotFoundError: Requirement 'jsonargparse[signatures]>=4.27.7' not met``, from
``lightning/pytorch/cli.py``'s ``_JSONARGPARSE_SIGNATURES_AVAILABLE``; ``WandbLogger``: ``Requirement 'wandb>=0.12.10'
not met``). The import walk sees ``lightning`` and passes, so a LightningCLI project without jsonargparse in its
requirements passed ``srifty check`` and would have failed on every node at start-up (a trial), and so would a config's
``logger: class_path: lightning.pytorch.loggers.WandbLogger`` without wandb. Each use is found where it is written:
the names the walked Python files use (an import, a call, an attribute; not a comment), the ``class_path`` values and
``trainer.strategy`` of the command's config files, and the command's own ``--trainer.*`` arguments.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    """A Lightning class that runs on a package Lightning does not install."""

    names: tuple[str, ...]  # how code or a config names it (the class, its module; "strategy=deepspeed": a strategy)
    modules: tuple[str, ...]  # the top-level module it imports (any one of them will do)
    requirement: str  # what to add to the requirements file, as Lightning's own check names it
    what: str  # the class, for a finding


EXTRAS = (
    Extra(("LightningCLI", "lightning.pytorch.cli", "pytorch_lightning.cli"), ("jsonargparse",),
          "jsonargparse[signatures]", "LightningCLI"),
    Extra(("WandbLogger",), ("wandb",), "wandb", "WandbLogger"),
    Extra(("MLFlowLogger",), ("mlflow",), "mlflow", "MLFlowLogger"),
    Extra(("CometLogger",), ("comet_ml",), "comet-ml", "CometLogger"),
    Extra(("NeptuneLogger",), ("neptune",), "neptune", "NeptuneLogger"),
    Extra(("TensorBoardLogger",), ("tensorboard", "tensorboardX"), "tensorboard", "TensorBoardLogger"),
    Extra(("DeepSpeedStrategy", "strategy=deepspeed"), ("deepspeed",), "deepspeed", "DeepSpeedStrategy"),
    Extra(("BitsandbytesPrecision",), ("bitsandbytes",), "bitsandbytes", "BitsandbytesPrecision"),
)  # fmt: skip

_CLASS_PATH = re.compile(r"""^[ \t-]*["']?class_path["']?[ \t]*:[ \t]*["']?([A-Za-z_][\w.]*)""", re.MULTILINE)
_STRATEGY = re.compile(r"""^[ \t]*["']?strategy["']?[ \t]*:[ \t]*["']?(deepspeed\w*)""", re.MULTILINE)


def _code_names(source: str) -> set[str]:
    """The names a Python file's code uses: imported modules and names, names and attributes, and a ``strategy=``
    keyword's "deepspeed..." (other strings, comments and docstrings name nothing)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif (
            isinstance(node, ast.keyword)
            and node.arg == "strategy"
            and isinstance(node.value, ast.Constant)
            and str(node.value.value).startswith("deepspeed")
        ):
            out.add("strategy=deepspeed")  # Trainer(strategy="deepspeed_stage_2")
    return out


def _config_names(text: str) -> set[str]:
    """The class names a config's ``class_path`` values give (their last part: LightningCLI takes a bare class name
    too) and a ``strategy: deepspeed...`` (as ``strategy=deepspeed``)."""
    out = {path.rsplit(".", 1)[-1] for path in _CLASS_PATH.findall(text)}
    out.update(path for path in _CLASS_PATH.findall(text))
    return out | ({"strategy=deepspeed"} if _STRATEGY.search(text) else set())


def _argument_names(args: Iterable[str]) -> set[str]:
    """The class names the command's ``--trainer.*`` / ``--model.*`` / ``--data.*`` arguments give
    (``--trainer.logger=WandbLogger``, ``--trainer.strategy deepspeed_stage_2`` as ``strategy=deepspeed``)."""
    out: set[str] = set()
    args = list(args)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if not name.startswith(("--trainer.", "--model.", "--data.")):
            continue
        raw = value if eq else args[i + 1] if i + 1 < len(args) else ""
        out.update({raw, raw.rsplit(".", 1)[-1]})
        if name == "--trainer.strategy" and raw.startswith("deepspeed"):
            out.add("strategy=deepspeed")
    return out


def lightning_uses(
    sources: Mapping[str, str], files: Iterable[str], configs: Mapping[str, str], args: Iterable[str]
) -> dict[Extra, str]:
    """Each :data:`EXTRAS` class the job uses -> where it is first named: a walked Python file of ``files`` (their
    ``sources``), a config file of ``configs`` (path -> text), or "the command"."""
    found: dict[Extra, str] = {}
    seen = [(f, _code_names(sources.get(f, ""))) for f in files if f.endswith(".py")]
    seen += [(path, _config_names(text)) for path, text in configs.items()]
    seen.append(("the command", _argument_names(args)))
    for where, names in seen:
        for extra in EXTRAS:
            if extra not in found and names & set(extra.names):
                found[extra] = where
    return found
