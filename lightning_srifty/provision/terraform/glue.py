"""What a training script asks of lightning-srifty, read from its source (``ast``, never run): the srifty strategies it
names, whether it applies the plan (``srifty_auto``, ``plan_strategy``), and whether it, or a module of its code
that it imports, imports ``lightning_srifty``.

Lightning checks a strategy's name in ``Trainer()``: ``strategy="srifty_auto"`` is a name only once this package
has registered it, which importing it does (before or after lightning). A script that names it without the import
stops on every node ("invalid strategy name"). Names count where the code uses them as values: a comment or a
docstring that mentions ``srifty_auto`` asks for nothing (a trial's script said it did, and got no warning).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import tarfile
from dataclasses import dataclass
from typing import Any

from lightning_srifty.provision.terraform.command import train_argv
from lightning_srifty.provision.terraform.script_imports import ProjectImports, project_imports
from lightning_srifty.provision.terraform.snapshot import Snapshot, read_member

PLAN_STRATEGY = "srifty_auto"  # the strategy that applies the plan's layout and per-rank batch
# its name with DDP's find_unused_parameters=True (as Lightning's ddp_find_unused_parameters_true: a GAN's)
PLAN_STRATEGIES = frozenset({PLAN_STRATEGY, "srifty_auto_find_unused_parameters_true"})
SRIFTY_STRATEGIES = PLAN_STRATEGIES | {
    "srifty_ddp",
    "srifty_ddp_spawn",
    "srifty_ddp_find_unused_parameters_true",
    "srifty_fsdp",
}
PLAN_CALL = "plan_strategy"  # the function that does the same
FABRIC_GUARD = "FabricPreemption"  # what a Fabric loop calls to checkpoint, resume and leave on a fleet
PACKAGE = "lightning_srifty"
MAX_SOURCE_BYTES = 2_000_000  # a Python file larger than this is data, not read
CONFIGS = (".yaml", ".yml")  # the config files whose _target_ / class_path / target the import walk follows


@dataclass(frozen=True)
class ScriptGlue:
    strategies: frozenset[str]  # the srifty strategy names the script uses as values
    plan_strategy: bool  # it calls plan_strategy() (under any name it imported it as)
    imports_srifty: bool | None  # it, or a module of the code it imports, imports lightning_srifty (None: not asked)
    fabric_only: bool = False  # it builds a Lightning Fabric and no Trainer (nor LightningCLI) of its own
    fabric_preemption: bool = False  # it calls FabricPreemption: its Fabric loop checkpoints, resumes and leaves

    def fabric_note(self, script: str) -> str | None:
        """What to say of a script that trains with Fabric (else None). Without :class:`FabricPreemption` (a trial: a
        Fabric script trained through the notice and started over on the replacements, and the rehearsal waited
        minutes for a first step nothing reported) it is a warning (:attr:`fabric_unguarded`); with it, what the
        loop keeps its own: the batch and the accumulation."""
        if not self.fabric_only:
            return None
        if self.fabric_preemption:
            return (
                f"{script} trains with Lightning Fabric and {FABRIC_GUARD}: the nodes train it as one job "
                "(LT_NUM_NODES), and the spot notice's checkpoint, the periodic checkpoints and the resume are "
                f"{FABRIC_GUARD}'s. Its batch and accumulation are its loop's: the plan's are "
                "launch_settings().batch_size and .accumulate_grad_batches (the same training as profiled)"
            )
        return (
            f"{script} trains with Lightning Fabric, not a Trainer, and does not call {FABRIC_GUARD}: the nodes train "
            "it as one job (LT_NUM_NODES), but on this fleet a spot notice ends it without a checkpoint, the "
            "replacements start it over, no node sees it hang, and srifty rehearse sees no step. Wrap its loop in "
            f"lightning_srifty.{FABRIC_GUARD} (docs/launch.md), or train with a Trainer"
        )

    @property
    def fabric_unguarded(self) -> bool:
        """A Fabric script whose loop nothing of srifty's watches: a notice ends it without a checkpoint."""
        return self.fabric_only and not self.fabric_preemption

    @property
    def asks_for_the_plan(self) -> bool:
        return bool(PLAN_STRATEGIES & set(self.strategies)) or self.plan_strategy

    @property
    def unregistered(self) -> bool:
        """It names a srifty strategy that nothing of its code is seen to register: Trainer() would refuse it."""
        return bool(self.strategies) and self.imports_srifty is False

    def unregistered_note(self, script: str) -> str | None:
        """What to say of ``script`` when it names a srifty strategy nothing of its code registers (else None). A
        package from the requirements may import it unseen: a warning, not a refusal."""
        if not self.unregistered:
            return None
        names = " and ".join(f'"{n}"' for n in sorted(self.strategies))
        return (
            f"{script} names the strategy {names} but neither it nor a module of its code imports {PACKAGE}, which "
            f"registers the name: unless a package of its requirements imports it, Trainer() refuses it on every node "
            f'(Lightning\'s "invalid strategy name"). Add `import {PACKAGE}` to {script}'
        )


