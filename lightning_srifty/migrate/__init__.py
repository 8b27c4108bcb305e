"""Inside the training job: what moves it (spot notices and SIGTERM, drift and price triggers, checkpoints it can
trust). May import torch, lightning, ``protocol``, ``imds`` (the metadata service), ``profiling`` (the run's profile)
and ``predictor``; never ``provision`` or ``cli``."""
