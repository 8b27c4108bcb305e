"""Inside the training job: SriftyCallback and what it measures (step phases, clocks, FLOPs, the operator table,
model and hardware facts, assembling the profile). May import torch, lightning, ``comm`` (the all-reduce timer
``srifty_ddp`` installs), ``timing``, ``launch_checks``, ``imds`` (the instance type), ``protocol``, ``console`` and
``predictor``; never ``strategies``, ``migrate``, ``provision`` or ``cli``."""