def read_glue(snapshot: Snapshot, script: str, *, module: bool = False) -> ScriptGlue | None:
    """The glue of ``script`` (a path in the snapshot; ``module``: run as ``python -m``, which first runs its
    packages' ``__init__.py``); None where it is not there or does not parse."""
    sources = python_sources(snapshot)
    if script not in sources:
        return None
    try:
        tree = ast.parse(sources[script])
    except SyntaxError:
        return None
    strategies, calls, names = set(), False, set()
    imported = {  # what the script imported from the package, under the names it calls them
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE
        for alias in node.names
    }
    aliases = {PLAN_CALL} | {name for name, real in imported.items() if real == PLAN_CALL}
    for node in _code_nodes(tree):
        if isinstance(node, ast.Constant) and node.value in SRIFTY_STRATEGIES:
            strategies.add(str(node.value))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            calls |= called in aliases
            names.add(imported.get(called, called) if called else called)
    imports = _imports_srifty(snapshot, script, module) if strategies else None  # only asked of one that names one
    fabric_only = "Fabric" in names and not names & {"Trainer", "LightningCLI"}
    return ScriptGlue(frozenset(strategies), calls, imports, fabric_only, FABRIC_GUARD in names)


def command_glue(snapshot: Snapshot, argv: list[str]) -> ScriptGlue | None:
    """The glue of the training command's script (torchrun's argv: ``train.py ...`` or ``-m pkg.train ...``), with a
    LightningCLI's strategy from its arguments: ``--trainer.strategy X`` or a ``--config`` / ``-c`` file of the code
    that sets ``trainer: {strategy: X}`` (a trial: ``main.py fit --config config.yaml`` naming srifty_auto there was
    told it never asked for the plan)."""
    sources = python_sources(snapshot)
    if argv[0] != "-m":
        script = os.path.normpath(argv[0])
        glue, args = read_glue(snapshot, script), argv[1:]
    else:
        stem = argv[1].replace(".", "/")
        script = f"{stem}.py" if f"{stem}.py" in sources else f"{stem}/__main__.py"
        glue, args = read_glue(snapshot, script, module=True), argv[2:]
    named = cli_strategies(snapshot, args) & SRIFTY_STRATEGIES
    if glue is None or not named - glue.strategies:
        return glue
    imports = glue.imports_srifty if glue.strategies else _imports_srifty(snapshot, script, argv[0] == "-m")
    return dataclasses.replace(glue, strategies=glue.strategies | named, imports_srifty=imports)


def cli_strategies(snapshot: Snapshot, args: list[str]) -> set[str]:
    """The Trainer strategies a LightningCLI command names: ``--trainer.strategy[=]X`` and ``trainer.strategy`` of
    each ``--config[=]`` / ``-c`` YAML file of the code (a file it cannot read names nothing)."""
    return {v for _, v in cli_trainer_values(snapshot, args, "strategy") if isinstance(v, str)}


