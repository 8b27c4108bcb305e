"""The spot guard's last on-demand start, with and without the on-demand finish's node failures and saves priced.

srifty launch's hard rule starts the on-demand fleet when the slack left is what an on-demand finish needs. Until the
thirty-fourth session that was the restart and the steps left at the step time; it now also counts the finish's
periodic checkpoints and its node failures at the plan's confidence (:func:`predictor.runs.spot.on_demand_time_s`;
their expectation for a plan without one). This replays an on-demand finish started at each rule's last moment,
drawing node failures, and counts the finishes past the deadline.

The finish: ``RESTART_S`` to bring the fleet up, then ``work`` of training with a save of ``CHECKPOINT_S`` every
Young-Daly interval (the plan's, from the model's rate); node failures arrive as a Poisson process during training
and saves, and each costs the restart, a checkpoint load and the training since the last save. The rate drawn is the
model's (OPT-175B's, :data:`~predictor.runs.spot.FAILURES_PER_GPU_HR`) and the held-out run's (Llama 3's, 6.8x
lower): the guard cannot know which the fleet meets. No check rounding: the guard decides on ticks of
``--spot-check-s``, which adds up to one check of margin to every rule.

python bench/guard_failures.py [--runs 20000] [--out bench/results/guard_failures.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.runs.spot import FAILURES_PER_GPU_HR, on_demand_cost, on_demand_time_s  # noqa: E402

LLAMA3_PER_GPU_HR = 419 / (16_384 * 54 * 24)  # the held-out run of bench/node_failures.py
RESTART_S = 900.0  # a fleet's start-up, a save and a restore: the scale srifty's plans show for p4d/p5 fleets
CHECKPOINT_S = 60.0


def finish_s(work_s: float, tau: float, rate_s: float, rng: np.random.Generator) -> float:
    """One on-demand finish's wall time: the restart, then training with a save every ``tau``; failures at
    ``rate_s`` per second each cost the restart, a load and the training since the last save."""
    t, done, since = RESTART_S, 0.0, 0.0
    next_fail = rng.exponential(1 / rate_s)
    while done < work_s:
        # the next event: a save, the end, or a failure
        to_save = tau - since if np.isfinite(tau) else np.inf
        seg = min(to_save, work_s - done)
        saving = seg == to_save and done + seg < work_s
        span = seg + (CHECKPOINT_S if saving else 0.0)
        if next_fail < span:
            t += next_fail + RESTART_S + CHECKPOINT_S
            done -= since  # back to the last save
            since = 0.0
            next_fail = rng.exponential(1 / rate_s)
            continue
        next_fail -= span
        t += span
        done += seg
        since = 0.0 if saving else since + seg
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "guard_failures.json")
    args = parser.parse_args()
    rng = np.random.default_rng(34)
    rules = {"bare": None, "expected": None, "0.9": 0.9, "0.95": 0.95}
    rows = []
    print("| GPUs | work left | rate drawn | " + " | ".join(f"misses, {r}" for r in rules) + " | room at 0.9 |")
    print("|---:|---:|---|" + "---:|" * (len(rules) + 1))
    for gpus in (8, 64, 256):
        for work_h in (6.0, 24.0, 72.0):
            work_s = work_h * 3600
            tau = float(on_demand_cost(work_s, CHECKPOINT_S, restart_s=RESTART_S, gpus=gpus).checkpoint_interval_s[0])
            need = {r: RESTART_S + on_demand_time_s(work_s, CHECKPOINT_S, RESTART_S, gpus, c) for r, c in rules.items()}
            need["bare"] = RESTART_S + work_s
            for label, per_gpu_hr in (("model's", FAILURES_PER_GPU_HR), ("Llama 3's", LLAMA3_PER_GPU_HR)):
                rate_s = gpus * per_gpu_hr / 3600
                t = np.array([finish_s(work_s, tau, rate_s, rng) for _ in range(args.runs)])
                misses = {r: float(np.mean(t > n)) for r, n in need.items()}
                room = (need["0.9"] - RESTART_S - work_s) / 3600
                rows.append({"gpus": gpus, "work_h": work_h, "rate": label, "tau_h": tau / 3600, "misses": misses,
                             "need_h": {r: n / 3600 for r, n in need.items()}})  # fmt: skip
                cells = " | ".join(f"{m:.1%}" for m in misses.values())
                print(f"| {gpus} | {work_h:.0f} h | {label} | {cells} | {room:.2f} h |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": args.runs, "restart_s": RESTART_S, "checkpoint_s": CHECKPOINT_S,
                                    "rows": rows}, indent=1) + "\n")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
