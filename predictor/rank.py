"""``from predictor.rank import rank, Constraints, ...``: the ranker's public names (the code is in
:mod:`predictor.ranking`, one module per concept)."""

from predictor import ranking
from predictor.ranking import *  # noqa: F403 - the re-export is the point of this module
from predictor.ranking.pareto import exact_front, pareto

__all__ = [*ranking.__all__, "exact_front", "pareto"]
