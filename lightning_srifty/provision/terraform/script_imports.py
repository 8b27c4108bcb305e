"""What a training script imports, as Python would run it on the nodes: the script's own imports and, through the
project's modules it imports (files of the code snapshot), theirs, so that ``srifty check`` sees a package a helper
module needs (``train.py`` -> ``models/net.py`` -> ``import timm``) before a fleet is paid for, not only one the
script names. Static: ``ast`` only, nothing of the project is imported or run here.

Where a project module is found: a name the script imports is looked up in the script's own folder (``sys.path[0]``
of ``python sub/train.py``), then at the code folder's top (where the nodes ``cd`` and run the command; ``-m`` puts
it on the path); a relative import in the folder of the module that makes it. Importing ``a.b.c`` runs
``a/__init__.py`` and ``a/b/__init__.py`` before ``a/b/c.py`` (a folder without ``__init__.py`` is a namespace
package: nothing of its own runs), and ``from a import b`` runs ``a/b.py`` too when it is a module there. What
Python cannot see statically is not followed: ``importlib.import_module`` of a computed name, a path a script adds to
``sys.path`` itself, ``__import__``.
"""

from __future__ import annotations

import ast
import posixpath
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

_CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
# try, and try with except* (Python 3.11+)
TRIES: tuple[type, ...] = tuple(t for t in (getattr(ast, name, None) for name in ("Try", "TryStar")) if t)


@dataclass(frozen=True)
class ImportStatement:
    """One ``import`` or ``from ... import`` that runs (not under ``if TYPE_CHECKING:``)."""

    module: str  # as written: "a.b" ("" for ``from . import x``)
    level: int  # 0: absolute; n: relative, from n - 1 packages above the importing module's
    names: tuple[str, ...]  # ``from m import a, b``: a and b (each may be a submodule); () for ``import m``
    optional: bool  # the module runs without it: guarded by a try whose handler takes an ImportError and goes on
    deferred: bool = False  # in a function's body: it runs when the function is called, not on import


# How sure it is that an import runs, along the way from the script (the greatest level on the way, the least over
# the ways): when the script runs; only when a project module's function that makes it is called (a lazy import, the
# way a library defers an optional package: the script's own functions are taken to run); or only where a guard
# lets the script go on without it.
RUNS, DEFERRED, OPTIONAL = 0, 1, 2


