"""What a training script imports, as Python would run it on the nodes: the script's own imports and, through the
project's modules it imports (files of the code snapshot), theirs, so that ``srifty check`` sees a package a helper
module needs (``train.py`` -> ``models/net.py`` -> ``import timm``) before a fleet is paid for, not only one the
script names. Static: ``ast`` only, nothing of the project is imported or run here.

Where a project module is found: a name the script imports is looked up in the script's own folder (``sys.path[0]``
of ``python sub/train.py``), then at the code folder's top (where the nodes ``cd`` and run the command; ``-m`` puts
it on the path); a relative import in the folder of the module that makes it. Importing ``a.b.c`` runs
``a/__init__.py`` and ``a/b/__init__.py`` before ``a/b/c.py`` (a folder without ``__init__.py`` is a namespace
package: nothing of its own runs; one with no Python beneath is data, not a package), and ``from a import b`` runs
``a/b.py`` too when it is a module there; an imported module's ``if __name__ == "__main__":`` block does not run.
``importlib.import_module("a.b")`` and ``__import__("a.b")`` with the name written out run as ``import a.b``, and a
Hydra ``_target_``, a LightningCLI ``class_path`` or a latent-diffusion ``target`` in the project's YAML files as one
that runs if the job's config names it (:func:`config_targets`; surely in a ``--config`` file of the command). What
Python cannot see statically is not followed: an import of a computed name, code ``exec``'d from a file; a module
that names ``sys.path`` (or rootutils) is taken to put the code folder's top on the path
(:attr:`ProjectImports.adjusts_path`).
"""

from __future__ import annotations

import ast
import importlib.util
import posixpath
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
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
    optional: bool  # the module runs without it: a guard (:func:`_import_guard`) lets it go on
    deferred: bool = False  # in a function's body: it runs when the function is called, not on import
    source: str = ""  # the statement as written (``ast.unparse``: "from .models import Net as N")

    def written(self) -> str:
        """The statement as the source has it: "from .models import Net as N", "import a.b"."""
        if self.source:
            return self.source
        if not self.names:
            return f"import {self.module}"
        return f"from {'.' * self.level}{self.module} import {', '.join(self.names)}"


# How sure it is that an import runs, along the way from the script (the greatest level on the way, the least over
# the ways): when the script runs; only when a project module's function that makes it is called (a lazy import, the
# way a library defers an optional package: the script's own functions are taken to run); or only where a guard
# lets the script go on without it.
RUNS, DEFERRED, CONFIGURED, OPTIONAL = 0, 1, 2, 3  # CONFIGURED: only through a config file's target


# a Hydra ``_target_: a.b.C``, a LightningCLI / jsonargparse ``class_path: a.b.C`` or a latent-diffusion style
# ``target: a.b.C`` (its ``instantiate_from_config``: CompVis/stable-diffusion, ldm; YAML, or JSON's quoted keys): a
# dotted name the job imports when it builds what the config describes
_CONFIG_TARGET = re.compile(
    r"""^\ufeff?[ \t-]*["']?(_target_|class_path|target)["']?[ \t]*:[ \t]*["']?([A-Za-z_]\w*(?:\.\w+)+)["']?[ \t]*,?"""
    r"""[ \t]*(?:#[^\r\n]*)?\r?$""",
    re.MULTILINE,
)
# ``target`` is a common word in configs (a metric, a file, a host: ``target: labels.v2.csv``), so its value counts
# only with two dots at least (``ldm.models.diffusion.ddpm.LatentDiffusion``, ``torch.nn.Identity``), and then only
# where it names a module of the project or one installed here (:func:`project_imports`): a value of a config's own
# is never reported as a package the nodes lack
_BARE_TARGET_DOTS = 2
# the keys, as the check's findings name them
CONFIG_KEYS = "_target_, class_path or target"


def config_targets(text: str, bare: bool = True) -> list[str]:
    """The dotted names a config file's ``_target_`` / ``class_path`` / ``target`` keys name, in order, each once
    (``__main__.X``, the running script's own, left out: the script is walked anyway; a ``target`` with fewer than
    two dots left out: see :data:`_BARE_TARGET_DOTS`). ``bare=False``: those of the ``_target_`` and ``class_path``
    keys only."""
    names = (
        name
        for key, name in _CONFIG_TARGET.findall(text)
        if key != "target" or (bare and name.count(".") >= _BARE_TARGET_DOTS)
    )
    return [t for t in dict.fromkeys(names) if not t.startswith("__main__.")]


