"""What following the project's modules costs the import check (``srifty check``, ``srifty terraform``,
``srifty apply``'s pre-flight; lightning_srifty.provision.terraform.script_imports).

The check now reads the script and every project module it imports, transitively, from the code snapshot. This
times ``check_imports`` on real projects, medians of several runs, against the script's own imports alone (what the
check read before): this repository (a script that imports ``lightning_srifty``, whose modules are then the
project's: about 200 of them), and a project whose code is a copy of an installed package's source (``--package``,
e.g. ``transformers``: a few thousand files, a script that imports it).

    python bench/import_walk.py [--runs 5] [--package transformers] [--before PATH] [--project FOLDER:SCRIPT ...]

``--before PATH``: a checkout of an earlier commit (``git worktree add /tmp/before 7e5a243``): its
``check_imports``, which read the script alone, is timed on the same projects in a process of its own.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_srifty.provision.preflight import check_imports
from lightning_srifty.provision.terraform import glue
from lightning_srifty.provision.terraform.script_imports import imported_modules, project_imports
from lightning_srifty.provision.terraform.snapshot import build_snapshot, read_member

SPEC = {"packages": ["torch==2.13.0", "lightning==2.6.6"], "requirements": None}


def median_s(call, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


BEFORE = """
import json, statistics, sys, time
from pathlib import Path
from lightning_srifty.provision.preflight import check_imports
from lightning_srifty.provision.terraform.snapshot import build_snapshot
project, script, out, runs, spec = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
snapshot = build_snapshot(project, out, json.loads(spec))
times = []
for _ in range(runs):
    start = time.perf_counter()
    check_imports(snapshot, [script])
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def before_s(tree: Path | None, project: Path, script: str, out: Path, runs: int) -> str:
    """The median time of the earlier checkout's ``check_imports`` on the same project (its own process)."""
    if tree is None:
        return "-"
    argv = [sys.executable, "-c", BEFORE, str(project), script, str(out), str(runs), json.dumps(SPEC)]
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, cwd=tree)
    return f"{float(done.stdout.split()[-1]) * 1e3:.0f} ms"


def _cold() -> None:
    """Forget what an earlier call read and walked (the check keeps both for its next caller)."""
    glue._texts_of.cache_clear()
    glue._walk_of.cache_clear()


def measure(name: str, project: Path, script: str, work: Path, runs: int, before: Path | None = None) -> None:
    snapshot = build_snapshot(project, work / f"out-{name}", SPEC)
    python = [f for f in snapshot.files if f.endswith(".py")]
    sources, configs = glue._texts_of(str(snapshot.path), snapshot.sha256)
    found = project_imports(sources, lambda f: sources.get(f, ""), script, False, configs)
    alone = median_s(lambda: imported_modules(read_member(snapshot, script).decode()), runs)
    read = median_s(lambda: (glue._texts_of.cache_clear(), glue.python_sources(snapshot)), runs)
    walk = median_s(lambda: project_imports(sources, lambda f: sources.get(f, ""), script, False, configs), runs)
    total = median_s(lambda: (_cold(), check_imports(snapshot, [script])), runs)
    earlier = before_s(before, project, script, work / f"before-{name}", runs)
    print(
        f"| {name} | {len(snapshot.files):,} ({len(python):,} .py, {len(configs)} YAML) | {len(found.modules):,} | "
        f"{len(found.needed)} | "
        f"{alone * 1e3:.0f} ms | {earlier} | {read * 1e3:.0f} ms | {walk * 1e3:.0f} ms | {total * 1e3:.0f} ms |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--package", default="transformers", help="an installed package whose source is a project")
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit, timed on the same projects")
    parser.add_argument(
        "--project", action="append", default=[], help="FOLDER:SCRIPT, a project of your own to time too (repeatable)"
    )
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    print(
        "| project | files in the snapshot | project modules walked | names from outside | the script's imports alone "
        "| check_imports before (--before) | reading the .py and YAML files (one pass) | the walk (parse, resolve) | "
        "check_imports now |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        own = work / "own"
        for part in ("lightning_srifty", "predictor", "examples"):
            shutil.copytree(root / part, own / part, ignore=shutil.ignore_patterns("__pycache__"))
        measure(
            "this repository, examples/train_digits.py", own, "examples/train_digits.py", work, args.runs, args.before
        )
        for n, given in enumerate(args.project):
            folder, _, script = given.rpartition(":")
            measure(f"{Path(folder).name}, {script}", Path(folder), script, work / f"p{n}", args.runs, args.before)
        spec = importlib.util.find_spec(args.package)
        if spec is None or not spec.submodule_search_locations:
            print(f"({args.package} is not installed: its row is left out)")
            return
        other = work / "other"
        shutil.copytree(
            Path(next(iter(spec.submodule_search_locations))),
            other / args.package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        (other / "train.py").write_text(f"import {args.package}\nimport lightning\n")
        measure(
            f"{args.package}'s source as the code, train.py imports it", other, "train.py", work, args.runs, args.before
        )


if __name__ == "__main__":
    main()
