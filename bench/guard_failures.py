"""The spot guard's last on-demand start, with and without the on-demand finish's node failures and saves priced.

srifty launch's hard rule starts the on-demand fleet when the slack left is what an on-demand finish needs. Until the
thirty-fourth session that was the restart and the steps left at the step time; it now also counts the finish's
periodic checkpoints and its node failures (:func:`predictor.runs.spot.on_demand_time_s`), at the plan's confidence
once the job has measured its step. This drives the real :class:`SpotGuard` (hard rule only: a policy that always
waits, spot never there, no progress, the step measured, a check every 300 s) to the first check where it forces
on-demand, starts an on-demand finish there, draws its node failures, and counts the finishes past the deadline.

The finish: ``RESTART_S`` to bring the fleet up (the guard's restart), then ``work`` of training with a save of
``CHECKPOINT_S`` every Young-Daly interval (the plan's, from the model's rate); node failures arrive as a Poisson
process during training and saves, and each costs the restart, a checkpoint load and the training since the last
save. The rate drawn is the model's (OPT-175B's, :data:`~predictor.runs.spot.FAILURES_PER_GPU_HR`) and the held-out
run's (Llama 3's, 6.8x lower): the guard cannot know which the fleet meets. The deadline is 1.5x the work, so the
guard waits a third of the run before the rule fires.

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

from lightning_srifty.provision.launcher.spot_guard import SpotGuard  # noqa: E402
from predictor.runs import deadline  # noqa: E402
from predictor.runs.spot import FAILURES_PER_GPU_HR, on_demand_cost  # noqa: E402

LLAMA3_PER_GPU_HR = 419 / (16_384 * 54 * 24)  # the held-out run of bench/node_failures.py
RESTART_S = 900.0  # a fleet's start-up, a save and a restore: the scale srifty's plans show for p4d/p5 fleets
CHECKPOINT_S = 60.0
STEP_S, CHECK_S = 10.0, 300.0


class Waits(deadline.Policy):
    """Never spot, never on-demand by choice: only the guard's hard rule starts the on-demand fleet."""

    def decide(self, s, j) -> int:
        return deadline.WAIT


def last_start_s(work_s: float, gpus: float, confidence: float | None) -> float:
    """Seconds from the start to the check where the guard forces on-demand (``gpus`` 0: the rule before)."""
    g = SpotGuard(Waits(), started_unix=0.0, deadline_h=1.5 * work_s / 3600, steps=round(work_s / STEP_S),
                  step_s=STEP_S, restart_s=RESTART_S, check_s=CHECK_S, spot_usd_hr=1.0, od_usd_hr=3.0, gpus=gpus,
                  checkpoint_s=CHECKPOINT_S, confidence=confidence)  # fmt: skip
    g.progress(None, step_time_s=STEP_S)  # measured
    g.observe(False, now=0.0)
    k = 0
    while not g.decide(k * CHECK_S, None).forced:
        k += 1
    return k * CHECK_S


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
    rules = {"before (no room)": (0.0, None), "expectation": (None, None), "0.9": (None, 0.9), "0.95": (None, 0.95)}
    rows = []
    print("| GPUs | work left | rate drawn | " + " | ".join(f"misses, {r}" for r in rules) + " | room at 0.9 |")
    print("|---:|---:|---|" + "---:|" * (len(rules) + 1))
    for gpus in (8, 64, 256):
        for work_h in (6.0, 24.0, 72.0):
            work_s = work_h * 3600
            tau = float(on_demand_cost(work_s, CHECKPOINT_S, restart_s=RESTART_S, gpus=gpus).checkpoint_interval_s[0])
            starts = {r: last_start_s(work_s, gpus if g is None else g, c) for r, (g, c) in rules.items()}
            room = (starts["before (no room)"] - starts["0.9"]) / 3600
            for label, per_gpu_hr in (("model's", FAILURES_PER_GPU_HR), ("Llama 3's", LLAMA3_PER_GPU_HR)):
                rate_s = gpus * per_gpu_hr / 3600
                t = np.array([finish_s(work_s, tau, rate_s, rng) for _ in range(args.runs)])
                misses = {r: float(np.mean(start + t > 1.5 * work_s)) for r, start in starts.items()}
                rows.append({"gpus": gpus, "work_h": work_h, "rate": label, "tau_h": tau / 3600, "misses": misses,
                             "last_start_h": {r: x / 3600 for r, x in starts.items()}})  # fmt: skip
                cells = " | ".join(f"{m:.1%}" for m in misses.values())
                print(f"| {gpus} | {work_h:.0f} h | {label} | {cells} | {room:.2f} h |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": args.runs, "restart_s": RESTART_S, "checkpoint_s": CHECKPOINT_S,
                                    "rows": rows}, indent=1) + "\n")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
