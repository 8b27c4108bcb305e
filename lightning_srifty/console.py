"""The readable summary of a profile (rich tables); torch-free, used by the callback and ``srifty profile show``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from predictor.documents.plan import Plan, PlanEntry
from predictor.documents.profile import PHASES, Profile, Stats
from predictor.ranking.explain import chance


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def fmt_hours(hours: float) -> str:
    if hours >= 1:
        return f"{hours:,.2f} h"
    if hours * 60 >= 1:
        return f"{hours * 60:.1f} min"
    return f"{hours * 3600:.0f} s"


def fmt_hours_range(lo: float, hi: float) -> str:
    """An interval of hours, compact, in the unit :func:`fmt_hours` gives its upper end: ``27-52 min``, ``0.53-1.0 h``,
    ``12-19 h`` (two significant digits: an 80% interval is not known better)."""
    unit = fmt_hours(hi).rsplit(" ", 1)[1]
    scale = {"h": 1.0, "min": 60.0, "s": 3600.0}[unit]

    def two(x: float) -> str:
        return f"{x:,.0f}" if x >= 9.95 else f"{x:.1f}" if x >= 0.995 else f"{x:.2f}"

    return f"{two(lo * scale)}-{two(hi * scale)} {unit}"


def fmt_life(hours: float) -> str:
    """A life cap in whole minutes, as a person reads it: ``17 h``, ``1 h 19 min``, ``45 min`` (not ``1.31667 h``)."""
    minutes = round(hours * 60)
    h, m = divmod(minutes, 60)
    return " ".join(part for part in (f"{h} h" if h else "", f"{m} min" if m or not h else "") if part)


def fmt_usd(usd: float) -> str:
    return f"${usd:,.2f}" if usd >= 10 else f"${usd:.3g}"


def console(width: int = 170) -> Console:
    """A console that does not squeeze tables to 80 columns when the output is not a terminal (``width`` columns
    then: ``srifty recommend --wide`` asks for more, so that a mixed fleet's name is not clipped in a pipe, issue
    #37 L), and reads no markup in strings: a model, GPU or instance name is printed as written ("[/x]" raised rich's
    MarkupError, issue #23 item 9); the few styled words are :class:`rich.text.Text` (:func:`styled`)."""
    c = Console(markup=False)
    return c if c.is_terminal else Console(width=width, markup=False)


_default_console = console  # print_profile's parameter shadows the name


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text of plain strings and (string, style) pairs: no markup is parsed in either."""
    return Text.assemble(*parts)


def fmt_count(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def _stats_line(stats: Stats | None) -> str:
    if stats is None:
        return "-"
    parts = [f"p50 {fmt_s(stats.p50)}"]
    if stats.p90 is not None:
        parts.append(f"p90 {fmt_s(stats.p90)}")
    if stats.p99 is not None:
        parts.append(f"p99 {fmt_s(stats.p99)}")
    if stats.cv is not None:
        parts.append(f"CV {stats.cv * 100:.1f}%")
    return " · ".join(parts)


def profile_tables(profile: Profile, path: Path | None = None) -> Group:
    """The summary as rich renderables: the profile's rows (:func:`_timing_rows`, :func:`_model_rows`,
    :func:`_system_rows`), the per-rank table, its notes."""
    hw, model = profile.hardware, profile.model
    if hw.gpu or hw.accelerator != "cpu":
        where = hw.gpu or hw.device_name or hw.accelerator or "unknown device"
    else:
        where = f"cpu ({hw.cpu_model})" if hw.cpu_model else "cpu"
    main = Table(show_header=False, box=None, pad_edge=False)
    main.add_column(style="bold cyan", no_wrap=True)
    main.add_column()
    for rows in (_timing_rows, _model_rows, _system_rows):
        for name, value in rows(profile):
            main.add_row(name, value)
    parts: list[Any] = [main]
    if profile.ranks:
        parts.append(_ranks_table(profile))
    for note in profile.notes or ():
        parts.append(styled(("note:", "yellow"), f" {note}"))
    if path is not None:
        parts.append(styled("profile written to ", (str(path), "bold")))
    title = Text(f"Srifty profile: {model.name or 'model'} on {where}")  # a Panel reads markup in a str title
    return Group(Panel(Group(*parts), title=title, title_align="left"))


Row = tuple[str, "str | Text"]


def _timing_rows(profile: Profile) -> list[Row]:
    """The window, the step time, the throughput, the batch and the phases."""
    hw, timing, batch = profile.hardware, profile.timing, profile.batch
    world = hw.world_size or hw.devices * hw.nodes
    rows: list[Row] = []
    window = timing.window
    if window is not None:
        excluded = ", ".join(f"{n} {why}" for why, n in (window.excluded_steps or {}).items())
        last = window.first_step + window.steps - 1 + sum((window.excluded_steps or {}).values())
        span = f"steps {window.first_step}-{last}"
        rows.append(
            (
                "Window",
                styled(
                    f"{span}: {window.steps} kept" + (f" ({excluded} excluded)" if excluded else ""),
                    (" (truncated)", "yellow") if window.truncated else "",
                    f", clock {window.clock}",
                ),
            )
        )
    measured = timing.step_time_s is not None and (timing.step_time_s.p50 or 0.0) > 0
    rows.append(("Step time", _stats_line(timing.step_time_s) if measured else "not measured (0: a captured profile)"))
    if timing.samples_per_s is not None:
        rows.append(("Throughput", f"{timing.samples_per_s.p50:,.1f} samples/s (all ranks, median)"))
    step, every = batch.accumulate_grad_batches or 1, batch.all_devices or batch.per_device * world
    rows.append(
        (
            "Batch",
            f"{batch.per_device}/device · {every} all devices · {world} rank(s)"
            + (f" · {step} batches accumulated: {every * step} samples an optimizer step" if step > 1 else ""),
        )
    )
    if timing.phase_share and timing.phases_s:
        # the share is of the mean step (the sum of the phases' means), so the time beside it is the mean too
        shares = " · ".join(
            f"{p} {timing.phase_share[p] * 100:.1f}% ({fmt_s(timing.phases_s[p].mean)})" for p in PHASES
        )
        rows.append(("Phases", shares + " (means)"))
    return rows


def _model_rows(profile: Profile) -> list[Row]:
    """The model, its gradients and optimizer state, its FLOPs and its operator table."""
    model = profile.model
    rows: list[Row] = [
        (
            "Model",
            f"{model.name or '-'}: {fmt_count(model.parameters)} parameters, {model.precision}"
            + (f", matmul {model.float32_matmul_precision}" if model.float32_matmul_precision else ""),
        ),
        (
            "Gradients",
            f"{fmt_bytes(model.gradient_bytes)} · optimizer state "
            f"{fmt_bytes(model.optimizer_state_bytes)} ({model.optimizer or '-'})",
        ),
    ]
    flops = model.flops
    if flops is not None and flops.per_sample is not None:
        rows.append(
            (
                "FLOPs/sample",
                f"{fmt_count(flops.per_sample)}FLOP (forward {fmt_count(flops.forward_per_sample)}"
                f", backward {fmt_count(flops.backward_per_sample)})",
            )
        )
    elif flops is not None:
        rows.append(("FLOPs/sample", styled(("not measured", "yellow"), f": {flops.reason}")))
    if profile.ops is not None:
        ops = profile.ops
        rows.append(
            (
                "Operators",
                f"{len(ops.ops)} ATen signatures, {sum(o.count for o in ops.ops)} calls per step "
                f"({sum((ops.skipped or {}).values())} views skipped), captured on {ops.device}" + _layout_words(ops),
            )
        )
    return rows


def _layout_words(ops: Any) -> str:
    """The convolutions' memory layout as recorded (channels_last or NCHW), which the prediction prices (cuDNN's
    layout conversions): a trial could not tell from the summary whether its channels_last was recorded."""
    convs = [o for o in ops.ops if "convolution" in o.op]
    if not convs:
        return ""
    nhwc = sum(o.count for o in convs if (o.params or {}).get("channels_last"))
    total = sum(o.count for o in convs)
    layout = "channels-last" if nhwc == total else "NCHW" if nhwc == 0 else f"{nhwc} of {total} channels-last"
    return f"; convolutions: {total} calls, {layout}"


def _sharded_collectives(comm: Any) -> str:
    """A sharded step's all-gathers and reduce-scatters: bytes a step and the p50 of a step's time in each."""
    parts = [
        f"{name} {fmt_bytes(nbytes or 0)}/step, {fmt_s(stats.p50)} a step"
        for name, stats, nbytes in (
            ("all-gather", comm.allgather_s, comm.allgather_bytes_per_step),
            ("reduce-scatter", comm.reduce_scatter_s, comm.reduce_scatter_bytes_per_step),
        )
        if stats is not None
    ]
    return " · ".join(parts) + f" over {comm.backend or '?'} (p50)"


def _system_rows(profile: Profile) -> list[Row]:
    """The peak memory, the all-reduce and the hardware."""
    hw, mem, comm = profile.hardware, profile.memory, profile.communication
    rows: list[Row] = []
    if mem is not None:
        held: list[str] = []
        if mem.peak_allocated_bytes is not None:
            held.append(
                f"GPU allocated {fmt_bytes(mem.peak_allocated_bytes)}, reserved {fmt_bytes(mem.peak_reserved_bytes)}"
            )
        if mem.peak_rss_bytes is not None:
            held.append(f"host RSS {fmt_bytes(mem.peak_rss_bytes)}")
        rows.append(("Peak memory", " · ".join(held)))
    if comm is not None:
        if comm.allreduce_s is not None and comm.exposed_s is not None:
            rows.append(
                (
                    "All-reduce",
                    f"{fmt_bytes(comm.bytes_per_step)}/step in {comm.buckets} bucket(s) over "
                    f"{comm.backend or '?'}: busy {fmt_s(comm.allreduce_s.p50)}, exposed "
                    f"{fmt_s(comm.exposed_s.p50)} ({(comm.share_of_step or 0) * 100:.1f}% of the "
                    f"step), {(comm.overlap_fraction or 0) * 100:.0f}% overlapped with backward",
                )
            )
        elif comm.allgather_s is not None or comm.reduce_scatter_s is not None:  # FSDP: no all-reduce, its own
            rows.append(("Collectives", _sharded_collectives(comm)))
        else:
            rows.append(("All-reduce", f"not measured: {comm.reason or 'no timing was recorded'}"))
    place: list[str] = [hw.accelerator or "-"]
    if hw.device_name and hw.device_name != hw.cpu_model:
        place.append(hw.device_name)
    if hw.instance_type:
        place.append(f"{hw.instance_type} ({hw.lifecycle or 'EC2'}, {hw.availability_zone or '?'})")
    place.append(f"{hw.cpu_count or '?'} CPUs" + (f" ({hw.cpu_model})" if hw.cpu_model else ""))
    rows.append(("Hardware", " · ".join(place)))
    return rows


def _ranks_table(profile: Profile) -> Table:
    """A multi-rank profile's per-rank step, phases, exposed communication and samples."""
    ranks = Table(title="Per rank", title_justify="left")
    for col in ("rank", "device", "step p50", "forward p50", "backward p50", "exposed comm p50", "samples"):
        ranks.add_column(col, justify="right" if col != "device" else "left")
    for r in profile.ranks or ():
        phases = r.phases_s or {}
        ranks.add_row(
            str(r.rank),
            r.device_name or "-",
            fmt_s(r.step_time_s.p50),
            fmt_s(phases["forward"].p50) if "forward" in phases else "-",
            fmt_s(phases["backward"].p50) if "backward" in phases else "-",
            fmt_s(r.exposed_comm_s.p50) if r.exposed_comm_s else "-",
            str(r.samples_per_step or "-"),
        )
    return ranks


