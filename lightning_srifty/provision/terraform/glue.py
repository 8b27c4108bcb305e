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
import os
from dataclasses import dataclass

from lightning_srifty.provision.terraform.snapshot import Snapshot, read_member

SRIFTY_STRATEGIES = frozenset({"srifty_auto", "srifty_ddp", "srifty_ddp_spawn", "srifty_fsdp"})
PLAN_STRATEGY = "srifty_auto"  # the strategy that applies the plan's layout and per-rank batch
PLAN_CALL = "plan_strategy"  # the function that does the same
PACKAGE = "lightning_srifty"
MAX_MODULES = 200  # of the code read for the import, at most


@dataclass(frozen=True)
class ScriptGlue:
    strategies: frozenset[str]  # the srifty strategy names the script uses as values
    plan_strategy: bool  # it calls plan_strategy()
    imports_srifty: bool  # it, or a module of the code it imports, imports lightning_srifty

    @property
    def asks_for_the_plan(self) -> bool:
        return PLAN_STRATEGY in self.strategies or self.plan_strategy

    @property
    def unregistered(self) -> bool:
        """It names a srifty strategy that nothing of its code registers: Trainer() refuses it."""
        return bool(self.strategies) and not self.imports_srifty

    def unregistered_note(self, script: str) -> str | None:
        """What to say of ``script`` when it names a srifty strategy nothing of its code registers (else None)."""
        if not self.unregistered:
            return None
        names = " and ".join(f'"{n}"' for n in sorted(self.strategies))
        return (
            f"{script} names the strategy {names} but neither it nor a module of its code imports {PACKAGE}, which "
            f'registers the name: Trainer() refuses it on every node (Lightning\'s "invalid strategy name"). Add '
            f"`import {PACKAGE}` to {script}"
        )


def read_glue(snapshot: Snapshot, script: str) -> ScriptGlue | None:
    """The glue of ``script`` (a path in the snapshot); None where it is not there or does not parse."""
    if script not in snapshot.files:
        return None
    try:
        tree = ast.parse(read_member(snapshot, script).decode(errors="replace"))
    except SyntaxError:
        return None
    strategies, calls = set(), False
    for node in _code_nodes(tree):
        if isinstance(node, ast.Constant) and node.value in SRIFTY_STRATEGIES:
            strategies.add(str(node.value))
        elif isinstance(node, ast.Call):
            func = node.func
            calls |= (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) == PLAN_CALL
    return ScriptGlue(frozenset(strategies), calls, _imports_package(snapshot, script, tree))


def _code_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but the bare string statements (docstrings): they name nothing the code uses."""
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n for n in ast.walk(tree) if id(n) not in bare]


def _imports_package(snapshot: Snapshot, script: str, tree: ast.AST) -> bool:
    """Whether ``script`` or a module of the code it imports (found from the script's folder or the code's root, as
    the node's ``sys.path[0]`` and working folder find them) imports lightning_srifty."""
    seen, queue = {script}, [(script, tree)]
    while queue and len(seen) <= MAX_MODULES:
        path, node = queue.pop()
        for name, level in _imported(node):
            if name.split(".")[0] == PACKAGE and level == 0:
                return True
            for found in _local_files(snapshot, path, name, level):
                if found in seen:
                    continue
                seen.add(found)
                try:
                    queue.append((found, ast.parse(read_member(snapshot, found).decode(errors="replace"))))
                except SyntaxError:
                    continue
    return False


def _imported(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, level) of every import in ``tree``; ``from a import b`` gives a and a.b (b may be a module)."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            out.append((base, node.level))
            out += [(f"{base}.{alias.name}".lstrip("."), node.level) for alias in node.names]
    return out


def _local_files(snapshot: Snapshot, importer: str, name: str, level: int) -> list[str]:
    """The snapshot's files that ``import name`` (at ``level``) in ``importer`` loads: each package's
    ``__init__.py`` on the way and the module itself."""
    folder = os.path.dirname(importer)
    if level:
        for _ in range(level - 1):
            folder = os.path.dirname(folder)
        roots = [folder]
    else:
        roots = list(dict.fromkeys([folder, ""]))
    parts = [p for p in name.split(".") if p]
    found = []
    for root in roots:
        for depth in range(1, len(parts) + 1):
            stem = os.path.join(root, *parts[:depth])
            found += [f for f in (f"{stem}.py", os.path.join(stem, "__init__.py")) if f in snapshot.files]
    return found
