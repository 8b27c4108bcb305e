"""``from predictor.rank import rank, Constraints, ...``: the ranker's public names (the code is in
:mod:`predictor.ranking`, one module per concept)."""

from predictor.ranking import (
    MARKETS,
    OBJECTIVES,
    Calibration,
    Constraints,
    Market,
    Objective,
    Work,
    global_batch,
    parse_market,
    rank,
)
from predictor.ranking.pareto import exact_front, pareto

__all__ = [
    "MARKETS",
    "OBJECTIVES",
    "Calibration",
    "Constraints",
    "Market",
    "Objective",
    "Work",
    "exact_front",
    "global_batch",
    "pareto",
    "parse_market",
    "rank",
]
