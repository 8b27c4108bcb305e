"""Three gloo ranks profiled by FabricProfiler beside an unprofiled twin, for the Fabric profiler's rank tests.

torchrun --nproc_per_node 3 tests/scripts/fabric_profile_ranks.py OUT

Two DDP models of the same initial weights train on the same batches (each rank's seeded by (step, rank)): ``plain``
as Fabric sets it up, ``profiled`` under a FabricProfiler (batches 2-5; its all-reduce hook stays for the rest of the
run). Rank 0's step 3 of ``profiled`` raises after its optimizer step and the loop catches it (a logger failing, say):
the other ranks must not be left waiting in the window's end. Then a second profiler of ``profiled`` (batches 12-15)
finds the first's hook. Each rank writes OUT/equal-rank<r>.txt: whether every parameter of the two models is the same,
bit for bit, after 20 steps (world 3: DDP's own mean divides by a number that is not a power of two).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from torch import nn

from lightning_srifty import FabricProfiler


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 12, generator=g)
    return x, torch.randint(0, 5, (16,), generator=g)


def build(fabric: L.Fabric):
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 48), nn.Tanh(), nn.Linear(48, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return fabric.setup(model, optimizer)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    fabric = L.Fabric(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy="ddp")
    fabric.launch()
    plain, plain_opt = build(fabric)
    model, optimizer = build(fabric)
    options = {"warmup_steps": 2, "profile_steps": 4, "recommend": False, "verbose": False}
    prof = FabricProfiler(fabric, model, optimizer, output=out / "profile.json", **options)
    for step in range(20):
        if step == 10:
            prof = FabricProfiler(fabric, model, optimizer, output=out / "profile2.json", **options)
        x, y = batch(step, fabric.global_rank)
        fabric.backward(nn.functional.cross_entropy(plain(x), y))
        plain_opt.step()
        plain_opt.zero_grad()
        try:
            with prof.step((x, y)):
                prof.backward(nn.functional.cross_entropy(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
                if step == 3 and fabric.global_rank == 0:
                    raise ConnectionError("the logger's server went away")
        except ConnectionError:
            pass
    same = all(torch.equal(a, b) for a, b in zip(plain.parameters(), model.parameters(), strict=True))
    (out / f"equal-rank{fabric.global_rank}.txt").write_text(f"{same}\n")


if __name__ == "__main__":
    main()