def print_profile(profile: Profile, path: Path | None = None, console: Console | None = None) -> None:
    """Print the summary to the terminal."""
    (console or _default_console()).print(profile_tables(profile, path))


# every column of the ranked-fleet table; the default keeps those that fit a 100-column terminal
PLAN_COLUMNS = (
    "#",
    "fleet",
    "GPUs",
    "market",
    "region",
    "$/h",
    "time",
    "time 80% interval",
    "cost",
    "cost 80% interval",
    "layout",
    "spot risk",
    "perf. risk",
    "effort",
    "savings",
    "GiB/GPU",
    "batch/GPU",
    "Pareto",
)
_LEFT = ("fleet", "market", "region", "layout", "spot risk", "perf. risk", "effort")
_SHORT = {
    "time 80% interval": "80%",
    "batch/GPU": "batch",
    "spot risk": "spot",
    "perf. risk": "perf.",
    "GiB/GPU": "GiB",
}  # narrow headers of the default table (the legend says)


# the wide table's two-word headers on two lines: every column fits 200 terminal columns (the last one was cut)
_WIDE = {
    "time 80% interval": "time 80%\ninterval",
    "cost 80% interval": "cost 80%\ninterval",
    "spot risk": "spot\nrisk",
    "perf. risk": "perf.\nrisk",
    "GiB/GPU": "GiB/\nGPU",
    "batch/GPU": "batch/\nGPU",
}


