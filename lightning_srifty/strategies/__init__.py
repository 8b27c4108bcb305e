"""Every strategy of the training job, in one folder: ``srifty_ddp`` (DDP with the all-reduce timing hook and
unequal per-rank batches for mixed fleets), ``srifty_fsdp`` (FSDP by block class names), :func:`plan_strategy`
(the plan's layout as a strategy) and ``srifty_auto`` (:mod:`.planned`: the plan applied in the Trainer under
``srifty launch``). May import torch, lightning, ``comm`` (the all-reduce timer), ``timing``, ``protocol``,
``store``, ``teardown``, ``migrate`` (``srifty_auto`` resumes and checkpoints through it) and ``predictor``; the
profiler and ``migrate`` never import it (they read what they need off the Trainer, and ``launch_checks``)."""
