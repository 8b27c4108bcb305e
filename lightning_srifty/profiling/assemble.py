"""Build the profile: from what every rank measured (framework-free; runs on rank 0), or from a capture on the meta
device (``srifty capture``: no time measured, the predictor predicts it from the operator table)."""

from __future__ import annotations

import datetime as _dt
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_srifty.comm import CommSeries
from lightning_srifty.profiling.recorder import StepSeries
from lightning_srifty.profiling.sharded import ShardedSeries
from predictor.documents.profile import PHASES, SCHEMA, Profile, profile_from_dict
from predictor.model.stats import summarize

if TYPE_CHECKING:
    from lightning_srifty.profiling.capture import StepCapture

CAPTURE_TIME_NOTE = (
    "timing.step_time_s is not measured (0): this profile was captured on the meta device by srifty capture; "
    "the predictor predicts the step time from the operator table (ops)."
)


@dataclass
class RankPayload:
    """What one rank sends to rank 0 at the end of the window (pickled by all_gather_object)."""

    rank: int
    series: StepSeries | None = None
    comm: CommSeries | None = None
    sharded: ShardedSeries | None = None  # FSDP's all-gathers and reduce-scatters
    device_name: str | None = None
    hostname: str | None = None
    peak_memory: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    ops: Any = None  # rank 0's OpTable (the profile's ``ops``); None on the other ranks


def _phase_stats(series: StepSeries) -> dict[str, Any] | None:
    if not series.phase_steps:
        return None
    return {p: summarize(series.phases[p]) for p in PHASES}


def _median_samples(series: StepSeries) -> int | None:
    known = [s for s in series.samples if s]
    return int(statistics.median(known)) if known else None


def assemble_profile(
    *,
    ranks: list[RankPayload],
    model: dict[str, Any],
    hardware: dict[str, Any],
    batch_source: str,
    accumulate_grad_batches: int,
    window: dict[str, Any],
    software: dict[str, Any] | None,
    notes: list[str],
    max_series: int,
    comm_reason: str | None,
    backend: str | None,
    created_at: str,
    checkpoint: dict[str, Any] | None = None,
    layout: str | None = None,
    validation: dict[str, Any] | None = None,
    loader_workers: int | None = None,
    optimization: dict[str, Any] | None = None,
) -> Profile:
    """The srifty.profile/v1 document. Raises ProfileError when rank 0 measured nothing usable."""
    notes = list(notes)
    lead, per_device, global_batch, good = _lead_and_batch(ranks, notes)
    series = lead.series
    assert series is not None
    step = summarize(series.step_s)
    timing = _timing(series, step, global_batch, window, max_series)
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "created_at": created_at,
        "model": model,
        "batch": {
            "per_device": per_device,
            "all_devices": global_batch,
            "accumulate_grad_batches": accumulate_grad_batches,
            "source": batch_source,
            **({} if loader_workers is None else {"loader_workers": loader_workers}),
            **(optimization or {}),  # a manual loop's (lightning_srifty.profiling.steps.optimization_record)
        },
        "hardware": hardware,
        "timing": timing,
        "memory": lead.peak_memory or None,
        "communication": _communication(lead.comm, len(ranks), step, comm_reason, backend, lead.sharded),
        "software": software,
        "checkpoint": checkpoint,
        "validation": validation,
        "ops": lead.ops,
        "layout": layout,
    }
    if len(ranks) > 1:
        data["ranks"] = [_rank_entry(p) for p in good]
    if notes:
        data["notes"] = notes
    return profile_from_dict(_drop_none(data))


def _lead_and_batch(ranks: list[RankPayload], notes: list[str]) -> tuple[RankPayload, int, int, list[RankPayload]]:
    """Rank 0's payload, its samples per batch, the global batch (every rank's, when every rank reported) and the
    ranks that measured steps; a rank that could not report is noted.

    Raises:
        ProfileError: rank 0 measured no step, or its batch size is unknown.
    """
    from predictor.exceptions import ProfileError

    for payload in ranks:
        if payload.error:
            notes.append(f"rank {payload.rank} could not report its measurements: {payload.error}")
    good = [p for p in ranks if p.series is not None and p.series.step_s]
    lead = next((p for p in good if p.rank == ranks[0].rank), None)
    if lead is None or lead.series is None:
        left_out = ranks[0].series.excluded if ranks and ranks[0].series is not None else None
        if left_out:  # every step of the window had other work in it: say which, and what to change
            said = ", ".join(f"{why} {n}" for why, n in sorted(left_out.items()))
            raise ProfileError(
                f"No step was measured on rank 0: every step of the window had other work in it ({said}), and such "
                "steps are left out. Profile more steps (profile_steps=) or do that work less often in the window "
                "(a checkpoint every step: a longer checkpoint interval, every_s=)."
            )
        raise ProfileError("No step was measured on rank 0, so there is nothing to write.")
    per_device = _median_samples(lead.series)
    if per_device is None:
        raise ProfileError(
            "The batch size could not be found in the batches (no tensor with a leading dimension). "
            "Pass SriftyCallback(batch_size_fn=lambda batch: ...) returning samples per batch."
        )
    rank_samples = [(_median_samples(p.series) or per_device) for p in good if p.series is not None]
    global_batch = sum(rank_samples) if len(good) == len(ranks) else per_device * len(ranks)
    return lead, per_device, global_batch, good


