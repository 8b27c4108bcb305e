"""Overhead of SriftyCallback on step time: the demo run with and without it, interleaved, same seed.

    python bench/profile_overhead.py [--model cnn|lm] [--rounds 15] [--warmup 20] [--profile 200] [--after 200]
        [--accelerator cpu|cuda]

Two measurements:

1. A/B runs. Every arm carries the same tiny step clock (perf_counter at every on_train_batch_start); the "on" arm
   adds SriftyCallback. Each round runs the arms in one process with the same seed (order alternating), takes the
   median step time during the profile window [warmup, warmup+profile) and after it [warmup+profile+5, end), and the
   ratio on/off. An A/A pair (off vs off) per round measures the machine's noise floor for the same statistic.
2. Attribution. In the "on" arm every hook of the callback is wrapped with perf_counter: the time spent inside the
   callback per step, divided by that step's time, is its overhead with microsecond resolution, immune to the
   run-to-run drift that dominates (1) on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from lightning_srifty.demo.run import DemoConfig, build  # noqa: E402
from lightning_srifty.profiling.callback import SriftyCallback  # noqa: E402
from lightning_srifty.profiling.hardware import cpu_count, cpu_model  # noqa: E402

HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_train_batch_end",
    "on_train_epoch_start",
    "on_validation_start",
    "on_save_checkpoint",
)


class HookTimer:
    """Wraps the callback's hooks: seconds spent inside them, per step index (counted by the step clock)."""

    def __init__(self, callback: Callback, clock: StepClock) -> None:
        self.per_step: dict[int, float] = {}
        for name in HOOKS:
            setattr(callback, name, self._wrap(getattr(callback, name), clock))

    def _wrap(self, fn, clock):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                step = len(clock.starts) - 1
                self.per_step[step] = self.per_step.get(step, 0.0) + time.perf_counter() - t0

        return timed


class Noop(Callback):
    """Same hooks, no work: its in-hook time is the instrumentation's own cost."""

    def on_train_batch_start(self, *args) -> None:
        return None

    on_before_backward = on_after_backward = on_train_batch_end = on_train_epoch_start = on_train_batch_start
    on_validation_start = on_save_checkpoint = on_train_batch_start


class StepClock(Callback):
    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())


