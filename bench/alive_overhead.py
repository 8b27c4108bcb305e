"""What the node's alive file costs a training step (the module's hang watch, lightning_srifty.migrate.alive).

Every step of local rank 0 on a srifty fleet node calls ``NodeAlive.step``: a clock read and a comparison, and every
``ALIVE_EVERY_S`` (5 s) one rewrite of a line in the node's state folder (a temporary file renamed into place). This
times both, medians of several runs of many calls each, on the folder given (the node's is /run/srifty, a tmpfs; the
default here is a temporary folder on this machine's disk), and states them against steps of 4 ms and of 100 ms.

    python bench/alive_overhead.py [--folder /dev/shm] [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_srifty.migrate.alive import NodeAlive


def per_call_ns(folder: Path, calls: int, every_s: float) -> float:
    node = NodeAlive(folder, every_s=every_s)
    node.step(0)
    start = time.perf_counter_ns()
    for step in range(1, calls + 1):
        node.step(step)
    return (time.perf_counter_ns() - start) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", help="where the alive file goes (default: a temporary folder)")
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.folder or tmp)
        throttled = [per_call_ns(folder, 200_000, 5.0) for _ in range(args.runs)]  # the step hook between writes
        written = [per_call_ns(folder, 5_000, 0.0) for _ in range(args.runs)]  # a write at every call
    hook, write = statistics.median(throttled), statistics.median(written)
    print(f"folder: {args.folder or 'a temporary folder'}; medians of {args.runs} runs")
    print(f"  a step's call between writes:  {hook:8.0f} ns (range {min(throttled):.0f}-{max(throttled):.0f})")
    low, high = min(written) / 1000, max(written) / 1000
    print(f"  a step's call that writes:     {write / 1000:8.1f} us (range {low:.1f}-{high:.1f})")
    for what, step_s in (("4 ms steps", 0.004), ("100 ms steps", 0.1)):
        steps_per_write = max(1.0, 5.0 / step_s)
        per_step = hook + (write - hook) / steps_per_write
        print(f"  on {what}: {per_step:.0f} ns a step on average, {100 * per_step * 1e-9 / step_s:.4f} % of it")


if __name__ == "__main__":
    main()
