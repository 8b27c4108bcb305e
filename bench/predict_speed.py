"""Speed of the performance model: loading it, and predicting one fleet (issue #4 targets: < 1 s, < 1 ms).

python bench/predict_speed.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILE = json.loads((ROOT / "examples" / "profiles" / "resnet50-v100.json").read_text())  # hand-written


def main() -> None:
    code = (
        "import time; t = time.perf_counter(); from predictor.model.predict import predict; "
        "from predictor.model.correction import load_correction; from predictor.catalog import Catalog; "
        "load_correction(); Catalog.load(use_refreshed=False); print(time.perf_counter() - t)"
    )
    loads = sorted(
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        for _ in range(5)
    )
    from predictor.catalog import Catalog
    from predictor.catalog.fleet import parse_fleet
    from predictor.documents.profile import load_profile
    from predictor.model.predict import predict

    catalog = Catalog.load(use_refreshed=False)
    profile = load_profile(PROFILE)
    rows = []
    # the layout given (ddp), and the default, auto: the layout srifty recommend runs (plain DDP where it fits
    # without accumulation, one prediction; else the layouts' sweep and the chosen one)
    cases = [(f, "ddp") for f in ("p3.2xlarge:1", "p4d.24xlarge:2", "p3.8xlarge:2,g5.12xlarge:1")]
    for fleet_text, layout in [*cases, ("p4d.24xlarge:2", "auto")]:
        fleet = parse_fleet(fleet_text, catalog)
        predict(profile, fleet, catalog=catalog, layout=layout)
        times = []
        for _ in range(2000):
            t = time.perf_counter()
            predict(profile, fleet, catalog=catalog, layout=layout)
            times.append(time.perf_counter() - t)
        rows.append((f"{fleet_text}` ({layout}", statistics.median(times)))
    # from an operator table (a 1.2B-parameter Llama-shaped transformer captured on meta, 116 records): each
    # repetition takes a freshly loaded profile, so the table is classified and its kernels predicted every time
    table_profile = ROOT / "examples" / "profiles" / "llama-1b-meta.json"
    table_times: dict[str, list[float]] = {"ddp": [], "auto": []}
    for _ in range(30):
        for layout, into in table_times.items():
            fresh = load_profile(table_profile)
            t = time.perf_counter()
            predict(fresh, parse_fleet("p5.4xlarge:1", catalog), catalog=catalog, layout=layout)
            into.append(time.perf_counter() - t)
    # the same table's operator sum on an H100 and on an H200 (whose kernels the twin rule prices through the H100's)
    from predictor.catalog.gpus import get_gpu
    from predictor.model import ops

    classified = ops.classify_table(load_profile(table_profile).ops.ops)
    sums: dict[str, list[float]] = {"H100-SXM": [], "H200-SXM": []}
    for _ in range(30):
        for key, into in sums.items():
            t = time.perf_counter()
            ops.ops_time(classified, get_gpu(key), "bf16-mixed", "high", "absolute")
            into.append(time.perf_counter() - t)
    every = [it for it in catalog.filter() if it.gpu in catalog.gpus]
    t = time.perf_counter()
    for it in every:
        for n in (1, 2, 4, 8):
            predict(profile, parse_fleet([(it.name, n)], catalog), catalog=catalog, layout="ddp")
    sweep = time.perf_counter() - t
    print("| what | median |")
    print("|---|---|")
    print(f"| import + load the model (correction artefact) and the catalog, cold process | {loads[2] * 1e3:.0f} ms |")
    for fleet_text, t_one in rows:
        print(f"| predict one fleet `{fleet_text}) | {t_one * 1e6:.0f} µs |")
    for layout, times in table_times.items():
        print(f"| predict one fleet `p5.4xlarge:1` ({layout}) from the operator table of a 1.2B transformer, fresh "
              f"profile | {statistics.median(times) * 1e3:.1f} ms |")  # fmt: skip
    print(
        f"| that table's operator sum on an H100 / on an H200 (priced through its twin, the H100) | "
        f"{statistics.median(sums['H100-SXM']) * 1e3:.2f} / {statistics.median(sums['H200-SXM']) * 1e3:.2f} ms |"
    )
    print(f"| {len(every) * 4} fleets (every CUDA type with specs x 1/2/4/8), one by one | {sweep * 1e3:.0f} ms |")
    import numpy as np

    from predictor.model.fleets import predict_many

    rng = np.random.default_rng(0)
    names = [it.name for it in every]
    for size in (10_000, 1_000_000):
        types = [names[i] for i in rng.integers(0, len(names), size)]
        counts = rng.integers(1, 65, size)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            predict_many(profile, types, counts, catalog=catalog)
            times.append(time.perf_counter() - t)
        print(
            f"| predict_many: {size:,} homogeneous fleets (random type x 1-64) | {statistics.median(times) * 1e3:.0f}"
            f" ms ({statistics.median(times) / size * 1e9:.0f} ns per fleet) |"
        )


if __name__ == "__main__":
    main()