def one_run(
    model_name: str,
    size: str,
    with_srifty: bool,
    warmup: int,
    profile: int,
    after: int,
    out_dir: Path,
    accelerator: str = "cpu",
) -> dict[str, float]:
    pl.seed_everything(0, verbose=False)
    model, data = build(DemoConfig(model=model_name, size=size))
    clock = StepClock()
    callbacks: list[Callback] = [clock]
    hooks = floor = None
    if with_srifty:
        cb = SriftyCallback(
            warmup_steps=warmup, profile_steps=profile, output=out_dir / "p.json", verbose=False, recommend=False
        )
        hooks = HookTimer(cb, clock)
        noop = Noop()
        floor = HookTimer(noop, clock)
        callbacks += [cb, noop]
    trainer = pl.Trainer(
        max_steps=warmup + profile + after,
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(model, datamodule=data)
    steps = [b - a for a, b in zip(clock.starts, clock.starts[1:])]  # step i = start(i) -> start(i+1)
    window = steps[warmup : warmup + profile]
    tail = steps[warmup + profile + 5 :]
    out = {"window": statistics.median(window), "after": statistics.median(tail)}
    if hooks is not None:

        def cost(i: int) -> float:  # seconds inside SriftyCallback's hooks at step i, less the instrumentation
            return max(0.0, hooks.per_step.get(i, 0.0) - floor.per_step.get(i, 0.0))

        def share(lo: int, hi: int) -> tuple[float, float]:
            idx = range(lo, min(hi, len(steps)))
            per = [cost(i) / steps[i] for i in idx]
            return statistics.median(per), sum(cost(i) for i in idx) / sum(steps[i] for i in idx)

        def per_step_us(lo: int, hi: int) -> float:
            return statistics.median(cost(i) for i in range(lo, min(hi, len(steps)))) * 1e6

        out["hook_window_median"], out["hook_window_total"] = share(warmup, warmup + profile)
        out["hook_after_median"], out["hook_after_total"] = share(warmup + profile + 1, len(steps))
        out["hook_us_window"] = per_step_us(warmup, warmup + profile)
        out["hook_us_after"] = per_step_us(warmup + profile + 1, len(steps))
        out["floor_us"] = statistics.median(floor.per_step.get(i, 0.0) for i in range(warmup, len(steps))) * 1e6
        # the operator capture runs in the last warm-up step (outside the window): its step against the warm-up's
        warm = [steps[i] for i in range(max(1, warmup - 10), warmup - 1)]
        out["capture_step_ms"] = steps[warmup - 1] * 1e3
        out["capture_step_ratio"] = steps[warmup - 1] / statistics.median(warm)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["cnn", "lm"], default="cnn")
    parser.add_argument("--size", choices=["small", "medium", "large"], default="small")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: less noise)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--profile", type=int, default=200)
    parser.add_argument("--after", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    rows = []
    for r in range(args.rounds):
        arms = [("off", False), ("on", True), ("off2", False)]
        if r % 2:
            arms.reverse()
        res = {
            name: one_run(
                args.model, args.size, flag, args.warmup, args.profile, args.after, args.out, args.accelerator
            )
            for name, flag in arms
        }
        row = {"round": r, **{f"{k}_{m}": v for k, d in res.items() for m, v in d.items()}}
        row["ratio_window"] = res["on"]["window"] / res["off"]["window"]
        row["ratio_after"] = res["on"]["after"] / res["off"]["after"]
        row["aa_window"] = res["off2"]["window"] / res["off"]["window"]
        row["aa_after"] = res["off2"]["after"] / res["off"]["after"]
        rows.append(row)
        print(
            f"round {r}: A/B window x{row['ratio_window']:.4f} after x{row['ratio_after']:.4f} | A/A window "
            f"x{row['aa_window']:.4f} after x{row['aa_after']:.4f} | in hooks: window "
            f"{res['on']['hook_us_window']:.1f} us/step ({res['on']['hook_window_median'] * 100:.3f}%), after "
            f"{res['on']['hook_us_after']:.2f} us/step ({res['on']['hook_after_median'] * 100:.4f}%); instrumentation "
            f"floor {res['on']['floor_us']:.1f} us/step",
            flush=True,
        )

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    def spread(key: str) -> str:
        vals = sorted(r[key] for r in rows)
        return f"[{vals[len(vals) // 4]:.4f}, {vals[(3 * len(vals)) // 4]:.4f}]"

    summary = {
        "model": f"{args.model}/{args.size}",
        "rounds": args.rounds,
        "warmup": args.warmup,
        "profile": args.profile,
        "after": args.after,
        "threads": args.threads,
        "accelerator": args.accelerator,
        "machine": f"{cpu_model()}, {cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name()}" if args.accelerator == "cuda" else ""),
        "median_step_off_ms": med("off_window") * 1e3,
        "ab_window": med("ratio_window"),
        "ab_after": med("ratio_after"),
        "aa_window": med("aa_window"),
        "aa_after": med("aa_after"),
        "hook_window_median": med("on_hook_window_median"),
        "hook_window_total": med("on_hook_window_total"),
        "hook_after_median": med("on_hook_after_median"),
        "hook_after_total": med("on_hook_after_total"),
        "hook_us_window": med("on_hook_us_window"),
        "hook_us_after": med("on_hook_us_after"),
        "capture_step_ms": med("on_capture_step_ms"),
        "capture_step_ratio": med("on_capture_step_ratio"),
        "rows": rows,
    }
    (args.out / f"profile_overhead_{args.model}_{args.size}_{args.accelerator}.json").write_text(
        json.dumps(summary, indent=2)
    )
    print(
        "\n| model | step (off) | A/B window | A/B after | A/A window (noise) | A/A after (noise) | "
        "in-hook window: per step (share) | in-hook after: per step (share) |"
    )
    print(
        f"| {summary['model']} | {summary['median_step_off_ms']:.2f} ms | {summary['ab_window']:.4f} "
        f"{spread('ratio_window')} | {summary['ab_after']:.4f} {spread('ratio_after')} | {summary['aa_window']:.4f} "
        f"{spread('aa_window')} | {summary['aa_after']:.4f} {spread('aa_after')} | "
        f"{summary['hook_us_window']:.1f} us ({summary['hook_window_median'] * 100:.3f}%; with the one-off "
        f"write {summary['hook_window_total'] * 100:.3f}%) | {summary['hook_us_after']:.2f} us "
        f"({summary['hook_after_median'] * 100:.4f}%) |"
    )
    print(
        f"operator capture (last warm-up step, outside the window): {summary['capture_step_ms']:.1f} ms, "
        f"{summary['capture_step_ratio']:.2f}x a warm-up step (medians over rounds)"
    )


if __name__ == "__main__":
    main()