def import_statements(source: str) -> list[ImportStatement]:
    """The imports of ``source`` that run, in the order ``ast.walk`` meets them. Raises SyntaxError."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        guard, deferred = _import_guard(node, parents)
        if guard == "never":
            continue
        optional = guard == "optional"
        if isinstance(node, ast.Import):
            out += [ImportStatement(alias.name, 0, (), optional, deferred) for alias in node.names]
        else:
            names = tuple(a.name for a in node.names)
            out.append(ImportStatement(node.module or "", node.level, names, optional, deferred))
    return out


def imported_modules(source: str) -> dict[str, bool]:
    """Top-level names of the absolute imports in ``source`` (``import a.b`` -> a; relative imports left out), each
    with whether the script runs without it: True when every import of the name is guarded by a ``try`` whose
    handlers take an ``ImportError`` (``ModuleNotFoundError``, ``Exception``, a bare ``except``), the way optional
    loggers and accelerators are imported. Imports under ``if TYPE_CHECKING:`` never run and are left out."""
    optional: dict[str, bool] = {}
    for s in import_statements(source):
        if s.level == 0 and s.module:
            name = s.module.split(".")[0]
            optional[name] = optional.get(name, True) and s.optional
    return optional


def _import_guard(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> tuple[str, bool]:
    """``never`` (under ``if TYPE_CHECKING:``, wherever in its ancestors), ``optional`` (in the body of a ``try``
    whose handler takes an ImportError and goes on: a handler that raises or exits makes the import required, with a
    message) or ``required``; and whether it is in a function's body. A function's body runs later, outside the
    ``try`` around its ``def``: the walk for the ``try`` stops there."""
    guard, child, in_function = "required", node, False
    while child in parents:
        parent = parents[child]
        if isinstance(parent, ast.If) and child in parent.body and _names_type_checking(parent.test):
            return "never", in_function
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if not in_function and (_guards(parent, child) or _if_available(parent, child)):
            guard = "optional"
        child = parent
    return guard, in_function


def _guards(parent: ast.AST, child: ast.AST) -> bool:
    """``child`` is in the body of the ``try`` ``parent``, one of whose handlers takes an ImportError and goes on."""
    tried: Any = parent
    return isinstance(parent, TRIES) and child in tried.body and any(_catches_import_error(h) for h in tried.handlers)


# what a test that asks whether a package can be imported calls: importlib's, lightning_utilities' (Lightning's own
# flags, e.g. _WANDB_AVAILABLE = RequirementCache("wandb")), pkgutil's
_PROBES = {"find_spec", "find_loader", "module_available", "package_available", "RequirementCache"}


def _if_available(parent: ast.AST, child: ast.AST) -> bool:
    """``child`` is in the body of an ``if`` that asks whether a package is there, the way libraries import an
    optional one: ``if _LITSERVE_AVAILABLE:``, ``if is_wandb_available():``, ``if find_spec("wandb"):``. Its
    ``else`` runs when it is not: an import there is required."""
    if not (isinstance(parent, ast.If) and child in parent.body):
        return False
    for node in ast.walk(parent.test):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if "available" in name.lower() or name in _PROBES:
            return True
    return False


def _names_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    """The handler takes an ImportError and lets the script go on (its last statement neither raises nor exits)."""
    last = handler.body[-1] if handler.body else None
    if isinstance(last, ast.Raise) or (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and (
            (isinstance(last.value.func, ast.Name) and last.value.func.id in ("exit", "quit"))
            or (isinstance(last.value.func, ast.Attribute) and last.value.func.attr in ("exit", "_exit"))
        )
    ):
        return False
    if handler.type is None:
        return True
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        (isinstance(c, ast.Name) and c.id in _CATCHES_IMPORT_ERROR)
        or (isinstance(c, ast.Attribute) and c.attr in _CATCHES_IMPORT_ERROR)
        for c in caught
    )


def top_name(rel: str) -> str:
    """The importable name a code file provides at the top folder: ``pkg/x.py`` -> pkg, ``mod.py`` -> mod."""
    top = rel.split("/", 1)[0]
    return top[:-3] if top.endswith(".py") else top


@dataclass(frozen=True)
class Needed:
    """A name from outside the project that the script needs, and where: the first module (in the walk from the
    script, breadth first) that imports it at its surest level."""

    level: int  # RUNS, DEFERRED or OPTIONAL: the surest way to it
    where: str  # the project file whose import it is
    via: tuple[str, ...]  # the files the script's imports pass through to ``where`` (the script first)


@dataclass
class ProjectImports:
    """What :func:`project_imports` found."""

    needed: dict[str, Needed] = field(default_factory=dict)  # top-level names from outside the project
    modules: list[str] = field(default_factory=list)  # the project files read, the script first
    # a project file that does not parse: file -> (the error, via, level), as last walked
    unparsed: dict[str, tuple[str, tuple[str, ...], int]] = field(default_factory=dict)


def project_imports(
    files: Iterable[str], read: Callable[[str], str], script: str, run_as_module: bool = False
) -> ProjectImports:
    """The imports of ``script`` and of every project module it imports, transitively (``files``: the code
    snapshot's, relative POSIX paths; ``read``: a file's text). ``run_as_module``: the command is ``-m pkg.train``,
    so ``script`` is ``pkg/train.py`` and its packages' ``__init__.py`` run first. An import's level (:data:`RUNS`,
    :data:`DEFERRED`, :data:`OPTIONAL`) is its own, or that of the import that brought its module in if greater."""
    found = ProjectImports()
    finder = _Finder(set(files), script, run_as_module)
    walked: dict[str, int] = {}  # file -> level, as last walked: walked again when reached at a surer level
    queue: deque[tuple[str, int, tuple[str, ...]]] = deque()
    command = "python -m " + script[: -len(".py")].replace("/", ".").removesuffix(".__main__")
    for path in finder.packages_of(script) if run_as_module else []:  # what python -m runs before the script
        queue.append((path, RUNS, (command, path)))
    queue.append((script, RUNS, (script,)))
    while queue:
        path, level, via = queue.popleft()
        if path in walked and walked[path] <= level:
            continue
        if path not in walked:
            found.modules.append(path)
        walked[path] = level
        try:
            statements = import_statements(read(path))
        except (SyntaxError, ValueError) as exc:  # ValueError: source with a NUL byte
            found.unparsed[path] = (str(exc), via, level)
            continue
        for s in statements:
            own = OPTIONAL if s.optional else DEFERRED if s.deferred and path != script else RUNS
            targets = finder.resolve(s, path)
            if targets is None:
                _need(found.needed, s.module.split(".")[0], max(level, own), path, via)
            for target in targets or ():
                queue.append((target, max(level, own), via if target in via else (*via, target)))
    return found


def _need(needed: dict[str, Needed], name: str, level: int, where: str, via: tuple[str, ...]) -> None:
    known = needed.get(name)
    if known is None or level < known.level:
        needed[name] = Needed(level, where, via)


class _Finder:
    """Where the project's files answer an import (see the module docstring)."""

    def __init__(self, files: set[str], script: str, run_as_module: bool) -> None:
        self.files = files
        self.folders = {posixpath.dirname(f) for f in files}
        for f in list(self.folders):
            while f:
                f = posixpath.dirname(f)
                self.folders.add(f)
        own = "" if run_as_module else posixpath.dirname(script)
        self.roots = [own, ""] if own else [""]

    def packages_of(self, script: str) -> list[str]:
        """The ``__init__.py`` files ``python -m`` runs before ``script`` (``a/b/train.py``: a's, then b's)."""
        parts = script.split("/")[:-1]
        return [p for i in range(1, len(parts) + 1) if (p := "/".join(parts[:i]) + "/__init__.py") in self.files]

    def resolve(self, s: ImportStatement, importer: str) -> list[str] | None:
        """The project files ``s`` runs, in order ([] when it is the project's but runs nothing of it: a namespace
        package, a relative import of a name defined in its package); None when it is not the project's."""
        if s.level:
            base = posixpath.dirname(importer)
            for _ in range(s.level - 1):
                base = posixpath.dirname(base)
            parts = s.module.split(".") if s.module else []
            return self._with_names(self._walk(base, parts, first=False) or [], base, parts, s.names)
        parts = s.module.split(".")
        for root in self.roots:
            ran = self._walk(root, parts, first=True)
            if ran is not None:
                return self._with_names(ran, root, parts, s.names)
        return None

    def _walk(self, base: str, parts: list[str], *, first: bool) -> list[str] | None:
        """The files importing ``parts`` under ``base`` runs; None when the first part is not there (``first``: an
        absolute import, which then looks elsewhere)."""
        ran: list[str] = []
        here = base
        for i, part in enumerate(parts):
            here = posixpath.join(here, part)
            if f"{here}/__init__.py" in self.files:
                ran.append(f"{here}/__init__.py")
            elif f"{here}.py" in self.files:
                ran.append(f"{here}.py")
                break  # a module: the rest are its attributes
            elif here not in self.folders:
                return None if (first and i == 0) else ran
        return ran

    def _with_names(self, ran: list[str], base: str, parts: list[str], names: tuple[str, ...]) -> list[str]:
        """``from package import name`` runs ``package/name.py`` (or its ``__init__.py``) when it is a module."""
        if ran and ran[-1].endswith(".py") and not ran[-1].endswith("/__init__.py"):
            return ran
        package = posixpath.join(base, *parts) if parts else base
        for name in names:
            for candidate in (posixpath.join(package, name, "__init__.py"), posixpath.join(package, f"{name}.py")):
                if candidate in self.files:
                    ran.append(candidate)
                    break
        return ran
