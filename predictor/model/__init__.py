"""The performance model: time, throughput, memory and cost of a training on a fleet, with its uncertainty.

- the fleet model, every candidate at once (numpy): :mod:`~predictor.model.fleets`; :mod:`~predictor.model.predict`
  is its one-row view (:func:`predict`);
- its terms: compute (:mod:`.compute`, :mod:`.ops`, :mod:`.kernels`), the collectives on a fleet (:mod:`.network`),
  scaling across GPUs (:mod:`.scaling`), memory fit (:mod:`.memory`), the per-rank batch (:mod:`.batch`), the parallel
  layout (:mod:`.layout`), the learned correction (:mod:`.correction`, :mod:`.artefact`), the intervals
  (:mod:`.uncertainty`, :mod:`.stats`), the basis they share (:mod:`.basis`).

What a run pays besides its steps (start-up, spot, the deadline) is :mod:`predictor.runs`.

Imports the documents and the catalog, never the ranking or the service.
"""

from predictor.model.fleets import ManyPredictions, predict_many
from predictor.model.predict import Prediction, predict

__all__ = ["ManyPredictions", "Prediction", "predict", "predict_many"]
