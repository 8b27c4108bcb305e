"""One recommendation: rank a profile's fleets under constraints, in-process or through ``srifty serve``, and write
the plan and its HTML report. ``srifty recommend`` and ``SriftyCallback`` both call :func:`recommend`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictor.documents.atomic import check_distinct_outputs, check_writable
from predictor.documents.plan import Plan
from predictor.documents.profile import Profile
from predictor.exceptions import ConfigError
from predictor.ranking import Constraints, rank
from predictor.ranking.words import PYTHON, Words

if TYPE_CHECKING:
    from predictor.catalog import Catalog
    from predictor.runs.odds import SpotStats
    from predictor.service.client import ServiceClient


@dataclass(frozen=True)
class Recommendation:
    """The plan, and where it was written: ``written["plan"]``, ``["report"]`` and ``["plot"]`` when asked."""

    plan: Plan
    written: dict[str, Path] = field(default_factory=dict)


def recommend(
    profile: Profile,
    constraints: Constraints,
    *,
    catalog: Catalog | None = None,
    service: ServiceClient | None = None,
    plan_path: str | os.PathLike[str] | None = None,
    report_path: str | os.PathLike[str] | None = None,
    refine: Callable[[Plan], Plan] | None = None,
    spot_stats: SpotStats | None = None,
    words: Words = PYTHON,
) -> Recommendation:
    """Rank fleets for ``profile`` under ``constraints`` (through ``service`` when given: its observations calibrate
    the ranking), ``refine`` the plan (``srifty recommend --launchable`` keeps what the account can start), then
    write the plan (atomically) and the report where asked. ``spot_stats``: spot capacity from traces
    (:class:`predictor.runs.odds.SpotStats`), in place of the catalog's rates (local ranking only). ``words``:
    the caller's words for the constraints in the plan's prose (:mod:`predictor.ranking.words`; the service is asked
    for them too)."""
    outputs = {
        "plan_path": plan_path,
        "report_path": report_path,
        "report_path's plot (report_path with .png)": Path(report_path).with_suffix(".png") if report_path else None,
    }
    check_distinct_outputs(outputs)
    for output in outputs.values():
        if output is not None:  # every output can be written before any is (or any ranking is spent)
            check_writable(output)
    if service is not None and spot_stats is not None:
        raise ConfigError.between(
            "Spot traces ({spot_stats}) are used by the local ranking only: drop {service}, or rank without "
            "{spot_stats}.",
            parameter="spot_stats",
        )
    plan = (
        service.rank(profile, constraints, words=words.vocabulary)
        if service is not None
        else rank(profile, constraints, catalog=catalog, spot_stats=spot_stats, words=words)
    )
    if refine is not None:
        plan = refine(plan)
    written: dict[str, Any] = {}
    if plan_path is not None:
        written["plan"] = plan.save(plan_path)
    if report_path is not None:
        from predictor.ranking.report import write_report

        written["report"], written["plot"] = write_report(plan, report_path)
    return Recommendation(plan, written)
