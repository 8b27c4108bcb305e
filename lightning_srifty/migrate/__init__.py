"""Inside the training job: what moves it (spot notices and SIGTERM, drift and price triggers, checkpoints it can
trust). May import torch, lightning, ``protocol``, ``store``, ``imds`` (the metadata service), ``launch_checks``,
``profiling`` (the run's profile), ``teardown`` (the process group's end at exit) and ``predictor``; never
``strategies``, ``provision`` or ``cli``."""
