"""A finished fit whose process then ends one way or another, on a srifty fleet node (SRIFTY_NODE_STATE set).

python tests/scripts/exit_mark_job.py CKPT HOW

HOW: "abort": the script ends, and its process then dies of SIGABRT in its teardown, as torch's gloo teardown kills one
(an atexit handler registered before lightning_srifty's import, so run after the mark's: atexit is last in, first
out); "raise": an exception after the fit reaches the top, through a replaced sys.excepthook (as rich's install
makes); "exit3": sys.exit(3) after the fit (Hydra's way with an exception it reported); "end": the script just ends.
"""

import atexit
import os
import sys
from pathlib import Path

ckpt, how = sys.argv[1], sys.argv[2]
if how == "abort":
    atexit.register(os.abort)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import TinyModel, loader, trainer  # noqa: E402
from lightning_srifty.migrate.preemption import SpotPreemption  # noqa: E402


class Failing(TinyModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("a step that fails")
        return super().training_step(batch, batch_idx)


callback = SpotPreemption(dirpath=ckpt)  # as every Trainer on a fleet gets it
model = Failing() if how == "fit-raises" else TinyModel()
trainer(max_steps=4, callbacks=[callback]).fit(model, loader())
print("fit ended", flush=True)
if how == "raise":
    sys.excepthook = lambda kind, value, tb: sys.__excepthook__(kind, value, tb)
    raise RuntimeError("an export after the fit that fails")
if how == "exit3":
    sys.exit(3)
