"""On-demand fleets checkpoint too: the node failure rate of :data:`predictor.runs.spot.FAILURES_PER_GPU_HR` checked
against the published run it was not taken from, and what it changes in a plan.

- *the model's rate*: Meta's OPT-175B run on 992 cloud A100s, interrupted every 7.5 h (its logbook, as tabulated in
  G. Lockwood's "job reliability" notes, glennklockwood.com/garden/job-reliability): 1 / (7.5 x 992) per GPU-hour;
- *held out*: Llama 3 405B's pre-training, 419 unexpected interruptions in a 54-day snapshot on 16,384 H100s ("The
  Llama 3 Herd of Models", 2024, Table 5; reported by DatacenterDynamics, 2024-07).

Young-Daly's overhead per second of work is C / tau + rate * tau / 2 (plus the restarts, which the interval does not
change); at tau = sqrt(2 C / rate) it is sqrt(2 C rate). An interval set for a rate k times the true one costs
(sqrt(k) + 1 / sqrt(k)) / 2 of that optimum, whichever way k goes. The second table: what srifty recommend now
writes for on-demand fleets of the MINIMAL profile (30 s checkpoint, 2,000,000 steps of 256 samples).

python bench/node_failures.py [--out bench/results/node_failures.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from predictor.runs.spot import FAILURE_RATE_BOUNDS, FAILURES_PER_GPU_HR, spot_cost  # noqa: E402

HELD_OUT = {"name": "Llama 3 405B, 16,384 H100, 54 days", "failures": 419, "gpus": 16_384, "hours": 54 * 24}
CHECKPOINT_S = 30.0


def penalty(k: float) -> float:
    """Young-Daly's overhead at the interval for a rate k x the true one, over the optimum's."""
    return (math.sqrt(k) + 1 / math.sqrt(k)) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "node_failures.json")
    args = ap.parse_args()
    import numpy as np

    held = HELD_OUT["failures"] / (HELD_OUT["gpus"] * HELD_OUT["hours"])
    k = FAILURES_PER_GPU_HR / held
    lo, hi = FAILURE_RATE_BOUNDS
    assert lo <= FAILURES_PER_GPU_HR <= hi and lo <= held <= hi
    print(f"model rate {FAILURES_PER_GPU_HR:.3g} per GPU-hour (OPT-175B); held out {held:.3g} ({HELD_OUT['name']})")
    print(f"the model's rate is {k:.2f}x the held-out one: its interval costs {penalty(k):.2f}x the optimum's overhead")
    rows = []
    print(
        "\noverheads of a month's work: checkpoints and failures (420 s restart, 30 s load, the work lost), % of work"
    )
    head = f"{'GPUs':>5} {'MTBF h':>8} {'tau h':>7} {'tau h (held out)':>17} {'model %':>8} {'held out: tau %':>16}"
    print(head + f" {'optimum %':>10} {'no checkpoint %':>16}")
    for gpus in (1, 4, 8, 16, 32, 64, 128):
        rate_s = gpus * FAILURES_PER_GPU_HR / 3600
        tau = math.sqrt(2 * CHECKPOINT_S / rate_s)
        tau_held = math.sqrt(2 * CHECKPOINT_S / (gpus * held / 3600))
        work = np.array([30 * 24 * 3600.0])  # a month: every interval is periodic
        cost = spot_cost(work, np.ones(1), np.zeros(1), CHECKPOINT_S, gpus=np.array([gpus]))
        overhead = float(cost.overhead_s[0] / work[0])
        restart = 420 + CHECKPOINT_S
        at_held = CHECKPOINT_S / tau + (gpus * held / 3600) * (restart + tau / 2)
        best_held = CHECKPOINT_S / tau_held + (gpus * held / 3600) * (restart + tau_held / 2)
        none = rate_s * (restart + work[0] / 2)  # before: no periodic checkpoint on-demand, half the run lost
        rows.append(
            {"gpus": gpus, "mtbf_h": 1 / (gpus * FAILURES_PER_GPU_HR), "tau_h": tau / 3600,
             "tau_held_out_h": tau_held / 3600, "overhead": overhead, "overhead_at_held_out_rate": at_held,
             "optimum_at_held_out_rate": best_held, "no_periodic_checkpoint": none}
        )  # fmt: skip
        print(
            f"{gpus:>5} {rows[-1]['mtbf_h']:>8.0f} {tau / 3600:>7.2f} {tau_held / 3600:>17.2f} "
            f"{100 * overhead:>8.3f} {100 * at_held:>16.3f} {100 * best_held:>10.3f} {100 * none:>16.1f}"
        )
    plans = _plans()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {
        "model_rate_per_gpu_hr": FAILURES_PER_GPU_HR, "held_out_rate_per_gpu_hr": held, "ratio": k,
        "penalty": penalty(k), "checkpoint_s": CHECKPOINT_S, "fleets": rows, "plans": plans,
    }  # fmt: skip
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"\nwrote {args.out}")
    return 0


def _plans() -> list[dict]:
    """srifty recommend's on-demand entries for a month-long job: the interval each fleet's job is given."""
    import copy

    from _support import MINIMAL
    from predictor.catalog import Catalog
    from predictor.documents.profile import load_profile
    from predictor.ranking import Constraints, rank

    profile = load_profile(copy.deepcopy(MINIMAL))
    c = Constraints(steps=2_000_000, market="on-demand", allow=("p3.2xlarge", "p3.16xlarge"), max_instances=4, top=8)
    plan = rank(profile, c, catalog=Catalog.load(use_refreshed=False, use_env=False))
    print(f"\n{'fleet':<16} {'GPUs':>5} {'time h':>8} {'checkpoint every':>17}")
    rows = []
    for e in plan.entries:
        every = "none (shorter run)" if e.checkpoint_interval_s is None else f"{e.checkpoint_interval_s / 3600:.2f} h"
        print(f"{e.fleet:<16} {e.gpus:>5} {e.time_h:>8.1f} {every:>17}")
        rows.append({"fleet": e.fleet, "gpus": e.gpus, "time_h": e.time_h, "every_s": e.checkpoint_interval_s})
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
