"""Inside the training job: what moves it (spot notices and SIGTERM, drift and price triggers, checkpoints it can
trust, the metadata service). May import torch, lightning, ``protocol``, ``profiling`` (the run's profile) and
``predictor``; never ``provision`` or ``cli``."""
