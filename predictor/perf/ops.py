"""Step time from the profile's operator table and the per-operator latency model (filled in below)."""

from __future__ import annotations

from typing import Any


def ops_compute(profile: Any, src: Any, dst: Any, notes: list[str], extrapolation: list[str]) -> None:
    """Not wired yet: the step-level path is used."""
    return None