def _installed_here(top: str) -> bool:
    """Whether this machine's Python finds a top-level module ``top`` (nothing is imported)."""
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # a module in sys.modules without a spec, a name find_spec refuses
        return False


def import_statements(source: str, filename: str = "<unknown>", imported: bool = False) -> list[ImportStatement]:
    """The imports of ``source`` that run, in the order ``ast.walk`` meets them. ``imported``: the source is a
    module the script imports, not the script, so its ``if __name__ == "__main__":`` block never runs. Raises
    SyntaxError (naming ``filename``)."""
    tree = ast.parse(source, filename=filename)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        named = _imported_by_call(node)
        if not (named or isinstance(node, (ast.Import, ast.ImportFrom))):
            continue
        guard, deferred = _import_guard(node, parents, imported)
        if guard == "never":
            continue
        optional = guard == "optional"
        if named:
            out.append(ImportStatement(named, 0, (), optional, deferred))
        elif isinstance(node, ast.Import):
            out += [ImportStatement(alias.name, 0, (), optional, deferred) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names)
            out.append(ImportStatement(node.module or "", node.level, names, optional, deferred, ast.unparse(node)))
    return out


def _imported_by_call(node: ast.AST) -> str:
    """The module ``importlib.import_module("a.b")`` or ``__import__("a.b")`` imports when its name is written out
    (an absolute one; "" otherwise: a computed name, a relative one, not such a call). It runs as ``import a.b``."""
    if not (isinstance(node, ast.Call) and node.args):
        return ""
    func = node.func
    importlib_s = (isinstance(func, ast.Name) and func.id in ("import_module", "__import__")) or (
        isinstance(func, ast.Attribute)
        and func.attr == "import_module"
        and isinstance(func.value, ast.Name)
        and func.value.id == "importlib"
    )  # importlib.import_module, one imported by name, the builtin: not another object's import_module
    if not importlib_s:
        return ""
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value[:1].isidentifier():
        return first.value
    return ""


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


def _import_guard(node: ast.AST, parents: dict[ast.AST, ast.AST], imported: bool) -> tuple[str, bool]:
    """``never`` (under ``if TYPE_CHECKING:``, wherever in its ancestors; in an imported module's ``if __name__ ==
    "__main__":``), ``optional`` (in the body of a ``try`` whose handler takes an ImportError and goes on: a handler
    that raises or exits makes the import required, with a message; under an ``if`` that asks whether a package is
    installed; in a branch on the Python version or the platform) or ``required``; and whether it is deferred: in a
    function's body, a method's included (a LightningModule's run, but a library's many DataModules run one). A
    function's body runs later, outside the ``try`` around its ``def``: the walk for the ``try`` stops there."""
    guard, child, in_function, deferred = "required", node, False, False
    relative = isinstance(node, ast.ImportFrom) and node.level > 0  # its failure is a plain ImportError
    while child in parents:
        parent = parents[child]
        if isinstance(parent, ast.If) and child in parent.body and _names_type_checking(parent.test):
            return "never", deferred
        if isinstance(parent, ast.If) and _names_main(parent.test):
            # which branch runs: the one for __main__ in the script, the other in a module it imports
            main_branch = parent.body if isinstance(parent.test.ops[0], ast.Eq) else parent.orelse  # type: ignore[attr-defined]
            if (child in main_branch) == imported:
                return "never", deferred
        if isinstance(parent, ast.If) and _names_own_package(parent.test):
            guard = "optional"  # `if __package__:` / `if __spec__ is None:`: how it was run picks the branch
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = deferred = True
        if not in_function and (
            _guards(parent, child, relative) or _if_available(parent, child) or _if_version(parent)
        ):
            guard = "optional"
        child = parent
    return guard, deferred


def _names_own_package(test: ast.expr) -> bool:
    """A test of the module's own ``__package__`` or ``__spec__`` (the dual-use script's way to pick its imports)."""
    return any(isinstance(n, ast.Name) and n.id in ("__package__", "__spec__") for n in ast.walk(test))


