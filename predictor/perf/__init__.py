"""The performance model: compute scaling across GPUs, all-reduce on a fleet, memory fit."""