DEFAULT_WIDTH = 100  # the default table's width budget (tests/recommendation/test_plan_output.py holds it)


def plan_table(plan: Plan, model: str | None = None, wide: bool = False) -> Group:
    """The ranked fleets as a rich table, the chosen one highlighted, with what was left out.

    By default the columns that decide (fleet, market, $/h, time, cost, risks; region and savings only when they
    differ or were asked for; ``*`` after the rank marks the Pareto front) so that it fits 100 columns; ``wide``
    shows every column (:func:`_plan_columns`); each entry's cells (:func:`_plan_cells`) and what the columns mean
    and what was left out below the table (:func:`_plan_footer`).
    """
    title = (
        f"Fleets for {model or plan.model or 'the model'}: {plan.constraints.work_samples:,.0f} samples, "
        f"objective {plan.constraints.objective} (catalog {plan.catalog_snapshot})"
    )
    columns, layouts = _plan_columns(plan, wide)
    table = Table(
        title=title,
        caption=plan.why,
        box=None if not wide else box.HEAVY_HEAD,
        header_style="bold",
        pad_edge=wide,
    )
    # only the fleet column wraps, between its types (the longest type:count is its minimum width)
    longest = max((len(g) for e in plan.entries for g in e.fleet.split(",")), default=5)
    header = [_SHORT.get(col, col) if not wide else _WIDE.get(col, col) for col in columns]
    for col, head in zip(columns, header, strict=True):
        table.add_column(
            head,
            justify="left" if col in _LEFT else "right",
            no_wrap=col != "fleet",
            min_width=longest if col == "fleet" else None,
        )
    fallback_shown = False
    widths = [max(len(part) for part in h.split("\n")) for h in header]
    for i, e in enumerate(plan.entries):
        cells = _plan_cells(e, wide)
        fallback_shown = fallback_shown or bool(e.on_demand_fallback and e.on_demand_fallback >= FALLBACK_SHOWN)
        table.add_row(*(cells[c] for c in columns), style="bold green" if i == plan.chosen else None)
        widths = [max(w, len(cells[c]) if c != "fleet" else longest) for w, c in zip(widths, columns, strict=True)]
    if not wide and sum(widths) + 2 * (len(columns) - 1) > DEFAULT_WIDTH:
        table.collapse_padding = True  # one space between columns, not two, before a value is cut (B200-long names)
    return Group(table, _plan_footer(plan, columns, wide, layouts, fallback_shown))


