"""2-process CPU run with strategy srifty_ddp; rank 1 is made a straggler (sleeps in training_step).

python tests/scripts/ddp_profile.py OUT.json SLEEP_S
"""

import faulthandler
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as pl

from helpers import TinyModel, loader
from lightning_srifty import SriftyCallback, SriftyDDPStrategy

if __name__ == "__main__":
    # a run that hangs or crawls prints every thread's stack, on both ranks (rank 1 runs this script too), well before
    # the test's 240 s bound kills it (the clock starts after the imports, which take 10-30 s under CI's load); the
    # run itself takes 10-15 s
    faulthandler.dump_traceback_later(150, exit=True)
    # each rank says it got past its imports (a rank that never joins the rendezvous shows by its absence)
    print(f"ddp_profile.py: rank {os.environ.get('LOCAL_RANK', '0')} started (pid {os.getpid()})", file=sys.stderr)
    out, sleep_s = sys.argv[1], float(sys.argv[2])
    pl.seed_everything(0, verbose=False)
    model = TinyModel(
        hidden=20000, sleep_on_rank=1, sleep_s=sleep_s
    )  # ~1.4 MB of gradients in 2 DDP buckets of >= 0.1 MB
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=SriftyDDPStrategy(bucket_cap_mb=0.1),
        max_steps=30,
        callbacks=[SriftyCallback(recommend=False, warmup_steps=5, profile_steps=20, output=out, verbose=False)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader(2048, batch_size=16))
    faulthandler.cancel_dump_traceback_later()
    # no destroy_process_group() here: the strategy registers it at exit (gloo's threads outliving the comm hook made
    # the exit abort or hang now and then, CI under load); a hang there is ended by the test's bound, with the output
