"""Where the test suite's CPU goes: each test's wall time and CPU (the worker's own and every child process it reaped:
terraform and its provider, the AWS CLI, moto, the DDP ranks), summed by file.

CI's time is set by CPU on 2 cores (docs/ci-log.md; BENCHMARKS.md, "CI's time"), so a test's CPU, not its wall time,
is what it costs the suite. A process a test leaves to a fixture of a wider scope (a module's moto server) is counted
where it is reaped, and one never waited for not at all, so the sum is a floor of the machine's CPU.

    python bench/suite_cpu.py [--out FOLDER] [--top N] [PYTEST ARGS ...]   # the whole suite (25-30 min here)
    python bench/suite_cpu.py --report FOLDER                              # the tables of a run already made

With ``-p suite_cpu`` (``bench/`` on PYTHONPATH) a pytest run records one JSON line per test in
``$SRIFTY_SUITE_CPU_OUT`` (a file per worker); this script runs ``python -m pytest`` so and prints the tables.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT_VARIABLE = "SRIFTY_SUITE_CPU_OUT"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The test's setup, call and teardown, timed: wall, the worker's CPU, its reaped children's CPU."""
    before, start = os.times(), time.monotonic()
    yield
    after, wall = os.times(), time.monotonic() - start
    out = os.environ.get(OUT_VARIABLE)
    if not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    record = {
        "test": item.nodeid,
        "worker": worker,
        "wall_s": round(wall, 3),
        "self_cpu_s": round((after.user - before.user) + (after.system - before.system), 3),
        "children_cpu_s": round(
            (after.children_user - before.children_user) + (after.children_system - before.children_system), 3
        ),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / f"{worker}.jsonl", "a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")


def read(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]


def report(records: list[dict[str, Any]], top: int) -> str:
    if not records:
        return "no test recorded (was the run made with -p suite_cpu and SRIFTY_SUITE_CPU_OUT set?)"

    def cpu(r: dict[str, Any]) -> float:
        return float(r["self_cpu_s"] + r["children_cpu_s"])

    total = sum(map(cpu, records))
    own = sum(r["self_cpu_s"] for r in records)
    workers: dict[str, float] = collections.Counter()
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in records:
        workers[r["worker"]] += r["wall_s"]
        entry = files[r["test"].split("::")[0]]
        entry[0] += cpu(r)
        entry[1] += r["wall_s"]
        entry[2] += 1
    lines = [
        f"{len(records)} tests; CPU {total:,.0f} s (the workers' own {own:,.0f} s, their reaped children "
        f"{total - own:,.0f} s); the workers' test time "
        + ", ".join(f"{w} {s:,.0f} s" for w, s in sorted(workers.items())),
        "",
        "| file | tests | CPU (s) | share | wall (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| `{name}` | {n} | {c:,.0f} | {100 * c / total:.0f} % | {w:,.0f} |")
    lines += ["", "| test | CPU (s) | wall (s) |", "|---|---:|---:|"]
    for r in sorted(records, key=cpu, reverse=True)[:top]:
        lines.append(f"| `{r['test']}` | {cpu(r):,.0f} | {r['wall_s']:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="where the per-test records go (default: a new temporary folder)")
    parser.add_argument("--report", type=Path, help="print the tables of the records in this folder; run nothing")
    parser.add_argument("--top", type=int, default=20, help="rows of each table (default 20)")
    args, pytest_args = parser.parse_known_args(argv)
    if args.top < 1:
        parser.error(f"--top must be at least 1, not {args.top}")
    if args.report is not None:
        if not args.report.is_dir():
            parser.error(f"--report {args.report}: no such folder (the --out of an earlier run)")
        print(report(read(args.report), args.top))
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="srifty-suite-cpu-"))
    if out.exists() and any(out.glob("*.jsonl")):
        parser.error(f"--out {out} holds an earlier run's records; give an empty or new folder")
    env = {
        **os.environ,
        OUT_VARIABLE: str(out),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")])),
    }
    start = time.monotonic()
    print(f"running the suite (records in {out}) ...", file=sys.stderr, flush=True)
    code = subprocess.call([sys.executable, "-m", "pytest", "-p", "suite_cpu", *pytest_args], cwd=ROOT, env=env)
    print(f"pytest exited with {code} after {time.monotonic() - start:,.0f} s\n")
    print(report(read(out), args.top))
    return code


if __name__ == "__main__":
    sys.exit(main())
