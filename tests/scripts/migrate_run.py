"""One leg of a migrated run: train a small regression with GlobalBatchSampler + ExactResume + SpotPreemption.

python tests/scripts/migrate_run.py OUT --batch-sizes 8 --max-steps 30 [--sigterm-at K] [--resume]

Every rank appends the sample ids of each step to OUT/seen-rank<r>.txt ("epoch step id id ..."); rank 0 appends the
parameters after each step to OUT/params.txt. Checkpoints go to OUT/ckpt.
"""

import time

START = time.monotonic()  # before the imports: the resume time includes importing torch and lightning

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from lightning_srifty.migrate.preemption import SpotPreemption, find_checkpoint  # noqa: E402
from lightning_srifty.protocol import RESUME_LATEST, LaunchEnv  # noqa: E402
from lightning_srifty.strategies.ddp import SriftyDDPStrategy  # noqa: E402
from lightning_srifty.strategies.hetero import ExactResume, GlobalBatchSampler  # noqa: E402

N = 96


class Indexed(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 4, generator=g)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(N, 1, generator=g)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


class Model(pl.LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Linear(4, 1)
        self.out = out

    def training_step(self, batch, batch_idx):
        ids, x, y = batch
        if self.global_rank == 0 and not (self.out / "first-step.json").exists():
            (self.out / "first-step.json").write_text(
                json.dumps({"s_from_start": time.monotonic() - START, "unix": time.time()})
            )
        with open(self.out / f"seen-rank{self.global_rank}.txt", "a") as f:
            f.write(f"{self.current_epoch} {self.global_step} " + " ".join(str(int(i)) for i in ids) + "\n")
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, *args) -> None:
        if self.global_rank == 0:
            flat = torch.cat([p.detach().flatten() for p in self.parameters()])
            with open(self.out / "params.txt", "a") as f:
                f.write(f"{self.global_step} " + " ".join(f"{v:.9g}" for v in flat.tolist()) + "\n")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class SigtermAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class HangAt(pl.Callback):
    """Rank 0 stops in its step ``step`` and never comes back (a GPU that stopped answering): SIGTERM does not end
    it, the watch thread (PROGRESS.json) goes on."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, *args) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            while True:
                time.sleep(3600)


class RebalanceAt(pl.Callback):
    """One rank's node gets a rebalance recommendation after step ``step`` (its own metadata service: no other
    node's sees it)."""

    def __init__(self, step: int, rank: int, preemption: SpotPreemption) -> None:
        self.step, self.rank, self.preemption = step, rank, preemption

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            from lightning_srifty.migrate.spot_watcher import Notice

            self.preemption._notice(Notice("rebalance", None, None, time.monotonic()))


class Sleep(pl.Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args) -> None:
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--batch-sizes", default="8")
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--sigterm-at", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--from-env", action="store_true", help="batch sizes, checkpoints and resume from srifty launch")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--rebalance-at", type=int, help="rank --rebalance-rank's node gets a rebalance recommendation")
    p.add_argument("--rebalance-rank", type=int, default=1)
    p.add_argument("--hang-at", type=int, help="a first leg (nothing resumed) hangs at this step, for good")
    p.add_argument("--progress-s", type=float, default=60.0, help="SpotPreemption's progress_s")
    p.add_argument("--every-s", type=float, help="SpotPreemption's every_s (periodic checkpoints)")
    p.add_argument("--triggers-profile", help="add MigrationTriggers with this profile (under srifty launch)")
    p.add_argument("--triggers-after", type=int, default=10, help="steps measured before the first check")
    p.add_argument("--seed", type=int, default=7, help="the sampler's seed (--plain: Lightning's, 0 unless set)")
    p.add_argument(
        "--plain",
        action="store_true",
        help="the script a user writes: DataLoader(batch_size=8, shuffle=True), Trainer(strategy='srifty_auto'), "
        "fit() without ckpt_path; under srifty launch the strategy applies the plan",
    )
    args = p.parse_args()
    out = Path(args.out)
    if args.plain:
        plain(args, out)
        return
    accumulation = 1
    launch = LaunchEnv.from_env() if args.from_env else None
    if launch is not None:
        args.batch_sizes = ",".join(map(str, launch.batch_sizes))
        accumulation = launch.accumulate_grad_batches
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    sampler = GlobalBatchSampler(N, sizes, rank, shuffle=True, seed=args.seed, accumulate_grad_batches=accumulation)
    loader = DataLoader(Indexed(), batch_sampler=sampler)
    ckpt_dir = launch.checkpoint_uri if launch is not None else str(out / "ckpt")
    preemption = SpotPreemption(ckpt_dir, exit_process=False, progress_s=args.progress_s, every_s=args.every_s)
    callbacks = [ExactResume(), preemption]
    if args.hang_at is not None and not (launch is not None and launch.resume):
        callbacks.append(HangAt(args.hang_at))
    if args.sigterm_at is not None:
        callbacks.append(SigtermAt(args.sigterm_at))
    if args.step_sleep:
        callbacks.append(Sleep(args.step_sleep))
    if args.rebalance_at is not None:
        callbacks.insert(0, RebalanceAt(args.rebalance_at, args.rebalance_rank, preemption))  # before its step end
    if args.triggers_profile:
        from lightning_srifty.migrate.triggers import MigrationTriggers

        callbacks.append(
            MigrationTriggers(
                profile=args.triggers_profile,
                first_check_steps=args.triggers_after,
                check_every_s=3600,
                work_from="plan",  # these 40 steps stand for the start of the plan's long run
            )
        )
    strategy = SriftyDDPStrategy(batch_sizes=sizes, process_group_backend="gloo") if len(sizes) > 1 else "auto"
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=len(sizes),
        strategy=strategy,
        max_steps=args.max_steps,
        accumulate_grad_batches=accumulation,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    ckpt = find_checkpoint(str(out / "ckpt")) if args.resume else None
    if launch is not None:  # "latest": fit() without ckpt_path, and SpotPreemption resumes the newest there
        ckpt = launch.resume if launch.resume != RESUME_LATEST else None
        ckpt = ckpt or None
    (out / "first-step.json").unlink(missing_ok=True)
    trainer.fit(Model(out), train_dataloaders=loader, ckpt_path=ckpt, weights_only=True)
    if preemption.preempted and trainer.is_global_zero:
        (out / "preempted.json").write_text(json.dumps({"step": trainer.global_step, **preemption.timings}))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def plain(args: argparse.Namespace, out: Path) -> None:
    """No lightning-srifty in the script but the strategy's name: no batch split, accumulation or ckpt_path."""
    out.mkdir(parents=True, exist_ok=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="srifty_auto",
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Sleep(args.step_sleep)] if args.step_sleep else [],
    )
    (out / "first-step.json").unlink(missing_ok=True)
    trainer.fit(Model(out), train_dataloaders=DataLoader(Indexed(), batch_size=8, shuffle=True))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