FALLBACK_SHOWN = 0.005  # the on-demand fallback share a row's market shows (+N% OD)


def _plan_columns(plan: Plan, wide: bool) -> tuple[list[str], bool]:
    """(the plan table's columns, whether some fleet runs a layout other than ddp): by default those that decide,
    region and savings only when they differ or were asked for, "in time" under a deadline; ``wide``: every column."""
    # layout and memory per GPU decide once some fleet runs a layout other than ddp (a model that needs sharding)
    layouts = any(e.layout is not None and e.layout.name != "ddp" for e in plan.entries)
    if wide:
        savings = any(e.savings_vs_current is not None for e in plan.entries)  # only a re-plan has a current fleet
        columns = [c for c in PLAN_COLUMNS if (layouts or c != "layout") and (savings or c != "savings")]
    else:
        columns = ["#", "fleet", "market", "$/h", "time", "time 80% interval", "cost", "batch/GPU", "spot risk"]
        if layouts:
            columns[7:7] = ["layout", "GiB/GPU"]
        if len({e.region for e in plan.entries}) > 1:
            columns.insert(3, "region")
        if any(e.savings_vs_current is not None for e in plan.entries):
            columns.append("savings")
    if plan.constraints.deadline_h is not None and any(e.deadline_probability is not None for e in plan.entries):
        columns.insert(columns.index("time 80% interval") + 1, "in time")  # the chance of meeting the deadline
    return columns, layouts


