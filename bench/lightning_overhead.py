"""Lightning's own host time per training step, apart from the operators the step launches, on the machine it runs on.

    python bench/lightning_overhead.py [--steps 400] [--repeats 5] [--strategy auto|ddp]

A one-parameter LightningModule (``training_step``: one multiply, one sum, ``self.log(..., prog_bar=True)`` as the
demo logs; Adam) trained by ``Trainer.fit`` on CPU, and the same operators in a plain PyTorch loop (forward, backward,
``optimizer.step()``, ``zero_grad``) over the same batches. Each step is timed from the batch in hand to the step done
(Lightning: ``on_train_batch_start`` to ``on_train_batch_end``; the plain loop: the same span), so the data loader's
fetch is out of both, as the profile's data phase is out of a predicted step. The difference of the medians is what
Lightning adds per step (its hooks, the optimizer closure, the precision plugin, logging, the loop's bookkeeping),
whatever the model: a host cost per step, not per kernel.

The same host's Python speed is probed as ``bench/host_dispatch.py`` probes a GPU host (a bare tensor ``add``, an
``nn.Linear`` module call), on CPU tensors, so the step cost can be carried to another host in units of its module
call (``linear_module - add``: the Python of a module call, without the operator). Prints one JSON object (medians of
``--repeats`` runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings


def probes(calls: int = 20000) -> dict[str, float]:
    """Microseconds per call of a bare ``add`` and an ``nn.Linear(64, 64)`` module call on CPU tensors."""
    import torch
    from torch import nn

    x = torch.ones(256)
    lin = nn.Linear(64, 64)
    h = torch.ones(8, 64)
    out = {}
    for name, fn in (("add", lambda: x.add(1.0)), ("linear_module", lambda: lin(h))):
        for _ in range(500):
            fn()
        reps = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            reps.append((time.perf_counter() - t) / calls * 1e6)
        out[f"{name}_us"] = statistics.median(reps)
    return out


def lightning_step_us(steps: int, strategy: str) -> float:
    """Median microseconds of a Lightning step of the one-parameter module, batch in hand to step done."""
    import lightning.pytorch as pl
    import torch
    from torch import nn

    class Null(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            loss = (self.w * batch).sum()
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.spans: list[float] = []

        def on_train_batch_start(self, *args: object) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, *args: object) -> None:
            self.spans.append(time.perf_counter() - self.t0)

    clock = Clock()
    data = torch.utils.data.DataLoader([torch.ones(4) for _ in range(steps)], batch_size=None)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=True,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[clock],
    )
    trainer.fit(Null(), train_dataloaders=data)
    return statistics.median(clock.spans[steps // 5 :]) * 1e6


def plain_step_us(steps: int) -> float:
    """Median microseconds of the same operators in a plain PyTorch loop."""
    import torch
    from torch import nn

    w = nn.Parameter(torch.ones(4))
    opt = torch.optim.Adam([w], lr=1e-3)
    spans = []
    for batch in torch.utils.data.DataLoader([torch.ones(4) for _ in range(steps)], batch_size=None):
        t = time.perf_counter()
        loss = (w * batch).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        spans.append(time.perf_counter() - t)
    return statistics.median(spans[steps // 5 :]) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--strategy", default="auto", help="the Trainer's strategy (auto: one device, no wrapper)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    reps = [(lightning_step_us(args.steps, args.strategy), plain_step_us(args.steps)) for _ in range(args.repeats)]
    out: dict[str, object] = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__}
    try:
        with open("/proc/cpuinfo") as fh:
            out["cpu"] = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import lightning

    out["lightning"] = lightning.__version__
    out |= probes()
    out["lightning_step_us"] = statistics.median(r[0] for r in reps)
    out["plain_step_us"] = statistics.median(r[1] for r in reps)
    out["lightning_overhead_us"] = statistics.median(r[0] - r[1] for r in reps)
    out["overhead_in_module_calls"] = out["lightning_overhead_us"] / (out["linear_module_us"] - out["add_us"])
    out["overhead_in_adds"] = out["lightning_overhead_us"] / out["add_us"]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
