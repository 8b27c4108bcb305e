"""Inside the training job: the ``srifty_ddp`` strategy, the communication hook that times every gradient
all-reduce, and unequal per-rank batches for mixed fleets. May import torch, lightning,
``profiling.clock`` (the profile's one clock) and ``predictor.exceptions``; nothing else of this package."""
