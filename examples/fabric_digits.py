"""Profile and train a CNN on scikit-learn's digits in a Lightning Fabric loop: FabricProfiler and FabricPreemption.

python examples/fabric_digits.py                        # 1 process (GPU if there is one)
torchrun --nproc_per_node 2 examples/fabric_digits.py   # 2 DDP processes: every gradient all-reduce timed

Batches 20-219 are profiled; at the window's end rank 0 writes srifty/profile.json and, for a run of ``--work-steps``
optimizer steps, ranks EC2 fleets (srifty/plan.json, srifty/report.html): the plan
``srifty terraform --plan srifty/plan.json --train-command "examples/fabric_digits.py"`` provisions. On that fleet the
same script resumes from the fleet's checkpoints and leaves on a spot notice (FabricPreemption), takes the plan's
batch and accumulation for its rank (launch_settings: the global batch it was profiled with), continues at the
checkpoint's sample after a resume (GlobalBatchSampler: the samples an uninterrupted run trains on, on any world
size), and is not profiled again (the state says it was); its own profile and plan go to srifty/launch-<id>/ under a
launch.
"""

import argparse
import os

import lightning as L
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from lightning_srifty import Constraints, FabricPreemption, FabricProfiler, GlobalBatchSampler, launch_settings
from lightning_srifty.demo.data import DigitsDataModule
from lightning_srifty.demo.models import DigitsCNN

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--max-steps", type=int, default=300, help="the profile needs 220 (20 warm-up + 200)")
    parser.add_argument("--work-steps", type=int, default=20_000, help="the whole run the fleets are ranked for")
    args = parser.parse_args()

    # under torchrun: its processes on this machine; a fleet's nodes set LT_NUM_NODES, which Fabric reads
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    strategy = "ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto"
    fabric = L.Fabric(accelerator=args.accelerator, devices=devices, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0)
    settings = launch_settings(default_batch_size=64)  # the plan's batch and accumulation on a fleet; 64 and 1 off one
    accumulate = settings.accumulate_grad_batches
    data = DigitsDataModule()
    data.setup("fit")
    # every rank's batch (a fleet of mixed GPUs gives them unequal shares of one global batch), in rank order
    sizes = [int(b) for b in fabric.all_gather(torch.tensor(settings.batch_size)).reshape(-1)]
    weight = fabric.world_size * settings.batch_size / sum(sizes)  # DDP's mean of the ranks' means: the batch's mean
    # the same seeded order of samples on every rank and every fleet; after a resume it continues at the step
    sampler = GlobalBatchSampler(
        len(data.train), sizes, rank=fabric.global_rank, seed=0, accumulate_grad_batches=accumulate
    )
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(data.train, batch_sampler=sampler), use_distributed_sampler=False)
    state = {"model": model, "optimizer": optimizer, "step": 0}  # step: optimizer steps
    # the profiler after the resume: a state that says the run was profiled is not profiled again
    with (
        FabricPreemption(fabric, state, sampler=sampler) as spot,  # state: the fleet's newest checkpoint's, if any
        FabricProfiler(
            fabric,
            model,
            optimizer,
            constraints=Constraints(steps=args.work_steps),
            accumulate_grad_batches=accumulate,
            dataloader=loader,
            state=state,
        ) as prof,
    ):
        batches = 0
        while state["step"] < args.max_steps:
            for x, y in loader:
                batches += 1
                stepping = batches % accumulate == 0  # the last batch of an optimizer step
                with prof.step((x, y)), fabric.no_backward_sync(model, enabled=not stepping):
                    loss = F.cross_entropy(model(x), y) * weight / accumulate
                    prof.backward(loss)
                    if stepping:
                        optimizer.step()
                        optimizer.zero_grad()
                if not stepping:
                    continue
                state["step"] += 1
                spot.step()  # the checkpoints, the notice's leave, the node's alive file
                if state["step"] >= args.max_steps:
                    break
    fabric.print(f"trained {state['step']} steps")
