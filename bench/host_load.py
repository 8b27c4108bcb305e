"""A profile of the same run on an idle and on a loaded machine, and the predictions each gives (issue #37 H1: "the
prediction depends on how busy the profiling machine was"; the goal: within 10%).

    python bench/host_load.py [--runs 2] [--hogs N] [--fleets g4dn.xlarge:1,g5.xlarge:1,p3.2xlarge:1]

For each run: ``srifty demo`` (the CNN, the same seed) writes a profile on this machine as it is, then again beside
``--hogs`` busy processes (``yes > /dev/null``; default: one per core); both are predicted on each fleet. Prints the
step and data-phase statistics of each profile and the predicted step time of each fleet, idle vs loaded, and the
ratio; the figures go to BENCHMARKS.md. Timing only: nothing is asserted here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@contextlib.contextmanager
def hogs(n: int):
    procs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def profile(out: Path) -> None:
    cmd = [sys.executable, "-m", "lightning_srifty.cli", "demo", "--output", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--fleets", default="g4dn.xlarge:1,g5.xlarge:1,p3.2xlarge:1")
    args = parser.parse_args()
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.model.predict import predict

    catalog = Catalog.load(use_refreshed=False, use_env=False)
    fleets = args.fleets.split(",")
    worst = 0.0
    with tempfile.TemporaryDirectory() as folder:
        for run in range(args.runs):
            paths = {"idle": Path(folder) / f"idle{run}.json", "loaded": Path(folder) / f"loaded{run}.json"}
            profile(paths["idle"])
            with hogs(args.hogs):
                profile(paths["loaded"])
            profiles = {k: load_profile(v) for k, v in paths.items()}
            for name, p in profiles.items():
                t = p.timing
                data = t.phases_s["data"] if t.phases_s else None
                print(
                    f"run {run} {name:6}: step p50 {t.step_time_s.p50 * 1e3:7.2f} ms, data p50 "
                    f"{data.p50 * 1e3 if data else float('nan'):6.3f} ms min {(data.min or 0) * 1e3:6.3f} ms"
                )
            for fleet in fleets:
                idle, loaded = (
                    predict(profiles[k], fleet, catalog=catalog, layout="ddp").iteration_time_s for k in paths
                )
                ratio = loaded / idle
                worst = max(worst, abs(ratio - 1))
                print(f"  {fleet:15} idle {idle * 1e3:7.3f} ms  loaded {loaded * 1e3:7.3f} ms  ratio {ratio:.3f}")
    print(f"worst |loaded / idle - 1| over {args.runs} run(s) and {len(fleets)} fleets: {worst:.1%} (goal: <= 10%)")


if __name__ == "__main__":
    main()
