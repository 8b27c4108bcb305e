"""The plan as something to look at: a Pareto plot (PNG) and one self-contained HTML file (plot embedded, table,
assumptions). Torch-free; matplotlib is imported only here."""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path
from typing import Any

from predictor.documents.atomic import atomic_write_bytes, atomic_write_text, check_writable
from predictor.documents.plan import Plan, PlanEntry
from predictor.ranking.explain import chance


def pareto_png(plan: Plan) -> bytes:
    """Time vs cost of the ranked fleets and the Pareto front (:func:`pareto_figure`) as PNG."""
    import matplotlib.pyplot as plt

    fig = pareto_figure(plan)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def pareto_figure(plan: Plan) -> Any:
    """Time vs cost of the ranked fleets and the Pareto front; the chosen fleet marked; 80% intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    shown = {e.fleet + e.market + e.region: e for e in (*plan.entries, *plan.pareto)}.values()
    for market, color in (("on-demand", "tab:blue"), ("spot", "tab:orange"), ("mixed", "tab:purple")):
        pts = [e for e in shown if e.market == market]
        if not pts:
            continue
        xs, ys = [e.time_h for e in pts], [e.cost_usd for e in pts]
        # the step-time interval moves time and cost together (the plan's own intervals: the start-up is fixed)
        times = [e.time_range_h() for e in pts]
        # a plan's intervals contain their estimates (PlanEntry refuses others); within its rounding slack a bound can
        # sit a hair past the estimate, which matplotlib >= 3.11 refuses as a negative error bar
        xerr = [
            [max(e.time_h - t[0], 0.0) for e, t in zip(pts, times)],
            [max(t[1] - e.time_h, 0.0) for e, t in zip(pts, times)],
        ]
        yerr = [
            [max(e.cost_usd - e.cost_interval_usd[0], 0.0) for e in pts],
            [max(e.cost_interval_usd[1] - e.cost_usd, 0.0) for e in pts],
        ]
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt="o", ms=4, alpha=0.6, color=color, label=market, lw=0.8)
    front = sorted(plan.pareto, key=lambda e: e.time_h)
    ax.plot([e.time_h for e in front], [e.cost_usd for e in front], color="gray", lw=1, ls="--", label="Pareto front")
    chosen = plan.entries[plan.chosen]
    ax.scatter(
        [chosen.time_h],
        [chosen.cost_usd],
        s=160,
        facecolors="none",
        edgecolors="green",
        linewidths=2,
        label=f"chosen: {chosen.fleet} ({chosen.market})",
        zorder=5,
    )
    if plan.constraints.deadline_h:
        ax.axvline(plan.constraints.deadline_h, color="red", lw=1, label="deadline")
    if plan.constraints.budget_usd:
        ax.axhline(plan.constraints.budget_usd, color="purple", lw=1, label="budget")
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import LogFormatter

    for axis in (ax.xaxis, ax.yaxis):  # plain numbers ("6", "0.2"), not "6x10^0": on a short log axis matplotlib
        axis.set_major_formatter(LogFormatter(labelOnlyBase=False))  # labels the minor ticks, and mathtext labels
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))  # overlapped
    ax.set_xlabel("predicted time to finish (h)")
    ax.set_ylabel("predicted cost (USD)")
    ax.set_title(
        f"{plan.model or 'model'}: {plan.constraints.work_samples:,.0f} samples, objective {plan.constraints.objective}"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def num(x: float) -> str:
    """A figure with 4 significant digits (thousands separated, no exponent): 0.0042, 14.17, 1,234, 123,457."""
    if x == 0:
        return "0"
    if abs(x) >= 10_000:
        return f"{x:,.0f}"
    return f"{x:,.4g}"


def _pct(share: float | None) -> str:
    return "" if share is None else f"{share:+.0%}"


def _gib(e: PlanEntry) -> str:
    """Memory per GPU as the console shows it: a floor marked '?' when the profile has no activation memory."""
    return f"{e.memory_gib:.1f}" if e.memory_known is not False else f"&ge;{e.memory_gib:.1f} ?"


def _profiled(plan: Plan) -> str:
    """Where the profile came from: its GPU, a capture on the meta device (no step run: the plan's note says so),
    or the CPU (issue #37 L: a meta capture read "Profiled on CPU")."""
    if plan.profile_gpu:
        return f"Profiled on {plan.profile_gpu}"
    if any("captured on the meta device" in note for note in plan.notes or ()):
        return "Captured on the meta device (srifty capture: no step was run)"
    return "Profiled on the CPU (no GPU step measured)"


def _asked(plan: Plan) -> str:
    """What the ranking was asked, in one line: the work, the scaling, the objective, the market and the limits."""
    c = plan.constraints
    return ", ".join(
        x
        for x in (
            f"{c.work_samples:,.0f} samples",
            f"strong scaling (global batch {c.global_batch} on every fleet)"
            if c.scaling == "strong"
            else "weak scaling (per-GPU batch kept; the global batch grows with the fleet)",
            f"objective {c.objective}",
            f"market {c.market}"
            + (f" ({c.spot_share:.0%} spot above {c.on_demand_base} on-demand)" if c.spot_share is not None else ""),
            f"up to {c.max_types} types per fleet" if c.max_types > 1 else "",
            f"current fleet {c.current_fleet}" if c.current_fleet else "",
            f"regions {', '.join(c.regions)}",
            f"up to {c.max_instances} instances",
            f"deadline {c.deadline_h:g} h" if c.deadline_h else "",
            f"budget ${c.budget_usd:,.0f}" if c.budget_usd else "",
            "transport tcp (no EFA)" if c.transport == "tcp" else "",
        )
        if x
    )


def write_report(plan: Plan, path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``path`` (HTML, self-contained) and the PNG of the plot beside it; both atomically."""
    target = Path(path)
    png_path = target.with_suffix(".png")
    for output in (target, png_path):  # both can be written, before either is
        check_writable(output)
    png = pareto_png(plan)
    atomic_write_bytes(png_path, png)
    esc = html.escape
    rows = "\n".join(
        f"<tr{' class=chosen' if i == plan.chosen else ''}><td>{e.rank - 1}</td><td>{esc(e.fleet)}</td>"
        f"<td>{e.gpus}</td>"
        f"<td>{esc(e.market)}</td><td>{esc(e.region)}</td><td>{num(e.usd_per_hour)}</td><td>{num(e.time_h)}</td>"
        f"<td>{chance(e.deadline_probability)}</td>"
        f"<td>{num(e.cost_usd)}</td><td>{num(e.cost_interval_usd[0])}-{num(e.cost_interval_usd[1])}</td>"
        f"<td>{esc(e.risk)} ({e.expected_interruptions:.2f})</td><td>{esc(e.performance_risk)}</td>"
        f"<td>{esc(e.migration_effort)}</td><td>{_pct(e.savings_vs_current)}</td><td>{esc(e.batch_per_gpu())}</td>"
        f"<td>{esc(e.layout.name if e.layout is not None else 'ddp')}</td><td>{_gib(e)}</td>"
        f"<td>{'yes' if e.pareto else ''}</td></tr>"
        for i, e in enumerate(plan.entries)
    )
    excluded = "".join(f"<li>{n:,} {esc(why)}</li>" for why, n in plan.excluded.items())
    excluded += "".join(
        f"<li>{n:,} instance type{'s' if n > 1 else ''}: {esc(why)}</li>"
        for why, n in (plan.excluded_types or {}).items()
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in plan.notes or ())
    asked = _asked(plan)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>srifty plan: {esc(plan.model or "model")}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px}}img{{max-width:100%;height:auto}}
table{{border-collapse:collapse;font-size:.85em}}th{{font-weight:600}}
td,th{{border:1px solid #ccc;padding:.2em .45em;text-align:right}}td:nth-child(2),td:nth-child(4),td:nth-child(5)
{{text-align:left}}tr.chosen{{background:#e6f4e6;font-weight:bold}}</style></head><body>
<h1>Which fleet for {esc(plan.model or "this model")}?</h1>
<p><b>{esc(plan.why)}</b></p>
<p>Asked: {esc(asked)}. {esc(_profiled(plan))}; catalog {esc(plan.catalog_source)}
(snapshot {esc(plan.catalog_snapshot)}); {plan.considered:,} candidate fleets.</p>
<img alt="time vs cost" src="data:image/png;base64,{base64.b64encode(png).decode()}">
<h2>Ranked fleets</h2>
<table><tr><th title="--choice (0: the recommendation)">#</th><th>fleet</th><th>GPUs</th><th>market</th>
<th>region</th><th>$/h</th><th>time (h)</th>
<th>in time (chance of meeting the deadline)</th>
<th>cost ($)</th><th>cost 80%</th><th>spot risk (interr.)</th><th>perf. risk</th>
<th>effort</th><th>savings</th><th>batch/GPU (x accum.)</th><th>layout</th><th>GiB/GPU</th><th>Pareto</th></tr>
{rows}</table>
<h2>Left out</h2><ul>{excluded}</ul>
<h2>Assumptions</h2><ul>{notes}</ul>
<p>Plan document: <code>{esc(plan.schema)}</code>, made {esc(plan.created_at or "")}.</p>
</body></html>
"""
    return atomic_write_text(target, page), png_path
