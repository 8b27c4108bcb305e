"""A Lightning Fabric loop as a user writes one for a srifty fleet (FabricPreemption), for the Fabric tests.

torchrun --nproc_per_node 2 tests/scripts/fabric_run.py OUT --max-steps 20 [--sigterm-at K] [--fail-at K]

Each rank takes its batch of step s from a generator seeded by (s, rank): a resumed leg sees the batches an
uninterrupted run sees from its step on. Rank 0 appends the parameters after each step to OUT/params.txt
("step v v ..."). Checkpoints go where the environment says (``SRIFTY_CHECKPOINT_URI`` on a fleet).
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from torch import nn

from lightning_srifty import FabricPreemption


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(8, 1, generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--sigterm-at", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # a GPU node's "auto" is its GPUs, torchrun's processes
    fabric = L.Fabric(
        accelerator="cpu", devices=devices, strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto"
    )
    fabric.launch()
    torch.manual_seed(1)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    with FabricPreemption(fabric, state) as spot:
        if fabric.is_global_zero:
            (args.out / "started-at.txt").write_text(f"{state['step']}\n")
        while state["step"] < args.max_steps:
            if state["step"] == args.fail_at:
                raise RuntimeError(f"a bug at step {state['step']}")
            x, y = batch(state["step"], fabric.global_rank)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            state["step"] += 1
            if fabric.is_global_zero:
                flat = torch.cat([p.detach().flatten() for p in model.parameters()])
                with open(args.out / "params.txt", "a") as f:
                    f.write(f"{state['step']} " + " ".join(f"{v:.9g}" for v in flat.tolist()) + "\n")
            if state["step"] == args.sigterm_at and fabric.is_global_zero:
                os.kill(os.getpid(), signal.SIGTERM)  # the node's notice, on one rank
            time.sleep(args.step_sleep)
            spot.step()
    if fabric.is_global_zero:
        (args.out / "done.txt").write_text(f"{state['step']}\n")


if __name__ == "__main__":
    main()
