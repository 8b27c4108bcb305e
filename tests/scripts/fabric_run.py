"""A Lightning Fabric loop as a user writes one for a srifty fleet (FabricPreemption), for the Fabric tests.

torchrun --nproc_per_node 2 tests/scripts/fabric_run.py OUT --max-steps 20 [--sigterm-at K] [--fail-at K] [--profile]

Each rank takes its batch of step s from a generator seeded by (s, rank): a resumed leg sees the batches an
uninterrupted run sees from its step on. Each rank appends its parameters (its shard under FSDP) after each step to
OUT/params-rank<r>.txt ("step v v ..."). Checkpoints go where the environment says (``SRIFTY_CHECKPOINT_URI`` on a
fleet). With ``--profile`` a FabricProfiler measures batches 2-4 (OUT/profile.json), its state in the checkpoint.
"""

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from torch import nn

from lightning_srifty import FabricPreemption, FabricProfiler
from lightning_srifty.migrate.spot_watcher import Notice


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
    parser.add_argument("--fsdp", choices=("sharded", "full"), help="FSDP, its checkpoints a directory or one file")
    parser.add_argument("--rebalance-at", type=int, default=-1, help="rank 1's node gets a rebalance after it")
    parser.add_argument("--profile", action="store_true", help="FabricProfiler over batches 2-4, in the state")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # a GPU node's "auto" is its GPUs, torchrun's processes
    strategy = "ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto"
    if args.fsdp:
        from lightning.fabric.strategies import FSDPStrategy

        class GlooFSDP(FSDPStrategy):
            """FSDP on gloo: Fabric refuses FSDPStrategy itself off a GPU (an exact type check) and gives FSDP the
            device index (None on the CPU, which FSDP refuses); the save and load are Fabric's own."""

            def setup_module(self, module: nn.Module) -> nn.Module:
                from torch.distributed.fsdp import FullyShardedDataParallel

                return FullyShardedDataParallel(module, device_id=torch.device("cpu"), **self._fsdp_kwargs)

        # each Linear its own FSDP unit: a full state dict is a collective, as on a real model
        strategy = GlooFSDP(state_dict_type=args.fsdp, auto_wrap_policy={nn.Linear})
        if args.fsdp == "full":
            _full_state_dict_on_the_cpu()
    fabric = L.Fabric(accelerator="cpu", devices=devices, strategy=strategy)
    fabric.launch()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    if args.fsdp:  # FSDP flattens the parameters when it wraps the module: the optimizer comes after
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    with FabricPreemption(fabric, state) as spot:
        if fabric.is_global_zero:
            (args.out / "started-at.txt").write_text(f"{state['step']}\n")
        prof = profiler(fabric, model, optimizer, state, args.out) if args.profile else None
        while state["step"] < args.max_steps:
            if state["step"] == args.fail_at:
                raise RuntimeError(f"a bug at step {state['step']}")
            x, y = batch(state["step"], fabric.global_rank)
            with prof.step((x, y)) if prof else contextlib.nullcontext():
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                prof.backward(loss) if prof else fabric.backward(loss)
                optimizer.step()
            state["step"] += 1
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])  # FSDP: this rank's shard
            with open(args.out / f"params-rank{fabric.global_rank}.txt", "a") as f:
                f.write(f"{state['step']} " + " ".join(f"{v:.9g}" for v in flat.tolist()) + "\n")
            if state["step"] == args.sigterm_at and fabric.is_global_zero:
                os.kill(os.getpid(), signal.SIGTERM)  # the node's notice, on one rank
            if state["step"] == args.rebalance_at and fabric.global_rank == 1:  # that node's own metadata says so
                spot._notice(Notice("rebalance", None, None, time.monotonic()))
            time.sleep(args.step_sleep)
            spot.step()
    if fabric.is_global_zero:
        (args.out / "done.txt").write_text(f"{state['step']}\n")


def profiler(fabric: L.Fabric, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, out: Path):
    return FabricProfiler(
        fabric,
        model,
        optimizer,
        warmup_steps=2,
        profile_steps=3,
        output=out / "profile.json",
        recommend=False,
        state=state,
        verbose=False,
    )


def _full_state_dict_on_the_cpu() -> None:
    """Lightning 2.6's FSDP gathers a full state dict with ``offload_to_cpu=True`` on any device: with the shards
    already on the CPU the offload frees the storage its views still alias, and rank 0 ends with SIGSEGV in the save
    (Lightning-AI/pytorch-lightning#21804). Fabric's own save and load stay; they gather under srifty_fsdp's context
    for the CPU (the same gather, no offload), as on a GPU fleet, where the offload is a copy."""
    from lightning.fabric.strategies import fsdp as fabric_fsdp

    from lightning_srifty.strategies.fsdp import _full_state_dict_in_place

    fabric_fsdp._get_full_state_dict_context = _full_state_dict_in_place


if __name__ == "__main__":
    main()
