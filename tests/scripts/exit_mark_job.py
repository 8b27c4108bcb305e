"""A finished fit whose process then ends one way or another, on a srifty fleet node (SRIFTY_NODE_STATE set).

python tests/scripts/exit_mark_job.py CKPT HOW

HOW: "abort": the script ends, and its process then dies of SIGABRT in its teardown, as torch's gloo teardown kills one
(an atexit handler registered before the fit, so run after the mark's: atexit is last-in, first-out); "raise": an
exception after the fit reaches the top; "fit-raises": the fit itself raises; "end": the script just ends.
"""

import atexit
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers import TinyModel, loader, trainer
from lightning_srifty.migrate.preemption import SpotPreemption

ckpt, how = sys.argv[1], sys.argv[2]


class Failing(TinyModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("a step that fails")
        return super().training_step(batch, batch_idx)


if how == "abort":
    atexit.register(os.abort)
callback = SpotPreemption(exit_process=False, handle_sigterm=False, dirpath=ckpt)
model = Failing() if how == "fit-raises" else TinyModel()
trainer(max_steps=4, callbacks=[callback]).fit(model, loader())
print("fit ended", flush=True)
if how == "raise":
    raise RuntimeError("an export after the fit that fails")
