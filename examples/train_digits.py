"""Profile a CNN on scikit-learn's digits with SriftyCallback: what adding it to your own Trainer looks like.

python examples/train_digits.py                      # 1 process (GPU if there is one)
python examples/train_digits.py --devices 2          # 2 DDP processes with all-reduce timing (srifty_ddp)
torchrun --nproc_per_node 2 examples/train_digits.py  # the same under torchrun (what srifty terraform's fleets run)

With several processes the strategy is srifty_auto: srifty_ddp here, and on a fleet srifty launch or srifty terraform
started, the plan's layout and per-rank batch, so that the fleet trains the profiled global batch (64) rather than 64
on every rank (the rehearsal checks it).
"""

import argparse
import os

import lightning.pytorch as pl

from lightning_srifty import SriftyCallback
from lightning_srifty.demo.data import DigitsDataModule
from lightning_srifty.demo.models import DigitsCNN

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    # under torchrun: its processes on this machine (nproc_per_node); a fleet sets the nodes (PL_TRAINER_NUM_NODES)
    parser.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--max-steps", type=int, default=300, help="the profile needs 220 (20 warm-up + 200)")
    args = parser.parse_args()

    pl.seed_everything(0)
    trainer = pl.Trainer(
        max_steps=args.max_steps,
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="srifty_auto" if args.devices > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        callbacks=[SriftyCallback(warmup_steps=20, profile_steps=200, output="srifty/digits-profile.json")],
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(DigitsCNN(), datamodule=DigitsDataModule(batch_size=64))
