"""Outside the training job, torch-free: the launcher (``srifty launch``), the fleets it runs on (local processes or
Terraform), the generated root module and python-terraform runner, the training command, the Terraform files
shipped as package data, and what runs once a fleet is up (``fleets``: status and cost; ``logs``: the nodes' logs).
May import ``protocol``, ``console`` and ``predictor``; never torch, lightning, ``profiling``, ``ddp`` or
``migrate``."""