def _names_main(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` or ``!=`` (either way round)."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.ops[0], (ast.Eq, ast.NotEq))
        and {
            n.id if isinstance(n, ast.Name) else n.value if isinstance(n, ast.Constant) else None
            for n in (test.left, *test.comparators)
        }
        >= {"__name__", "__main__"}
    )


def _if_version(parent: ast.AST) -> bool:
    """An ``if`` on the Python version or the platform (``sys.version_info``, ``sys.platform``,
    ``platform.system()``): which branch runs on the nodes is their Python's, not known here; both are optional
    (``tomllib`` on 3.11, ``tomli`` before)."""
    if not isinstance(parent, ast.If):
        return False
    for node in ast.walk(parent.test):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("sys", "platform")
            and node.attr in ("version_info", "platform", "system", "python_version")
        ):
            return True
    return False


def _guards(parent: ast.AST, child: ast.AST, relative: bool = False) -> bool:
    """``child`` is in the body of the ``try`` ``parent``, one of whose handlers takes an ImportError and goes on."""
    tried: Any = parent
    return (
        isinstance(parent, TRIES)
        and child in tried.body
        and any(_catches_import_error(h, relative) for h in tried.handlers)
    )


# what a test that asks whether a package can be imported calls: importlib's, lightning_utilities' (Lightning's own
# flags, e.g. _WANDB_AVAILABLE = RequirementCache("wandb")), pkgutil's
_PROBES = {"find_spec", "find_loader", "module_available", "package_available", "RequirementCache"}


def _if_available(parent: ast.AST, child: ast.AST) -> bool:
    """``child`` is in the body of an ``if`` that asks whether a package is there, the way libraries import an
    optional one: ``if _LITSERVE_AVAILABLE:``, ``if is_wandb_available():``, ``if find_spec("wandb"):`` (a probe with
    the package's name). Not a device's (``torch.cuda.is_available()``: true on the nodes). Its ``else`` runs when
    it is not: an import there is required."""
    if not (isinstance(parent, ast.If) and child in parent.body):
        return False
    for node in ast.walk(parent.test):
        if (
            isinstance(node, ast.Call)
            and _call_name(node.func) in _PROBES
            and any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)
        ):
            return True
        name = _call_name(node) if isinstance(node, (ast.Name, ast.Attribute)) else ""
        package = name.lower().replace("available", "").replace("is_", "").strip("_")
        if "available" in name.lower() and package:
            return True
    return False


def _call_name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _names_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler, relative: bool = False) -> bool:
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
    # a refused relative import raises a plain ImportError, which ``except ModuleNotFoundError`` does not take
    takes = _CATCHES_IMPORT_ERROR - {"ModuleNotFoundError"} if relative else _CATCHES_IMPORT_ERROR
    return any(
        (isinstance(c, ast.Name) and c.id in takes) or (isinstance(c, ast.Attribute) and c.attr in takes)
        for c in caught
    )


# what a module that puts a folder on the import path names (the script's own sys.path.insert, rootutils'
# setup_root(pythonpath=True), a PYTHONPATH it sets for itself, site.addsitedir)
PATH_CHANGES = ("sys.path", "PYTHONPATH", "addsitedir", "rootutils")


@dataclass(frozen=True)
class Needed:
    """A name from outside the project that the script needs, and where: the first module (in the walk from the
    script, breadth first) that imports it at its surest level."""

    level: int  # RUNS, DEFERRED, CONFIGURED or OPTIONAL: the surest way to it
    where: str  # the project file whose import it is
    via: tuple[str, ...]  # the files the script's imports pass through to ``where`` (the script first)


@dataclass
class ProjectImports:
    """What :func:`project_imports` found."""

    needed: dict[str, Needed] = field(default_factory=dict)  # top-level names from outside the project
    modules: list[str] = field(default_factory=list)  # the project files read, in the walk's order
    # a project file that does not parse: file -> (the error, via, level), as last walked
    unparsed: dict[str, tuple[str, tuple[str, ...], int]] = field(default_factory=dict)
    # a script run from a subfolder: top names found at the code folder's top alone -> (the importer, via); Python
    # looks in the script's folder, so they resolve only if the script puts the top on sys.path or installs it
    from_top: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    adjusts_path: bool = False  # a module on the way names sys.path, PYTHONPATH, site.addsitedir or rootutils
    from_configs: int = 0  # of ``modules``, those (the last) only config files' targets reach
    # a relative import Python refuses where the file runs (a plain script's: it has no package; one above the top
    # package the file was imported in): file -> such an import at the surest level it is reached
    relative: dict[str, Relative] = field(default_factory=dict)


@dataclass(frozen=True)
class Relative:
    """A relative import that raises ImportError where it runs: ``from .models import Net`` in ``python train.py``
    ("attempted relative import with no known parent package", Python's reference, "The import system", 5.7: a
    main module run by its path has no package) or ``from .. import x`` in a top package's module ("beyond
    top-level package")."""

    statement: str  # as written, e.g. "from .models import Net"
    dots: int  # how many packages up it goes (the statement's dots)
    depth: int  # how many packages the importing module is in where it runs (0: none)
    level: int  # RUNS, DEFERRED or CONFIGURED: the surest way to it (a guarded one, the dual-use idiom, is not)
    via: tuple[str, ...]


def project_imports(
    files: Iterable[str],
    read: Callable[[str], str],
    script: str,
    run_as_module: bool = False,
    configs: Mapping[str, str] | None = None,
    configs_used: Iterable[str] = (),
) -> ProjectImports:
    """The imports of ``script`` and of every project module it imports, transitively (``files``: the code
    snapshot's, relative POSIX paths; ``read``: a file's text). ``run_as_module``: the command is ``-m pkg.train``,
    so ``script`` is ``pkg/train.py`` and its packages' ``__init__.py`` run first. ``configs``: the project's config
    files (path -> text), whose targets (:func:`config_targets`) are imported at :data:`CONFIGURED`, or :data:`RUNS`
    for those of ``configs_used`` (the command's ``--config`` files). An import's level (:data:`RUNS`,
    :data:`DEFERRED`, :data:`CONFIGURED`, :data:`OPTIONAL`) is its own, or that of the import that brought its module
    in if greater."""
    found = ProjectImports()
    finder = _Finder(set(files), read, script, run_as_module)
    walked: dict[str, int] = {}  # file -> level, as last walked: walked again when reached at a surer level
    # the queue's files, each with the folder on the path it was found under (its package is the folders between)
    queue: deque[tuple[str, int, tuple[str, ...], str]] = deque()
    command = "python -m " + script[: -len(".py")].replace("/", ".").removesuffix(".__main__")
    for path in finder.packages_of(script) if run_as_module else []:  # what python -m runs before the script
        queue.append((path, RUNS, (command, path), ""))
    queue.append((script, RUNS, (script,), "" if run_as_module else posixpath.dirname(script)))
    _drain(queue, walked, found, finder, script, read)
    from_script = len(found.modules)
    used = set(configs_used)
    for config, text in sorted((configs or {}).items()):
        level = RUNS if config in used else CONFIGURED
        keyed = set(config_targets(text, bare=False))
        for target in config_targets(text):
            module, _, name = target.rpartition(".")  # as `from a.b import C`: an attribute before a submodule
            resolved = finder.resolve(ImportStatement(module, 0, (name,), False), config, "")
            top = target.split(".")[0]
            if resolved is None and target not in keyed and not _installed_here(top):
                continue  # a bare target naming neither a project module nor one installed here: a config's own value
            if resolved is not None and finder.from_top.get(top) == config:  # found at the top only, as imports are
                found.from_top.setdefault(top, (config, (config,)))
            if resolved is None:
                _need(found.needed, target.split(".")[0], level, config, (config,))
                continue
            for path in resolved[0]:
                queue.append((path, level, (config, path), resolved[1]))
        _drain(queue, walked, found, finder, script, read)
    found.from_configs = len(found.modules) - from_script
    return found


def _drain(
    queue: deque[tuple[str, int, tuple[str, ...], str]],
    walked: dict[str, int],
    found: ProjectImports,
    finder: _Finder,
    script: str,
    read: Callable[[str], str],
) -> None:
    """Walk the files of ``queue`` and those their imports run, into ``found`` (see :func:`project_imports`)."""
    while queue:
        path, level, via, root = queue.popleft()
        if path in walked and walked[path] <= level:
            continue
        if path not in walked:
            found.modules.append(path)
        walked[path] = level
        text = read(path)
        found.adjusts_path |= any(k in text for k in PATH_CHANGES)
        try:
            statements = import_statements(text, path, imported=path != script)
        except (SyntaxError, ValueError) as exc:  # ValueError: source with a NUL byte
            found.unparsed[path] = (str(exc), via, level)
            continue
        # PEP 366: a main module that sets __package__ itself imports relatively from the package it names (and
        # whether that resolves is the job's sys.path): its relative imports are neither followed nor refused
        own_package = path == script and _sets_package(text)
        depth = _depth(path, root)
        for s in statements:
            own = OPTIONAL if s.optional else DEFERRED if s.deferred and path != script else RUNS
            if s.level > depth:  # Python raises ImportError there; a guarded one falls back (the dual-use idiom)
                known = found.relative.get(path)
                if max(level, own) < OPTIONAL and not own_package and (known is None or max(level, own) < known.level):
                    found.relative[path] = Relative(s.written(), s.level, depth, max(level, own), via)
                continue
            resolved = finder.resolve(s, path, root)
            top = s.module.split(".")[0]
            if resolved is not None and s.level == 0 and finder.from_top.get(top) == path:
                found.from_top.setdefault(top, (path, via))
            if resolved is None:
                _need(found.needed, s.module.split(".")[0], max(level, own), path, via)
                continue
            targets, under = resolved
            for target in targets:
                queue.append((target, max(level, own), via if target in via else (*via, target), under))


def _depth(path: str, root: str) -> int:
    """How many packages the module ``path``, found under the path entry ``root``, is in (``a/b/c.py`` or
    ``a/b/__init__.py`` under "": 2, a.b's): how far up its relative imports may go."""
    folder = posixpath.dirname(path)
    if root and folder != root and not folder.startswith(root + "/"):
        root = ""  # not beneath it (never so for a file the walk found under it): from the code folder's top
    return 0 if folder == root else len(folder.split("/")) - (len(root.split("/")) if root else 0)


def _sets_package(source: str) -> bool:
    """The module assigns its own ``__package__`` (PEP 366)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(n, ast.Name) and n.id == "__package__" and isinstance(n.ctx, ast.Store) for n in ast.walk(tree)
    )


def _need(needed: dict[str, Needed], name: str, level: int, where: str, via: tuple[str, ...]) -> None:
    known = needed.get(name)
    if known is None or level < known.level:
        needed[name] = Needed(level, where, via)


class _Finder:
    """Where the project's files answer an import (see the module docstring)."""

    def __init__(self, files: set[str], read: Callable[[str], str], script: str, run_as_module: bool) -> None:
        self.files = files
        self.read = read
        self.folders = _ancestors(files)  # every folder of the snapshot
        self.code_folders = _ancestors(f for f in files if f.endswith(".py"))  # those with Python code beneath
        own = "" if run_as_module else posixpath.dirname(script)
        self.roots = [own, ""] if own else [""]
        self.from_top: dict[str, str] = {}  # top names found only at the code folder's top, not in the script's folder
        self._namespaces: dict[str, _Namespace] = {}  # a package's __init__.py -> what it binds

    def packages_of(self, script: str) -> list[str]:
        """The ``__init__.py`` files ``python -m`` runs before ``script`` (``a/b/train.py``: a's, then b's)."""
        parts = script.split("/")[:-1]
        return [p for i in range(1, len(parts) + 1) if (p := "/".join(parts[:i]) + "/__init__.py") in self.files]

    def resolve(self, s: ImportStatement, importer: str, root: str) -> tuple[list[str], str] | None:
        """The project files ``s`` runs, in order ([] when it is the project's but runs nothing of it: a namespace
        package, a relative import of a name defined in its package), with the path entry they are found under
        (``root``, the importer's, for a relative import); None when it is not the project's."""
        if s.level:
            base = posixpath.dirname(importer)
            for _ in range(s.level - 1):
                base = posixpath.dirname(base)
            parts = s.module.split(".") if s.module else []
            return self._with_names(self._walk(base, parts), base, parts, s.names, importer), root
        parts = s.module.split(".")
        found = self._root_of(parts[0])
        if found is None:
            return None
        if found != self.roots[0]:
            self.from_top.setdefault(parts[0], importer)
        return self._with_names(self._walk(found, parts), found, parts, s.names, importer), found

    def _root_of(self, top: str) -> str | None:
        """The first root with ``top`` as a module or a regular package; else the first with it as a namespace
        package (a folder with Python code beneath: one without is data, and an installed package wins over it, as
        CPython's path search lets a regular package anywhere on ``sys.path`` win over a namespace portion)."""
        for root in self.roots:
            here = posixpath.join(root, top)
            if f"{here}/__init__.py" in self.files or f"{here}.py" in self.files:
                return root
        return next((r for r in self.roots if posixpath.join(r, top) in self.code_folders), None)

    def _walk(self, base: str, parts: list[str]) -> list[str]:
        """The files importing ``parts`` under ``base`` runs (a package's ``__init__.py``, the module's file)."""
        ran: list[str] = []
        here = base
        for part in parts:
            here = posixpath.join(here, part)
            if f"{here}/__init__.py" in self.files:
                ran.append(f"{here}/__init__.py")
            elif f"{here}.py" in self.files:
                ran.append(f"{here}.py")
                break  # a module: the rest are its attributes
            elif here not in self.folders:
                break
        return ran

    def _with_names(
        self, ran: list[str], base: str, parts: list[str], names: tuple[str, ...], importer: str = ""
    ) -> list[str]:
        """``from package import name`` runs ``package/name.py`` (or its ``__init__.py``) when it is a module there
        and the package's ``__init__.py`` has not bound ``name`` itself (CPython's ``_handle_fromlist`` imports the
        submodule only for a name the package lacks); ``from package import *`` runs the modules its ``__all__``
        names (none without one)."""
        if ran and ran[-1].endswith(".py") and not ran[-1].endswith("/__init__.py"):
            return ran
        package = posixpath.join(base, *parts) if parts else base
        init = posixpath.join(package, "__init__.py")
        # what the package binds once its __init__.py has run; an import from inside the package (its __init__.py, a
        # module that runs on the way) may meet it half-run: taken as binding nothing there
        inside = not package or importer == init or importer.startswith(package + "/")
        namespace = self._namespace(init) if init in self.files and not inside else _Namespace()
        if "*" in names:
            names = tuple(n for n in names if n != "*") + namespace.all
        for name in names:
            if name in namespace.bound:
                continue
            for candidate in (posixpath.join(package, name, "__init__.py"), posixpath.join(package, f"{name}.py")):
                if candidate in self.files:
                    ran.append(candidate)
                    break
        return ran

    def _namespace(self, init: str) -> _Namespace:
        if init not in self._namespaces:
            self._namespaces[init] = _namespace_of(self.read(init), init)
        return self._namespaces[init]


@dataclass(frozen=True)
class _Namespace:
    """What a package's ``__init__.py`` binds when it runs (names, not what they are) and its ``__all__`` (a
    literal list or tuple of strings; () without one, or when computed). A name it does not bind is imported as a
    submodule, a module ``__getattr__`` (PEP 562) or not: a lazy loader's is the way it imports one."""

    bound: frozenset[str] = frozenset()
    all: tuple[str, ...] = ()


def _from_itself(node: ast.ImportFrom, init: str) -> bool:
    """``from . import x`` or ``from pkg import x`` in ``pkg/__init__.py``: an import of the package's own
    submodules (or of names an earlier one bound), not a binding that hides one."""
    if node.level:
        return node.level == 1 and not node.module
    folders = posixpath.dirname(init).split("/")  # pkg's dotted name is one of a.b.pkg, b.pkg, pkg (by its root)
    return node.module in {".".join(folders[i:]) for i in range(len(folders))}


def _namespace_of(source: str, filename: str) -> _Namespace:
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError):
        return _Namespace()  # read as binding nothing: every submodule named is taken to run
    bound: set[str] = set()
    every: list[str] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _names_type_checking(node.test):
            pending += node.orelse  # its body never runs
            continue
        if isinstance(node, (ast.If, ast.For, ast.While)):
            continue  # a name bound in a branch or a loop may not be: its submodule is taken to run
        if isinstance(node, (ast.With, ast.AsyncWith, *TRIES)):
            for name in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, name, []):
                    pending += child.body if isinstance(child, ast.ExceptHandler) else [child]
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.ImportFrom) and _from_itself(node, filename):
            continue  # ``from . import x`` binds the submodule it runs: the walk follows it there
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            bound |= names
            if "__all__" in names and isinstance(node.value, (ast.List, ast.Tuple)):
                every += [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return _Namespace(frozenset(bound), tuple(every))


def _ancestors(files: Iterable[str]) -> set[str]:
    """Every folder above ``files`` (relative POSIX paths; the top is "")."""
    out: set[str] = set()
    for f in files:
        while f:
            f = posixpath.dirname(f)
            out.add(f)
    return out