def _said_once(reasons: Iterable[str]) -> list[str]:
    """Reasons with a parenthesised explanation they share (the image's driver rule of each GPU its torch cannot
    boot, three lines each) given it once, on the last of them (a trial read it twice in one footer)."""
    out = list(reasons)
    tails = [r[r.index(" (the driver") :] if " (the driver" in r else None for r in out]
    for i, tail in enumerate(tails):
        if tail is not None and tail in tails[i + 1 :]:
            out[i] = out[i][: -len(tail)]
    return out


def _plan_cells(e: PlanEntry, wide: bool) -> dict[str, str]:
    """One entry's cell of every column (the table shows those of its columns)."""
    lo, hi = e.cost_interval_usd
    market = e.market if e.market != "mixed" else f"mixed ({e.spot_share:.0%} spot)"
    if e.on_demand_fallback and e.on_demand_fallback >= FALLBACK_SHOWN:  # why a spot row can cost more than on demand
        market += f" +{e.on_demand_fallback:.0%} OD"  # (issue #37 M1: said only in the plan's notes before)
    return {
        # the entry's index, what srifty terraform / launch / replay --choice take (0: the recommendation), not its
        # 1-based rank: a trial's `--choice 4` wrote the fifth row, p3dn.24xlarge:1, where the table said #4 p4d
        "#": str(e.rank - 1) if wide else f"{e.rank - 1}{'*' if e.pareto else ' '}",
        # a space after each comma lets a fleet of several types wrap between types, never inside one
        "fleet": e.fleet if wide else e.fleet.replace(",", ", "),
        "GPUs": str(e.gpus),
        "market": market if wide else market.replace(" spot)", ")"),
        "region": e.region,
        "$/h": f"{e.usd_per_hour:,.2f}" if e.usd_per_hour >= 0.1 else f"{e.usd_per_hour:.2g}",
        "time": fmt_hours(e.time_h),
        "cost": fmt_usd(e.cost_usd),
        "time 80% interval": fmt_hours_range(*e.time_range_h()),
        "cost 80% interval": f"{fmt_usd(lo)}-{fmt_usd(hi)}",
        "spot risk": f"{e.risk} ({e.expected_interruptions:.2f})" if wide else e.risk,
        "perf. risk": e.performance_risk,
        "effort": e.migration_effort,
        "savings": "" if e.savings_vs_current is None else f"{e.savings_vs_current:+.0%}",
        "GiB/GPU": f"{e.memory_gib:.1f}" if e.memory_known is not False else f">={e.memory_gib:.1f} ?",
        "batch/GPU": e.batch_per_gpu(),
        "layout": e.layout.name if e.layout is not None else "ddp",
        "Pareto": "*" if e.pareto else "",
        # a fleet ranked with its move when late (move_if_late): its chance counts the move
        "in time": chance(e.deadline_probability) + (" (moves)" if e.late_move_to else ""),
    }


