"""Spot capacity as it was: the traces of skypilot-org/spot-traces (``metadata.gap_seconds`` and a 0/1 column per
zone), read and checked (:func:`read_trace`), their spells of capacity (:func:`spells`), and several zones' traces as
one (:func:`combine_traces`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from predictor.documents.atomic import TooLarge, read_bounded
from predictor.exceptions import ConfigError

TraceValues = Literal["available", "preempted"]  # what a trace's 1 means (``metadata.values``)


@dataclass(frozen=True)
class Trace:
    """Spot availability of one or more zones: ``available[z, k]`` is True when zone ``z`` had the fleet's spot node
    count at tick ``k``; ``gap_s`` seconds per tick."""

    gap_s: float
    available: np.ndarray  # (zones, ticks) bool
    names: tuple[str, ...] = ()

    @property
    def ticks(self) -> int:
        return int(self.available.shape[1])

    @property
    def hours(self) -> float:
        return self.ticks * self.gap_s / 3600.0

    def resample(self, factor: int) -> Trace:
        """Ticks of ``factor`` x the gap; a coarse tick is available only when every tick in it was (a preemption
        anywhere inside ends the spot fleet: conservative for spot)."""
        if factor <= 1:
            return self
        n = self.ticks // factor
        a = self.available[:, : n * factor].reshape(self.available.shape[0], n, factor).all(axis=2)
        # a 3-d array reduced over one axis is a 2-d array (numpy's stubs say np.bool | NDArray for any axis)
        return Trace(self.gap_s * factor, cast(np.ndarray, a), self.names)

    def window(self, start: int, length: int) -> Trace:
        return Trace(self.gap_s, self.available[:, start : start + length], self.names)

    def availability(self) -> float:
        """Share of ticks with spot in at least one zone."""
        return float(self.available.any(axis=0).mean()) if self.ticks else 0.0


TRACE_BYTES = 64 << 20  # a spot-traces zone file is a few hundred KB


TRACE_TICKS = 1_000_000  # ticks a replay takes (about 3 months at the repository's 10 s, 9.5 years at 300 s)


def _trace_error(path: str, field_name: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"Spot trace {path}: {field_name} {fix}", parameter=field_name, value=value)


def read_trace(
    source: str | os.PathLike[str] | Any,
    *,
    nodes: int = 1,
    values: TraceValues | None = None,
) -> tuple[Trace, list[str]]:
    """One zone's trace in the format of skypilot-org/spot-traces: ``{"metadata": {"gap_seconds": G}, "data": [...]}``
    where ``data`` holds, per tick, the number of instances available (``values="available"``, the repository's
    README) or, for its single-node files, a preempted flag (``"preempted"``: 1 = no capacity, how the Can't Be Late
    simulator reads them). ``metadata.values`` may say which; ``values`` overrides it. Spot is usable at a tick when at
    least ``nodes`` instances are available.

    The steps: the document (:func:`_trace_document`), its gap and ticks checked (:func:`_trace_ticks`), the ticks
    read as instance counts (:func:`_trace_counts`).

    Returns the trace and notes (how it was read). Raises :class:`ConfigError` naming the field, the value and the fix.
    """
    inline = not isinstance(source, (str, os.PathLike))
    path = "(inline)" if inline else str(source)
    doc: Any = source if inline else _trace_document(source, path)
    gap, arr = _trace_ticks(doc, path)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"nodes must be a whole number >= 1; got {nodes!r}.", parameter="nodes", value=nodes)
    counts, notes = _trace_counts(arr, path, values or doc["metadata"].get("values"))
    if nodes > 1 and counts.max() < nodes:
        notes.append(
            f"{os.path.basename(path)}: never {nodes} instances available (at most {int(counts.max())}): spot is "
            "never usable for this fleet"
        )
    name = os.path.splitext(os.path.basename(path))[0]
    return Trace(float(gap), (counts >= nodes)[None, :], (name,)), notes


def _trace_document(source: str | os.PathLike[str], path: str) -> Any:
    """The JSON document of a trace file: a regular file of bounded size only (a FIFO, a device or a folder is
    refused before any byte is read)."""
    try:
        return json.loads(read_bounded(source, TRACE_BYTES))
    except TooLarge:
        raise ConfigError(
            f"Spot trace {path} is over {TRACE_BYTES >> 20} MB: a trace of a zone's months at a sample every few "
            "minutes is well under 1 MB; give one zone's trace, or resample it to a larger gap_seconds.",
            parameter="trace",
            value=path,
        ) from None
    except FileNotFoundError:
        raise ConfigError(
            f"Spot trace {path} does not exist: give the path of a JSON trace (skypilot-org/spot-traces format).",
            parameter="trace",
            value=path,
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"Spot trace {path} cannot be read: {exc.strerror or exc}.", parameter="trace", value=path
        ) from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:  # ValueError: JSON, or 4,300+ digits
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ConfigError(f"Spot trace {path} is not JSON ({why}).", parameter="trace", value=path) from None


def _trace_ticks(doc: Any, path: str) -> tuple[float, np.ndarray]:
    """(gap_seconds, the ticks' values) of a trace document, each field checked: an object with a positive
    ``metadata.gap_seconds`` and a non-empty ``data`` of at most :data:`TRACE_TICKS` whole numbers >= 0."""
    if not isinstance(doc, dict):
        raise _trace_error(path, "the document", type(doc).__name__, "must be an object with 'metadata' and 'data'.")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise _trace_error(
            path, "metadata.gap_seconds", None, 'is missing: write {"metadata": {"gap_seconds": 300}, ...}.'
        )
    gap = meta["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap <= 0:
        raise _trace_error(path, "metadata.gap_seconds", gap, f"must be a number of seconds > 0; got {gap!r}.")
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise _trace_error(path, "data", type(data).__name__, "must be a non-empty list of instance counts per tick.")
    if len(data) > TRACE_TICKS:
        raise _trace_error(
            path,
            "data",
            f"{len(data):,} ticks",
            f"may hold at most {TRACE_TICKS:,} ticks ({TRACE_TICKS * gap / 86400:,.0f} days at gap_seconds={gap:g}): "
            "replay a window of it, or resample it to a larger gap_seconds.",
        )
    bad = [(i, v) for i, v in enumerate(data) if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        i, v = bad[0]
        raise _trace_error(path, f"data[{i}]", v, f"must be a number of instances; got {v!r} ({len(bad)} such).")
    arr = np.asarray(data, dtype=float)
    if (arr < 0).any() or (arr != np.floor(arr)).any():
        i = int(np.flatnonzero((arr < 0) | (arr != np.floor(arr)))[0])
        raise _trace_error(path, f"data[{i}]", data[i], f"must be a whole number of instances >= 0; got {data[i]!r}.")
    return float(gap), arr


def _trace_counts(arr: np.ndarray, path: str, how: str | None) -> tuple[np.ndarray, list[str]]:
    """The instances available per tick, reading the ticks as ``how`` says (``available`` counts, or ``preempted``
    flags; None: counts, with a note when the values are all 0/1), and the notes on how they were read."""
    notes: list[str] = []
    if how is None:
        how = "available"
        if set(np.unique(arr)) <= {0.0, 1.0}:
            notes.append(
                f"{os.path.basename(path)}: 0/1 values read as instances available (the spot-traces README); the Can't "
                "Be Late simulator reads its single-node files as preempted flags: --trace-values preempted"
            )
    if how not in ("available", "preempted"):
        raise _trace_error(path, "metadata.values", how, "must be 'available' or 'preempted'.")
    if how == "preempted":
        if not set(np.unique(arr)) <= {0.0, 1.0}:
            raise _trace_error(path, "data", "counts", "holds counts above 1: it cannot be read as preempted flags.")
        return np.where(arr > 0, 0.0, 1.0), notes
    return arr, notes


def spells(available: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lengths in ticks of the runs with spot and of the runs without, in a 1-D availability series."""
    out = []
    for series in (available.astype(int), 1 - available.astype(int)):
        edges = np.diff(np.r_[0, series, 0])
        out.append(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
    return out[0], out[1]


def combine_traces(traces: Sequence[Trace]) -> Trace:
    """Zones side by side (the plan may move between them): same gap, cut to the shortest."""
    if not traces:
        raise ConfigError("At least one trace is needed.", parameter="trace")
    gaps = {t.gap_s for t in traces}
    if len(gaps) != 1:
        raise ConfigError(
            f"Traces of one replay must share metadata.gap_seconds; got {sorted(gaps)}.", parameter="trace"
        )
    n = min(t.ticks for t in traces)
    return Trace(
        traces[0].gap_s,
        np.concatenate([t.available[:, :n] for t in traces]),
        tuple(name for t in traces for name in t.names),
    )
