"""Inside the training job: the ``srifty_ddp`` strategy, the communication hook that times every gradient
all-reduce, and unequal per-rank batches for mixed fleets. May import torch, lightning,
``timing`` (the profile's one clock, shared with ``profiling``) and ``predictor.exceptions``; nothing else of
this package (never ``profiling``)."""
