"""What ``FabricPreemption.step()`` costs a Fabric loop's step: two gloo ranks under torchrun, a tiny model (so the
step is mostly the framework's own work), the same loop with and without ``spot.step()``.

    python bench/fabric_step.py [--steps 400] [--runs 3] [--base DIR]

``--base DIR``: also the wrapped loop with the package of another checkout (a ``git worktree`` of an earlier commit),
in the same runs.

Each run starts both loops under torchrun one after the other (alternating which goes first), times every step on
rank 0 after a warm-up of 50, and reports the median step. The wrapper's own work a step is the agreement on a
notice and on a due checkpoint (small all-reduces) and, on a fleet node, local rank 0's alive file (a rename every
5 s at most); no checkpoint is due in these runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOOP = r"""
import os, sys, time, json
import lightning as L, torch
from torch import nn
from lightning_srifty import FabricPreemption
torch.set_num_threads(1)
wrapped, steps, out = sys.argv[1] == "wrapped", int(sys.argv[2]), sys.argv[3]
fabric = L.Fabric(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy="ddp")
fabric.launch()
torch.manual_seed(0)
model = nn.Linear(64, 64)
model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
state = {"model": model, "optimizer": optimizer, "step": 0}
spot = FabricPreemption(fabric, state, os.path.join(out, "ck")) if wrapped else None
if spot is not None:
    spot.start()
x = torch.randn(32, 64)
times = []
for _ in range(steps):
    t = time.perf_counter()
    loss = model(x).square().mean()
    optimizer.zero_grad()
    fabric.backward(loss)
    optimizer.step()
    state["step"] += 1
    if spot is not None:
        spot.step()
    times.append(time.perf_counter() - t)
if spot is not None:
    spot.finished()
if fabric.is_global_zero:
    with open(os.path.join(out, "times.json"), "w") as f:
        json.dump(times, f)
"""


def run(mode: str, steps: int, port: int, root: Path = ROOT) -> list[float]:
    with tempfile.TemporaryDirectory() as out:
        script = Path(out, "loop.py")
        script.write_text(LOOP)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root), "AWS_EC2_METADATA_DISABLED": "true"}
        for name in [k for k in env if k.startswith("SRIFTY_")]:
            env.pop(name)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
        loop = "wrapped" if mode.startswith("wrapped") else mode
        done = subprocess.run([*command, str(script), loop, str(steps), out], env=env, capture_output=True, text=True)
        if done.returncode and not Path(out, "times.json").exists():  # torch's teardown abort after it is not
            sys.exit(f"the {mode} loop failed ({done.returncode}):\n{done.stderr[-3000:]}")
        import json

        return json.loads(Path(out, "times.json").read_text())[50:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--base", type=Path, help="another checkout's package for a third loop, wrapped")
    args = parser.parse_args()
    modes = ["plain", "wrapped"] + (["wrapped-base"] if args.base else [])
    rows = []
    for i in range(args.runs):
        order = modes[i % len(modes) :] + modes[: i % len(modes)]  # each loop first in turn
        medians = {}
        for j, mode in enumerate(order):
            started = time.monotonic()
            root = args.base.resolve() if mode == "wrapped-base" else ROOT
            medians[mode] = statistics.median(run(mode, args.steps, 29700 + 3 * i + j, root)) * 1e3
            print(f"run {i + 1}: {mode:12s} median step {medians[mode]:.3f} ms ({time.monotonic() - started:.0f} s)")
        rows.append(medians)
    print("\n| run | " + " | ".join(f"{m} step (ms)" for m in modes) + " | wrapped - plain (ms) |")
    print("|---|" + "---:|" * (len(modes) + 1))
    for i, m in enumerate(rows, 1):
        cells = " | ".join(f"{m[k]:.3f}" for k in modes)
        print(f"| {i} | {cells} | {m['wrapped'] - m['plain']:+.3f} |")
    for mode in modes[1:]:
        diffs = [m[mode] - m["plain"] for m in rows]
        print(f"median {mode} - plain over {len(rows)} runs: {statistics.median(diffs):+.3f} ms a step")


if __name__ == "__main__":
    main()
