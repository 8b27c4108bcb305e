"""Spot capacity's cost width by the run's length (examined, not shipped): how far the srifty policy's replayed cost
lands from the ranking's expectation on the spot traces, for runs of 0.5-128 h of training, against
:data:`predictor.runs.odds.CAPACITY_LOG_WIDTH` (measured on 10-200 h runs); and the same with a launch into a market
without spot read as one interruption at the start (probability 1 - the trace's availability), a physical term tried.

The jobs, traces and prices are bench/spot_replay.py's (p3.2xlarge, skypilot-org/spot-traces); deadlines 1.1-5x the
on-demand time, five start points per trace; the expectation from each whole trace's statistics (--spot-trace's).
``--ticks`` replays the 2023-04-22 preemption trace at its own 32 s ticks against the 320 s the sets use, to see how
much of a short run's gap is the replay's resolution.

python bench/capacity_width.py [--ticks]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import spot_replay as sr  # noqa: E402

from predictor.runs import deadline as dl  # noqa: E402
from predictor.runs import odds  # noqa: E402
from predictor.runs.spot import spot_cost  # noqa: E402

WORK_H = (0.5, 1, 2, 4, 8, 16, 32, 64, 128)
FACTORS = (1.1, 1.5, 2.0, 3.0, 5.0)
STARTS = 5
BANDS = (("0.5-2 h", 0.0, 2.0), ("4-16 h", 4.0, 16.0), ("32-128 h", 32.0, 1e9), ("all", 0.0, 1e9))


def expected(job: dl.Job, trace, launch: bool, start_s: float = 0.0) -> float:
    """The ranking's expectation from the whole trace's spells; ``launch``: plus 1 - availability interruptions;
    ``start_s``: the first start-up, billed (bench/spot_replay.py's expectation leaves it out, 0: the replay bills
    the job's whole restart for it)."""
    a, up_h, down_h = sr.spells(trace)
    sc = spot_cost(np.array([job.work_s]), np.ones(1), np.array([1.0 / up_h]), sr.CHECKPOINT_S, restart_s=job.restart_s)
    n = sc.expected_interruptions + ((1.0 - a) if launch else 0.0)
    fb = odds.expected_with_fallback(
        sc.expected_time_s, np.array([job.work_s]), n, job.deadline_s, np.array([start_s]), np.array([job.restart_s]),
        np.array([job.spot_usd_hr]), np.array([job.od_usd_hr]), down_s=down_h * 3600,
    )  # fmt: skip
    return float(fb.cost_usd[0])


def replays(sets: dict, restart: float, work_h=WORK_H, factors=FACTORS) -> np.ndarray:
    """Rows (work h, deadline factor, replayed cost, expected, expected with the launch term)."""
    out = []
    for spec in sets.values():
        for trace in sr.traces(spec):
            for job, start, w, f in sr.jobs(trace, restart, spec[2], factors, work_h, STARTS):
                o = dl.replay(job, trace.window(start, trace.ticks - start), dl.Srifty())
                now = (expected(job, trace, False), expected(job, trace, True))
                billed = (expected(job, trace, False, restart), expected(job, trace, True, restart))
                out.append((w, f, o.cost_usd, *now, *billed))
    return np.array(out)


def table(name: str, rows: np.ndarray) -> None:
    lo, hi = odds.CAPACITY_LOG_WIDTH
    labels = ("as spot_replay.py", "+ a launch without spot", "+ the first start-up", "+ both")
    for label, col in zip(labels, (3, 4, 5, 6)):
        for band, a, b in BANDS:
            m = (rows[:, 0] >= a) & (rows[:, 0] <= b)
            lr = np.log(rows[m, 2] / rows[m, col])
            mape = np.mean(np.abs(rows[m, col] / rows[m, 2] - 1))
            inside = np.mean((lr >= lo) & (lr <= hi))
            p10, p50, p90 = np.percentile(lr, (10, 50, 90))
            print(f"| {name} | {label} | {band} | {m.sum()} | {mape:.1%} | {p10:+.2f} | {p50:+.2f} | {p90:+.2f} | "
                  f"{inside:.0%} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", action="store_true", help="the 2023-04-22 trace at 320 s and at its own 32 s ticks")
    args = ap.parse_args()
    restart = sr.restart_s()
    print("| set | expectation | training | runs | MAPE | ln(replayed / expected) p10 | p50 | p90 | inside "
          "CAPACITY_LOG_WIDTH |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    table("development", replays(sr.SETS, restart))
    table("held out", replays(sr.HELD_OUT, restart))
    if args.ticks:
        print("\n| ticks | training | runs | ln(replayed / expected) p10 | p50 | p90 |")
        print("|---|---|---:|---:|---:|---:|")
        for factor in (10, 1):
            spec = ("preemption/1-node/aws-04-22-2023/*.json", "preempted", 1, factor)
            rows = replays({"p": spec}, restart, work_h=(0.5, 2, 8), factors=(1.1, 2.0, 5.0))
            for w in (0.5, 2, 8):
                lr = np.log(rows[rows[:, 0] == w, 2] / rows[rows[:, 0] == w, 3])
                p10, p50, p90 = np.percentile(lr, (10, 50, 90))
                print(f"| {32 * factor} s | {w:g} h | {len(lr)} | {p10:+.2f} | {p50:+.2f} | {p90:+.2f} |")


if __name__ == "__main__":
    main()
