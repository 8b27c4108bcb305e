"""How fast the torch-free side starts and answers: catalog load, queries, and the `srifty catalog show` command.

    python bench/catalog_speed.py [--runs 7]

Cold figures run a fresh interpreter each time (median of --runs); warm figures time repeated calls in-process.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cold(code: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(code, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def warm(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    py = sys.executable
    rows = [
        ("python -c pass (interpreter floor)", cold([py, "-c", "pass"], args.runs)),
        (
            "import predictor.catalog + Catalog.load()",
            cold([py, "-c", "from predictor.catalog import Catalog; Catalog.load(use_refreshed=False)"], args.runs),
        ),
        ("srifty --help", cold([py, "-m", "lightning_srifty.cli", "--help"], args.runs)),
        (
            "srifty catalog show --format json",
            cold([py, "-m", "lightning_srifty.cli", "catalog", "show", "--format", "json"], args.runs),
        ),
        ("import lightning (for comparison)", cold([py, "-c", "import lightning"], max(3, args.runs // 2))),
    ]
    from predictor.catalog import Catalog

    cat = Catalog.load(use_refreshed=False)
    rows_warm = [
        ("Catalog.load() (bundled, warm)", warm(lambda: Catalog.load(use_refreshed=False), 50)),
        ("catalog.get('p4d.24xlarge')", warm(lambda: cat.get("p4d.24xlarge"), 2000)),
        (
            "catalog.filter(region='us-east-1', max_price=30)",
            warm(lambda: cat.filter(region="us-east-1", max_price=30), 200),
        ),
    ]
    print("| what | median |")
    print("|---|---|")
    for name, t in rows:
        print(f"| {name} (cold process) | {t * 1e3:.0f} ms |")
    for name, t in rows_warm:
        print(f"| {name} | {t * 1e6:.1f} µs |")


if __name__ == "__main__":
    main()