def _timing(
    series: StepSeries, step: Any, global_batch: int, window: dict[str, Any], max_series: int
) -> dict[str, Any]:
    """The profile's ``timing``: the step time, the throughput, the raw series (at most ``max_series``), the window,
    and the phases' times and shares when the recorder had them."""
    timing: dict[str, Any] = {
        "step_time_s": step,
        "samples_per_s": summarize([global_batch / s for s in series.step_s if s > 0]),
        "series_s": series.step_s[:max_series],
        "series_truncated": len(series.step_s) > max_series,
        "window": {**window, "steps": len(series.step_s), "excluded_steps": series.excluded or None},
    }
    phases = _phase_stats(series)
    if phases is not None:
        timing["phases_s"] = phases
        total = sum(statistics.fmean(series.phases[p]) for p in PHASES)
        timing["phase_share"] = {p: statistics.fmean(series.phases[p]) / total for p in PHASES} if total > 0 else None
    return timing


def _communication(
    comm: CommSeries | None,
    world: int,
    step: Any,
    reason: str | None,
    backend: str | None,
    sharded: ShardedSeries | None = None,
) -> dict[str, Any]:
    if sharded is not None:
        return {
            "backend": backend,
            "world_size": world,
            "allgather_s": summarize(sharded.allgather_s),
            "reduce_scatter_s": summarize(sharded.reduce_scatter_s),
            "allgather_bytes_per_step": sharded.allgather_bytes_per_step,
            "reduce_scatter_bytes_per_step": sharded.reduce_scatter_bytes_per_step,
        }
    if comm is None or not comm.busy_s:
        return {"world_size": world, "reason": reason or "no all-reduce was recorded"}
    busy, exposed = summarize(comm.busy_s), summarize(comm.exposed_s)
    total_busy = sum(comm.busy_s)
    return {
        "backend": backend,
        "world_size": world,
        "buckets": len(comm.buckets),
        "bytes_per_step": comm.bytes_per_step,
        "allreduce_s": busy,
        "exposed_s": exposed,
        "overlap_fraction": min(1.0, max(0.0, 1 - sum(comm.exposed_s) / total_busy)) if total_busy > 0 else None,
        "share_of_step": exposed.p50 / step.p50 if exposed is not None and step.p50 > 0 else None,
        "bucket_detail": [
            {"index": i, "bytes": nbytes, "allreduce_s": summarize(times)}
            for i, (nbytes, times) in comm.buckets.items()
        ],
    }


def _rank_entry(payload: RankPayload) -> dict[str, Any]:
    series = payload.series
    assert series is not None
    mem = payload.peak_memory
    return {
        "rank": payload.rank,
        "step_time_s": summarize(series.step_s),
        "phases_s": _phase_stats(series),
        "exposed_comm_s": summarize(payload.comm.exposed_s) if payload.comm and payload.comm.exposed_s else None,
        "samples_per_step": _median_samples(series),
        "device_name": payload.device_name,
        "hostname": payload.hostname,
        "peak_memory_bytes": mem.get("peak_allocated_bytes", mem.get("peak_rss_bytes")),
    }


def capture_profile(capture: StepCapture, *, name: str, batch_size: int, accumulation: int) -> Profile:
    """The profile of a step captured on the meta device: the capture's model section and operator table, one
    device, ``batch_size`` samples a device (the batch's source "manual"), and a step time of 0 (not measured)."""
    from lightning_srifty.profiling.hardware import software_versions

    model = {**capture.model_section(), "name": name}
    data = {
        "schema": SCHEMA,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": model,
        "batch": {
            "per_device": batch_size,
            "all_devices": batch_size,
            "accumulate_grad_batches": accumulation,
            "source": "manual",
        },
        "hardware": {"accelerator": "meta", "devices": 1, "nodes": 1, "world_size": 1},
        "timing": {"step_time_s": {"p50": 0.0}},
        "ops": capture.table,
        "software": software_versions(),
        "notes": [CAPTURE_TIME_NOTE],
    }
    return profile_from_dict(_drop_none(data))


def _drop_none(value: Any) -> Any:
    """Plain JSON-ready data: Stats objects dumped, None values dropped."""
    from predictor.documents.schema import to_dict

    value = to_dict(value)
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value