def cli_trainer_values(snapshot: Snapshot, args: list[str], key: str) -> list[tuple[str, Any]]:
    """What a LightningCLI command gives the Trainer's ``key``, as (where, value) in the order LightningCLI applies
    them, the command line's (the last wins): ``trainer.<key>`` of a ``--config[=]`` / ``-c`` YAML file of the code
    (where: its path) and ``--trainer.<key>[=]X`` (where: that argument; YAML-read: ``600`` is a number). A file it
    cannot read gives nothing."""
    import yaml

    out: list[tuple[str, Any]] = []
    configs = iter(cli_configs(args))  # in the command's order, as the arguments that name them
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        raw = value if eq else args[i + 1] if i + 1 < len(args) else ""
        if name in ("--config", "-c") and raw:
            path = next(configs)
            try:
                config = yaml.safe_load(read_member(snapshot, path))
            except (KeyError, OSError, yaml.YAMLError):
                continue
            trainer = config.get("trainer") if isinstance(config, dict) else None
            if isinstance(trainer, dict) and trainer.get(key) is not None:
                out.append((path, trainer[key]))
        elif name == f"--trainer.{key}":
            try:
                out.append((name, yaml.safe_load(raw)))
            except yaml.YAMLError:
                out.append((name, raw))
    return out


@functools.lru_cache(maxsize=8)
def _texts_of(archive: str, sha256: str) -> tuple[dict[str, str], dict[str, str]]:
    """The snapshot's Python files and its YAML files (path -> text), in one pass of its archive."""
    with tarfile.open(archive, "r:gz") as tar:  # one pass: a member's own read would decompress from the start
        sources: dict[str, str] = {}
        configs: dict[str, str] = {}
        for member in tar:
            kind = sources if member.name.endswith(".py") else configs if member.name.endswith(CONFIGS) else None
            handle = tar.extractfile(member) if member.isfile() and kind is not None else None
            if handle is not None and kind is not None and member.size <= MAX_SOURCE_BYTES:
                kind[member.name] = handle.read().decode(errors="replace")
        return sources, configs


def _sources_of(archive: str, sha256: str) -> dict[str, str]:
    return _texts_of(archive, sha256)[0]


def python_sources(snapshot: Snapshot) -> dict[str, str]:
    """Every Python file of the snapshot (path -> source), read in one pass of its archive and kept for the next
    caller (srifty terraform reads the script's glue three times)."""
    return _sources_of(str(snapshot.path), snapshot.sha256)


def _code_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but the bare string statements (docstrings): they name nothing the code uses."""
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n for n in ast.walk(tree) if id(n) not in bare]


@functools.lru_cache(maxsize=16)
def _walk_of(archive: str, sha256: str, script: str, module: bool, used: tuple[str, ...]) -> ProjectImports:
    sources, configs = _texts_of(archive, sha256)
    return project_imports(sources, lambda f: sources.get(f, ""), script, module, configs, used)


def project_walk(
    snapshot: Snapshot, script: str, module: bool = False, configs_used: tuple[str, ...] = ()
) -> ProjectImports:
    """The imports of ``script`` and of the project modules it imports, transitively, as the nodes' Python runs them
    (:func:`~lightning_srifty.provision.terraform.script_imports.project_imports`; ``module``: ``python -m``), over
    the snapshot's Python files, with the targets its YAML files name (``configs_used``: the command's ``--config``
    files, whose targets surely run); kept for the next caller (the script check and the glue read the same walk)."""
    return _walk_of(str(snapshot.path), snapshot.sha256, script, module, configs_used)


def cli_configs(args: list[str]) -> list[str]:
    """The config files a LightningCLI command names (``--config[=]X``, ``-c X``), as paths of the code folder."""
    out = []
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if key in ("--config", "-c") and value:
            out.append(os.path.normpath(value))
    return out


def _imports_srifty(snapshot: Snapshot, script: str, module: bool) -> bool:
    """Whether ``script`` or a module of the code it imports imports lightning_srifty (guarded or lazily too)."""
    return PACKAGE in project_walk(snapshot, script, module).needed


def asks_for_the_plan(snapshot: Snapshot, train_command: str) -> bool | None:
    """Whether the training script's code uses the plan's strategy (``srifty_auto``, ``plan_strategy()``), which
    applies the plan's layout and per-rank batch (:mod:`.glue`: a comment or a docstring asks for nothing); None where
    it cannot be read (a script not in the snapshot or that does not parse)."""
    glue = command_glue(snapshot, train_argv(train_command))
    return None if glue is None else glue.asks_for_the_plan


def unregistered_strategy_note(snapshot: Snapshot, train_command: str) -> str | None:
    """What to say of a script that names a srifty strategy nothing of its code registers (None: nothing)."""
    argv = train_argv(train_command)
    glue = command_glue(snapshot, argv)
    return None if glue is None else glue.unregistered_note(argv[1] if argv[0] == "-m" else argv[0])
