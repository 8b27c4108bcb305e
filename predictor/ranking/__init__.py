"""Ranking fleets for a profile under constraints, by concept:

- :mod:`~predictor.ranking.constraints`: what is asked (:class:`Constraints`, :class:`Objective`, :class:`Market`);
- :mod:`~predictor.ranking.candidates`: the feasible types, the fleet shapes over them, each priced per region and
  market (an on-demand base plus a spot share for the mixed market);
- :mod:`~predictor.ranking.pareto`: the time-cost front;
- :mod:`~predictor.ranking.explain`: the binding constraint, the reason in words, the structured
  :class:`~predictor.exceptions.NoFeasibleConfigError`;
- :mod:`~predictor.ranking.build`: a ranked candidate as a plan entry;
- :mod:`~predictor.ranking.core`: :func:`rank`, which ties them together.

Candidates that cannot be priced, cannot split the global batch, do not fit in GPU memory, or break a constraint are
excluded and counted by reason (instance types left out before any candidate was formed are counted apart).
"""

from predictor.documents.work import Work, global_batch
from predictor.ranking.constraints import MARKETS, OBJECTIVES, Constraints, Market, Objective, parse_market
from predictor.ranking.core import Calibration, rank
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
