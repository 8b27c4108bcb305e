"""predictor: profiles, the instance catalog, the performance model and the ranking. Never imports torch."""