def _plan_footer(
    plan: Plan,
    columns: list[str],
    wide: bool,
    layouts: bool,
    fallback_shown: bool,
) -> str:
    """Below the plan table: the scaling, the candidates and what was left out (in the words the ranking was asked
    for: :mod:`predictor.ranking.words`), and what the columns shown mean."""
    excluded = ", ".join(f"{n:,} {why}" for why, n in sorted(plan.excluded.items(), key=lambda kv: -kv[1]))
    types = ", ".join(_said_once(f"{n:,} {why}" for why, n in sorted((plan.excluded_types or {}).items(),
                                                                      key=lambda kv: -kv[1])))  # fmt: skip
    c = plan.constraints
    scaling = (
        f"strong scaling: every fleet trains the global batch of {c.global_batch}"
        if c.scaling == "strong"
        else "weak scaling: the per-GPU batch is kept, the global batch grows with the fleet"
    )
    footer = (
        scaling + f"\n{plan.considered:,} candidate fleets considered" + (f"; excluded: {excluded}" if excluded else "")
    )
    if types:
        footer += f"\ninstance types left out: {types}"
    first = plan.entries[0] if plan.entries else None
    if first is not None and first.startup_s:  # a short training's time is mostly its start-up: say so
        footer += (
            f"\ntime: wall clock, start-up included (the first fleet's {fmt_hours(first.startup_s / 3600)} from "
            f"launch to its first step, then {fmt_hours(max(first.time_h - first.startup_s / 3600, 0.0))} of "
            "training)"
        )
    if "in time" in columns and c.deadline_h is not None:
        footer += (
            f"\nin time: the chance of finishing within the {fmt_hours(c.deadline_h)} deadline (the prediction's "
            "held-out spread, start-up, spot interruptions and the on-demand fallback); every fleet listed meets it "
            f"at {c.confidence or 0.5:.0%} or more (--confidence)"
        )
    if fallback_shown:
        footer += (
            "\n+N% OD: the expected share of the work the deadline policy runs on demand (spot capacity lost, the "
            "deadline kept), priced in the row's time and cost"
        )
    footer += "\n#: the entry's number for --choice (srifty terraform, launch, replay; 0: the recommendation)"
    if any(e.market == "mixed" for e in plan.entries):  # a trial read "mixed (33%)" for --market spot:0.75
        footer += (
            "; mixed (N%): the share of the fleet's instances on spot, the on-demand base included (--market "
            "spot:0.75 puts 75% of those above the base on spot)"
        )
    if not wide:
        footer += (
            "; * on the Pareto front (time vs cost); 80%: the time's 80% interval; batch: samples per GPU per step "
            "(4x2: micro-batches of 4, 2 accumulated; 3/2: GPUs a sample apart); "
            "spot: interruption risk over this run's hours (low: under 0.5 interruptions expected, medium: under 2; "
            "a type's own rate: srifty catalog); --wide for every column (GPUs, region, cost interval, prediction "
            "risk, effort, memory)" + ("; GiB: memory per GPU" if layouts else "")
        )
    return footer
