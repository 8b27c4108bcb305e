"""The shape of the code base: modules per package, the longest files, classes and functions, import cycles between
modules, and each package's rooms and floors.

    python bench/house.py [--json out.json]

Imports are read from the source (``ast``), whether at module level or inside functions; a cycle is a strongly
connected set of two or more modules of this project that import each other, directly or through others, at
module level (function-level imports are lazy by design and are listed separately). Between packages, every import
counts: a package cycle is two packages that reach each other by any import.

A package's **rooms** are its direct children (modules and sub-packages, ``__init__`` aside); its **floors** are
the longest chain of imports between its rooms, any import counted (inside functions too): a room that imports
no other room is on floor 1, and a room is one floor above the highest room it imports. A circle between rooms
has no floors (reported as a cycle, and the exit status is 1).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_srifty", "predictor")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(module-level imports, function-level imports) of ``name`` that are modules of this project."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top, lazy = set(), set()

    def resolve(node: ast.AST) -> list[str]:
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        out = []
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.append(t)
        return out

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (top if depth == 0 else lazy).update(resolve(child))
            inner = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            visit(child, inner)

    visit(tree, 0)
    return top, lazy - top


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of two or more modules."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def package_of(name: str, found: dict[str, Path]) -> str:
    path = found[name]
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def room_of(name: str, package: str) -> str | None:
    """The room of ``package`` that module ``name`` is in (None: outside the package, or its ``__init__``)."""
    if not name.startswith(package + "."):
        return None
    return name[len(package) + 1 :].split(".")[0]


def rooms_and_floors(
    package: str, found: dict[str, Path], graph: dict[str, set[str]], lazy: dict[str, set[str]]
) -> dict[str, object]:
    """``package``'s rooms, the rooms each imports (any import) and the floor of each (None inside a circle)."""
    rooms = sorted({r for n in found if (r := room_of(n, package))})
    below: dict[str, set[str]] = {r: set() for r in rooms}
    for name in found:
        mine = room_of(name, package)
        if mine is None:
            continue
        for target in graph[name] | lazy[name]:
            theirs = room_of(target, package)
            if theirs and theirs != mine:
                below[mine].add(theirs)
    circles = cycles(below)
    in_circle = {r for c in circles for r in c}
    floor: dict[str, int | None] = {}

    def height(room: str) -> int | None:
        if room in in_circle:
            return None
        if room not in floor:
            under = [height(r) for r in below[room]]
            floor[room] = None if None in under else 1 + max((h for h in under if h is not None), default=0)
        return floor[room]

    for room in rooms:
        height(room)
    return {
        "rooms": rooms,
        "imports": {r: sorted(below[r]) for r in rooms},
        "floor": floor,
        "floors": max((f for f in floor.values() if f is not None), default=0),
        "cycles": circles,
    }


def longest_definitions(found: dict[str, Path], kind: type, top: int = 5) -> list[tuple[str, int]]:
    """The ``top`` longest classes (``ast.ClassDef``) or functions (``ast.FunctionDef``, methods and nested ones
    too) of the project, ``module:name`` and lines from ``def``/``class`` to the last line."""
    out = []
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, kind) or (kind is ast.FunctionDef and isinstance(node, ast.AsyncFunctionDef)):
                out.append((f"{name}:{node.name}", node.end_lineno - node.lineno + 1))
    return sorted(out, key=lambda kv: -kv[1])[:top]


ROOMED = ("lightning_srifty", "lightning_srifty.provision", "predictor", "predictor.model")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    found = modules()
    known = set(found)
    graph, lazy_graph = {}, {}
    for name, path in found.items():
        graph[name], lazy_graph[name] = imports(name, path, known)
    # a package's __init__ importing its own submodules is not a cycle between peers
    graph = {n: {t for t in ts if not t.startswith(n + ".")} for n, ts in graph.items()}
    per_package: dict[str, int] = defaultdict(int)
    for name in found:
        if found[name].name != "__init__.py":
            per_package[package_of(name, found)] += 1
    lines = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in found.items()}
    longest = sorted(lines.items(), key=lambda kv: -kv[1])[:5]
    module_cycles = cycles(graph)
    # packages: every import, inside functions too (a lazy import still ties two packages); a package's own
    # sub-packages are its children, not its peers
    packages: dict[str, set[str]] = defaultdict(set)
    for name in found:
        mine = package_of(name, found)
        for target in graph[name] | lazy_graph[name]:
            theirs = package_of(target, found)
            if theirs != mine and not theirs.startswith(mine + ".") and not mine.startswith(theirs + "."):
                packages[mine].add(theirs)
    package_cycles = cycles(dict(packages))
    lazy_pairs = sorted(
        f"{a} -> {b}" for a, ts in lazy_graph.items() for b in ts if a in graph.get(b, set()) or a in lazy_graph[b]
    )
    houses = {package: rooms_and_floors(package, found, graph, lazy_graph) for package in ROOMED}
    classes = longest_definitions(found, ast.ClassDef)
    functions = longest_definitions(found, ast.FunctionDef)
    result = {
        "rooms": houses,
        "longest_classes": [{"class": n, "lines": k} for n, k in classes],
        "longest_functions": [{"function": n, "lines": k} for n, k in functions],
        "modules_per_package": dict(sorted(per_package.items())),
        "longest_files": [{"module": n, "lines": k} for n, k in longest],
        "import_cycles": module_cycles,
        "package_cycles": package_cycles,
        "mutual_lazy_imports": lazy_pairs,
    }
    print("modules per package:")
    for package, count in result["modules_per_package"].items():
        print(f"  {package:40s} {count:3d}")
    print("longest files:")
    for row in result["longest_files"]:
        print(f"  {row['module']:40s} {row['lines']:5d} lines")
    print("longest classes:")
    for n, k in classes:
        print(f"  {n:60s} {k:5d} lines")
    print("longest functions:")
    for n, k in functions:
        print(f"  {n:60s} {k:5d} lines")
    for package, house in houses.items():
        print(f"{package}: {len(house['rooms'])} rooms on {house['floors']} floors")
        for room in house["rooms"]:
            level = house["floor"][room]
            where = "circle" if level is None else f"floor {level}"
            print(f"  {where:8s} {room:22s} <- {', '.join(house['imports'][room])}")
    print(f"import cycles (module level): {len(module_cycles)}")
    for c in module_cycles:
        print("  " + " <-> ".join(c))
    print(f"package cycles (any import, inside functions too): {len(package_cycles)}")
    for c in package_cycles:
        print("  " + " <-> ".join(c))
    print(f"modules importing each other (one side inside a function): {len(lazy_pairs)}")
    for p in lazy_pairs:
        print("  " + p)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    room_cycles = [c for house in houses.values() for c in house["cycles"]]
    print(f"cycles between rooms: {len(room_cycles)}")
    return 1 if module_cycles or package_cycles or room_cycles else 0


if __name__ == "__main__":
    sys.exit(main())
