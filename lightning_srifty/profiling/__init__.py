"""Inside the training job: SriftyCallback and what it measures (step phases, clocks, FLOPs, the operator table,
model and hardware facts, assembling the profile). May import torch, lightning, ``ddp`` (the all-reduce timer),
``imds`` (the instance type), ``console`` and ``predictor``; never ``provision`` or ``cli``."""
